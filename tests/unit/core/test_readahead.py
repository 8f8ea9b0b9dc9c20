"""The order detector and the readahead policies of refmount.core.readahead and
refmount.core.targetreadahead, without FUSE (a fake block store, a fake target, trio's
MockClock). TargetReadahead's streaming behaviour under concurrent readers is in
test_prefetch.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from support.fakes import FakeLoader, StreamsWhole

from refmount.base.stats import Stats
from refmount.core.readahead import (
    SLACK,
    GridReadahead,
    HandleReadahead,
    OpenFile,
    OrderDetector,
    Readahead,
    ReadState,
    continues,
)
from refmount.core.targetreadahead import AcrossKeys, TargetRead, TargetReadahead

MiB = 2**20
URL = "http://example.invalid/data.bin"


def test_continues_within_slack_after_and_behind() -> None:
    assert continues(100, 100, front=100, behind=SLACK)
    assert continues(100 + SLACK, 100, front=100, behind=SLACK)
    assert not continues(101 + SLACK, 100, front=100, behind=SLACK)
    assert continues(100 + 5 * SLACK, 100, front=100 + 4 * SLACK, behind=0)  # readahead ran ahead
    assert not continues(99, 100, front=100, behind=0)
    assert continues(0, 4 * MiB, front=4 * MiB, behind=4 * MiB)


def test_order_detector_follows_reads_near_the_last_end() -> None:
    order = OrderDetector()
    assert not order.follows(URL, 0, 1000)  # the first read of a target
    assert order.follows(URL, 1000, 2000)
    assert order.follows(URL, 2000 + SLACK, 3 * SLACK)  # a gap within the slack
    assert not order.follows(URL, 100 * SLACK, 101 * SLACK)  # a seek
    assert order.follows(URL, 101 * SLACK - 10, 102 * SLACK)  # ... then in order again
    assert not order.follows("other", 102 * SLACK, 103 * SLACK)  # per target


def test_order_detector_is_bounded() -> None:
    order = OrderDetector(max_streams=100)
    for i in range(1000):
        order.follows(f"u{i}", 0, 10)
    assert len(order) == 100
    assert order.follows("u999", 10, 20)  # the most recent targets are remembered


def test_handle_readahead_doubles_while_streaming_and_stops_on_a_seek() -> None:
    ra = HandleReadahead(block_size=MiB, max_readahead=8 * MiB)
    state = ReadState()
    windows = []
    for off in range(0, 10 * MiB, MiB):
        ahead = ra.advance(state, off, off + MiB, 100 * MiB)
        windows.append(state.window)
        assert len(ahead) * MiB <= 8 * MiB  # never beyond max_readahead
        if state.window:
            assert ahead.start == (off + MiB) // MiB  # from the block after the read
    assert windows == [0, 2 * MiB, 4 * MiB, 8 * MiB] + [8 * MiB] * 6  # none on the first read
    assert not ra.advance(state, 50 * MiB, 51 * MiB, 100 * MiB)  # a seek
    assert state.window == 0
    assert len(ra.advance(state, 51 * MiB, 52 * MiB, 100 * MiB)) == 2  # streaming again


def test_handle_readahead_stops_at_the_end_of_the_file() -> None:
    ra = HandleReadahead(block_size=MiB, max_readahead=64 * MiB)
    state = ReadState()
    for off in range(0, 5 * MiB, MiB):
        ahead = ra.advance(state, off, off + MiB, 6 * MiB)
        assert all(b < 6 for b in ahead)


def grid_loader(on_disk: set[int]) -> FakeLoader:
    return FakeLoader(on_disk=lambda key: key.start // MiB in on_disk)


def key_in(k: int) -> tuple[int, int]:
    """A small key inside grid block ``k``."""
    return k * MiB + 10, k * MiB + 1000


def started(loader: FakeLoader) -> list[int]:
    """The grid blocks loaded ahead, all from disk."""
    assert not any(loader.fetched)
    return [start // MiB for start, _ in loader.loads]


def test_grid_readahead_loads_the_next_blocks_on_disk_while_keys_follow() -> None:
    ra = GridReadahead(block_size=MiB, max_readahead=4 * MiB)
    loader = grid_loader(set(range(100)))
    ra.note(URL, *key_in(0), loader)  # the first: nothing yet
    assert started(loader) == []
    ra.note(URL, *key_in(0), loader)
    assert started(loader) == [1, 2, 3, 4]  # within max_readahead
    ra.note(URL, *key_in(1), loader)
    assert started(loader) == [1, 2, 3, 4, 5]
    assert ra.in_order(URL, 2 * MiB) and not ra.in_order(URL, 7 * MiB)


def test_grid_readahead_stops_on_a_jump_and_where_the_disk_ends() -> None:
    ra = GridReadahead(block_size=MiB, max_readahead=8 * MiB)
    loader = grid_loader({0, 1, 2, 3, 50, 51, 52})
    ra.note(URL, *key_in(0), loader)
    ra.note(URL, *key_in(0), loader)
    assert started(loader) == [1, 2, 3]  # not past the first block the disk lacks
    ra.note(URL, *key_in(50), loader)  # a jump
    assert started(loader) == [1, 2, 3]
    ra.note(URL, *key_in(50), loader)
    assert started(loader) == [1, 2, 3, 51, 52]


def test_grid_readahead_is_bounded_in_targets() -> None:
    ra = GridReadahead(block_size=MiB, max_readahead=MiB, max_streams=50)
    for i in range(500):
        ra.note(f"u{i}", *key_in(0), None)
    assert len(ra) == 50


class Target(StreamsWhole):
    def __init__(self, size: int) -> None:
        self.size = size
        self.requests: list[tuple[int, int]] = []

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        self.requests.append((start, end))
        await trio.sleep(0.02)
        return bytes(max(0, min(end, self.size) - start))


def test_target_readahead_stops_on_a_seek_and_stays_within_capacity() -> None:
    target = Target(1024 * MiB)
    ra = TargetReadahead(target, Stats(), capacity=16 * MiB, max_window=8 * MiB, grid=MiB)
    chunk = 256 * 1024

    async def main() -> None:
        async with trio.open_nursery() as n:
            for i in range(8):  # in order: readahead starts
                if await ra.lookup(URL, i * chunk, (i + 1) * chunk) is None:
                    ra.note(URL, i * chunk, (i + 1) * chunk, n, miss=True)
                else:
                    ra.note(URL, i * chunk, (i + 1) * chunk, n, miss=False)
                await trio.sleep(0.05)
            assert target.requests
            assert ra.prefetched_bytes <= ra.capacity
            before = len(target.requests)
            for i in range(0, 4000, 500):  # random jumps: no readahead
                ra.note(URL, i * chunk, (i + 1) * chunk, n, miss=True)
                await trio.sleep(0.05)
            assert len(target.requests) == before
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_target_readahead_forgets_old_targets() -> None:
    ra = TargetReadahead(Target(MiB), Stats(), capacity=MiB, max_window=MiB, grid=MiB)

    async def main() -> None:
        async with trio.open_nursery() as n:
            for i in range(ra.MAX_STREAMS + 100):
                ra.note(f"u{i}", 0, 10, n, miss=True)
            assert len(ra) == ra.MAX_STREAMS

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# ---- the one interface: every policy stops at a seek and stays within its bound --------------
CHUNK = 256 * 1024
MAX_AHEAD = 4 * MiB


class Recorder(FakeLoader, StreamsWhole):
    """The loader the policies ask (HandleReadahead, GridReadahead) and the target
    TargetReadahead fetches from: every range asked for, as bytes of the target."""

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        self.loads.append((start, end))
        self.fetched.append(True)
        await trio.sleep(0.01)
        return bytes(end - start)


def handle_policy(rec: Recorder) -> tuple[Readahead[Any], Callable[[], object]]:
    state = ReadState()
    return HandleReadahead(MiB, MAX_AHEAD), lambda: OpenFile(state, URL, 0, 4096 * MiB)


def grid_policy(rec: Recorder) -> tuple[Readahead[Any], Callable[[], object]]:
    return GridReadahead(MiB, MAX_AHEAD), lambda: URL


def target_policy(rec: Recorder) -> tuple[Readahead[Any], Callable[[], object]]:
    ra = TargetReadahead(rec, Stats(), capacity=4 * MAX_AHEAD, max_window=MAX_AHEAD, grid=MiB)
    return AcrossKeys(ra), lambda: TargetRead(URL, True)


POLICIES = {  # how far past the furthest read each may load
    "handle": (handle_policy, MAX_AHEAD + MiB),
    "grid": (grid_policy, MAX_AHEAD + MiB),
    "target": (target_policy, MAX_AHEAD + TargetReadahead.REQUEST_LIMIT),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_loads_ahead_in_order_within_its_bound_and_stops_at_a_seek(name: str) -> None:
    make, bound = POLICIES[name]
    phases: list[int] = []  # loads after each phase
    leads: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            rec = Recorder(nursery)
            policy, stream = make(rec)

            async def read(chunks: list[int]) -> None:
                for i in chunks:
                    start, end = i * CHUNK, (i + 1) * CHUNK
                    seen = len(rec.loads)
                    policy.note(stream(), start, end, rec)
                    await trio.sleep(0.005)  # loads started by this read begin meanwhile
                    leads.extend(e - end for _, e in rec.loads[seen:])
                await trio.sleep(1)
                phases.append(len(rec.loads))

            await read(list(range(64)))  # in order: 16 MiB
            # seeks: far apart, never the next chunk or grid block
            await read([4000 - 40 * j if j % 2 else 2000 + 40 * j for j in range(20)])
            await read(list(range(5000, 5016)))  # in order again
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    in_order, after_seeks, again = phases
    assert in_order > 0  # it read ahead
    assert max(leads) <= bound  # never further ahead of the reader than its bound
    assert after_seeks == in_order  # nothing at all while the reader seeks
    assert again > after_seeks  # and it starts again once reads follow on
