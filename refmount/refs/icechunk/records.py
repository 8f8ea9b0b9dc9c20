"""What the Icechunk reader returns: chunk references, nodes, snapshot summaries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ChunkRef:
    kind: Literal["inline", "native", "virtual"]
    data: bytes | memoryview | None = None  # inline: the chunk's bytes (a view of the manifest)
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
