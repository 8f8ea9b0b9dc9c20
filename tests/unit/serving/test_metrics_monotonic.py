"""Exported counters never go down while a process runs: the final counters of the set
versions ``Sets`` closes (the least recently used idle set, a version replaced by a reload, a
set gone from the catalogue) are kept (serving/retired.py) and added by the collector; and the
disk cache's writes and evictions, counted by the cache writer process, are exported. Real
``Sets``, ``Stats``, ``MemoryLRU`` and cache writer process; no FUSE, no server."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families

from refmount.base.stats import Stats
from refmount.cache.blocks import DiskCache, MemoryLRU
from refmount.cache.writer import CacheWriter
from refmount.serving.metrics import MetricsCollector, Reading, exposition
from refmount.serving.retired import RetiredCounters
from refmount.sets.opensets import Sets
from refmount.sets.setslots import Opened, SetSlot, SetVersion

KiB, MiB = 2**10, 2**20
URL = "https://h.example/data.nc"


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def value(text: bytes, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    options: dict[str, str] = field(default_factory=dict)


class Core:
    """A set's core as the collector and ``Sets`` see it, with real counters."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.reader = type("Reader", (), {})()
        self.reader.memory = MemoryLRU(1000)
        self.reader.target_readahead = type("Readahead", (), {"inflight_bytes": 0})()
        self.disk = self.writer = None
        self.closed = False

    def bind_loop(self, loop: Any) -> None:
        pass

    def start(self, nursery: trio.Nursery, trim: Any = None) -> None:
        pass

    async def warm(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


def use(core: Core, reads: int) -> None:
    """``reads`` reads of a set, each a miss fetched over HTTPS, and a memory eviction."""
    s = core.stats
    for _ in range(reads):
        s.reads += 1
        s.misses += 1
        s.bytes_read += 100
        s.fetched(URL, 100, 0.01)
        s.request_latency.observe(0.001)
    core.reader.memory.put(object(), b"x" * 600)
    core.reader.memory.put(object(), b"y" * 600)  # evicts the one before


COUNTERS = [("refmount_fuse_requests_total", {"kind": "read"}), ("refmount_read_bytes_total", {}),
            ("refmount_cache_misses_total", {}), ("refmount_fetches_total", {"protocol": "https"}),
            ("refmount_fetched_bytes_total", {"protocol": "https"}),
            ("refmount_cache_evictions_total", {"cache": "memory"}),
            ("refmount_request_duration_seconds_count", {"frontend": "fuse"}),
            ("refmount_request_duration_seconds_bucket", {"frontend": "fuse", "le": "0.001"}),
            ("refmount_fetch_duration_seconds_count", {}), ("refmount_set_opens_total", {})]


def scrape(sets: Sets) -> dict[str, float]:
    text = exposition(MetricsCollector(lambda: Reading(
        "fuse", cores=[v.core for v in sets.counted_versions()], sets=sets.describe(),
        retired=sets.retired)))
    got = samples(text)  # a series gone counts as 0: down
    return {name + str(sorted(labels.items())): got.get((name, tuple(sorted(labels.items()))), 0.0)
            for name, labels in COUNTERS}


def run(names: list[str], body: Callable[[Sets, dict[str, str]], Awaitable[None]], max_open: int) -> None:
    identity = {n: "v1" for n in names}

    def open_set(name: str, entry: Entry) -> Opened:
        return Opened(Core(), identity[name], f"{name}:{identity[name]}")

    async def main() -> None:
        sets = Sets({n: Entry(n, f"/data/{n}.json") for n in names}, open_set=open_set,
                    identify=lambda e: identity[e.name], max_open=max_open)
        async with trio.open_nursery() as nursery:
            sets.attach(nursery, None)
            await body(sets, identity)
            await sets.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def slot(sets: Sets, name: str) -> SetSlot:
    s = sets.slot(name)
    assert s is not None
    return s


async def closed(version: SetVersion) -> None:
    with trio.fail_after(5):
        await version.closed.wait()
    assert version.core.closed


def never_less(before: dict[str, float], after: dict[str, float]) -> None:
    down = {k: (before[k], after[k]) for k in before if after[k] < before[k]}
    assert not down, f"counters went down: {down}"


def test_a_closed_sets_counters_stay_in_the_scrape() -> None:
    async def body(sets: Sets, identity: dict[str, str]) -> None:
        a = await sets.open(slot(sets, "a"))
        sets.hold(a)  # a file open on a: it stays open while b opens
        b = await sets.open(slot(sets, "b"))
        use(a.core, 5)
        use(b.core, 2)
        both = scrape(sets)
        assert both["refmount_fuse_requests_total[('kind', 'read')]"] == 7
        sets.drop(a)  # over max_open=1: a (least recently used, idle now) closes
        await closed(a)
        assert [v.core for v in sets.counted_versions()] == [b.core]
        after = scrape(sets)
        never_less(both, after)
        assert after == both  # a's counts kept, exactly
        # a reload swaps b's version: the old one's counts stay too
        identity["b"] = "v2"
        assert await sets.check() == 1
        await closed(b)
        use(slot(sets, "b").current.core, 1)
        swapped = scrape(sets)
        never_less(after, swapped)
        assert swapped["refmount_fuse_requests_total[('kind', 'read')]"] == 8
        assert swapped["refmount_set_opens_total[]"] == 3
        # b removed from the catalogue: its versions stay counted
        new_b = slot(sets, "b").current
        sets.update({"a": sets.slot("a").entry})
        await closed(new_b)
        gone = scrape(sets)
        never_less(swapped, gone)
        assert gone["refmount_fuse_requests_total[('kind', 'read')]"] == 8

    run(["a", "b"], body, max_open=1)


def test_disk_cache_writes_and_evictions_are_exported_and_kept_once_retired(tmp_path: Path) -> None:
    disk = DiskCache(str(tmp_path / "cache"), 1 * MiB)  # room for about 15 blocks of 64 KiB
    disk.scan()
    core = Core()
    core.disk, core.writer = disk, CacheWriter(disk, core.stats, ring_size=1 * MiB)
    reading = Reading("fuse", cores=[core])
    collector = MetricsCollector(lambda: reading)
    text = exposition(collector)
    assert value(text, "refmount_cache_evictions_total", cache="disk") == 0
    assert value(text, "refmount_cache_bytes", cache="disk") == 0  # the daemon's scan: empty
    assert core.writer.start() is not None
    try:
        n, count = 64 * KiB, 30
        for i in range(count):
            while True:
                dropped = core.stats.cache_writes_dropped
                core.writer.submit(URL, i * n, bytes([i]) * n)
                if core.stats.cache_writes_dropped == dropped:
                    break
                time.sleep(0.02)
    finally:
        core.writer.close(timeout=10)
    text = exposition(collector)
    size = DiskCache.HEADER_SIZE + n
    on_disk = sum(s for _, s, _ in disk.files())
    evicted = count - on_disk // size
    assert evicted > 0
    assert value(text, "refmount_cache_evictions_total", cache="disk") == evicted
    assert value(text, "refmount_cache_evicted_bytes_total", cache="disk") == evicted * size
    assert value(text, "refmount_cache_written_bytes_total", cache="disk") == count * size
    assert value(text, "refmount_cache_written_blocks_total", cache="disk") == count
    assert value(text, "refmount_cache_bytes", cache="disk") == on_disk <= disk.capacity
    assert value(text, "refmount_cache_evictions_total", cache="memory") == 0
    # the core closes: its counts move to the retired ones, the scrape keeps them
    retired = RetiredCounters()
    retired.fold(core)
    reading.cores, reading.retired = [], retired
    later = exposition(collector)
    assert value(later, "refmount_cache_evictions_total", cache="disk") == evicted
    assert value(later, "refmount_cache_written_bytes_total", cache="disk") == count * size
    assert ("refmount_cache_bytes", (("cache", "disk"),)) not in samples(later)  # no set: not known


def test_a_closing_version_counts_until_its_counts_are_retired() -> None:
    """Closing a core takes time (its cache writer drains its ring, up to 5 s): meanwhile the
    version is no longer open, and still counted."""
    release = threading.Event()

    async def body(sets: Sets, identity: dict[str, str]) -> None:
        a = await sets.open(slot(sets, "a"))
        use(a.core, 4)
        before = scrape(sets)
        a.core.close = lambda timeout=5.0: release.wait(10)  # a slow drain
        await sets.open(slot(sets, "b"))  # over max_open=1: a closes
        with trio.fail_after(5):
            await a.closing.wait()
        await trio.sleep(0.05)
        assert not a.closed.is_set() and a not in sets.open_versions()
        never_less(before, scrape(sets))
        release.set()
        with trio.fail_after(5):
            await a.closed.wait()
        never_less(before, scrape(sets))

    run(["a", "b"], body, max_open=1)
