"""Reading Icechunk repositories (on-disk format versions 1 and 2), read-only.

The public API is :mod:`refmount.refs.icechunk.repository`: :class:`Repository` (refs, config,
snapshots), :class:`Snapshot` (nodes, chunk references), and the records they return.
"""

from refmount.refs.icechunk.repository import (
    ChunkRef,
    IcechunkError,
    Node,
    Repository,
    Snapshot,
    SnapshotInfo,
)

__all__ = ["ChunkRef", "IcechunkError", "Node", "Repository", "Snapshot", "SnapshotInfo"]
