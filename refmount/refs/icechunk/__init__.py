"""Reading Icechunk repositories (on-disk format versions 1 and 2), read-only.

The public API is :mod:`refmount.refs.icechunk.repository`: :class:`Repository` (refs, config,
snapshots), :class:`Snapshot` (nodes, chunk references), and the records they return. They are
imported on first use, so that asking whether a SOURCE is a repository (``format.py``) does not
load the readers (flatbuffers, numpy, yaml) for a SOURCE that is not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from refmount.refs.icechunk.repository import (
        ChunkRef,
        IcechunkError,
        Node,
        Repository,
        Snapshot,
        SnapshotInfo,
    )

__all__ = ["ChunkRef", "IcechunkError", "Node", "Repository", "Snapshot", "SnapshotInfo"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("refmount.refs.icechunk.repository"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
