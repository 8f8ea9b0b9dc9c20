"""TargetReadahead (refmount.readahead) without FUSE: a fake target with a fixed latency, trio's MockClock."""

from __future__ import annotations

import random

import trio
import trio.testing

from refmount.readahead import TargetReadahead
from refmount.stats import Stats

MiB = 2**20
URL = "http://example.invalid/data.bin"


class SlowTarget:
    """cat_range after ``latency`` (virtual) seconds; records every request."""

    def __init__(self, size: int, latency: float = 0.02) -> None:
        self.size = size
        self.latency = latency
        self.requests: list[tuple[int, int]] = []  # as asked, clipped to the target
        self.furthest = 0  # the furthest byte a reader has asked for so far
        self.lead = 0  # the most bytes a request ended ahead of that

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        self.requests.append((start, max(start, min(end, self.size))))
        self.lead = max(self.lead, end - self.furthest)
        await trio.sleep(self.latency)
        end = min(end, self.size)
        if start >= end:
            raise ValueError("past the end")
        return bytes(end - start)


def readahead(target: SlowTarget, max_window: int = 64 * MiB) -> TargetReadahead:
    return TargetReadahead(target, Stats(), capacity=2 * max_window, max_window=max_window,  # type: ignore[arg-type]
                           grid=4 * MiB)


async def read_chunks(ra: TargetReadahead, target: SlowTarget, chunks: list[int], chunk: int,
                      readers: int, nursery: trio.Nursery) -> int:
    """``readers`` tasks take chunks in list order (as zarr does, several at once); a chunk
    not covered by a prefetched stretch is fetched on demand. Returns the demand fetches."""
    todo = iter(chunks)
    misses = 0

    async def reader() -> None:
        nonlocal misses
        for i in todo:
            start, end = i * chunk, (i + 1) * chunk
            target.furthest = max(target.furthest, end)
            found = await ra.lookup(URL, start, end)
            if found is None:
                misses += 1
                ra.note(URL, start, end, nursery, miss=True)
                await target.cat_range(URL, start, end)
            else:
                ra.note(URL, start, end, nursery, miss=False)
            await trio.sleep(0.001)  # the reader's own work per chunk

    async with trio.open_nursery() as readers_nursery:
        for _ in range(readers):
            readers_nursery.start_soon(reader)
    return misses


def run(chunk: int, n: int, readers: int, order: list[int] | None = None,
        max_window: int = 64 * MiB) -> tuple[int, SlowTarget, TargetReadahead]:
    target = SlowTarget(n * chunk)
    ra = readahead(target, max_window)
    out: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            out.append(await read_chunks(ra, target, order or list(range(n)), chunk, readers, nursery))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return out[0], target, ra


def test_concurrent_readers_in_key_order_keep_one_run() -> None:
    # zarr reads ~10 chunks at once: ranges arrive ahead of and behind each other. The run
    # must survive that, or every window's end costs a new run of demand fetches.
    for chunk in (64 * 2**10, MiB, 8 * MiB):
        n = 256 * MiB // chunk
        misses, target, _ = run(chunk, n, readers=10)
        assert misses <= 8, (chunk, misses)
        assert sum(e - s for s, e in target.requests) <= 256 * MiB + 24 * chunk


def test_readahead_stays_within_its_window_and_capacity() -> None:
    misses, target, ra = run(MiB, 256, readers=4, max_window=16 * MiB)
    assert misses <= 8
    assert ra.prefetched_bytes <= ra.capacity
    # requests never reach further ahead of the readers than the window (+ one request's
    # rounding to the grid)
    assert target.lead <= 16 * MiB + ra.REQUEST_LIMIT, target.lead


def test_a_random_reader_starts_no_readahead() -> None:
    order = list(range(1024))
    random.Random(3).shuffle(order)
    misses, target, _ = run(MiB, 1024, readers=1, order=order[:200])
    # every read is a demand fetch of its own chunk; almost nothing is fetched ahead
    assert misses == 200
    assert sum(e - s for s, e in target.requests) <= 200 * MiB + 16 * MiB


def test_readers_of_slices_of_one_target_fetch_its_bytes_about_once() -> None:
    # Sixteen clients of one server, each reading its own slice of a target in order, ten
    # chunks at once: each one's run meets the stretches fetched for the others, and what a
    # stretch already holds (or is fetching) is not fetched again.
    chunk, per, clients = 64 * 2**10, 32, 16
    size = clients * per * chunk
    target = SlowTarget(size)
    ra = readahead(target)
    misses: list[int] = []

    async def client(c: int, nursery: trio.Nursery) -> None:
        misses.append(await read_chunks(ra, target, list(range(c * per, (c + 1) * per)), chunk, 10, nursery))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async with trio.open_nursery() as clients_nursery:
                for c in range(clients):
                    clients_nursery.start_soon(client, c, nursery)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    fetched = sum(e - s for s, e in target.requests)
    covered, reach = 0, 0  # bytes of the target fetched at least once
    for s, e in sorted(target.requests):
        covered += max(0, e - max(s, reach))
        reach = max(reach, e)
    assert covered == size
    assert fetched <= size * 5 // 4, (fetched / size, sum(misses))
