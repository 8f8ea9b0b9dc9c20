"""Serving FUSE reads of a reference: a map from a reference and an offset to blocks.

Strategy (Zarr readers read whole chunks, the kernel asks in ≤1 MiB pieces):
* inline references are sliced from the index;
* a range reference up to ``whole_fetch_limit`` is one block, fetched whole on its first
  read; later reads are served from memory;
* larger ranges and whole-file targets are read in aligned blocks of ``block_size``, with
  the per-handle readahead of ``readahead.HandleReadahead``;
* keys read in target order are prefetched across keys (``TargetReadahead``); the
  prefetched stretches go to the disk cache as *grid blocks* — ``block_size`` pieces at
  multiples of ``block_size`` in the target, the same keys as whole-file blocks — so a
  later reader loads one block for many keys and reads the following blocks ahead
  (``GridReadahead``).
Every block is loaded by the ``BlockStore`` (memory, disk, fetch, single-flight); this
module only says which blocks a read needs and tells the readahead policies about it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import trio

from .blockstore import BlockKey, BlockStore, Fetch
from .cache import Block, DiskCache, MemoryLRU
from .cachewriter import CacheWriter
from .fetch import Fetcher, PastEnd
from .lru import LRU
from .readahead import GridReadahead, HandleReadahead, OrderDetector, ReadState, TargetReadahead
from .refs import Ref, RefKind
from .stats import Stats

log = logging.getLogger(__name__)

__all__ = ["BlockKey", "ReadState", "RefReader"]


class RefReader:
    MAX_SIZES = 1_000_000  # target sizes remembered at once
    PUSH_LIMIT = 2**20

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
        self.store = BlockStore(fetcher, memory, disk, disk_writer=disk_writer, stats=stats)
        self.fetcher = fetcher
        self.memory = memory
        self.disk = disk
        self.disk_writer = disk_writer
        self.whole_fetch_limit = whole_fetch_limit
        self.block_size = block_size
        self.max_readahead = max_readahead
        self.stats = stats
        self._sizes: LRU[str, int] = LRU(self.MAX_SIZES)
        # Readahead across keys that read one target in order (small ranges only: larger
        # ones have block readahead of their own).
        self.readahead = TargetReadahead(
            fetcher, stats, capacity=min(max(2 * max_readahead, 16 * 2**20), memory.capacity),
            max_window=max_readahead, grid=block_size, on_block=self._grid_to_disk,
            links=fetcher.links,
        )
        self.handle_readahead = HandleReadahead(block_size, max_readahead)
        self.grid_readahead = GridReadahead(block_size, max_readahead)
        self.order = OrderDetector()  # keys read for the first time, per target

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work (disk writes, readahead) runs: the daemon's nursery."""
        self.store.attach(nursery)

    # ---- sizes: a range running past the end of its target -------------------------------
    def clipped(self, ref: Ref) -> int | None:
        """The length of a range that runs past the end of its target, once the target's
        size is known (a fetch met its end, or it was measured): the bytes that exist.
        None for any other reference."""
        if ref.kind is not RefKind.RANGE or ref.url is None:
            return None
        size = self._sizes.peek(ref.url)
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
                self._sizes.put(url, e.size)
            if e.data:  # also where reads of the clipped range look for it
                self.memory.put(BlockKey(url, start, len(e.data)), e.data)
            return e.data

    async def settle(self, ref: Ref) -> int | None:
        """Whether a range runs past the end of its target, found out before its first
        read: the bytes that exist, or None (``clipped``). A range up to
        ``whole_fetch_limit`` is read (its first read, early: the bytes stay in memory for
        the reads that follow), which tells the target's size if it ends inside the range.
        For a larger one, read in blocks and often not from its start, the target's size is
        asked for, once per target."""
        if ref.kind is not RefKind.RANGE or ref.url is None or ref.length <= 0:
            return None
        if ref.url not in self._sizes:
            if ref.length <= self.whole_fetch_limit:
                await self.read(ref, 0, 1)
            else:
                self._sizes.put(ref.url, await self.fetcher.size(ref.url))
        return self.clipped(ref)

    async def size(self, ref: Ref) -> int:
        if ref.kind is not RefKind.WHOLE or ref.length >= 0:
            clipped = self.clipped(ref)
            return ref.length if clipped is None else clipped
        assert ref.url is not None
        size = self._sizes.peek(ref.url)
        if size is None:
            size = await self.fetcher.size(ref.url)
            self._sizes.put(ref.url, size)
        return max(size - ref.offset, 0)  # a Parquet row without a size: offset to the end

    # ---- reads ---------------------------------------------------------------------------
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
            # A memory hit (most reads) is one dict lookup: a plain tuple of the fields is
            # the same key as the BlockKey, which is made only when the block is not there.
            cached = self.memory.get((url, start, total))
            if cached is not None:
                self.stats.memory_hits += 1
                return memoryview(cached)[off:end]
            key = BlockKey(url, start, total)
            store = self.store
            if not store.loading(key):
                in_order = self.order.follows(url, start, start + total) if off == 0 else False
                found = await self.readahead.lookup(url, start, start + total)
                if found is not None:
                    if off == 0:  # first read of this key
                        self._prefetch_hit(key, *found)
                    return found[0][off:end]
                # Grid blocks from disk only for a key not cached by itself, and only while
                # keys come in target order (or for keys of a quarter block or more):
                # loading a whole block for one small key read at random is many times the
                # disk traffic of the key (scripts/soak.py: a third fewer reads per second).
                if not store.may_be_on_disk(key):
                    piece = await self._from_grid(
                        url, start, start + total, from_disk=in_order or 4 * total >= self.block_size
                    )
                    if piece is not None:
                        return piece[off:end]

            def fetch_whole() -> Awaitable[bytes]:
                self.readahead.note(url, start, start + total, store.background, miss=True)
                return self._cat(url, start, start + total)

            data = await store.load(key, fetch_whole)
            return memoryview(data)[off:end]
        return await self._read_blocks(url, ref.offset, total, off, end, state)

    def _prefetch_hit(self, key: BlockKey, data: Block, in_grid_blocks: bool) -> None:
        """A key served from a prefetched stretch for the first time."""
        url, start, length = key
        self.stats.prefetch_hits += 1
        if not in_grid_blocks:  # keep it on disk like any fetch
            self.store.to_disk(key, data)
        self.readahead.note(url, start, start + length, self.store.background, miss=False)

    def ready_whole(self, ref: Ref) -> Block | None:
        """All bytes of a chunk (a range reference up to ``PUSH_LIMIT``) read ahead of a
        reader going through its target in order, if memory has them right now (no I/O, no
        waiting), counted as its first read: for storing in the page cache at open. Chunks
        met at random are left to their READs: such readers often read part of a file, and
        a store is a copy of all of it, on the FUSE thread."""
        if ref.kind is not RefKind.RANGE or ref.url is None or not 0 < ref.length <= self.PUSH_LIMIT:
            return None
        url, start, end = ref.url, ref.offset, ref.offset + ref.length
        self.order.follows(url, start, end)  # a first read, pushed or not: keep the order detector current
        if self.memory.get((url, start, ref.length)) is not None:  # the BlockKey's fields
            return None
        found = self.readahead.peek(url, start, end)
        if found is not None:
            self._prefetch_hit(BlockKey(url, start, ref.length), *found)
            return found[0]
        if not self.grid_readahead.in_order(url, start // self.block_size):
            return None  # not in order through grid blocks
        blocks = self._grid_in_memory(url, start, end)
        if blocks is None:
            return None
        self.stats.memory_hits += 1
        return self._grid_piece(url, blocks, start, end)

    # ---- blocks of large ranges and whole targets ---------------------------------------
    def _block(self, url: str, base: int, total: int, b: int) -> BlockKey:
        start = base + b * self.block_size
        return BlockKey(url, start, min(self.block_size, total - b * self.block_size))

    def _fetch(self, key: BlockKey) -> Fetch:
        return lambda: self._cat(key.url, key.start, key.start + key.length)

    async def _read_blocks(
        self, url: str, base: int, total: int, off: int, end: int, state: ReadState | None
    ) -> bytes | memoryview:
        bs = self.block_size
        first, last = off // bs, (end - 1) // bs
        parts: dict[int, Block] = {}
        store = self.store
        if state is not None:
            ahead = self.handle_readahead.advance(state, off, end, total)
            if ahead and store.background is not None:
                for b in ahead:
                    key = self._block(url, base, total, b)
                    if not store.busy(key):
                        store.prefetch(key, self._fetch(key))

        errors: list[Exception] = []

        async def get(b: int) -> None:
            key = self._block(url, base, total, b)
            try:
                parts[b] = await store.load(key, self._fetch(key))
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

    # ---- grid blocks: readahead stretches on disk -------------------------------------
    def _grid_to_disk(self, url: str, start: int, data: memoryview) -> None:
        self.store.grid_to_disk(url, start, data, self.block_size)

    async def _from_grid(
        self, url: str, start: int, end: int, *, from_disk: bool = True
    ) -> memoryview | None:
        """Bytes [start, end) of ``url`` from grid blocks in memory or on disk, if every
        block they need is there; the disk is then read ahead while keys follow in order."""
        bs = self.block_size
        store = self.store
        first, last = start // bs, (end - 1) // bs
        blocks: list[Block] = []
        for k in range(first, last + 1):
            gkey = BlockKey(url, k * bs, bs)
            data = self.memory.get(gkey)
            if data is not None:
                self.stats.memory_hits += 1
            else:
                if not store.loading(gkey) and (not from_disk or not store.may_be_on_disk(gkey)):
                    return None  # not there: no thread hop
                data = await store.load(gkey, None, upto=True)
                if data is None:
                    return None
            blocks.append(data)
        return self._grid_piece(url, blocks, start, end)

    def _grid_in_memory(self, url: str, start: int, end: int) -> list[Block] | None:
        bs = self.block_size
        blocks = []
        for k in range(start // bs, (end - 1) // bs + 1):
            data = self.memory.get(BlockKey(url, k * bs, bs))
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
        loader = self.store if self.store.background is not None and self.disk is not None else None
        self.grid_readahead.served(url, last, loader)
        skip = start - first * bs
        if first == last:
            return memoryview(blocks[0])[skip : skip + end - start]
        return memoryview(b"".join(blocks))[skip : skip + end - start]
