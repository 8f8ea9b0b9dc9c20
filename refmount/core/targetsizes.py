"""``TargetSizes``: what is known of the size of each target, and ranges running past it.

A reference's length is what its set says, until a fetch meets the end of its target
(``PastEnd``: the bytes that exist and the target's size) or the target's size is asked for.
Then a range running past the end is served as the bytes that exist (``clipped``), and a
whole-target reference (or a Parquet row without a size) is as long as the target
(``length``). Sizes are remembered per target URL, the most recently used ``max_sizes``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from refmount.base.lru import LRU
from refmount.cache.blocks import MemoryLRU
from refmount.core.blockstore import BlockKey
from refmount.refs import Ref, RefKind
from refmount.targets.rangeanswers import PastEnd

log = logging.getLogger(__name__)


class SizeFetcher(Protocol):
    """What ``TargetSizes`` needs of the fetcher (a fake one in tests)."""

    async def cat_range(self, url: str, start: int, end: int) -> bytes: ...

    async def size(self, url: str) -> int: ...


class TargetSizes:
    MAX_SIZES = 1_000_000  # target sizes remembered at once

    def __init__(self, fetcher: SizeFetcher, memory: MemoryLRU, *, whole_fetch_limit: int,
                 max_sizes: int = MAX_SIZES) -> None:
        self.fetcher = fetcher
        self.memory = memory
        self.whole_fetch_limit = whole_fetch_limit
        self._sizes: LRU[str, int] = LRU(max_sizes)

    def known(self, url: str) -> int | None:
        """The size of the target ``url``, if known (no I/O)."""
        return self._sizes.peek(url)

    def __len__(self) -> int:
        """The targets whose size is remembered."""
        return len(self._sizes)

    def clipped(self, ref: Ref) -> int | None:
        """The length of a range that runs past the end of its target, once the target's
        size is known (a fetch met its end, or it was measured): the bytes that exist.
        None for any other reference."""
        if ref.kind is not RefKind.RANGE:
            return None
        length = self.known_length(ref)
        return length if length is not None and length < ref.length else None

    def known_length(self, ref: Ref) -> int | None:
        """The bytes the reference serves, if known without I/O: all but a whole target
        whose size has not been measured yet (a range running past the end of its target:
        ``clipped``)."""
        if ref.kind is RefKind.WHOLE and ref.length < 0:
            # a whole target, or a Parquet row without a size: from its offset to the end
            size = self._sizes.peek(ref.url)  # type: ignore[arg-type]
            return None if size is None else max(size - ref.offset, 0)
        if ref.kind is RefKind.RANGE and ref.url is not None:
            size = self._sizes.peek(ref.url)
            if size is not None and ref.offset + ref.length > size:
                return max(size - ref.offset, 0)
        return ref.length

    async def length(self, ref: Ref) -> int:
        """The bytes the reference serves; a whole target's size is measured once."""
        known = self.known_length(ref)
        if known is not None:
            return known
        assert ref.url is not None
        size = await self.fetcher.size(ref.url)
        self._sizes.put(ref.url, size)
        return max(size - ref.offset, 0)

    async def cat(self, url: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of ``url``; a range running past the end of the target gives
        the bytes that exist, and the target's size is remembered (see ``clipped``)."""
        try:
            return await self.fetcher.cat_range(url, start, end)
        except PastEnd as e:
            if url not in self._sizes:
                log.debug("%s ends at byte %d, inside a range read from it", url, e.size)
                self._sizes.put(url, e.size)
            if e.data:  # also where reads of the clipped range look for it
                self.memory.put(BlockKey(url, start, len(e.data)), e.data)
            return e.data

    def needs_settling(self, ref: Ref) -> bool:
        """Whether ``settle`` has something to find out: a range whose target's size is not
        known yet (no I/O)."""
        return (ref.kind is RefKind.RANGE and ref.url is not None and ref.length > 0
                and ref.url not in self._sizes)

    async def settle(self, ref: Ref, first_read: Callable[[], Awaitable[object]]) -> int | None:
        """Whether a range runs past the end of its target, found out before its first
        read: the bytes that exist, or None (``clipped``). For a range up to
        ``whole_fetch_limit`` that is ``first_read()`` (its first read, early: the bytes stay
        in memory for the reads that follow), which tells the target's size if it ends
        inside the range (through ``cat``). For a larger one, read in blocks and often not
        from its start, the target's size is asked for, once per target."""
        if not self.needs_settling(ref):
            return self.clipped(ref)
        assert ref.url is not None
        if ref.length <= self.whole_fetch_limit:
            await first_read()
        else:
            self._sizes.put(ref.url, await self.fetcher.size(ref.url))
        return self.clipped(ref)
