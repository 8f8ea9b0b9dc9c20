"""What a reference is, independent of the file format it came from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

FILE_SUFFIXES = (".json", ".gz", ".bz2", ".xz", ".zst")  # names of reference files


class RefKind(IntEnum):
    INLINE = 0  # bytes stored in the reference set itself
    RANGE = 1  # [url, offset, length]
    WHOLE = 2  # [url]: the whole target; its size is learnt lazily


class Ref(NamedTuple):
    kind: RefKind
    url: str | None = None
    offset: int = 0
    length: int = -1  # RANGE: exact length; INLINE: len(data); WHOLE: -1 until known
    data: bytes | None = None


class ReferenceSetError(ValueError):
    """The reference set is malformed. ``str(err)`` is one line that names the problem."""


@dataclass
class IndexFile:
    """What :meth:`Format.prepare` leaves for the daemon. Sent to it as JSON (``vars``)."""

    path: str  # the index file; "" for a format read lazily from SOURCE itself (Parquet)
    temporary: bool  # delete once the daemon has mapped it
    reused: bool  # an unchanged set's persisted index was found
    kind: str = "json"  # the name of the Format that prepared it
    revision: str = ""  # the revision of SOURCE prepared (an Icechunk snapshot id); "" for none


INT64_MAX = 2**63 - 1
