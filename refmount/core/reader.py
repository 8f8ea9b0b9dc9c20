"""Serving FUSE reads of a reference: a map from a reference and an offset to blocks.

Strategy (Zarr readers read whole chunks, the kernel asks in ≤1 MiB pieces):
* inline references are sliced from the index;
* a range reference up to ``whole_fetch_limit`` is one block, fetched whole on its first
  read; later reads are served from memory;
* larger ranges and whole-file targets are read in aligned blocks of ``block_size``, with
  the per-handle readahead of ``readahead.HandleReadahead``;
* keys read in target order are prefetched across keys (``TargetReadahead``); the
  prefetched stretches go to the disk cache as grid blocks, from which later readers are
  served (``gridblocks.GridBlocks``).
Every block is loaded by the ``BlockStore`` (memory, disk, fetch, single-flight); what is
known of target sizes is ``TargetSizes``'s. This module only says which blocks a read
needs and tells the readahead policies about it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from refmount.base.lru import LRU
from refmount.base.stats import Stats
from refmount.cache.blocks import Block, DiskCache, MemoryLRU
from refmount.cache.writer import CacheWriter
from refmount.core.blockstore import BlockKey, BlockStore, block_of
from refmount.core.gridblocks import GridBlocks
from refmount.core.readahead import HandleReadahead, OpenFile, OrderDetector, ReadState
from refmount.core.targetreadahead import AcrossKeys, TargetRead, TargetReadahead
from refmount.core.targetsizes import TargetSizes
from refmount.refs import Ref, RefKind
from refmount.targets.fetch import Fetcher

__all__ = ["BlockKey", "ReadState", "RefReader"]


class RefReader:
    PUSH_LIMIT = 2**20
    OBJECTS_AHEAD = 8192

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
        self.whole_fetch_limit = whole_fetch_limit
        self.block_size = block_size
        self.stats = stats
        self.sizes = TargetSizes(fetcher, memory, whole_fetch_limit=whole_fetch_limit)
        self.store = BlockStore(fetcher, memory, disk, disk_writer=disk_writer, stats=stats,
                                cat=self.sizes.cat)
        self.grid = GridBlocks(self.store, block_size, max_readahead)
        # Readahead across keys that read one target in order (small ranges only: larger
        # ones have block readahead of their own).
        self.target_readahead = TargetReadahead(
            fetcher, stats, capacity=min(max(2 * max_readahead, 16 * 2**20), memory.capacity),
            max_window=max_readahead, grid=block_size,
            on_block=self.grid.to_disk if disk_writer is not None else None,
            links=fetcher.links,
        )
        self.across_keys = AcrossKeys(self.target_readahead)
        self.handle_readahead = HandleReadahead(block_size, max_readahead)
        self.order = OrderDetector()  # keys read for the first time, per target
        # Objects loaded whole ahead of a reader going through them in key order (an Icechunk
        # repository's native chunks: ``core/objectreadahead.py``), until their open
        # (``ready_whole``) or until forgotten.
        self.objects_ahead: LRU[BlockKey, bool] = LRU(self.OBJECTS_AHEAD)

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background work (disk writes, readahead) runs: the daemon's nursery."""
        self.store.attach(nursery)

    # ---- sizes (TargetSizes) -------------------------------------------------------------
    def clipped(self, ref: Ref) -> int | None:
        return self.sizes.clipped(ref)

    async def settle(self, ref: Ref) -> int | None:
        return await self.sizes.settle(ref, lambda: self.read(ref, 0, 1))

    def settled(self, ref: Ref) -> bool:
        """Whether ``settle(ref)`` needs no I/O: nothing to find out, or its first read
        would be a memory hit (then ``clipped`` already tells) or would find all its bytes in
        a stretch that has arrived (then it does not run past the end of its target)."""
        if not self.sizes.needs_settling(ref):
            return True
        if ref.length > self.whole_fetch_limit:
            return False
        key = tuple.__new__(BlockKey, (ref.url, ref.offset, ref.length))
        return self.store.cached(key) is not None or self._from_stretch_now(key, first=False) is not None

    def when_arrived(self, ref: Ref, call: Callable[[], None]) -> bool:
        """For a caller outside trio whose ``settled``/``read_now`` said no: when the key's
        bytes are coming in a stretch read ahead (not loaded on their own), ``call()`` once
        they are there, and True; False when waiting would not help (ask trio)."""
        if ref.kind is not RefKind.RANGE or ref.url is None or not 0 < ref.length <= self.whole_fetch_limit:
            return False
        key = tuple.__new__(BlockKey, (ref.url, ref.offset, ref.length))
        if self.store.loading(key):
            return False
        return self.target_readahead.when_arrived(ref.url, ref.offset, ref.offset + ref.length, call,
                                                  self.store.background)

    async def size(self, ref: Ref) -> int:
        return await self.sizes.length(ref)

    # ---- reads ---------------------------------------------------------------------------
    async def read(
        self, ref: Ref, off: int, size: int, state: ReadState | None = None
    ) -> bytes | memoryview:
        """Bytes [off, off+size) of the reference. A view into a cached piece where one
        piece covers the request: the FUSE reply copies from it, so we do not copy first."""
        now = self.read_now(ref, off, size)
        if now is not None:
            return now
        assert ref.url is not None
        url = ref.url
        total = self.sizes.known_length(ref)
        if total is None:
            total = await self.sizes.length(ref)
        end = min(off + size, total)
        if off >= end:
            return b""
        if ref.kind is not RefKind.RANGE or total > self.whole_fetch_limit:
            return await self._read_blocks(url, ref.offset, total, off, end, state)
        start = ref.offset
        key = tuple.__new__(BlockKey, (url, start, total))
        store = self.store
        if not store.loading(key):
            in_order = self.order.follows(url, start, start + total) if off == 0 else False
            found = await self.target_readahead.lookup(url, start, start + total, store.background)
            if found is not None:
                if off == 0:  # first read of this key
                    self._prefetch_hit(key, *found)
                return found[0][off:end]
            # Grid blocks from disk only for a key not cached by itself, and only while
            # keys come in target order (or for keys of a quarter block or more):
            # loading a whole block for one small key read at random is many times the
            # disk traffic of the key (bench/diagnostics/soak.py: a third fewer reads per second).
            if not store.may_be_on_disk(key):
                piece = await self.grid.read(
                    url, start, start + total, from_disk=in_order or 4 * total >= self.block_size
                )
                if piece is not None:
                    return piece[off:end]

        def fetch_whole() -> Awaitable[bytes]:
            self.across_keys.note(TargetRead(url, True), start, start + total, store.loader)
            return self.sizes.cat(url, start, start + total)

        data = await store.load(key, fetch_whole)
        return memoryview(data)[off:end]

    def read_now(self, ref: Ref, off: int, size: int) -> bytes | memoryview | None:
        """What ``read`` answers without I/O or waiting, None when it must load: inline
        bytes, and a range up to ``whole_fetch_limit`` whose block is in memory (most
        reads; a view into it, no copy) or inside a stretch read ahead that has arrived.
        Callable outside trio (the HTTP front end answers such requests on the asyncio
        loop; loads ahead it starts go through ``Background``)."""
        if ref.kind is RefKind.INLINE:
            assert ref.data is not None
            return ref.data[off : off + size]
        total = self.sizes.known_length(ref)
        if total is None or ref.kind is not RefKind.RANGE or total > self.whole_fetch_limit:
            return None
        end = min(off + size, total)
        if off >= end:
            return b""
        # A memory hit is one dict lookup; the key is made without the Python-level
        # __new__ a NamedTuple has (the same BlockKey, for half the time).
        key = tuple.__new__(BlockKey, (ref.url, ref.offset, total))
        cached = self.store.cached(key)
        if cached is not None:
            self.stats.memory_hits += 1
        else:
            cached = self._from_stretch_now(key, first=off == 0)
            if cached is None:
                return None
        return memoryview(cached)[off:end]

    def _from_stretch_now(self, key: BlockKey, *, first: bool) -> Block | None:
        """The key's bytes if a stretch read ahead has them (arrived: no waiting), a view
        as in ``read`` (copying each key out of its stretch added measurable CPU to every
        cold read); a read from offset 0 is counted as the key's first, as there."""
        if self.store.loading(key):
            return None  # its own fetch is in flight: wait for that one (``read``)
        url, start, length = key
        found = self.target_readahead.peek(url, start, start + length)
        if found is None:
            return None
        if first:
            self.order.follows(url, start, start + length)
            self._prefetch_hit(key, *found)
        return found[0]

    def _prefetch_hit(self, key: BlockKey, data: Block, in_grid_blocks: bool) -> None:
        """A key served from a prefetched stretch for the first time."""
        url, start, length = key
        self.stats.prefetch_hits += 1
        if not in_grid_blocks:  # keep it on disk like any fetch
            self.store.to_disk(key, data)
        self.across_keys.note(TargetRead(url, False), start, start + length, self.store.loader)

    def ready_whole(self, ref: Ref) -> Block | None:
        """All bytes of a chunk (a range reference up to ``PUSH_LIMIT``) read ahead of a
        reader going through its target in order, if memory has them right now (no I/O, no
        waiting), counted as its first read: for storing in the page cache at open. Chunks
        met at random are left to their READs: such readers often read part of a file, and
        a store is a copy of all of it, on the FUSE thread. Objects read ahead whole in key
        order (``objects_ahead``) are pushed from memory the same way."""
        if ref.kind is not RefKind.RANGE or ref.url is None or not 0 < ref.length <= self.PUSH_LIMIT:
            return None
        url, start, end = ref.url, ref.offset, ref.offset + ref.length
        self.order.follows(url, start, end)  # a first read, pushed or not: keep the order detector current
        key = BlockKey(url, start, ref.length)
        cached = self.store.cached(key)
        if cached is not None:
            if self.objects_ahead.pop(key) is None:
                return None
            self.stats.prefetch_hits += 1  # an object read ahead of its reader (``ObjectReadahead``)
            return cached
        found = self.target_readahead.peek(url, start, end)
        if found is not None:
            self._prefetch_hit(key, *found)
            return found[0]
        return self.grid.peek(url, start, end)  # in order through grid blocks in memory

    # ---- blocks of large ranges and whole targets ---------------------------------------
    async def _read_blocks(
        self, url: str, base: int, total: int, off: int, end: int, state: ReadState | None
    ) -> bytes | memoryview:
        bs = self.block_size
        first, last = off // bs, (end - 1) // bs
        store = self.store
        if state is not None:
            self.handle_readahead.note(OpenFile(state, url, base, total), off, end, store.loader)
        skip = off - first * bs
        if first == last:
            key = block_of(url, base, total, bs, first)
            data: Block = await store.load(key, store.fetch_of(key))
        else:
            data = b"".join(await store.load_all([block_of(url, base, total, bs, b)
                                                  for b in range(first, last + 1)]))
        return memoryview(data)[skip : skip + (end - off)]
