"""The read path of decoded chunks (``-o decode``): ``ChunkDecoder``.

Stored bytes come from the ``RefReader`` (memory, disk, fetch, readahead across keys);
decoding runs in bounded worker threads (``WorkerPool``, bounded by decoded bytes in flight),
or for codecs off the allow-list in codec worker processes (``decode/codecworker.py``); results go
to the memory cache, shared by concurrent readers of a chunk; while a reader goes through an
array's chunks in order, the next ones are decoded ahead.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from refmount.base.lru import LRU
from refmount.base.singleflight import SingleFlight
from refmount.base.workers import WorkerPool
from refmount.cache.blocks import Block, MemoryLRU
from refmount.decode.codecplan import DecodedArray, DecodeError
from refmount.decode.codecworker import CodecWorkers, WorkerDied, WorkerError
from refmount.decode.sharding import ShardError, ShardIndexes
from refmount.decode.v3tree import MISSING_CHUNK
from refmount.decode.v3view import V3Array
from refmount.decode.view import DecodedView
from refmount.refs import Ref

log = logging.getLogger(__name__)


class _ByteBudget:
    """Decoded bytes in flight, bounded: a chunk waits until its bytes fit (one chunk larger
    than the whole budget goes alone)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = trio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._changed:
            while self.used and self.used + n > self.limit:
                await self._changed.wait()
            self.used += n

    async def release(self, n: int) -> None:
        async with self._changed:
            self.used -= n
            self._changed.notify_all()


@dataclass(frozen=True, slots=True)
class DecodedKey:
    """A decoded chunk in the memory cache (distinct from the reader's stored-byte keys)."""

    key: str


class ChunkDecoder:
    """Decoded chunks for the FUSE read path.

    ``read_stored(ref)`` gives a chunk's stored bytes (the ``RefReader``: memory, disk,
    fetch, readahead across keys). Decoding runs in ``threads`` worker threads of its own
    (``WorkerPool``: each takes the next chunk as soon as it is done with one), with at most
    ``max_bytes`` decoded bytes in flight; results go to ``memory`` (the
    mount's memory cache) and are shared by concurrent readers of the same chunk. While a
    reader goes through an array's chunks in order, the next chunks are decoded ahead.
    """

    def __init__(
        self,
        view: DecodedView,
        memory: MemoryLRU,
        read_stored: Callable[[Ref], Any],
        *,
        resolve: Callable[[str], Any] | None = None,
        threads: int | None = None,
        max_bytes: int = 128 * 2**20,
        ahead: int = 8,
        on_error: Callable[[], None] | None = None,
        stats: Any = None,
        workers: CodecWorkers | None = None,
        shards: ShardIndexes | None = None,
    ) -> None:
        self.view = view
        self.memory = memory
        self.read_stored = read_stored
        self.resolve = resolve
        self.pool = WorkerPool(threads or max(1, os.cpu_count() or 1), "refmount-decode")
        self.budget = _ByteBudget(max_bytes)
        self.ahead = ahead
        self.on_error = on_error
        self.stats = stats  # a Stats: its decoded / decoded_ahead counters
        self.workers = workers  # codec worker processes, for arrays with codecs off the allow-list
        self.shards = shards  # shard indexes of sharded Zarr v3 arrays (decode/sharding.py)
        self.decoded = 0  # chunks decoded
        self.decoded_ahead = 0  # of those, decoded ahead of a reader
        self._flights: SingleFlight[str, Block] = SingleFlight()
        self._last: LRU[str, int] = LRU(10_000)  # array path -> chunk number last read for the first time
        self._background: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._background = nursery

    def close(self) -> None:
        """Stop the worker threads (chunks not being decoded are dropped) and the codec
        worker processes."""
        self.pool.close()
        if self.workers is not None:
            self.workers.close()

    def ready(self, key: str) -> Block | None:
        """The decoded chunk if memory has it right now (for the page-cache push at open)."""
        return self.memory.get(DecodedKey(key))

    async def read(self, key: str, array: DecodedArray, ref: Ref, off: int, size: int) -> Block:
        data = self.memory.get(DecodedKey(key))
        if data is None:
            data = await self.chunk(key, array, ref)
        if off == 0:  # a reader starting on a chunk (decoded ahead or not)
            self._maybe_ahead(key, array)
        return memoryview(data)[off : off + size]

    async def chunk(self, key: str, array: DecodedArray, ref: Ref, *, ahead: bool = False) -> Block:
        """The decoded bytes of chunk ``key`` (memory, else a decode shared by all asking;
        ``ahead``: for no reader yet)."""
        mkey = DecodedKey(key)
        data = self.memory.get(mkey)
        if data is not None:
            return data
        return await self._flights.run(key, lambda: self._decode(key, array, ref, ahead))

    async def _decode(self, key: str, array: DecodedArray, ref: Ref, ahead: bool) -> Block:
        began = trio.current_time()
        ran: list[float] = []  # when a worker thread took the chunk, and how long it took

        def decode() -> memoryview:
            start = time.perf_counter()
            try:
                return array.decode(stored) if not array.isolated else isolated()
            finally:
                ran[:] = [start, time.perf_counter() - start]

        def isolated() -> memoryview:  # codecs off the allow-list: in a codec worker process
            assert array.chain is not None
            if self.workers is None:
                raise DecodeError(f"{'+'.join(array.codecs)}: codecs outside the allow-list "
                                  "need a codec worker, and this decoder has none")
            try:
                out = self.workers.decode(array.chain.spec(), stored, array.chain.nbytes)
            except (WorkerDied, WorkerError) as e:
                raise DecodeError(str(e)) from None
            if len(out) != array.chain.nbytes:
                raise DecodeError(f"the codec worker gave {len(out)} bytes, expected {array.chain.nbytes}")
            return array.cut_chunk(out)

        try:
            t0 = time.perf_counter()
            stored = await self._stored(key, array, ref)
            got = time.perf_counter()
            if stored is None:  # a v3 chunk not stored, or an inner chunk its shard does not hold
                assert isinstance(array, V3Array)
                data = array.fill_chunk()
            else:
                await self.budget.acquire(array.nbytes)
                try:
                    data = await self.pool.run(decode)
                finally:
                    await self.budget.release(array.nbytes)
        except DecodeError as e:
            if self.on_error is not None:
                self.on_error()
            log.error("decode failed: key=%s codecs=%s: %s", key, "+".join(array.codecs) or "none", e)
            e.logged = True
            raise
        if log.isEnabledFor(logging.DEBUG) and ran:
            log.debug("decode %s: began %.6f, stored bytes in %.6f s, waited %.6f s for a thread, "
                      "decoded in %.6f s%s", key, began, got - t0, ran[0] - got, ran[1],
                      " (ahead)" if ahead else "")
        self.decoded += 1
        self.decoded_ahead += ahead
        if self.stats is not None:
            self.stats.decoded += 1
            self.stats.decoded_ahead += ahead
        self.memory.put(DecodedKey(key), data)
        return data

    async def _stored(self, key: str, array: DecodedArray, ref: Ref) -> Any:
        """The stored bytes of a chunk: its reference's, or for a sharded v3 array its inner
        chunk's range of the shard (None: the shard does not hold it)."""
        if ref is MISSING_CHUNK:  # a v3 chunk or shard not stored: the fill value
            return None
        if not isinstance(array, V3Array) or array.shard is None:
            return await self.read_stored(ref)
        if self.shards is None:
            raise DecodeError("a sharded array needs shard indexes, and this decoder has none")
        idx = array.index_of(array.chunk_rel(key))
        if idx is None:
            raise DecodeError(f"{key} is not a chunk of the array")
        _shard, number = array.stored_location(idx)
        assert number is not None
        try:
            return await self.shards.inner(ref, array.shard, number, array.stored_bound)
        except ShardError as e:
            raise DecodeError(str(e)) from None

    # ---- decoding ahead ---------------------------------------------------------------------
    def _maybe_ahead(self, key: str, array: DecodedArray) -> None:
        """A reader starts on a chunk: if it is near the furthest one started in its array (a
        reader going through the array in C order, possibly several chunks at once, as zarr
        does), decode the ``ahead`` chunks after the furthest in the background."""
        if self._background is None or self.resolve is None or self.ahead <= 0:
            return
        coords = array.coords(key)
        if coords is None:
            return
        number, grid = coords
        last = self._last.get(array.path)
        in_order = last is not None and -2 * self.ahead <= number - last <= 2 * self.ahead
        front = max(number, last) if in_order and last is not None else number
        self._last.put(array.path, front)
        if not in_order or number == last:
            return
        base = key[: len(key) - len(array.chunk_rel(key))]
        for n in range(front + 1, front + 1 + self.ahead):
            if n >= math.prod(grid):
                break
            nxt = base + array.chunk_name(n, grid)
            if nxt in self._flights or self.memory.get(DecodedKey(nxt)) is not None:
                continue
            self._background.start_soon(self._ahead, nxt, array)

    async def _ahead(self, key: str, array: DecodedArray) -> None:
        try:
            assert self.resolve is not None
            found = await self.resolve(key)
            if found is None:
                return
            await self.chunk(key, array, found[1], ahead=True)
        except Exception as e:  # the reader will see (and log) the error if it gets there
            log.debug("decoding ahead %s failed: %s", key, e)
