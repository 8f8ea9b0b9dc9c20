"""An Icechunk repository read from storage through fsspec: refs, config, snapshots, manifests.

A synchronous API (the daemon calls it in worker threads). Every object is read under
:class:`~refmount.refs.limits.Limits`; anything malformed is an :class:`IcechunkError` whose
text is one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from refmount.refs.limits import DEFAULT_LIMITS, Limits
from refmount.refs.model import ReferenceSetError


class IcechunkError(ReferenceSetError):
    """The repository is malformed, incomplete or too big; ``str(err)`` is one line."""


@dataclass(frozen=True)
class ChunkRef:
    kind: Literal["inline", "native", "virtual"]
    data: bytes | None = None  # inline: the chunk's bytes
    location: str | None = None  # native: "chunks/<ID>" relative to the root; virtual: the URL
    offset: int = 0
    length: int = 0
    etag: str | None = None  # virtual: the checksum recorded with it, if any
    last_modified: int | None = None  # virtual: seconds since the epoch, if recorded


@dataclass(frozen=True)
class Node:
    path: str  # "" for the root group, else "a/b" (no leading slash)
    kind: Literal["group", "array"]
    zarr_json: bytes  # the node's Zarr v3 metadata document (zarr.json), as stored


@dataclass(frozen=True)
class SnapshotInfo:
    id: str  # as icechunk prints it (Crockford base32, 20 characters)
    parent_id: str | None
    flushed_at: str  # ISO 8601 UTC
    message: str


class Snapshot:
    info: SnapshotInfo
    nodes: list[Node]  # sorted by path

    def node(self, path: str) -> Node | None:
        raise NotImplementedError

    def chunk(self, path: str, coords: tuple[int, ...]) -> ChunkRef | None:
        """The chunk at ``coords`` of the array at ``path``; None where none was written."""
        raise NotImplementedError

    def chunks(self, path: str) -> Iterator[tuple[tuple[int, ...], ChunkRef]]:
        """Every written chunk of the array, sorted by coords (C order), manifest by manifest."""
        raise NotImplementedError

    def chunk_count(self, path: str) -> int:
        raise NotImplementedError


class Repository:
    format_version: int  # 1 or 2
    root: str  # the repository URL as opened

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any],
             limits: Limits = DEFAULT_LIMITS) -> Repository:
        raise NotImplementedError

    @staticmethod
    def detect(url: str, storage_options: Mapping[str, Any]) -> bool:
        """Whether ``url`` looks like an Icechunk repository (a few small reads)."""
        raise NotImplementedError

    def branches(self) -> dict[str, str]:
        raise NotImplementedError

    def tags(self) -> dict[str, str]:
        raise NotImplementedError

    def resolve(self, *, branch: str | None = None, tag: str | None = None,
                snapshot: str | None = None) -> str:
        raise NotImplementedError

    def snapshot(self, snapshot_id: str) -> Snapshot:
        raise NotImplementedError

    def virtual_chunk_containers(self) -> list[str]:
        raise NotImplementedError

    def object_url(self, location: str) -> str:
        raise NotImplementedError
