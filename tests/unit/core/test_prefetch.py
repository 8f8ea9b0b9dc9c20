"""TargetReadahead (refmount.core.targetreadahead) without FUSE: a fake target with a fixed latency,
trio's MockClock."""

from __future__ import annotations

import random
from collections.abc import Callable

import trio
import trio.testing
from support.fakes import StreamsWhole

from refmount.base.stats import Stats
from refmount.core.targetreadahead import TargetReadahead

MiB = 2**20
URL = "http://example.invalid/data.bin"


class SlowTarget(StreamsWhole):
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
    # trio's clock (the MockClock's virtual time), not the default monotonic one: the test's
    # readers and target live in virtual time, and a loaded machine must not change what
    # counts as recent.
    return TargetReadahead(target, Stats(), capacity=2 * max_window, max_window=max_window,  # type: ignore[arg-type]
                           grid=4 * MiB, clock=trio.current_time)


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


class StreamingTarget:
    """A target whose body arrives in ``piece``-byte pieces, one every ``gap`` (virtual)
    seconds after ``latency``, as an HTTP response's does; ``fail_at``: the first attempt
    breaks off after that many bytes and the request is tried again (pieces from 0 anew)."""

    def __init__(self, size: int, piece: int = 256 * 2**10, gap: float = 0.01,
                 latency: float = 0.02, fail_at: int | None = None, fail_for_good: bool = False) -> None:
        self.size, self.piece, self.gap, self.latency = size, piece, gap, latency
        self.fail_at, self.fail_for_good = fail_at, fail_for_good
        self.requests: list[tuple[int, int]] = []

    def content(self, start: int, end: int, attempt: int) -> bytes:
        return bytes((i + attempt) % 251 for i in range(start, end))

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        """The whole range at once, when its last piece has arrived."""
        self.requests.append((start, end))
        end = min(end, self.size)
        await trio.sleep(self.latency + self.gap * -(-(end - start) // self.piece))
        return self.content(start, end, 0)

    async def stream_range(self, url: str, start: int, end: int, sink) -> int:  # type: ignore[no-untyped-def]
        self.requests.append((start, end))
        end = min(end, self.size)
        for attempt in (0, 1):
            await trio.sleep(self.latency)
            for at in range(0, end - start, self.piece):
                if attempt == 0 and self.fail_at is not None and at >= self.fail_at:
                    break
                await trio.sleep(self.gap)
                hi = min(at + self.piece, end - start)
                sink(at, self.content(start + at, start + hi, attempt))
            else:
                return end - start
            if self.fail_for_good:
                raise OSError("connection reset")
        raise AssertionError("unreachable")


async def stretch_of(target: StreamingTarget, chunk: int,
                     nursery: trio.Nursery) -> tuple[TargetReadahead, int]:
    """Keys of ``chunk`` bytes read on demand in order (the first and ``MIN_STREAK`` more):
    readahead fetches a stretch from where they end. The stretch's start."""
    ra = TargetReadahead(target, Stats(), capacity=64 * MiB, max_window=8 * MiB, grid=4 * MiB,  # type: ignore[arg-type]
                         clock=trio.current_time)
    for i in range(ra.MIN_STREAK + 1):
        ra.note(URL, i * chunk, (i + 1) * chunk, nursery, miss=True)
    await trio.testing.wait_all_tasks_blocked()  # the stretch's task starts
    assert target.requests, "readahead should have started a stretch"
    return ra, target.requests[0][0]


def test_a_reader_takes_its_part_of_a_stretch_as_it_arrives() -> None:
    # A stretch is one request of up to 8 MiB; behind a slow link its body takes long to
    # arrive. A key at its start is served once its own bytes are there, not at the end.
    chunk = 64 * 2**10
    target = StreamingTarget(64 * MiB)  # 256 KiB every 10 ms: 8 MiB in 320 ms
    seen: dict[str, tuple[float, bytes]] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ra, s = await stretch_of(target, chunk, nursery)
            began = trio.current_time()

            async def read(name: str, start: int, end: int) -> None:
                found = await ra.lookup(URL, start, end)
                assert found is not None
                seen[name] = (trio.current_time() - began, bytes(found[0]))

            nursery.start_soon(read, "first", s, s + chunk)
            # across the boundary of two pieces: joined from both
            nursery.start_soon(read, "straddling", s + 256 * 2**10 - 100, s + 256 * 2**10 - 100 + chunk)
            nursery.start_soon(read, "late", s + 4 * MiB, s + 4 * MiB + chunk)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    for name, (_, data) in seen.items():
        assert len(data) == chunk, name
    s = target.requests[0][0]
    assert seen["first"][1] == target.content(s, s + chunk, 0)
    assert seen["straddling"][1] == target.content(s + 256 * 2**10 - 100, s + 256 * 2**10 - 100 + chunk, 0)
    assert seen["first"][0] <= 0.035, seen["first"][0]  # latency + one piece, not 8 MiB
    assert seen["straddling"][0] <= 0.045, seen["straddling"][0]
    assert 0.17 <= seen["late"][0] <= 0.2, seen["late"][0]  # 4 MiB in: half the stretch


def test_a_retried_stretch_never_mixes_bytes_of_two_attempts() -> None:
    # The first attempt breaks off after 1 MiB; the retry starts again at 0 with bytes that
    # differ (another mirror, a changed object): every key read comes whole from one attempt.
    chunk = 64 * 2**10
    target = StreamingTarget(64 * MiB, fail_at=MiB)
    got: list[tuple[int, bytes]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ra, s = await stretch_of(target, chunk, nursery)

            async def read(off: int) -> None:
                found = await ra.lookup(URL, s + off, s + off + chunk)
                assert found is not None
                got.append((off, bytes(found[0])))

            for off in range(0, 2 * MiB, chunk):
                nursery.start_soon(read, off)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    s = target.requests[0][0]
    assert len(got) == 32
    attempts = {off: [a for a in (0, 1) if data == target.content(s + off, s + off + chunk, a)]
                for off, data in got}
    assert all(len(a) == 1 for a in attempts.values()), attempts
    # keys past where the first attempt broke off come from the retry
    assert all(attempts[off] == [1] for off in range(MiB, 2 * MiB, chunk))


def test_a_stretch_that_fails_leaves_its_readers_to_fetch_on_their_own() -> None:
    chunk = 64 * 2**10
    target = StreamingTarget(64 * MiB, fail_at=MiB, fail_for_good=True)
    results: dict[int, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ra, s = await stretch_of(target, chunk, nursery)

            async def read(off: int) -> None:
                results[off] = await ra.lookup(URL, s + off, s + off + chunk)

            nursery.start_soon(read, 0)  # arrives before the failure
            nursery.start_soon(read, 2 * MiB)  # never arrives
            await trio.sleep(5)
            assert ra.peek(URL, s, s + chunk) is None  # the failed stretch is gone
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert results[0] is not None
    assert results[2 * MiB] is None


def test_a_caller_outside_trio_is_called_back_when_its_part_has_arrived() -> None:
    # The HTTP front end's handlers run on the host loop: they wait for a key's part of a
    # stretch through a callback, not in trio.
    chunk = 64 * 2**10
    target = StreamingTarget(64 * MiB)  # 256 KiB every 10 ms after 20 ms
    called: dict[str, float] = {}
    answers: dict[str, bool] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            ra, s = await stretch_of(target, chunk, nursery)
            began = trio.current_time()

            def call(name: str) -> Callable[[], None]:
                return lambda: called.setdefault(name, trio.current_time() - began)

            answers["early"] = ra.when_arrived(URL, s, s + chunk, call("early"))
            answers["mid"] = ra.when_arrived(URL, s + 2 * MiB, s + 2 * MiB + chunk, call("mid"))
            answers["elsewhere"] = ra.when_arrived(URL, 40 * MiB, 40 * MiB + chunk, call("elsewhere"))
            assert ra.peek(URL, s, s + chunk) is None  # not there yet
            await trio.sleep(1)
            assert ra.peek(URL, s, s + chunk) is not None
            answers["arrived"] = ra.when_arrived(URL, s, s + chunk, call("arrived"))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert answers == {"early": True, "mid": True, "elsewhere": False, "arrived": False}
    assert set(called) == {"early", "mid"}
    assert called["early"] <= 0.035, called
    assert 0.09 <= called["mid"] <= 0.12, called  # 2 MiB in: nine pieces
