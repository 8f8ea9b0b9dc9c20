"""Serving FUSE reads of a reference from caches and fetches.

Strategy (Zarr readers read whole chunks, the kernel asks in ≤1 MiB pieces):
* inline references are sliced from the index;
* a range reference up to ``whole_fetch_limit`` is fetched whole on its first read and
  later reads are served from memory;
* larger ranges and whole-file targets are read in aligned blocks of ``block_size``.
Concurrent reads of the same bytes share one fetch (single-flight).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable

import trio

from .cache import MemoryLRU
from .fetch import Fetcher
from .refs import Ref, RefKind
from .stats import Stats


class _Flight:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: bytes | None = None
        self.error: BaseException | None = None


class RefReader:
    def __init__(
        self,
        fetcher: Fetcher,
        memory: MemoryLRU,
        *,
        whole_fetch_limit: int,
        block_size: int,
        stats: Stats,
    ) -> None:
        self.fetcher = fetcher
        self.memory = memory
        self.whole_fetch_limit = whole_fetch_limit
        self.block_size = block_size
        self.stats = stats
        self._inflight: dict[Hashable, _Flight] = {}
        self._sizes: dict[str, int] = {}

    async def size(self, ref: Ref) -> int:
        if ref.kind is not RefKind.WHOLE or ref.length >= 0:
            return ref.length
        assert ref.url is not None
        size = self._sizes.get(ref.url)
        if size is None:
            size = await self.fetcher.size(ref.url)
            if len(self._sizes) > 1_000_000:
                self._sizes.clear()
            self._sizes[ref.url] = size
        return size

    async def read(self, ref: Ref, off: int, size: int) -> bytes:
        if ref.kind is RefKind.INLINE:
            assert ref.data is not None
            return ref.data[off : off + size]
        assert ref.url is not None
        url = ref.url
        total = await self.size(ref)
        end = min(off + size, total)
        if off >= end:
            return b""
        if ref.kind is RefKind.RANGE and total <= self.whole_fetch_limit:
            start = ref.offset

            def fetch_whole() -> Awaitable[bytes]:
                return self.fetcher.cat_range(url, start, start + total)

            data = await self._shared((url, start, total), fetch_whole)
            return data[off:end]
        return await self._read_blocks(url, ref.offset, total, off, end)

    async def _read_blocks(self, url: str, base: int, total: int, off: int, end: int) -> bytes:
        bs = self.block_size
        first, last = off // bs, (end - 1) // bs
        parts: dict[int, bytes] = {}

        async def get(b: int) -> None:
            start = base + b * bs
            stop = base + min((b + 1) * bs, total)
            parts[b] = await self._shared(
                (url, start, stop - start), lambda: self.fetcher.cat_range(url, start, stop)
            )

        if first == last:
            await get(first)
        else:
            async with trio.open_nursery() as nursery:
                for b in range(first, last + 1):
                    nursery.start_soon(get, b)
        data = b"".join(parts[b] for b in range(first, last + 1))
        skip = off - first * bs
        return data[skip : skip + (end - off)]

    async def _shared(self, key: Hashable, fetch: Callable[[], Awaitable[bytes]]) -> bytes:
        """Memory cache, else join an in-flight fetch of the same bytes, else fetch."""
        while True:
            cached = self.memory.get(key)
            if cached is not None:
                self.stats.memory_hits += 1
                return cached
            flight = self._inflight.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if flight.error is None:
                assert flight.result is not None
                return flight.result
            if not isinstance(flight.error, trio.Cancelled):
                raise flight.error
            # The leader was cancelled (its reader went away): try again ourselves.
        flight = self._inflight[key] = _Flight()
        self.stats.misses += 1
        try:
            data = await fetch()
            self.memory.put(key, data)
            flight.result = data
            return data
        except BaseException as e:
            flight.error = e
            raise
        finally:
            del self._inflight[key]
            flight.done.set()
