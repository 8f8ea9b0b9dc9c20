"""CacheWriter without FUSE: its real child process writing into a DiskCache under tmp_path.

Each test ends only the child it started (by its PID, through the writer's own record).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from refmount.base.stats import Stats
from refmount.cache import writer as cachewriter
from refmount.cache.blocks import DiskCache
from refmount.cache.writer import CacheWriter

KiB, MiB = 2**10, 2**20
URL = "http://example.invalid/data.bin"


def block(i: int, n: int) -> bytes:
    return bytes((i + j) % 251 for j in range(n))


@pytest.fixture
def disk(tmp_path: Path) -> DiskCache:
    d = DiskCache(str(tmp_path / "cache"), 64 * MiB)
    d.scan()  # as the daemon does at start: the presence filter then answers misses
    return d


@pytest.fixture
def writer(disk: DiskCache) -> Iterator[CacheWriter]:
    w = CacheWriter(disk, Stats(), ring_size=256 * KiB)
    yield w
    if w.pid is not None and w.exit_status() is None:
        os.kill(w.pid, signal.SIGCONT)  # a test may have stopped it
    w.close(timeout=10)


def start(w: CacheWriter) -> None:
    stderr = w.start()
    assert stderr is not None, "the cache writer child did not start"
    stderr.close()  # its log lines are not relayed here


def test_submitted_blocks_are_on_disk_after_close(disk: DiskCache, writer: CacheWriter) -> None:
    start(writer)
    assert not disk.may_contain(URL, 0, 64 * KiB)
    blocks = {(i * 100 * KiB, n): block(i, n) for i, n in enumerate([64 * KiB, 1, 5000, 100 * KiB])}
    for (at, n), data in blocks.items():
        writer.submit(URL, at, data)
        assert disk.may_contain(URL, at, n)  # marked at once, before the child wrote it
    # A grid block ending at the end of its target: stored under the grid's length.
    writer.submit(URL, 8 * MiB, b"tail", key_length=64 * KiB)
    writer.close(timeout=10)
    assert writer.exit_status() == 0
    for (at, n), data in blocks.items():
        assert bytes(disk.get(URL, at, n)) == data
    assert bytes(disk.get(URL, 8 * MiB, 64 * KiB, upto=True)) == b"tail"
    assert writer.stats.cache_writes_dropped == 0


def test_a_full_ring_drops_blocks_and_never_blocks(disk: DiskCache, writer: CacheWriter) -> None:
    start(writer)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGSTOP)  # the disk "is slower than the network"
    n = 64 * KiB  # the ring holds four
    for i in range(6):
        writer.submit(URL, i * n, block(i, n))
    assert writer.stats.cache_writes_dropped == 2
    assert not disk.may_contain(URL, 5 * n, n)  # a dropped block is not marked
    os.kill(writer.pid, signal.SIGCONT)
    writer.close(timeout=10)
    for i in range(4):
        assert bytes(disk.get(URL, i * n, n)) == block(i, n)
    assert disk.get(URL, 4 * n, n) is None and disk.get(URL, 5 * n, n) is None


def test_the_ring_wraps_around_once_the_child_has_caught_up(disk: DiskCache, writer: CacheWriter) -> None:
    start(writer)
    n, count = 48 * KiB, 12  # 48 KiB does not divide the ring: blocks start over at 0 early
    # The child frees space asynchronously: a submit that finds the ring full drops the
    # block (counted), never waits; each block is offered again until it goes in.
    deadline = time.monotonic() + 30
    for i in range(count):
        while True:
            dropped = writer.stats.cache_writes_dropped
            writer.submit(URL, i * n, block(i, n))
            if writer.stats.cache_writes_dropped == dropped:
                break
            assert time.monotonic() < deadline, "the child did not free the ring"
            time.sleep(0.02)
    assert writer.ring_position > 2 * writer.capacity  # round the ring more than twice
    writer.close(timeout=10)
    for i in range(count):
        assert bytes(disk.get(URL, i * n, n)) == block(i, n)


def test_blocks_too_large_for_the_ring_are_not_cached(disk: DiskCache, writer: CacheWriter) -> None:
    start(writer)
    writer.submit(URL, 0, bytes(128 * KiB + 1))  # over half the ring
    writer.close(timeout=10)
    assert disk.get(URL, 0, 128 * KiB + 1) is None
    assert writer.stats.cache_writes_dropped == 0  # skipped, not dropped for want of room


def test_a_child_that_cannot_start_turns_writing_off(disk: DiskCache, writer: CacheWriter,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cachewriter, "module_command", lambda *a: ["/nonexistent/refmount-python"])
    with caplog.at_level(logging.WARNING, logger="refmount.cache.writer"):
        assert writer.start() is None
    assert "cannot start the cache writer process" in caplog.text
    writer.submit(URL, 0, b"abc")  # a no-op, not an error
    assert not disk.may_contain(URL, 0, 3)


def test_a_dead_child_is_noticed_once_and_writing_stops(disk: DiskCache, writer: CacheWriter,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    stderr = writer.start()
    assert stderr is not None and writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.exit_status(10) is not None
    with caplog.at_level(logging.WARNING, logger="refmount.cache.writer"):
        async def relay() -> None:
            with trio.fail_after(10):
                await writer.relay_logs(stderr)  # returns at the child's end of output

        trio.run(relay)
        writer.submit(URL, 0, b"abc")
        writer.submit(URL, 4096, b"def")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "exited" in warnings[0], warnings
    assert not disk.may_contain(URL, 0, 3) and not disk.may_contain(URL, 4096, 3)


def test_a_write_to_a_dead_child_turns_writing_off(disk: DiskCache, writer: CacheWriter,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    start(writer)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.exit_status(10) is not None
    with caplog.at_level(logging.WARNING, logger="refmount.cache.writer"):
        writer.submit(URL, 0, b"abc")  # the note pipe has no reader: EPIPE
    assert "cache writer process is gone" in caplog.text
    writer.submit(URL, 4096, b"def")
    assert not disk.may_contain(URL, 4096, 3)


def test_the_childs_writes_and_evictions_reach_the_daemon(tmp_path: Path) -> None:
    """The child counts what it wrote and evicted in the ring's first page; the daemon reads
    them there (CacheWriter.counters), also once the child has exited."""
    disk = DiskCache(str(tmp_path / "cache"), 1 * MiB)  # room for about 15 blocks of 64 KiB
    disk.scan()
    assert disk.scanned_bytes == 0
    w = CacheWriter(disk, Stats(), ring_size=256 * KiB)
    try:
        assert w.counters() == cachewriter.DiskCounters()  # not started: nothing
        start(w)
        n, count = 64 * KiB, 40
        deadline = time.monotonic() + 30
        for i in range(count):
            while True:  # offered again until the ring has room (as in the wrap-around test)
                dropped = w.stats.cache_writes_dropped
                w.submit(URL, i * n, block(i, n))
                if w.stats.cache_writes_dropped == dropped:
                    break
                assert time.monotonic() < deadline, "the child did not free the ring"
                time.sleep(0.02)
        while w.counters().blocks_written < count:  # read while the child runs
            assert time.monotonic() < deadline, w.counters()
            time.sleep(0.02)
    finally:
        w.close(timeout=10)
    got = w.counters()  # after the child exited: its last values
    size = DiskCache.HEADER_SIZE + n
    assert got.blocks_written == count and got.bytes_written == count * size
    on_disk = [s for _, s, _ in disk.files()]
    assert got.evictions == count - len(on_disk) > 0
    assert got.evicted_bytes == got.evictions * size
    assert got.held_bytes == sum(on_disk) <= disk.capacity
    assert got.write_errors == 0
