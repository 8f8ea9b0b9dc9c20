"""Serving FUSE reads of a reference from caches and fetches.

Strategy (Zarr readers read whole chunks, the kernel asks in ≤1 MiB pieces):
* inline references are sliced from the index;
* a range reference up to ``whole_fetch_limit`` is fetched whole on its first read and
  later reads are served from memory;
* larger ranges and whole-file targets are read in aligned blocks of ``block_size``,
  with readahead that doubles while a reader streams sequentially and stops when it seeks;
* keys read in target order are prefetched across keys (``TargetReadahead``); the
  prefetched stretches go to the disk cache as *grid blocks* — ``block_size`` pieces at
  multiples of ``block_size`` in the target, the same keys as whole-file blocks — so a
  later reader loads one block for many keys and reads the following blocks ahead.
Every piece is looked up in memory, then on disk, then fetched; concurrent reads of the
same bytes share one fetch (single-flight). Fetched pieces are written to the disk cache
in the background, never on the reader's path.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import overload

import trio

from .cache import Block, DiskCache, MemoryLRU
from .cachewriter import CacheWriter
from .fetch import Fetcher, FetchError, PastEnd
from .prefetch import TargetReadahead
from .refs import Ref, RefKind
from .stats import Stats

log = logging.getLogger(__name__)


class Flight:
    """One load of a block that concurrent readers of the same bytes wait for (single-flight)."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Block | None = None
        self.error: BaseException | None = None


class ReadState:
    """Per open file: where the last read ended and how far ahead to prefetch."""

    __slots__ = ("last_end", "window")

    def __init__(self) -> None:
        self.last_end = -1
        self.window = 0


class RefReader:
    # After a failed fetch the kernel re-reads the same page at once (readahead, then a
    # synchronous read). A timed-out fetch is remembered briefly so that the re-read fails
    # at once instead of waiting a second full timeout; other failures are cheap to retry
    # and are not remembered (a target that recovers is read again right away).
    TIMEOUT_MEMORY = 2.0

    def __init__(
        self,
        fetcher: Fetcher,
        memory: MemoryLRU,
        disk: DiskCache | None,
        *,
        disk_writer: CacheWriter | None = None,
        whole_fetch_limit: int,
        block_size: int,
        max_readahead: int,
        stats: Stats,
    ) -> None:
        self.fetcher = fetcher
        self.memory = memory
        self.disk = disk
        self.disk_writer = disk_writer
        self.whole_fetch_limit = whole_fetch_limit
        self.block_size = block_size
        self.max_readahead = max_readahead
        self.stats = stats
        self._inflight: dict[Hashable, Flight] = {}
        self._failed: dict[Hashable, tuple[float, BaseException]] = {}
        self._sizes: dict[str, int] = {}
        self._disk_threads = trio.CapacityLimiter(8)
        self._background: trio.Nursery | None = None
        # Readahead across keys that read one target in order (small ranges only: larger
        # ones have block readahead of their own).
        self.readahead = TargetReadahead(
            fetcher, stats, capacity=min(max(2 * max_readahead, 16 * 2**20), memory.capacity),
            max_window=max_readahead, grid=block_size, on_block=self._grid_to_disk,
            links=fetcher.links,
        )
        # Per target: the grid block keys were last served from, and up to which block
        # the disk has been read ahead.
        self._grid_runs: dict[str, list[int]] = {}
        self._key_ends: dict[str, int] = {}  # per target: where the last key read first ended

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work (disk writes, readahead) runs: the daemon's nursery."""
        self._background = nursery

    def clipped(self, ref: Ref) -> int | None:
        """The length of a range that runs past the end of its target, once the target's
        size is known (a fetch met its end, or it was measured): the bytes that exist.
        None for any other reference."""
        if ref.kind is not RefKind.RANGE or ref.url is None:
            return None
        size = self._sizes.get(ref.url)
        if size is None or ref.offset + ref.length <= size:
            return None
        return max(size - ref.offset, 0)

    async def _cat(self, url: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of ``url``; a range running past the end of the target gives
        the bytes that exist, and the target's size is remembered (see ``clipped``)."""
        try:
            return await self.fetcher.cat_range(url, start, end)
        except PastEnd as e:
            if url not in self._sizes:
                log.debug("%s ends at byte %d, inside a range read from it", url, e.size)
                self._remember_size(url, e.size)
            if e.data:  # also where reads of the clipped range look for it
                self.memory.put((url, start, len(e.data)), e.data)
            return e.data

    def _remember_size(self, url: str, size: int) -> None:
        if len(self._sizes) > 1_000_000:
            self._sizes.clear()
        self._sizes[url] = size

    async def settle(self, ref: Ref) -> int | None:
        """Whether a range runs past the end of its target, found out before its first
        read: the bytes that exist, or None (``clipped``). The range's first piece is read
        (its first read, early: the bytes stay in memory for the reads that follow), which
        tells the target's size if it ends there. For a range larger than that piece (over
        ``whole_fetch_limit``, read in blocks) the target's size is asked for then, once per
        target."""
        if ref.kind is not RefKind.RANGE or ref.url is None or ref.length <= 0:
            return None
        if ref.url not in self._sizes:
            await self.read(ref, 0, 1)
            if ref.url not in self._sizes and ref.length > self.whole_fetch_limit:
                self._remember_size(ref.url, await self.fetcher.size(ref.url))
        return self.clipped(ref)

    async def size(self, ref: Ref) -> int:
        if ref.kind is not RefKind.WHOLE or ref.length >= 0:
            clipped = self.clipped(ref)
            return ref.length if clipped is None else clipped
        assert ref.url is not None
        size = self._sizes.get(ref.url)
        if size is None:
            size = await self.fetcher.size(ref.url)
            self._remember_size(ref.url, size)
        return max(size - ref.offset, 0)  # a Parquet row without a size: offset to the end

    async def read(
        self, ref: Ref, off: int, size: int, state: ReadState | None = None
    ) -> bytes | memoryview:
        """Bytes [off, off+size) of the reference. A view into a cached piece where one
        piece covers the request: the FUSE reply copies from it, so we do not copy first."""
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
            key = (url, start, total)
            if self.memory.get(key) is None and key not in self._inflight:
                in_order = self._follows(url, start, start + total) if off == 0 else False
                found = await self.readahead.lookup(url, start, start + total)
                if found is not None:
                    if off == 0:  # first read of this key
                        self._prefetch_hit(key, *found)
                    return found[0][off:end]
                # Grid blocks from disk only for a key not cached by itself, and only while
                # keys come in target order (or for keys of a quarter block or more):
                # loading a whole block for one small key read at random is many times the
                # disk traffic of the key (scripts/soak.py: a third fewer reads per second).
                if self.disk is None or not self.disk.may_contain(url, start, total):
                    piece = await self._from_grid(
                        url, start, start + total, from_disk=in_order or 4 * total >= self.block_size
                    )
                    if piece is not None:
                        return piece[off:end]

            def fetch_whole() -> Awaitable[bytes]:
                self.readahead.note(url, start, start + total, self._background, miss=True)
                return self._cat(url, start, start + total)

            data = await self._shared(key, fetch_whole)
            return memoryview(data)[off:end]
        return await self._read_blocks(url, ref.offset, total, off, end, state)

    def _prefetch_hit(self, key: tuple[str, int, int], data: Block, in_grid_blocks: bool) -> None:
        """A key served from a prefetched stretch for the first time."""
        url, start, length = key
        self.stats.prefetch_hits += 1
        if not in_grid_blocks:  # keep it on disk like any fetch
            self._to_disk(key, data)
        self.readahead.note(url, start, start + length, self._background, miss=False)

    PUSH_LIMIT = 2**20

    def ready_whole(self, ref: Ref) -> Block | None:
        """All bytes of a chunk (a range reference up to ``PUSH_LIMIT``) read ahead of a
        reader going through its target in order, if memory has them right now (no I/O, no
        waiting), counted as its first read: for storing in the page cache at open. Chunks
        met at random are left to their READs: such readers often read part of a file, and
        a store is a copy of all of it, on the FUSE thread."""
        if ref.kind is not RefKind.RANGE or ref.url is None or not 0 < ref.length <= self.PUSH_LIMIT:
            return None
        url, start, end = ref.url, ref.offset, ref.offset + ref.length
        key = (url, start, ref.length)
        self._follows(url, start, end)  # a first read, pushed or not: keep the order detector current
        if self.memory.get(key) is not None:
            return None
        found = self.readahead.peek(url, start, end)
        if found is not None:
            self._prefetch_hit(key, *found)
            return found[0]
        run = self._grid_runs.get(url)
        if run is None or not run[0] <= start // self.block_size <= run[0] + 1:
            return None  # not in order through grid blocks
        blocks = self._grid_in_memory(url, start, end)
        if blocks is None:
            return None
        self.stats.memory_hits += 1
        return self._grid_piece(url, blocks, start, end)

    def _block(self, url: str, base: int, total: int, b: int) -> tuple[tuple[str, int, int], Callable]:
        start = base + b * self.block_size
        stop = base + min((b + 1) * self.block_size, total)
        return (url, start, stop - start), lambda: self._cat(url, start, stop)

    async def _read_blocks(
        self, url: str, base: int, total: int, off: int, end: int, state: ReadState | None
    ) -> bytes | memoryview:
        bs = self.block_size
        first, last = off // bs, (end - 1) // bs
        parts: dict[int, Block] = {}
        if state is not None:
            self._readahead(url, base, total, off, end, state)

        errors: list[Exception] = []

        async def get(b: int) -> None:
            key, fetch = self._block(url, base, total, b)
            try:
                parts[b] = await self._shared(key, fetch)
            except Exception as e:  # reported below as itself, not as an ExceptionGroup
                errors.append(e)

        if first == last:
            await get(first)
        else:
            async with trio.open_nursery() as nursery:
                for b in range(first, last + 1):
                    nursery.start_soon(get, b)
        if errors:
            raise errors[0]
        skip = off - first * bs
        if first == last:
            return memoryview(parts[first])[skip : skip + (end - off)]
        data = b"".join(parts[b] for b in range(first, last + 1))
        return memoryview(data)[skip : skip + (end - off)]

    def _readahead(
        self, url: str, base: int, total: int, off: int, end: int, state: ReadState
    ) -> None:
        """Grow the window while reads are sequential; prefetch blocks after ``end``."""
        bs = self.block_size
        if off == state.last_end:
            state.window = min(max(state.window * 2, 2 * bs), self.max_readahead)
        elif off != 0:
            state.window = 0  # a seek: stop prefetching until the reader streams again
        state.last_end = end
        if not state.window or self._background is None:
            return
        last = min((end + state.window - 1) // bs, (total - 1) // bs)
        for b in range((end - 1) // bs + 1, last + 1):
            key, fetch = self._block(url, base, total, b)
            if key in self._inflight or self.memory.get(key) is not None:
                continue
            self._background.start_soon(self._prefetch, key, fetch)

    async def _prefetch(
        self, key: tuple[str, int, int], fetch: Callable[[], Awaitable[bytes]] | None, upto: bool = False
    ) -> None:
        try:
            await self._shared(key, fetch, upto=upto)
        except Exception as e:  # the reader will see (and log) the error if it gets there
            log.debug("readahead of %s failed: %s", key, e)

    # ---- grid blocks: readahead stretches on disk -------------------------------------
    def _grid_to_disk(self, url: str, start: int, data: memoryview) -> None:
        if self.disk_writer is not None:  # the last block of a target may be shorter
            self.disk_writer.submit(url, start, data, key_length=self.block_size)

    def _follows(self, url: str, start: int, end: int) -> bool:
        """Whether a key read for the first time starts near where the last one of its
        target ended (a reader going through the target in order); notes where it ends."""
        last = self._key_ends.get(url)
        if last is None and len(self._key_ends) >= 10_000:
            self._key_ends.clear()
        self._key_ends[url] = end
        return last is not None and abs(start - last) <= TargetReadahead.SLACK

    async def _from_grid(
        self, url: str, start: int, end: int, *, from_disk: bool = True
    ) -> memoryview | None:
        """Bytes [start, end) of ``url`` from grid blocks in memory or on disk, if every
        block they need is there; the disk is then read ahead while keys follow in order."""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        blocks: list[Block] = []
        for k in range(first, last + 1):
            gkey = (url, k * bs, bs)
            data = self.memory.get(gkey)
            if data is not None:
                self.stats.memory_hits += 1
            else:
                if gkey not in self._inflight and (
                    not from_disk or self.disk is None or not self.disk.may_contain(url, k * bs, bs)
                ):
                    return None  # not there: no thread hop
                data = await self._shared(gkey, None, upto=True)
                if data is None:
                    return None
            blocks.append(data)
        return self._grid_piece(url, blocks, start, end)

    def _grid_in_memory(self, url: str, start: int, end: int) -> list[Block] | None:
        bs = self.block_size
        blocks = []
        for k in range(start // bs, (end - 1) // bs + 1):
            data = self.memory.get((url, k * bs, bs))
            if data is None:
                return None
            blocks.append(data)
        return blocks

    def _grid_piece(self, url: str, blocks: list[Block], start: int, end: int) -> memoryview | None:
        """Bytes [start, end) out of the grid blocks that cover them."""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        if len(blocks[-1]) < end - last * bs:
            return None  # the target ends before the key does: let the fetch report it
        self._grid_readahead(url, last)
        skip = start - first * bs
        if first == last:
            return memoryview(blocks[0])[skip : skip + end - start]
        return memoryview(b"".join(blocks))[skip : skip + end - start]

    def _grid_readahead(self, url: str, k: int) -> None:
        """Keys served from grid block ``k``: while they go on in order, load the next
        blocks on disk in the background (up to ``max_readahead`` ahead)."""
        run = self._grid_runs.get(url)
        if run is None:
            if len(self._grid_runs) >= 10_000:
                self._grid_runs.clear()
            self._grid_runs[url] = [k, k]
            return
        last, ahead = run
        run[0] = k
        if not (last <= k <= last + 1) or self._background is None or self.disk is None:
            run[1] = k  # a jump: no readahead until keys follow on again
            return
        bs = self.block_size
        stop = k + max(1, self.max_readahead // bs)
        for j in range(max(ahead, k) + 1, stop + 1):
            gkey = (url, j * bs, bs)
            if gkey in self._inflight or self.memory.get(gkey) is not None:
                continue
            if not self.disk.may_contain(url, j * bs, bs):
                stop = j  # the cached part ends here
                break
            self._background.start_soon(self._prefetch, gkey, None, True)
        run[1] = max(ahead, stop)

    async def _from_disk(self, key: Hashable, upto: bool = False) -> Block | None:
        if self.disk is None or not isinstance(key, tuple):
            return None
        url, start, length = key
        if not self.disk.may_contain(url, start, length):
            return None  # a certain miss: no thread hop
        disk, policy = self.disk, self.fetcher.policy

        def lookup() -> Block | None:
            # The read-time policy comes first: a block another mount cached (or this one,
            # before a symlink was swapped in) is never a way around it. A refused target
            # is a miss here, and the fetch then fails with the reason.
            if policy.problem(url, resolve=True):
                return None
            return disk.get(url, start, length, upto=upto)

        return await trio.to_thread.run_sync(lookup, limiter=self._disk_threads)

    def _to_disk(self, key: Hashable, data: bytes | memoryview) -> None:
        if self.disk_writer is not None and isinstance(key, tuple) and len(data):
            self.disk_writer.submit(key[0], key[1], data)  # written by the writer process

    @overload
    async def _shared(self, key: Hashable, fetch: Callable[[], Awaitable[bytes]]) -> Block: ...
    @overload
    async def _shared(self, key: Hashable, fetch: None, *, upto: bool) -> Block | None: ...

    async def _shared(
        self, key: Hashable, fetch: Callable[[], Awaitable[bytes]] | None, *, upto: bool = False
    ) -> Block | None:
        """Memory, else join an in-flight load of the same bytes, else disk, else fetch
        (without ``fetch``: None when the bytes are not on disk)."""
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
                if flight.result is not None or fetch is None:
                    return flight.result
                continue  # a disk-only load found nothing: fetch ourselves
            if not isinstance(flight.error, trio.Cancelled):
                raise flight.error
            # The leader was cancelled (its reader went away): try again ourselves.
        failed = self._failed.get(key)
        if failed is not None:
            if failed[0] > trio.current_time():
                raise failed[1]
            del self._failed[key]
        flight = self._inflight[key] = Flight()
        try:
            data = await self._from_disk(key, upto)
            if data is not None:
                self.stats.disk_hits += 1
            elif fetch is None:
                return None
            else:
                self.stats.misses += 1
                data = await fetch()
                self._to_disk(key, data)
            self.memory.put(key, data)
            flight.result = data
            return data
        except BaseException as e:
            flight.error = e
            if isinstance(e, FetchError) and e.timed_out:
                if len(self._failed) > 10_000:
                    self._failed.clear()
                self._failed[key] = (trio.current_time() + self.TIMEOUT_MEMORY, e)
            raise
        finally:
            del self._inflight[key]
            flight.done.set()
