"""What a read of a byte range of a target answers besides its bytes: the ``Sink`` they go to
as they arrive, and the answers that are not the range — ``ShortRead`` (retried), ``PastEnd``
(the target ends inside the range), ``RangesIgnored`` (a server that does not serve ranges)."""

from __future__ import annotations

from collections.abc import Callable

from refmount.base.errors import FetchError

# Where the bytes of a range go as they arrive (``Fetcher.stream_range``): ``sink(at, piece)``
# is bytes [at, at + len(piece)) from the start of the range, in order; a retry starts again
# at 0. Called on trio's thread (from the host loop or from trio), never from another.
Sink = Callable[[int, bytes], None]


class ShortRead(OSError):
    """The target answered with fewer/more bytes than asked: retried, never served."""


class PastEnd(FetchError):
    """The range runs past the end of its target, whose size the storage told us (a
    Content-Range total, a 416, or the size of the target after a short answer): ``data``
    is what exists of the range (up to the end of the target; empty when the range starts
    at or after it). Permanent: never retried. Any other short answer stays a ShortRead."""

    def __init__(self, url: str, start: int, end: int, size: int, data: bytes) -> None:
        super().__init__(url, f"bytes {start}-{end}: the target ends at {size}")
        self.size = size
        self.data = data


def past_end(url: str, start: int, end: int, size: int | None, data: bytes) -> PastEnd | None:
    """A PastEnd if ``data`` (the answer to bytes [start, end)) is short only because the
    target of ``size`` bytes ends inside the range; None for any other short answer."""
    if size is None or end <= size or len(data) != max(size - start, 0):
        return None
    return PastEnd(url, start, end, size, data)


class RangesIgnored(FetchError):
    """The server answered a Range request with the whole object and does not announce
    ``Accept-Ranges: bytes``: it does not serve ranges (``python -m http.server`` does not).
    Permanent: retrying asks the same server again."""

    def __init__(self, url: str, start: int, end: int) -> None:
        super().__init__(url, f"bytes {start}-{end - 1}: the server ignores Range requests "
                              "(it answered 200 with the whole file)")
