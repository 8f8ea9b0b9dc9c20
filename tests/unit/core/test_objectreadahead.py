"""Readahead across chunk objects (refmount.core.objectreadahead) without FUSE: the policy on
positions, and ``NativeReadahead`` over a fake tree and a real BlockStore whose fetches are
counted."""

from __future__ import annotations

import numpy as np
import trio
import trio.testing

from refmount.base.stats import Stats
from refmount.cache.blocks import MemoryLRU
from refmount.core.blockstore import BlockKey, BlockStore
from refmount.core.objectreadahead import NativeReadahead, ObjectReadahead
from refmount.refs import Ref, RefKind

KiB = 2**10


def sizes(n: int, size: int = 2 * KiB) -> np.ndarray:
    return np.full(n, size, np.int64)


def ends(n: int, size: int = 2 * KiB) -> np.ndarray:
    return np.cumsum(sizes(n, size))


def test_in_order_reads_ahead_after_a_streak_and_never_twice() -> None:
    ra = ObjectReadahead(max_window=1 << 20)
    s = ends(10_000)
    assert not ra.note("a", 0, s)
    assert not ra.note("a", 1, s)
    first = ra.note("a", 2, s)
    assert first and first.start == 3  # the next objects, in key order
    assert len(first) == ObjectReadahead.FIRST_OBJECTS
    asked = set(first)
    ra.done(len(first) * 2 * KiB)
    for pos in range(3, 400):
        more = ra.note("a", pos, s)
        assert not asked & set(more), "a position asked for twice"
        asked |= set(more)
        ra.done(len(more) * 2 * KiB)
    assert set(range(3, 401)) <= asked  # everything the reader went on to read was asked ahead
    (end, ahead, window), = ra.streams("a")
    assert end == 399 and window == 1 << 20 and ahead - end <= ObjectReadahead.MAX_OBJECTS


def test_random_reads_never_read_ahead() -> None:
    ra = ObjectReadahead(max_window=1 << 20)
    s = ends(100_000)
    rng = np.random.default_rng(1)
    for pos in rng.permutation(100_000)[:500].tolist():
        assert not ra.note("a", pos, s)
    assert len(ra) <= ObjectReadahead.PER_SEQUENCE


def test_out_of_order_within_a_batch_continues() -> None:
    """zarr asks for ten chunks at once: they arrive in any order within a few positions."""
    ra = ObjectReadahead(max_window=1 << 20)
    s = ends(1000)
    got = []
    for batch in range(0, 100, 10):
        for pos in reversed(range(batch, batch + 10)):
            got += list(ra.note("a", pos, s))
    assert got and len(ra) == 1


def test_two_readers_keep_a_stream_each() -> None:
    ra = ObjectReadahead(max_window=1 << 20, max_inflight=1 << 30)
    s = ends(100_000)
    a = b = 0
    for i in range(50):
        a += len(ra.note("x", i, s))
        b += len(ra.note("x", 50_000 + i, s))
    assert a and b and len(ra.streams("x")) == 2


def test_bytes_in_flight_are_bounded_and_topped_up() -> None:
    ra = ObjectReadahead(max_window=1 << 20, max_inflight=64 * KiB)
    s = ends(10_000)
    asked = []
    for pos in range(20):
        asked += list(ra.note("a", pos, s))
        assert ra.inflight <= 64 * KiB
    assert len(asked) == 32  # nothing loaded yet: only what fits in flight
    ra.done(32 * 2 * KiB)
    more = ra.note("a", 20, s)
    assert more and more.start == asked[-1] + 1  # the window topped up where it stopped


def test_window_stops_at_the_end_of_the_array() -> None:
    ra = ObjectReadahead(max_window=1 << 20)
    s = ends(10)
    asked = [p for pos in range(10) for p in ra.note("a", pos, s)]
    assert asked and max(asked) == 9


class FakeTree:
    """An array of ``n`` chunks, every other one written, each an object of its own."""

    def __init__(self, n: int) -> None:
        self.numbers = np.arange(0, 2 * n, 2, dtype=np.int64)
        self.sizes = sizes(n, 4 * KiB)
        self.known = False
        self.batches: list[list[int]] = []

    def listing_now(self, aid: int) -> tuple[np.ndarray, np.ndarray] | None:
        return (self.numbers, self.sizes) if self.known else None

    async def listing(self, aid: int) -> tuple[np.ndarray, np.ndarray]:
        await trio.sleep(0.01)
        self.known = True
        return self.numbers, self.sizes

    async def object_refs(self, aid: int, numbers: list[int]) -> list[Ref | None]:
        self.batches.append(numbers)
        await trio.sleep(0.001)
        return [Ref(RefKind.RANGE, f"file:///repo/chunks/{n}", 0, 4 * KiB) for n in numbers]


class CountingFetcher:
    def __init__(self) -> None:
        self.fetched: list[str] = []

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        self.fetched.append(url)
        await trio.sleep(0.02)  # behind latency
        return bytes(end - start)


def test_native_readahead_loads_the_next_objects_once_each() -> None:
    async def main() -> None:
        tree = FakeTree(2000)
        fetcher = CountingFetcher()
        stats = Stats()
        store = BlockStore(fetcher, MemoryLRU(256 << 20), None, stats=stats)  # type: ignore[arg-type]
        ra = NativeReadahead(tree, store, max_window=1 << 20)
        async with trio.open_nursery() as nursery:
            store.attach(nursery)
            waited = 0.0
            for number in tree.numbers[:300].tolist():
                ra.opened(0, number)
                key = BlockKey(f"file:///repo/chunks/{number}", 0, 4 * KiB)
                t0 = trio.current_time()
                await store.load(key, store.fetch_of(key))  # the reader's own read
                waited += trio.current_time() - t0
            nursery.cancel_scope.cancel()
        assert len(fetcher.fetched) == len(set(fetcher.fetched))  # each object fetched once
        assert tree.batches and all(len(b) > 1 for b in tree.batches)  # references resolved in batches
        assert stats.memory_hits > 250  # the reader found what was read ahead
        assert waited < 300 * 0.02 / 10  # and hardly waited for the latency

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_native_readahead_without_background_does_nothing() -> None:
    tree = FakeTree(10)
    store = BlockStore(CountingFetcher(), MemoryLRU(1 << 20), None, stats=Stats())  # type: ignore[arg-type]
    ra = NativeReadahead(tree, store, max_window=1 << 20)
    ra.opened(0, 0)
    assert not tree.known and not tree.batches
