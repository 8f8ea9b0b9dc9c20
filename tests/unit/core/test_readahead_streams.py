"""Readahead per stream (refmount.core.streams, refmount.core.readahead,
refmount.core.targetreadahead), without FUSE: several readers
going through one target at different places (Dask workers each reading its slab, HTTP
clients each reading a slice) keep a stream each, with its own window, under global bounds;
a random reader reads nothing ahead. A fake target answering after a latency of trio's
virtual time (MockClock), the RefReader over it, and the HTTP front end over a real file."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing
from support.fakes import URL, FakeDisk, FakeFetcher, FakeLoader, KiB, MiB, content, run

from refmount.base.stats import Stats
from refmount.cache.blocks import MemoryLRU
from refmount.core.readahead import GridReadahead, OrderDetector
from refmount.core.reader import RefReader
from refmount.core.streams import Streams
from refmount.core.targetreadahead import TargetReadahead
from refmount.refs import Ref, RefKind

QUARTERS = 4


class At:
    __slots__ = ("end", "name")

    def __init__(self, name: str, end: int) -> None:
        self.name, self.end = name, end


def near(start: int) -> object:
    return lambda s: abs(start - s.end) <= 10


# ---- Streams ------------------------------------------------------------------------------------
def test_a_read_belongs_to_the_nearest_stream_that_takes_it() -> None:
    streams: Streams[At] = Streams(per_target=4)
    for name, end in (("a", 0), ("b", 100), ("c", 105)):
        streams.add(URL, At(name, end))
    found = streams.find(URL, 104, lambda s: abs(104 - s.end) <= 10)
    assert found is not None and found.name == "c"  # b takes it too, c is nearer
    assert streams.find(URL, 50, lambda s: abs(50 - s.end) <= 10) is None
    assert streams.find("other", 0, lambda s: True) is None  # per target
    assert [s.name for s in streams.of(URL)] == ["a", "b", "c"]  # c was last used already


def test_streams_are_bounded_per_target_and_in_all_least_recently_used_first() -> None:
    streams: Streams[At] = Streams(per_target=4, max_streams=10)
    for i in range(4):
        streams.add(URL, At(f"s{i}", i * 1000))
    assert streams.find(URL, 0, lambda s: s.end == 0) is not None  # s0 is used again
    streams.add(URL, At("new", 9000))  # makes room: s1 is the least recently used
    assert [s.name for s in streams.of(URL)] == ["s2", "s3", "s0", "new"]
    for t in range(5):
        streams.add(f"t{t}", At("x", 0))
        streams.add(f"t{t}", At("y", 1))
    assert len(streams) == 10  # the first targets gave up their oldest streams
    assert streams.targets <= 6 and streams.of("t4")
    assert not streams.of(URL)  # the least recently used target went first


# ---- the order detector and grid blocks: a stream per reader ----------------------------------
def interleaved(per: int, size: int, quarters: int = QUARTERS) -> list[tuple[int, int]]:
    """Keys of ``size`` bytes of ``quarters`` readers, each going through its own quarter in
    order, taken in turns: one key of each, then the next of each."""
    return [(q * per * size + i * size, q * per * size + (i + 1) * size)
            for i in range(per) for q in range(quarters)]


def test_the_order_detector_follows_each_of_interleaved_readers() -> None:
    order = OrderDetector()
    follows = [order.follows(URL, s, e) for s, e in interleaved(64, 64 * KiB)]
    assert follows[:QUARTERS] == [False] * QUARTERS  # each reader's first key
    assert all(follows[QUARTERS:])
    assert len(order) == QUARTERS


def test_grid_readahead_loads_ahead_of_each_of_interleaved_readers() -> None:
    ra = GridReadahead(block_size=MiB, max_readahead=2 * MiB)
    loader = FakeLoader()
    per, size = 64, 64 * KiB  # a quarter of 4 MiB: 4 grid blocks
    for s, e in interleaved(per, size):
        ra.note(URL, s, e, loader)
    loaded = [start // MiB for start, _ in loader.loads]
    # each reader loads the blocks after its first (its quarter's, and the window past it),
    # each block once, all from disk
    assert sorted(loaded) == list(range(1, 4 * QUARTERS + 2))
    assert not any(loader.fetched)
    assert len(ra) == QUARTERS
    assert all(ra.in_order(URL, q * 4 * MiB + 4 * MiB - size) for q in range(QUARTERS))


# ---- readahead across keys through the RefReader -------------------------------------------------
def reader(fetcher: FakeFetcher, *, max_readahead: int = 8 * MiB, memory: int = 64 * MiB,
           disk: FakeDisk | None = None) -> RefReader:
    return RefReader(fetcher, MemoryLRU(memory), disk, whole_fetch_limit=MiB,  # type: ignore[arg-type]
                     block_size=MiB, max_readahead=max_readahead, stats=Stats())


async def read_keys(r: RefReader, keys: list[tuple[int, int]], wrong: list[int]) -> None:
    for start, end in keys:
        got = await r.read(Ref(RefKind.RANGE, URL, start, end - start), 0, end - start)
        if bytes(got) != content(start, end):
            wrong.append(start)
        await trio.sleep(0.001)  # the reader's own work on each key


@pytest.mark.parametrize("how", ["in turns", "concurrently"])
def test_readers_of_quarters_of_one_target_keep_a_stream_each(how: str) -> None:
    # Four readers (Dask workers) each go through a quarter of one target's keys in order,
    # behind 20 ms of latency: either in strict turns (one key of each, then the next) or
    # at once, each at its own pace. One run per target would restart at every turn.
    per, size = 256, 64 * KiB  # 4 x 16 MiB
    f = FakeFetcher(size=QUARTERS * per * size, latency=0.02)
    r = reader(f)
    wrong: list[int] = []
    keys = interleaved(per, size)

    async def main() -> None:
        async with trio.open_nursery() as n:
            r.attach(n)
            if how == "in turns":
                await read_keys(r, keys, wrong)
            else:
                async with trio.open_nursery() as readers:
                    for q in range(QUARTERS):
                        readers.start_soon(read_keys, r, keys[q::QUARTERS], wrong)
            n.cancel_scope.cancel()

    run(main)
    s = r.stats
    assert wrong == []
    assert s.misses <= len(keys) // 10, (s.misses, len(keys))  # demand misses: at most 10 % of keys
    assert s.readahead_streams == QUARTERS, s.readahead_streams
    assert s.prefetch_hits >= len(keys) * 9 // 10
    assert sum(e - st for st, e in f.requests) <= f.size_ * 5 // 4  # each byte fetched about once
    assert len(r.target_readahead.streams(URL)) == QUARTERS


def random_pass(seed: int, keys: int, reads: int, size: int = 64 * KiB) -> tuple[RefReader, FakeFetcher]:
    """A reader of ``reads`` keys of ``size`` bytes at random among ``keys`` of one target
    (every key once when ``reads == keys``), behind 20 ms of latency."""
    f = FakeFetcher(size=keys * size, latency=0.02)
    r = reader(f)
    rng = random.Random(seed)
    order = rng.sample(range(keys), reads)
    wrong: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            r.attach(n)
            await read_keys(r, [(i * size, (i + 1) * size) for i in order], wrong)
            n.cancel_scope.cancel()

    run(main)
    assert wrong == []
    return r, f


def test_a_random_reader_fetches_only_what_it_reads() -> None:
    size = 64 * KiB
    r, f = random_pass(45, keys=1024, reads=512, size=size)
    assert r.stats.readahead_streams == 0 and r.stats.prefetched == 0
    assert all(e - s == size for s, e in f.requests)  # each read fetched its own key, nothing more
    assert len(f.requests) == 512
    assert len(r.target_readahead) <= TargetReadahead.PER_TARGET


def test_a_random_reader_of_every_key_reads_little_ahead() -> None:
    # Every key of a small target in random order, ten passes: now and then keys come in
    # order by chance and start a stream; its readers use little of what it brings, so it
    # stops after a window or two. What is fetched ahead stays within 8 % of what is read
    # (one run per target, before streams: 3.6 % on average over 30 such passes).
    keys, size = 1024, 64 * KiB
    ahead = streams = 0
    for seed in range(10):
        r, _ = random_pass(seed, keys=keys, reads=keys, size=size)
        ahead += r.stats.prefetched
        streams += r.stats.readahead_streams
    assert ahead <= 10 * keys * size * 8 // 100, (ahead, streams)
    assert streams <= 10


def test_a_random_reader_beside_readers_in_order_leaves_them_their_streams() -> None:
    # Keys of 48 KiB read at random (another array's chunks in the same file, say) between
    # the keys of four readers going through their quarters: the random reader's reads are
    # still fetched one by one, and each reader in order keeps its stream.
    per, size, odd = 256, 64 * KiB, 48 * KiB
    f = FakeFetcher(size=QUARTERS * per * size, latency=0.02)
    r = reader(f)
    wrong: list[int] = []
    order = list(range(QUARTERS * per))
    random.Random(7).shuffle(order)
    randoms = [(i * size + 8 * KiB, i * size + 8 * KiB + odd) for i in order[:QUARTERS * per // 2]]

    async def main() -> None:
        async with trio.open_nursery() as n:
            r.attach(n)
            async with trio.open_nursery() as readers:
                keys = interleaved(per, size)
                for q in range(QUARTERS):
                    readers.start_soon(read_keys, r, keys[q::QUARTERS], wrong)
                readers.start_soon(read_keys, r, randoms, wrong)
            n.cancel_scope.cancel()

    run(main)
    assert wrong == []
    in_order_misses = sum(1 for s, e in f.requests if e - s == size)
    random_fetches = sum(1 for s, e in f.requests if e - s == odd)
    # a random key is fetched on its own unless a stretch read ahead already had it
    assert random_fetches + r.stats.prefetch_hits >= len(randoms)
    assert in_order_misses <= QUARTERS * per // 10, in_order_misses
    assert r.stats.readahead_streams >= QUARTERS


# ---- global bounds ----------------------------------------------------------------------------
class CountingTarget:
    """A target of zeros after ``latency``, 500 MB/s per request; counts the bytes of
    readahead in flight, and the most at once."""

    def __init__(self, size: int, latency: float = 0.02) -> None:
        self.size, self.latency = size, latency
        self.inflight = self.most_inflight = 0

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        await trio.sleep(self.latency)
        return bytes(min(end, self.size) - start)

    async def stream_range(self, url: str, start: int, end: int, sink) -> int:  # type: ignore[no-untyped-def]
        self.inflight += end - start
        self.most_inflight = max(self.most_inflight, self.inflight)
        try:
            await trio.sleep(self.latency + (end - start) / 500e6)
            data = bytes(max(0, min(end, self.size) - start))
            sink(0, data)
            return len(data)
        finally:
            self.inflight -= end - start


async def read_in_order(ra: TargetReadahead, target: CountingTarget, keys: range, size: int,
                        nursery: trio.Nursery, *, at_once: int = 1, work: float = 0.002,
                        seen: Callable[[], None] | None = None) -> int:
    """A reader of keys ``keys`` (numbers of ``size``-byte keys) in order, ``at_once`` at a
    time (as zarr reads): from stretches read ahead, else fetched on demand. Its misses."""
    todo = iter(keys)
    misses = 0

    async def one() -> None:
        nonlocal misses
        for i in todo:
            start, end = i * size, (i + 1) * size
            if await ra.lookup(URL, start, end) is None:
                misses += 1
                ra.note(URL, start, end, nursery, miss=True)
                await target.cat_range(URL, start, end)
            else:
                ra.note(URL, start, end, nursery, miss=False)
            if seen is not None:
                seen()
            await trio.sleep(work)

    async with trio.open_nursery() as tasks:
        for _ in range(at_once):
            tasks.start_soon(one)
    return misses


def test_many_streams_share_the_global_bounds() -> None:
    # Twelve readers of twelve slices of one target, 1 MiB keys, two at once each, 600 MB/s
    # together: the bytes in flight and the bytes held stay within the bounds of one
    # readahead (32 MiB in flight carry ~900 MB/s here), and the readers still read mostly
    # from stretches read ahead.
    readers, per, size = 12, 64, MiB
    target = CountingTarget(readers * per * size)
    ra = TargetReadahead(target, Stats(), capacity=256 * MiB, max_window=32 * MiB, grid=4 * MiB,
                         clock=trio.current_time)
    held: list[int] = []
    misses: list[int] = []

    async def reader(c: int, n: trio.Nursery) -> None:
        misses.append(await read_in_order(ra, target, range(c * per, (c + 1) * per), size, n,
                                          at_once=2, work=0.04,
                                          seen=lambda: held.append(ra.prefetched_bytes)))

    async def main() -> None:
        async with trio.open_nursery() as n:
            async with trio.open_nursery() as rs:
                for c in range(readers):
                    rs.start_soon(reader, c, n)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert 0 < target.most_inflight <= ra.max_inflight == 32 * MiB
    assert max(held) <= ra.capacity
    assert sum(misses) <= readers * per // 4, misses
    assert ra.stats.readahead_streams >= readers


def test_a_stream_alone_again_gets_the_whole_window() -> None:
    # Four streams read ahead at once: each keeps to an eighth of the capacity. Once the
    # other three have stopped for longer than ACTIVE seconds, the one left grows to
    # max_window again.
    target = CountingTarget(1024 * MiB)
    ra = TargetReadahead(target, Stats(), capacity=64 * MiB, max_window=32 * MiB, grid=MiB,
                         clock=trio.current_time)
    size = MiB

    async def main() -> None:
        async with trio.open_nursery() as n:
            async with trio.open_nursery() as rs:
                for q in range(QUARTERS):
                    rs.start_soon(read_in_order, ra, target, range(q * 256, q * 256 + 48), size, n)
            assert len(ra.streams(URL)) == QUARTERS
            assert all(0 < w <= 8 * MiB for _, w in ra.streams(URL)), ra.streams(URL)
            await trio.sleep(ra.ACTIVE + 1)
            await read_in_order(ra, target, range(48, 200), size, n, at_once=4, work=0)
            assert max(w for _, w in ra.streams(URL)) == 32 * MiB, ra.streams(URL)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_streams_of_a_target_are_bounded() -> None:
    target = CountingTarget(4096 * MiB)
    ra = TargetReadahead(target, Stats(), capacity=16 * MiB, max_window=8 * MiB, grid=4 * MiB)

    async def main() -> None:
        async with trio.open_nursery() as n:
            for s in range(100):  # a hundred readers' first keys, far apart
                ra.note(URL, s * 32 * MiB, s * 32 * MiB + MiB, n, miss=True)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    ends = [e for e, _ in ra.streams(URL)]
    assert len(ends) == ra.PER_TARGET
    assert ends == [s * 32 * MiB + MiB for s in range(100 - ra.PER_TARGET, 100)]  # the most recent


# ---- serve's clients --------------------------------------------------------------------------
def test_http_clients_reading_slices_of_one_target_keep_a_stream_each(tmp_path: Path) -> None:
    # Four HTTP clients of refmount serve's front end, each going through its quarter of an
    # array's keys, all in one file: each keeps its own stream.
    from aiohttp.test_utils import make_mocked_request

    from refmount.base import guestloop
    from refmount.base.triocall import TrioCaller
    from refmount.config import MountConfig, apply_options
    from refmount.core.setcore import build_core
    from refmount.http.frontend import HttpFrontEnd
    from refmount.serving.preparation import index_source
    from refmount.targets.filesystems import await_task

    # 128 keys a client: the keys before a stream starts (its first few, as each client's
    # first requests race the others') stay a small part of what each reads
    chunk, per = 64 * KiB, 128
    n = QUARTERS * per
    data = np.random.default_rng(45).integers(0, 256, n * chunk, dtype=np.uint8).tobytes()
    (tmp_path / "array.bin").write_bytes(data)
    refs = {f"a/{i}": [str(tmp_path / "array.bin"), i * chunk, chunk] for i in range(n)}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    cfg = MountConfig(source=str(tmp_path / "refs.json"), mountpoint="")
    apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", "block_size=1M", "max_readahead=2M"])
    core = build_core(cfg, index_source(cfg))
    wrong: list[int] = []

    async def client(front: HttpFrontEnd, q: int) -> None:
        for i in range(q * per, (q + 1) * per):
            request = make_mocked_request("GET", f"/a/{i}")
            await front.handle(request)
            body = b"".join(bytes(c.args[0]) for c in request.writer.write.call_args_list)  # type: ignore[attr-defined]
            if body != data[i * chunk:(i + 1) * chunk]:
                wrong.append(i)
            await asyncio.sleep(0.005)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            core.start(nursery)
            front = HttpFrontEnd(core, TrioCaller(nursery), cors=None, token=None, max_clients=8,
                                 client_timeout=5, cache_seconds=1)

            async def clients() -> None:
                await asyncio.gather(*(client(front, q) for q in range(QUARTERS)))

            await await_task(asyncio.get_running_loop(), clients())
            nursery.cancel_scope.cancel()

    try:
        guestloop.run(main)
    finally:
        core.close()
    assert wrong == []
    # Each client keeps a stream: four start (one more may, when a client falls behind its own
    # stream's window for a moment on a busy machine and starts it again), and most keys are
    # read from what the streams brought ahead.
    stats = core.stats
    assert QUARTERS <= stats.readahead_streams <= QUARTERS + 1, stats.as_dict()
    assert stats.prefetch_hits >= n * 3 // 4, stats.as_dict()
    assert stats.misses <= n // 10, stats.as_dict()
