"""What a reference is, independent of the file format it came from."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


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


INT64_MAX = 2**63 - 1
