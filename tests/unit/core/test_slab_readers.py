"""Readahead across keys (refmount.core.targetreadahead) under Dask-like readers, without FUSE:
workers each going through their slab of one target's 1 MiB keys, each keeping several keys
asked at once as zarr does, behind a link whose bandwidth all requests share
(support/slabreaders.py, trio's virtual clock). Demand misses stay within 10 % of the keys
once slabs are more than a few dozen keys, and the global bounds hold."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from support.fakes import URL, MiB
from support.slabreaders import read_slabs

from refmount.base.stats import Stats
from refmount.core.targetreadahead import TargetReadahead


class Quiet:
    """A target that never answers within the test (only the requests asked matter)."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    async def stream_range(self, url: str, start: int, end: int, sink) -> int:  # type: ignore[no-untyped-def]
        self.asked.append((start, end))
        await trio.sleep_forever()
        return 0


@pytest.mark.parametrize(("latency", "at_once", "per"), [(0.0005, 10, 256), (0.02, 6, 128)])
def test_workers_reading_quarters_in_1mib_keys_miss_few(latency: float, at_once: int, per: int) -> None:
    # Four workers, 1 MiB keys, six (a mount: zarr's thread pool) or ten (zarr over HTTP)
    # keys asked at once. A stream is where its reader asks: before, each stream moved only
    # as keys arrived, so a reader asking six to ten keys ahead passed its window and missed
    # (0.20-0.49 of the keys here); and streams that topped up often took the bytes in
    # flight from the others. A worker's first keys, asked at once, miss when the last comes
    # first (all ten, in either order as trio runs them): 256 keys a worker keep that within
    # the bound whatever the order.
    run = read_slabs(4, per, MiB, latency=latency, at_once=at_once)
    assert run.wrong == []
    assert run.miss_fraction <= 0.10, (run.misses, sorted(run.by_position.items()))
    assert run.streams == 4
    ra = run.reader.target_readahead
    assert run.most_inflight <= ra.max_inflight and run.link.most_undelivered <= ra.max_inflight
    assert run.most_held <= ra.capacity
    assert sum(e - s for s, e in run.link.ahead) <= run.link.size_ * 5 // 4  # each byte about once


def test_eight_workers_miss_few_with_room_in_flight_for_them() -> None:
    # Eight readers keeping six 1 MiB keys each asked at once need about 8 x (6 + 4) MiB in
    # flight; max_readahead (the bound of bytes in flight, all streams together) is what
    # lets them have it. Within that bound each stream gets its share.
    run = read_slabs(8, 128, MiB, latency=0.02, at_once=6, max_readahead=128 * MiB)
    assert run.miss_fraction <= 0.10, (run.misses, sorted(run.by_position.items()))
    ra = run.reader.target_readahead
    assert run.most_inflight <= ra.max_inflight == 128 * MiB
    assert run.link.most_undelivered <= ra.max_inflight


def test_eight_workers_stay_within_the_default_bounds() -> None:
    # With the default 64 MiB in flight the same readers need more than the bound allows:
    # some of their keys are fetched on demand, but the bounds hold and each stream still
    # reads ahead (most keys come from stretches).
    run = read_slabs(8, 128, MiB, latency=0.02, at_once=6)
    ra = run.reader.target_readahead
    assert run.streams == 8
    assert run.most_inflight <= ra.max_inflight == 64 * MiB
    assert run.link.most_undelivered <= ra.max_inflight
    assert run.most_held <= ra.capacity
    assert run.miss_fraction <= 0.25, run.misses


def test_one_reader_asking_ten_keys_at_once_misses_only_its_first_keys() -> None:
    # Its first ten keys are asked at once, in either order: those before its stream starts
    # are fetched on demand (all ten at worst, when the last comes first), none after.
    run = read_slabs(1, 256, MiB, latency=0.02, at_once=10)
    assert TargetReadahead.MIN_STREAK + 1 <= run.misses <= 10, sorted(run.by_position.items())
    assert set(run.by_position) <= set(range(10))


def test_a_readers_first_keys_in_reverse_order_start_its_stream() -> None:
    # A reader asks for its first ten keys at once; they reach the readahead last first
    # (trio runs a batch of tasks in either order). The stream starts all the same.
    target = Quiet()
    ra = TargetReadahead(target, Stats(), capacity=128 * MiB, max_window=64 * MiB, grid=4 * MiB)

    async def main() -> None:
        async with trio.open_nursery() as n:
            for i in reversed(range(10)):
                ra.note(URL, i * MiB, (i + 1) * MiB, n, miss=True)
            await trio.sleep(0)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert ra.stats.readahead_streams == 1
    assert target.asked and min(target.asked)[0] == 10 * MiB  # from past its keys on


def test_scattered_ranges_near_one_another_start_nothing() -> None:
    # A random reader's ranges land near each other now and then: ranges each a few keys
    # past the last one (within CLOSE of it) continue a stream, but one key in three never
    # covers enough of the stretch they lie in to start it (a streak alone did before).
    target = Quiet()
    ra = TargetReadahead(target, Stats(), capacity=128 * MiB, max_window=64 * MiB, grid=4 * MiB)
    size = 64 * 2**10

    async def main() -> None:
        async with trio.open_nursery() as n:
            for k in (100, 103, 106, 109, 112, 115, 118):
                ra.note(URL, k * size, (k + 1) * size, n, miss=True)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert ra.stats.readahead_streams == 0 and target.asked == []


def test_a_stream_that_does_not_fit_in_flight_asks_for_less() -> None:
    # A stream has 8 of the 10 MiB that may be in flight: a new stream's first request is
    # cut to what fits (whole grid blocks), not put off until bytes arrive.
    target = Quiet()
    ra = TargetReadahead(target, Stats(), capacity=128 * MiB, max_window=10 * MiB, grid=MiB)
    base = 512 * MiB

    async def main() -> None:
        async with trio.open_nursery() as n:
            for i in range(4):
                ra.note(URL, i * MiB, (i + 1) * MiB, n, miss=True)
            assert ra.inflight_bytes == 8 * MiB
            for i in range(4):
                ra.note(URL, base + i * MiB, base + (i + 1) * MiB, n, miss=True)
            await trio.sleep(0)
            assert ra.inflight_bytes == ra.max_inflight == 10 * MiB
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sorted(target.asked) == [(4 * MiB, 12 * MiB), (base + 4 * MiB, base + 6 * MiB)]
