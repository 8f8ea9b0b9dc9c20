"""BlockStore and RefReader without FUSE: a fake fetcher, a fake disk, trio's MockClock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from support.fakes import URL, FakeDisk, FakeFetcher, FakeWriter, KiB, MiB, content, run

from refmount.base.errors import FetchError
from refmount.base.stats import Stats
from refmount.cache.blocks import MemoryLRU
from refmount.core.blockstore import BlockKey, BlockStore
from refmount.core.reader import ReadState, RefReader
from refmount.refs import Ref, RefKind


def store(fetcher: FakeFetcher, *, memory: int = 64 * MiB, disk: FakeDisk | None = None,
          writer: FakeWriter | None = None) -> BlockStore:
    return BlockStore(fetcher, MemoryLRU(memory), disk, disk_writer=writer, stats=Stats())  # type: ignore[arg-type]


def reader(fetcher: FakeFetcher, *, memory: int = 64 * MiB, disk: FakeDisk | None = None,
           writer: FakeWriter | None = None, max_readahead: int = 4 * MiB) -> RefReader:
    return RefReader(fetcher, MemoryLRU(memory), disk, disk_writer=writer,  # type: ignore[arg-type]
                     whole_fetch_limit=MiB, block_size=MiB, max_readahead=max_readahead, stats=Stats())


def fetch_of(f: FakeFetcher, key: BlockKey) -> Callable[[], Awaitable[bytes]]:
    return lambda: f.cat_range(key.url, key.start, key.start + key.length)


# ---- BlockStore -------------------------------------------------------------------------------
def test_concurrent_loads_of_one_block_make_one_fetch() -> None:
    f = FakeFetcher()
    w = FakeWriter()
    s = store(f, writer=w)
    key = BlockKey(URL, 100, 1000)
    got: list[bytes] = []

    async def main() -> None:
        async def one() -> None:
            got.append(bytes(await s.load(key, fetch_of(f, key))))
        async with trio.open_nursery() as n:
            for _ in range(16):
                n.start_soon(one)
        got.append(bytes(await s.load(key, fetch_of(f, key))))  # later: from memory

    run(main)
    assert f.requests == [(100, 1100)]
    assert got == [content(100, 1100)] * 17
    assert s.stats.misses == 1 and s.stats.memory_hits == 1
    assert w.submitted == [(URL, 100, 1000, None)]  # handed to the cache writer once


def test_a_timed_out_fetch_is_remembered_briefly() -> None:
    f = FakeFetcher()
    f.fail = FetchError(URL, "timed out", timed_out=True)
    s = store(f)
    key = BlockKey(URL, 0, 4096)

    async def main() -> None:
        with pytest.raises(FetchError):
            await s.load(key, fetch_of(f, key))
        assert len(f.requests) == 1
        t0 = trio.current_time()
        with pytest.raises(FetchError):  # the kernel's re-read: fails at once
            await s.load(key, fetch_of(f, key))
        assert trio.current_time() == t0 and len(f.requests) == 1
        await trio.sleep(s.TIMEOUT_MEMORY)
        f.fail = None
        assert bytes(await s.load(key, fetch_of(f, key))) == content(0, 4096)  # retried after it
        assert len(f.requests) == 2

    run(main)


def test_other_failures_are_not_remembered() -> None:
    f = FakeFetcher()
    f.fail = FetchError(URL, "connection refused")
    s = store(f)
    key = BlockKey(URL, 0, 4096)

    async def main() -> None:
        with pytest.raises(FetchError):
            await s.load(key, fetch_of(f, key))
        f.fail = None
        assert bytes(await s.load(key, fetch_of(f, key))) == content(0, 4096)

    run(main)
    assert len(f.requests) == 2


def test_memory_stays_within_its_capacity() -> None:
    f = FakeFetcher()
    s = store(f, memory=10 * 4096)

    async def main() -> None:
        for i in range(50):
            key = BlockKey(URL, i * 4096, 4096)
            await s.load(key, fetch_of(f, key))
            assert s.memory.size <= 10 * 4096

    run(main)
    assert len(s.memory) == 10


def test_the_disk_is_asked_only_when_its_filter_says_maybe() -> None:
    f = FakeFetcher()
    d = FakeDisk()
    on_disk = BlockKey(URL, 0, 4096)
    d.blocks[on_disk] = content(0, 4096)
    s = store(f, disk=d)
    missing = BlockKey(URL, 4096, 4096)

    async def main() -> None:
        assert bytes(await s.load(on_disk, fetch_of(f, on_disk))) == content(0, 4096)
        assert bytes(await s.load(missing, fetch_of(f, missing))) == content(4096, 8192)
        assert await s.load(BlockKey(URL, 8192, 4096), None, upto=True) is None  # disk only

    run(main)
    assert d.gets == [on_disk]  # certain misses cost no lookup (no thread hop)
    assert f.requests == [(4096, 8192)]
    assert s.stats.disk_hits == 1 and s.stats.misses == 1


def test_a_reader_that_joined_a_disk_only_load_fetches_when_it_finds_nothing() -> None:
    f = FakeFetcher()
    d = FakeDisk()
    key = BlockKey(URL, 0, 4096)
    d.false_positives.add(key)  # the filter says maybe; the lookup finds nothing
    s = store(f, disk=d)
    got: list[Any] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            async def disk_only() -> None:
                got.append(await s.load(key, None, upto=True))
            n.start_soon(disk_only)
            while not s.loading(key):
                await trio.sleep(0)
            got.append(bytes(await s.load(key, fetch_of(f, key))))

    run(main)
    assert got == [None, content(0, 4096)]
    assert f.requests == [(0, 4096)]


def test_load_all_loads_blocks_at_once_and_raises_a_failure_as_itself() -> None:
    f = FakeFetcher()
    cats: list[tuple[str, int, int]] = []

    async def cat(url: str, start: int, end: int) -> bytes:
        cats.append((url, start, end))
        return await f.cat_range(url, start, end)

    s = BlockStore(f, MemoryLRU(64 * MiB), None, stats=Stats(), cat=cat)  # type: ignore[arg-type]
    keys = [BlockKey(URL, i * 4096, 4096) for i in range(4)]
    assert s.loader is None  # no background yet: nothing to load ahead in

    async def main() -> None:
        t0 = trio.current_time()
        blocks = await s.load_all(keys)
        assert [bytes(b) for b in blocks] == [content(k.start, k.start + k.length) for k in keys]
        assert trio.current_time() - t0 == f.latency  # at once, not one after another
        f.fail = FetchError(URL, "connection refused")
        with pytest.raises(FetchError):  # not an ExceptionGroup
            await s.load_all([BlockKey(URL, 10**6, 10), BlockKey(URL, 2 * 10**6, 10)])
        async with trio.open_nursery() as n:
            s.attach(n)
            assert s.loader is s

    run(main)
    assert sorted(cats)[:4] == [(URL, k.start, k.start + k.length) for k in keys]  # the store's cat


# ---- RefReader over the store ----------------------------------------------------------------
def test_concurrent_reads_of_one_small_range_make_one_fetch() -> None:
    f = FakeFetcher()
    r = reader(f)
    ref = Ref(RefKind.RANGE, URL, 5000, 20 * KiB)
    got: list[tuple[int, bytes]] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            r.attach(n)
            async def one(off: int) -> None:
                got.append((off, bytes(await r.read(ref, off, 4 * KiB))))
            for i in range(5):
                n.start_soon(one, i * 4 * KiB)
            await trio.sleep(1)
            n.cancel_scope.cancel()

    run(main)
    assert f.requests == [(5000, 5000 + 20 * KiB)]  # whole-fetched once
    assert b"".join(b for _, b in sorted(got)) == content(5000, 5000 + 20 * KiB)
    assert r.stats.misses == 1


def test_later_reads_of_a_small_range_are_served_from_memory() -> None:
    f = FakeFetcher()
    r = reader(f)
    ref = Ref(RefKind.RANGE, URL, 777, 300 * KiB)

    async def main() -> None:
        for off in (0, 5, 4096, 299 * KiB, 300 * KiB - 1):
            want = content(777 + off, 777 + min(off + 8192, 300 * KiB))
            assert bytes(await r.read(ref, off, 8192)) == want
        assert await r.read(ref, 300 * KiB, 10) == b""  # at the end

    run(main)
    assert f.requests == [(777, 777 + 300 * KiB)]
    assert r.stats.misses == 1 and r.stats.memory_hits == 4


def test_block_readahead_is_bounded_and_stops_on_a_seek() -> None:
    f = FakeFetcher(size=64 * MiB)
    r = reader(f, max_readahead=4 * MiB)
    ref = Ref(RefKind.WHOLE, URL, 0, -1)
    state = ReadState()

    async def main() -> None:
        async with trio.open_nursery() as n:
            r.attach(n)
            for off in range(0, 8 * MiB, 128 * KiB):  # streaming
                assert bytes(await r.read(ref, off, 128 * KiB, state)) == content(off, off + 128 * KiB)
            await trio.sleep(1)
            fetched = {s for s, _ in f.requests}
            assert max(fetched) <= 8 * MiB + 4 * MiB  # never beyond the window
            assert 11 * MiB in fetched  # ... but up to it
            before = len(f.requests)
            await r.read(ref, 40 * MiB + 5, 4096, state)  # a seek
            await r.read(ref, 30 * MiB, 4096, state)  # and another
            await trio.sleep(1)
            assert len(f.requests) == before + 2  # the blocks read, nothing ahead
            n.cancel_scope.cancel()

    run(main)


def test_a_range_past_the_end_of_its_target_is_clipped_and_settled() -> None:
    f = FakeFetcher(size=10_000)
    r = reader(f)
    ref = Ref(RefKind.RANGE, URL, 8000, 4000)  # 2,000 bytes exist

    async def main() -> None:
        assert r.clipped(ref) is None  # not known yet
        assert await r.settle(ref) == 2000
        assert r.clipped(ref) == 2000 and await r.size(ref) == 2000
        n = len(f.requests)
        assert bytes(await r.read(ref, 0, 4000)) == content(8000, 10_000)
        assert len(f.requests) == n  # settled by its first piece, kept in memory

    run(main)


def test_a_large_range_is_settled_by_the_targets_size() -> None:
    f = FakeFetcher(size=3 * MiB)
    r = reader(f)
    ref = Ref(RefKind.RANGE, URL, MiB, 4 * MiB)  # over whole_fetch_limit: read in blocks

    async def main() -> None:
        assert await r.settle(ref) == 2 * MiB

    run(main)


def test_first_reads_in_target_order_use_grid_blocks_on_disk() -> None:
    f = FakeFetcher()
    d = FakeDisk()
    for k in range(4):
        d.blocks[(URL, k * MiB, MiB)] = content(k * MiB, (k + 1) * MiB)
    r = reader(f, disk=d, max_readahead=2 * MiB)
    chunk = 64 * KiB

    async def main() -> None:
        async with trio.open_nursery() as n:
            r.attach(n)
            for i in range(40):
                ref = Ref(RefKind.RANGE, URL, i * chunk, chunk)
                assert bytes(await r.read(ref, 0, chunk)) == content(i * chunk, (i + 1) * chunk)
                await trio.sleep(0.01)
            n.cancel_scope.cancel()

    run(main)
    # The first key is fetched (no order yet); every later one is served from grid blocks,
    # each loaded from disk once, the next ones ahead of the reader (within max_readahead).
    assert f.requests == [(0, chunk)]
    assert sorted(d.gets) == [(URL, k * MiB, MiB) for k in range(4)]
    assert r.stats.disk_hits == 4
