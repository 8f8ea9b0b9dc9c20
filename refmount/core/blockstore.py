"""``BlockStore``: the one place a block of a target is loaded — memory, disk, fetch.

A block is named by a ``BlockKey`` (target URL, first byte, length). ``load`` looks in the
memory cache, else joins a load of the same block in flight (single-flight: concurrent
readers of the same bytes share one disk read or fetch), else reads the disk cache — only
when its presence filter says the block may be there, so a certain miss costs no thread
hop — else fetches. Fetched blocks go to the memory cache at once and to the disk cache in
the background (the cache writer process), never on the reader's path.

A fetch that timed out is remembered for ``TIMEOUT_MEMORY`` seconds: the kernel re-reads a
page that failed at once, and that read then fails at once instead of waiting a second full
timeout. Other failures are cheap to retry and are not remembered (a target that recovers
is read again right away).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple, overload

import trio

from refmount.base.background import Background
from refmount.base.errors import FetchError
from refmount.base.lru import LRU
from refmount.base.singleflight import SingleFlight
from refmount.base.stats import Stats
from refmount.cache.blocks import Block, DiskCache, MemoryLRU
from refmount.cache.writer import CacheWriter
from refmount.targets.fetch import Fetcher

log = logging.getLogger(__name__)

Fetch = Callable[[], Awaitable[bytes]]
Cat = Callable[[str, int, int], Awaitable[bytes]]  # bytes [start, end) of a target


class BlockKey(NamedTuple):
    """Bytes [start, start + length) of the target ``url``: a cached piece's name in memory
    and on disk. (A tuple: a memory hit is one dict lookup.)"""

    url: str
    start: int
    length: int


def block_of(url: str, base: int, total: int, block_size: int, b: int) -> BlockKey:
    """Block ``b`` of the ``total`` bytes of ``url`` from ``base``, cut into ``block_size``
    blocks from ``base`` (the last one may be shorter)."""
    return BlockKey(url, base + b * block_size, min(block_size, total - b * block_size))


class BlockStore:
    TIMEOUT_MEMORY = 2.0
    MAX_FAILURES = 10_000  # timed-out blocks remembered at once

    def __init__(
        self,
        fetcher: Fetcher,
        memory: MemoryLRU,
        disk: DiskCache | None,
        *,
        disk_writer: CacheWriter | None = None,
        stats: Stats,
        cat: Cat | None = None,
    ) -> None:
        self.fetcher = fetcher
        self._cat: Cat = cat if cat is not None else fetcher.cat_range
        self.memory = memory
        self.disk = disk
        self.disk_writer = disk_writer
        self.stats = stats
        self._flights: SingleFlight[BlockKey, Block | None] = SingleFlight()
        self._failed: LRU[BlockKey, tuple[float, BaseException]] = LRU(self.MAX_FAILURES)
        self._disk_threads = trio.CapacityLimiter(8)
        self._background: Background | None = None
        # The block if memory has it (refreshed as recently used; no stats counted): the
        # memory cache's own lookup, with no call around it (a memory hit is the hot path).
        self.cached: Callable[[BlockKey], Block | None] = memory.get

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background loads run: the daemon's nursery (started from trio or from the
        host loop: ``Background``)."""
        self._background = Background(nursery)

    @property
    def background(self) -> Background | None:
        return self._background

    @property
    def loader(self) -> BlockStore | None:
        """The store as the readahead policies' ``Loader``, once background loads can run
        (attached to a nursery); None before."""
        return self if self._background is not None else None

    def fetch_of(self, key: BlockKey) -> Fetch:
        """How to fetch the block from its target (with the ``cat`` the store was given)."""
        return lambda: self._cat(key.url, key.start, key.start + key.length)

    # ---- what is where, without I/O ------------------------------------------------------
    def busy(self, key: BlockKey) -> bool:
        """Whether the block is in memory or being loaded."""
        return key in self._flights or self.memory.get(key) is not None

    def loading(self, key: BlockKey) -> bool:
        return key in self._flights

    def may_be_on_disk(self, key: BlockKey) -> bool:
        """False only when the disk cache certainly has no such block (no I/O)."""
        return self.disk is not None and self.disk.may_contain(key.url, key.start, key.length)

    # ---- loads ---------------------------------------------------------------------------
    @overload
    async def load(self, key: BlockKey, fetch: Fetch) -> Block: ...
    @overload
    async def load(self, key: BlockKey, fetch: None, *, upto: bool) -> Block | None: ...

    async def load(self, key: BlockKey, fetch: Fetch | None, *, upto: bool = False) -> Block | None:
        """Memory, else join a load of the same block in flight, else disk, else ``fetch()``.
        Without ``fetch``: the block from memory or disk, or None. With ``upto`` a block on
        disk may be shorter than ``key.length`` (it ends at the end of its target)."""
        while True:
            cached = self.memory.get(key)
            if cached is not None:
                self.stats.memory_hits += 1
                return cached
            data = await self._flights.run(key, lambda: self._load(key, fetch, upto))
            if data is not None or fetch is None:
                return data
            # We joined a disk-only load that found nothing: load (and fetch) ourselves.

    async def load_all(self, keys: list[BlockKey]) -> list[Block]:
        """The blocks, loaded at once (each as ``load`` with ``fetch_of``); a failure is
        raised as itself, not as an ExceptionGroup."""
        parts: list[Block] = [b""] * len(keys)
        errors: list[Exception] = []

        async def get(i: int, key: BlockKey) -> None:
            try:
                parts[i] = await self.load(key, self.fetch_of(key))
            except Exception as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for i, key in enumerate(keys):
                nursery.start_soon(get, i, key)
        if errors:
            raise errors[0]
        return parts

    async def _load(self, key: BlockKey, fetch: Fetch | None, upto: bool) -> Block | None:
        failed = self._failed.peek(key)
        if failed is not None:
            if failed[0] > trio.current_time():
                raise failed[1]
            self._failed.pop(key)
        data = await self._from_disk(key, upto)
        if data is not None:
            self.stats.disk_hits += 1
        elif fetch is None:
            return None
        else:
            self.stats.misses += 1
            try:
                data = await fetch()
            except FetchError as e:
                if e.timed_out:
                    self._failed.put(key, (trio.current_time() + self.TIMEOUT_MEMORY, e))
                raise
            self.to_disk(key, data)
        self.memory.put(key, data)
        return data

    def prefetch(self, key: BlockKey, fetch: Fetch | None = None, *, upto: bool = False) -> None:
        """Load a block in the background (from disk only without ``fetch``); a failure is
        left for the reader that gets there to see."""
        if self._background is not None:
            self._background.start_soon(self._prefetch, key, fetch, upto)

    async def _prefetch(self, key: BlockKey, fetch: Fetch | None, upto: bool) -> None:
        try:
            await self.load(key, fetch, upto=upto)  # type: ignore[call-overload]
        except Exception as e:  # the reader will see (and log) the error if it gets there
            log.debug("readahead of %s failed: %s", key, e)

    async def _from_disk(self, key: BlockKey, upto: bool = False) -> Block | None:
        disk = self.disk
        if disk is None:
            return None
        url, start, length = key
        if not disk.may_contain(url, start, length):
            return None  # a certain miss: no thread hop
        problem = self.fetcher.problem

        def lookup() -> Block | None:
            # The read-time policy comes first: a block another mount cached (or this one,
            # before a symlink was swapped in) is never a way around it. A refused target
            # is a miss here, and the fetch then fails with the reason. (The policy applies
            # where the target is read: after the target rules.)
            if problem(url, resolve=True):
                return None
            return disk.get(url, start, length, upto=upto)

        return await trio.to_thread.run_sync(lookup, limiter=self._disk_threads)

    # ---- hand-off to the cache writer ---------------------------------------------------
    def to_disk(self, key: BlockKey, data: Block) -> None:
        """Keep a block on disk (written by the cache writer process, in the background)."""
        if self.disk_writer is not None and len(data):
            self.disk_writer.submit(key.url, key.start, data)

    def grid_to_disk(self, url: str, start: int, data: memoryview, block_size: int) -> None:
        """Keep a grid block on disk under the key (url, start, block_size); the last block
        of a target may be shorter."""
        if self.disk_writer is not None:
            self.disk_writer.submit(url, start, data, key_length=block_size)
