"""LinkEstimate and the readahead window it sizes, without FUSE (trio's MockClock: virtual
time, no timing assertions on the real clock)."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from support.fakes import StreamsWhole

from refmount.base.stats import Stats
from refmount.core.targetreadahead import TargetReadahead
from refmount.targets.inflight import LinkEstimate, LinkEstimates

MiB = 2**20
URL = "http://example.invalid/data.bin"


def test_fit_separates_latency_from_bandwidth() -> None:
    link = LinkEstimate()
    assert link.estimate() is None and link.bdp() is None
    assert link.window(4 * MiB, 2 * MiB, 64 * MiB) == 2 * MiB  # no estimate: the floor
    for size in (MiB, 4 * MiB, MiB, 8 * MiB):
        link.observe(size, 0.02 + size / 100e6)
    latency, bandwidth = link.estimate()  # type: ignore[misc]
    assert latency == pytest.approx(0.02)
    assert bandwidth == pytest.approx(100e6)
    assert link.bdp() == pytest.approx(2e6, rel=1e-6)
    # PARALLEL x BDP + one request, within the bounds
    assert link.window(4 * MiB, 0, 1 << 40) == pytest.approx(link.PARALLEL * 2e6 + 4 * MiB, rel=1e-6)
    assert link.window(4 * MiB, 0, 8 * MiB) == 8 * MiB
    assert link.window(4 * MiB, 64 * MiB, 1 << 40) == 64 * MiB


def test_one_size_only_takes_the_shortest_request_as_latency() -> None:
    link = LinkEstimate()
    for seconds in (0.05, 0.03, 0.04):
        link.observe(4 * MiB, seconds)
    latency, bandwidth = link.estimate()  # type: ignore[misc]
    assert latency == 0.03  # an upper bound: never less in flight than needed
    assert bandwidth == pytest.approx(4 * MiB / 0.03)


def test_samples_and_hosts_are_bounded() -> None:
    link = LinkEstimate()
    for i in range(10 * link.SAMPLES):
        link.observe(MiB + i, 0.01)
    link.observe(0, 0.01)  # ignored: nothing learnt from an empty answer
    assert len(link) == link.SAMPLES
    links = LinkEstimates()
    assert links.of("http://a/x") is links.of("http://a/y")
    assert links.of("http://a/x") is not links.of("http://b/x")
    for i in range(2 * links.MAX_HOSTS):
        links.of(f"http://h{i}/x")
    assert len(links) <= links.MAX_HOSTS


class Link(StreamsWhole):
    """A target behind a link: each request takes ``latency`` + its bytes / ``bandwidth``
    (virtual seconds) and is observed by ``links`` as the fetcher does. Records what is in
    flight."""

    def __init__(self, size: int, latency: float, bandwidth: float, links: LinkEstimates) -> None:
        self.size, self.latency, self.bandwidth, self.links = size, latency, bandwidth, links
        self.requests: list[tuple[int, int]] = []
        self.in_flight = self.peak = 0
        self.furthest = 0  # the furthest byte a reader has asked for so far
        self.lead = 0  # the most bytes a request ended ahead of that

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        end = min(end, self.size)
        if start >= end:
            raise ValueError("past the end")
        self.requests.append((start, end))
        self.lead = max(self.lead, end - self.furthest)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        began = trio.current_time()
        try:
            await trio.sleep(self.latency + (end - start) / self.bandwidth)
        finally:
            self.in_flight -= 1
        self.links.of(url).observe(end - start, trio.current_time() - began)
        return bytes(end - start)


def simulate(order: list[int], chunk: int, *, readers: int = 10, latency: float = 0.02,
             bandwidth: float = 100e6, max_window: int = 64 * MiB,
             ) -> tuple[int, Link, TargetReadahead, float]:
    """Readers take chunks in ``order`` (zarr: several at once); a chunk no stretch covers is
    fetched on demand. Returns the demand fetches, the link, the readahead and the virtual
    seconds taken."""
    links = LinkEstimates()
    link = Link((max(order) + 1) * chunk, latency, bandwidth, links)
    ra = TargetReadahead(link, Stats(), capacity=2 * max_window, max_window=max_window,  # type: ignore[arg-type]
                         grid=4 * MiB, links=links)
    out: list[float] = []
    misses = 0

    async def main() -> None:
        nonlocal misses
        todo = iter(order)
        async with trio.open_nursery() as nursery:
            t0 = trio.current_time()

            async def reader() -> None:
                nonlocal misses
                for i in todo:
                    start, end = i * chunk, (i + 1) * chunk
                    link.furthest = max(link.furthest, end)
                    found = await ra.lookup(URL, start, end)
                    if found is None:
                        misses += 1
                        ra.note(URL, start, end, nursery, miss=True)
                        await link.cat_range(URL, start, end)
                    else:
                        assert len(found[0]) == end - start
                        ra.note(URL, start, end, nursery, miss=False)
                    await trio.sleep(0.0002)  # the reader's own work per chunk

            async with trio.open_nursery() as readers_nursery:
                for _ in range(readers):
                    readers_nursery.start_soon(reader)
            out.append(trio.current_time() - t0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return misses, link, ra, out[0]


@pytest.mark.parametrize("latency", [0.02, 0.05])
def test_behind_latency_several_requests_are_in_flight_and_bounded(latency: float) -> None:
    misses, link, ra, _ = simulate(list(range(256)), MiB, latency=latency, max_window=32 * MiB)
    assert misses <= 8
    # several readahead requests at once, each at most TargetReadahead.REQUEST_LIMIT
    assert link.peak >= 4, link.peak
    assert all(e - s <= TargetReadahead.REQUEST_LIMIT for s, e in link.requests)
    # bounded: never further ahead of the readers than the window plus one request,
    # never more held than the capacity, nothing fetched twice beyond a few demand chunks
    assert link.lead <= 32 * MiB + TargetReadahead.REQUEST_LIMIT, link.lead
    assert ra.prefetched_bytes <= ra.capacity
    assert sum(e - s for s, e in link.requests) <= 256 * MiB + 8 * MiB


def test_readahead_stops_on_a_seek() -> None:
    chunk = MiB
    # in order through the first 64 chunks, then a jump far away and scattered reads there
    scattered = list(range(900, 1024))
    random.Random(5).shuffle(scattered)
    order = list(range(64)) + scattered[:40]
    _, link, _, _ = simulate(order, chunk, readers=1)
    # nothing is read ahead past the in-order part beyond one window, and after the jump
    # only the scattered chunks themselves are fetched
    ahead = [(s, e) for s, e in link.requests if 64 * chunk <= s < 900 * chunk]
    assert sum(e - s for s, e in ahead) <= 64 * MiB
    after = [(s, e) for s, e in link.requests if s >= 900 * chunk]
    assert sum(e - s for s, e in after) <= 40 * chunk + 8 * MiB


def test_a_random_reader_pays_nothing() -> None:
    order = list(range(1024))
    random.Random(3).shuffle(order)
    misses, link, _, _ = simulate(order[:200], MiB, readers=4)
    assert misses == 200
    assert sum(e - s for s, e in link.requests) <= 200 * MiB + 8 * MiB
