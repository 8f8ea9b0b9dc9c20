"""Readers of slabs of one target, as Dask workers reading an array with zarr, for the unit tier
(no FUSE, no server): a target behind a link with a latency and a bandwidth that all requests
share (``Link``), and ``read_slabs``: workers each going through their own slab of its keys
in order, each keeping several keys asked at once (zarr asks for up to ten chunks at a time;
over a mount, its thread pool reads six files at once), through ``RefReader`` under trio's
virtual clock. It counts the demand misses and where in its slab each one fell."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
import trio.testing

from refmount.base.stats import Stats
from refmount.cache.blocks import MemoryLRU
from refmount.core.reader import RefReader
from refmount.refs import Ref, RefKind
from refmount.targets.inflight import LinkEstimates
from support.fakes import URL, NoPolicy

KiB, MiB = 2**10, 2**20


class Link:
    """A target of ``size`` zero bytes: each request waits ``latency``, then its bytes come
    in pieces over one wire of ``bandwidth`` bytes/s that every request shares (as one
    server's link, or one machine's cores, bound them together). Readahead's requests are
    streamed piece by piece; demand fetches (``cat_range``) are recorded by start. Counts
    the bytes readahead asked for that have not been delivered, and the most at once."""

    def __init__(self, size: int, latency: float, bandwidth: float, piece: int = 256 * KiB) -> None:
        self.size_, self.latency, self.bandwidth, self.piece = size, latency, bandwidth, piece
        self.demand: list[int] = []
        self.ahead: list[tuple[int, int]] = []
        self.undelivered = self.most_undelivered = 0
        self.links = LinkEstimates()
        self.policy = NoPolicy()
        self._wire: trio.Lock | None = None

    async def _send(self, n: int) -> None:
        if self._wire is None:
            self._wire = trio.Lock()  # fair: pieces of concurrent requests take turns
        async with self._wire:
            await trio.sleep(n / self.bandwidth)

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        self.demand.append(start)
        await trio.sleep(self.latency)
        end = min(end, self.size_)
        at = start
        while at < end:
            n = min(self.piece, end - at)
            await self._send(n)
            at += n
        return bytes(end - start)

    async def stream_range(self, url: str, start: int, end: int, sink: Callable[[int, bytes], None]) -> int:
        self.ahead.append((start, end))
        end = min(end, self.size_)
        self.undelivered += end - start
        self.most_undelivered = max(self.most_undelivered, self.undelivered)
        at = start
        try:
            await trio.sleep(self.latency)
            while at < end:
                n = min(self.piece, end - at)
                await self._send(n)
                self.undelivered -= n
                sink(at - start, bytes(n))
                at += n
        finally:
            self.undelivered -= end - at
        return end - start

    async def size(self, url: str) -> int:
        return self.size_

    def problem(self, url: str, *, resolve: bool) -> str | None:
        return None


@dataclass
class SlabRun:
    """What ``read_slabs`` saw: the demand misses (all, and by position in a slab), the
    streams that read ahead, the readahead's bounds and the most it held, had in flight
    (``most_inflight``) and had in flight ahead of where the readers asked (``most_ahead``)."""

    keys: int
    misses: int
    by_position: dict[int, int]
    streams: int
    reader: RefReader
    link: Link
    most_held: int = 0
    most_inflight: int = 0
    most_ahead: int = 0
    seconds: float = 0.0
    wrong: list[int] = field(default_factory=list)

    @property
    def miss_fraction(self) -> float:
        return self.misses / self.keys


def read_slabs(workers: int, per: int, size: int, *, latency: float, bandwidth: float = 400e6,
               at_once: int = 6, work_per_byte: float = 2e-9, max_readahead: int = 64 * MiB,
               spread: float = 0.005, seed: int = 0) -> SlabRun:
    """``workers`` readers, worker ``w`` going through keys ``w * per`` to ``(w + 1) * per``
    (``size`` bytes each) of one target in order, ``at_once`` keys asked at a time (the next
    one as soon as one is in), each key followed by the reader's own work on it
    (``work_per_byte``); the workers start within ``spread`` seconds of each other."""
    rng = random.Random(seed)
    link = Link(workers * per * size, latency, bandwidth)
    reader = RefReader(link, MemoryLRU(512 * MiB), None, whole_fetch_limit=32 * MiB,  # type: ignore[arg-type]
                       block_size=4 * MiB, max_readahead=max_readahead, stats=Stats())
    ra = reader.target_readahead
    ra.clock = trio.current_time  # which streams read ahead "now": virtual time, not the machine's
    result = SlabRun(workers * per, 0, {}, 0, reader, link)

    async def worker(w: int) -> None:
        await trio.sleep(rng.random() * spread)
        todo = iter(range(w * per, (w + 1) * per))

        async def one(i: int | None, arrives: float) -> None:
            # Each of the first keys is a request of its own, handled by a task of its own
            # (as the daemon handles each FUSE or HTTP request); trio runs a batch of new
            # tasks in either order, so they reach the reader in key order or last first.
            # Which, is decided here (``seed``), each one a microsecond after the other:
            # trio's own order is shuffled under Hypothesis, which other tests load.
            await trio.sleep(arrives)
            while i is not None:
                got = await reader.read(Ref(RefKind.RANGE, URL, i * size, size), 0, size)
                if len(got) != size:
                    result.wrong.append(i)
                result.most_held = max(result.most_held, ra.prefetched_bytes)
                result.most_inflight = max(result.most_inflight, ra.inflight_bytes)
                result.most_ahead = max(result.most_ahead, ra.ahead_inflight_bytes)
                await trio.sleep(size * work_per_byte)
                i = next(todo, None)

        first = [next(todo, None) for _ in range(at_once)]
        if rng.random() < 0.5:
            first.reverse()
        async with trio.open_nursery() as keys:
            for n, i in enumerate(first):
                keys.start_soon(one, i, n * 1e-6)

    async def main() -> None:
        async with trio.open_nursery() as background:
            reader.attach(background)
            t0 = trio.current_time()
            async with trio.open_nursery() as ws:
                for w in range(workers):
                    ws.start_soon(worker, w)
            result.seconds = trio.current_time() - t0
            background.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    result.misses = reader.stats.misses
    result.streams = reader.stats.readahead_streams
    for start in link.demand:
        position = (start // size) % per
        result.by_position[position] = result.by_position.get(position, 0) + 1
    return result
