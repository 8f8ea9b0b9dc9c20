"""The read path under real mounts: merging of neighbouring ranges, the disk-cache
writer process, and zero-copy replies that span blocks. (Throughput is measured by
python -m bench, never asserted here.)"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from pathlib import Path

import psutil
import pytest
from support.probes import HEADER, log_lines, run_readers, stats, wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

KiB = 1024


def one_target_set(srv, tmp_path: Path, n: int, size: int, spacing: int, name: str = "refs.json"
                   ) -> tuple[Path, str, dict[str, bytes]]:
    """``n`` range references of ``size`` bytes, ``spacing`` bytes apart, into one target."""
    blob = random.Random(n).randbytes(n * spacing + size)
    path = f"/data/{name}.bin"
    url = srv.put(path, blob)
    refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
    expected = {}
    for i in range(n):
        refs[f"c/{i}"] = [url, i * spacing, size]
        expected[f"c/{i}"] = blob[i * spacing : i * spacing + size]
    source = tmp_path / name
    source.write_text(json.dumps(refs))
    return source, path, expected


def read_all_at_once(mnt: Path, keys: list[str]) -> dict[str, bytes | Exception]:
    """Every key read by its own thread, all released together."""
    got: dict[str, bytes | Exception] = {}
    start = threading.Barrier(len(keys))

    def read(key: str) -> None:
        start.wait()
        try:
            got[key] = (mnt / key).read_bytes()
        except OSError as e:
            got[key] = e

    threads = [threading.Thread(target=read, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return got


def test_neighbouring_ranges_read_together_share_requests(srv, tmp_path, mount):
    """A slow target and many readers of adjacent chunks: ranges that wait while requests to
    the same target are in flight go out as merged requests, each reader gets its bytes."""
    source, path, expected = one_target_set(srv, tmp_path, n=48, size=4 * KiB, spacing=4 * KiB)
    srv.add_fault(path, "delay", times=None, seconds=0.3)
    m = mount(source, "no_disk_cache", "max_readahead=0")  # merging alone, no readahead
    got = read_all_at_once(m.path, list(expected))
    wrong = [k for k in expected if got.get(k) != expected[k]]
    assert not wrong, {k: got.get(k) for k in wrong[:5]}
    s = stats(m)
    assert srv.count(path) < len(expected), f"{srv.count(path)} requests for {len(expected)} ranges"
    assert s["merged"] > 0 and s["requests"] == srv.count(path), s
    # every request the server saw asked for one contiguous range of the target
    for req in srv.log(path):
        assert req.range is not None and req.range.startswith("bytes="), req.range


@pytest.mark.parametrize(("spacing", "opt"), [(512 * KiB, "merge_gap=64K"), (4 * KiB, "merge_gap=off")],
                         ids=["farther-than-merge_gap", "merge_gap-off"])
def test_ranges_not_merged_get_one_request_each(srv, tmp_path, mount, spacing, opt):
    """Ranges further apart than merge_gap, or any ranges with merging off, are fetched by
    requests of their own."""
    source, path, expected = one_target_set(srv, tmp_path, n=16, size=4 * KiB, spacing=spacing)
    srv.add_fault(path, "delay", times=None, seconds=0.3)
    m = mount(source, "no_disk_cache", opt, "max_readahead=0")
    got = read_all_at_once(m.path, list(expected))
    assert all(got[k] == expected[k] for k in expected)
    assert srv.count(path) == len(expected)
    assert stats(m)["merged"] == 0


def test_a_failing_merged_request_fails_only_its_reads(srv, tmp_path, mount):
    """A merged request that keeps failing gives EIO to the reads it served; they and all
    others succeed once the target recovers."""
    source, path, expected = one_target_set(srv, tmp_path, n=32, size=4 * KiB, spacing=4 * KiB)
    srv.add_fault(path, "delay", times=4, seconds=0.3)  # the first requests are slow...
    srv.add_fault(path, "status", times=None, status=500)  # ...and all later ones fail
    m = mount(source, "no_disk_cache", "retries=0", "max_readahead=0")
    got = read_all_at_once(m.path, list(expected))
    failed = [k for k, v in got.items() if isinstance(v, OSError)]
    assert failed, "expected the failing requests to give errors"
    assert all(got[k].errno == 5 for k in failed)
    assert all(got[k] == expected[k] for k in expected if k not in failed)
    srv.clear_faults(path)
    for k in failed:
        assert (m.path / k).read_bytes() == expected[k]


def writer_process(m) -> psutil.Process:
    daemon = next(p for p in psutil.process_iter(["cmdline"])
                  if "refmount.fuse.daemon" in " ".join(p.info["cmdline"] or [])
                  and str(m.path) in " ".join(p.info["cmdline"] or []))
    found = wait_for(lambda: [c for c in daemon.children()
                              if "refmount.cache.writer" in " ".join(c.cmdline())], 10)
    assert found and len(found) == 1, found
    return found[0]


def block_count(cache: Path) -> int:
    return sum(1 for p in (cache / "blocks").glob("*/*") if not p.name.endswith(".tmp"))


def test_blocks_written_by_the_writer_process_serve_the_next_mount(srv, tmp_path, mount):
    source, path, expected = one_target_set(srv, tmp_path, n=20, size=100 * KiB + 3,
                                            spacing=300 * KiB)
    cache = tmp_path / "cache"
    m1 = mount(source, f"cache_dir={cache}", "max_readahead=0")  # one block per key
    assert writer_process(m1).is_running()
    for k in expected:
        assert (m1.path / k).read_bytes() == expected[k]
    assert wait_for(lambda: block_count(cache) == len(expected), 10), block_count(cache)
    writer = writer_process(m1)
    m1.cleanup()
    assert wait_for(lambda: not writer.is_running() or writer.status() == psutil.STATUS_ZOMBIE, 10)
    srv.reset_log()
    m2 = mount(source, f"cache_dir={cache}", "max_readahead=0")
    for k in expected:
        assert (m2.path / k).read_bytes() == expected[k]
    assert srv.count(path) == 0, "blocks on disk were fetched again"
    assert stats(m2)["disk_hits"] == len(expected)


def test_mount_keeps_serving_when_the_writer_process_dies(srv, tmp_path, mount):
    source, _path, expected = one_target_set(srv, tmp_path, n=16, size=50 * KiB, spacing=100 * KiB)
    cache = tmp_path / "cache"
    m = mount(source, f"cache_dir={cache}")
    keys = list(expected)
    for k in keys[:4]:
        assert (m.path / k).read_bytes() == expected[k]
    writer_process(m).kill()
    time.sleep(0.3)
    for k in keys[4:]:
        assert (m.path / k).read_bytes() == expected[k]
    warned = wait_for(lambda: log_lines(m, "cache writer process"), 10)
    assert warned and len(warned) == 1, warned
    assert "WARNING" in warned[0]
    assert not log_lines(m, "read failed")


def test_reads_spanning_blocks_of_a_whole_file(srv, tmp_path, mount):
    """Reads at offsets that cross block boundaries (small block_size) return the right bytes:
    replies are views into one block, or joined when a read spans two."""
    blob = random.Random(2).randbytes(3 * 64 * KiB + 1234)
    url = srv.put("/whole.bin", blob)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"f": [url]}))
    m = mount(source, "no_disk_cache", "block_size=64K", "max_readahead=128K")
    fd = os.open(m.path / "f", os.O_RDONLY)
    try:
        for off, n in [(0, 100), (64 * KiB - 10, 20), (60 * KiB, 70 * KiB), (3 * 64 * KiB, 5000),
                       (len(blob) - 1, 10), (len(blob), 10)]:
            assert os.pread(fd, n, off) == blob[off : off + n], (off, n)
    finally:
        os.close(fd)
    assert (m.path / "f").read_bytes() == blob


def test_keys_read_in_target_order_are_prefetched(srv, tmp_path, mount):
    """One reader going through chunks laid out one after another in a target: after a few
    misses the following stretch of the target is fetched ahead, in few requests, and the
    end of the target (mid-stretch) is no error."""
    source, path, expected = one_target_set(srv, tmp_path, n=64, size=64 * KiB, spacing=64 * KiB)
    cache = tmp_path / "cache"
    m = mount(source, f"cache_dir={cache}")
    for i in range(len(expected)):
        assert (m.path / f"c/{i}").read_bytes() == expected[f"c/{i}"], i
    s = stats(m)
    assert s["prefetch_hits"] >= len(expected) // 2, s
    assert s["prefetched"] > 0 and srv.count(path) < len(expected) // 2, (s, srv.count(path))
    assert not log_lines(m, "read failed")
    # chunks read ahead were stored in the page cache when opened: their reads never came
    assert s["pushed"] >= 32 * 64 * KiB and s["reads"] < len(expected) // 2, s


def test_without_page_push_every_chunk_is_a_read(srv, tmp_path, mount):
    source, _path, expected = one_target_set(srv, tmp_path, n=32, size=64 * KiB, spacing=64 * KiB)
    m = mount(source, "no_disk_cache", "no_page_push")
    for i in range(len(expected)):
        assert (m.path / f"c/{i}").read_bytes() == expected[f"c/{i}"], i
    s = stats(m)
    assert s["pushed"] == 0 and s["reads"] >= len(expected) and s["prefetch_hits"] > 0, s


def test_page_push_with_many_readers_of_the_same_chunks(srv, tmp_path, mount):
    """Readers going through the same chunks at once (several opens of a file, READs in
    flight while another opens it): right bytes for all, and no hang — a store into a page
    that a pending READ holds would wait for the FUSE thread forever."""
    source, _path, expected = one_target_set(srv, tmp_path, n=96, size=48 * KiB, spacing=48 * KiB)
    m = mount(source, "no_disk_cache")
    keys = [f"c/{i}" for i in range(len(expected))]
    bad: list[str] = []

    def reader(seed: int) -> None:
        order = keys[seed % 3:] + keys[: seed % 3]  # slightly staggered, mostly in order
        for k in order:
            with open(m.path / k, "rb") as f:
                first = f.read(1000)
                data = first + f.read()
            if data != expected[k]:
                bad.append(k)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "readers hung"
    assert not bad, bad[:5]
    assert stats(m)["pushed"] > 0


def settled_block_count(cache: Path) -> int:
    """The number of block files once the writer has stopped adding any."""
    counts = [-1]

    def settled() -> bool:
        counts.append(block_count(cache))
        return counts[-1] == counts[-2] and not list((cache / "blocks").glob("*/*.tmp"))

    assert wait_for(settled, 10, interval=0.3)
    return counts[-1]


def test_prefetched_stretches_are_cached_as_grid_blocks(srv, tmp_path, mount):
    """Stretches read ahead across keys go to the disk cache as block_size blocks of the
    target (not a file per key), the last one cut short by the end of the target; the next
    mount serves every key from them — several keys per block loaded — without a request."""
    source, path, expected = one_target_set(srv, tmp_path, n=100, size=64 * KiB, spacing=64 * KiB)
    cache = tmp_path / "cache"
    keys = [f"c/{i}" for i in range(len(expected))]
    m1 = mount(source, f"cache_dir={cache}", "block_size=1M")
    for k in keys:
        assert (m1.path / k).read_bytes() == expected[k], k
    assert stats(m1)["prefetch_hits"] >= 90
    files = settled_block_count(cache)
    # 7 grid blocks (16 keys each; the last one short) + the keys before the first block
    assert files <= len(keys) // 4, files
    m1.cleanup()
    srv.reset_log()
    m2 = mount(source, f"cache_dir={cache}", "block_size=1M")
    for k in keys:
        assert (m2.path / k).read_bytes() == expected[k], k
    assert srv.count(path) == 0, "keys in blocks on disk were fetched again"
    s = stats(m2)
    assert s["disk_hits"] <= files and s["misses"] == 0, s
    assert not log_lines(m2, "corrupt")


def test_keys_read_out_of_order_are_not_prefetched(srv, tmp_path, mount):
    source, path, expected = one_target_set(srv, tmp_path, n=40, size=16 * KiB, spacing=4 * 2**20 // 8)
    m = mount(source, "no_disk_cache")
    order = list(range(len(expected)))
    random.Random(4).shuffle(order)
    for i in order:
        assert (m.path / f"c/{i}").read_bytes() == expected[f"c/{i}"], i
    s = stats(m)
    assert s["prefetched"] == 0 and s["prefetch_hits"] == 0, s
    assert srv.count(path) == len(expected)


def test_transient_errors_during_readahead_do_not_fail_reads(srv, tmp_path, mount):
    """Requests failing while readahead runs (whichever of the reader's and the
    readahead's requests they hit): every read still gets its bytes."""
    source, path, expected = one_target_set(srv, tmp_path, n=24, size=64 * KiB, spacing=64 * KiB)
    m = mount(source, "no_disk_cache", "retries=5")
    for i in range(3):
        assert (m.path / f"c/{i}").read_bytes() == expected[f"c/{i}"]
    srv.add_fault(path, "status", times=2, status=503)
    for i in range(3, len(expected)):
        assert (m.path / f"c/{i}").read_bytes() == expected[f"c/{i}"], i
    assert not log_lines(m, "read failed")


def test_mounts_sharing_a_cache_never_share_bytes_of_different_targets(srv, tmp_path, mount):
    """Two reference sets in two directories name the same relative path, "data.bin", for
    different files, and a third names a served file the same way; all share one cache
    directory: each mount serves its own bytes."""
    cache = tmp_path / "cache"
    got = {}
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "data.bin").write_bytes(name.encode() * 1000)
        (d / "refs.json").write_text(json.dumps({"k": ["data.bin", 0, 100], "w": ["data.bin"]}))
        m = mount(d / "refs.json", f"cache_dir={cache}")
        got[name] = ((m.path / "k").read_bytes(), (m.path / "w").read_bytes())
        m.cleanup()
    assert got["a"] == (b"a" * 100, b"a" * 1000)
    assert got["b"] == (b"b" * 100, b"b" * 1000)


def cached_keys(cache: Path, expected: dict[str, bytes]) -> dict[str, Path]:
    """Which keys have a block file, found by content (the data follows the header)."""
    by_data = {data: key for key, data in expected.items()}
    found = {}
    for p in (cache / "blocks").glob("*/*"):
        if not p.name.endswith(".tmp"):
            key = by_data.get(p.read_bytes()[HEADER:])
            assert key is not None, f"{p} holds bytes of no key"
            found[key] = p
    return found


def cache_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in (cache / "blocks").glob("*/*"))


def test_disk_cache_stays_under_cache_size_evicting_least_recently_used(srv, tmp_path, mount):
    """``cache_size`` bounds the block files; what goes is what was used least recently, by
    any mount of the directory: recency is a block file's mtime, refreshed when a hit finds
    it older than ``DiskCache.TOUCH_AFTER``."""
    source, path, expected = one_target_set(srv, tmp_path, n=12, size=512 * KiB, spacing=512 * KiB)
    keys = list(expected)
    cache = tmp_path / "cache"
    opts = (f"cache_dir={cache}", "cache_size=4M", "max_readahead=0")  # one block per key
    block = HEADER + 512 * KiB

    m1 = mount(source, *opts)
    for k in keys[:6]:
        assert (m1.path / k).read_bytes() == expected[k]
    m1.cleanup()  # the daemon lets its writer finish
    first = cached_keys(cache, expected)
    assert sorted(first) == sorted(keys[:6])
    now = time.time()
    for i, k in enumerate(keys[:6]):  # used an hour ago, in key order
        os.utime(first[k], (now - 3600 + i, now - 3600 + i))

    m2 = mount(source, *opts)
    assert (m2.path / keys[0]).read_bytes() == expected[keys[0]]  # used again: now the newest
    assert stats(m2)["disk_hits"] == 1
    for k in keys[6:]:  # 6 more blocks: 12 would be 6.05 MiB
        assert (m2.path / k).read_bytes() == expected[k]
    m2.cleanup()
    total = cache_bytes(cache)
    assert total <= 4 * 2**20, f"{total} bytes in block files, cache_size is 4 MiB"
    kept = cached_keys(cache, expected)
    # Each write past 4 MiB evicts down to 90 %: the five least recently used blocks go.
    assert sorted(kept) == sorted([keys[0], *keys[6:]]), sorted(kept)
    assert total == 7 * block

    srv.reset_log()
    m3 = mount(source, *opts)
    for k in [keys[0], *keys[6:]]:
        assert (m3.path / k).read_bytes() == expected[k]
    assert srv.count(path) == 0, "blocks kept on disk were fetched again"
    assert (m3.path / keys[1]).read_bytes() == expected[keys[1]]
    assert srv.count(path) == 1, "an evicted block must be fetched"


def test_the_kernel_keeps_data_names_and_missing_names(srv, tmp_path, mount):
    """The set never changes, so the kernel may keep everything: file data across opens
    (keep_cache), names and attributes (long timeouts) and missing names (negative entries).
    Once seen, none of them costs the daemon a request again. READs are as large as the
    kernel allows: 1 MiB, not libfuse's former 128 KiB."""
    blob = random.Random(5).randbytes(8 * 2**20)
    url = srv.put("/data/whole.bin", blob)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({".zgroup": '{"zarr_format": 2}', "w": [url], "d/x": [url, 10, 100]}))
    m = mount(source, "no_disk_cache")

    def counts() -> tuple[int, int, int]:
        s = stats(m)
        return s["lookups"], s["opens"], s["reads"]

    lookups0, opens0, reads0 = counts()
    for _ in range(3):
        for name in ("nope", "d/nope", "d/x", "w"):
            try:
                os.stat(m.path / name)
            except FileNotFoundError:
                assert "nope" in name
    # nope, d, d/nope, d/x, w: each looked up once
    assert counts() == (lookups0 + 5, opens0, reads0), counts()

    with open(m.path / "w", "rb", buffering=0) as f:
        while f.read(4 * 2**20):
            pass
    lookups1, opens1, reads1 = counts()
    assert (lookups1, opens1) == (lookups0 + 5, opens0 + 1)
    assert 1 <= reads1 - reads0 <= 9, f"{reads1 - reads0} READs for 8 MiB"
    for _ in range(2):
        assert (m.path / "w").read_bytes() == blob  # opened again: the page cache answers
    assert counts() == (lookups1, opens1 + 2, reads1), counts()


def requested(srv, path: str) -> list[tuple[int, int]]:
    """(start, end) of each range request the server saw for ``path``, in arrival order."""
    out = []
    for req in srv.log(path):
        assert req.range is not None and req.range.startswith("bytes="), req.range
        a, b = req.range[len("bytes="):].split("-")
        out.append((int(a), int(b) + 1))
    return out


def quiet(srv, path: str, seconds: float = 0.5) -> None:
    """Wait until no new request for ``path`` has come for ``seconds`` (readahead settled)."""
    n = -1
    while n != srv.count(path):
        n = srv.count(path)
        time.sleep(seconds)


def test_concurrent_reads_of_the_same_bytes_share_one_request(srv, tmp_path, mount):
    """Eight keys name the same 2 MiB range; sixteen readers read different parts of them at
    once, past the kernel's page cache: the daemon fetches the range once (single-flight)."""
    blob = random.Random(11).randbytes(4 * 2**20)
    path = "/data/shared.bin"
    url = srv.put(path, blob)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({f"k{i}": [url, 1000, 2 * 2**20] for i in range(8)}))
    srv.add_fault(path, "delay", times=None, seconds=0.5)  # all readers arrive while it is in flight
    m = mount(source, "no_disk_cache", "max_readahead=0")
    start = threading.Barrier(16)
    got: dict[tuple[int, int], bytes | Exception] = {}

    def read(i: int) -> None:
        key, off = f"k{i % 8}", (i // 8) * 2**20 + i * 4096
        fd = os.open(m.path / key, os.O_RDONLY)
        try:
            start.wait()
            got[(i, off)] = os.pread(fd, 4096, off)
        except OSError as e:
            got[(i, off)] = e
        finally:
            os.close(fd)

    run_readers(read, 16, timeout=30)
    assert len(got) == 16 and all(v == blob[1000 + off : 1000 + off + 4096] for (_, off), v in got.items())
    assert requested(srv, path) == [(1000, 1000 + 2 * 2**20)]
    assert stats(m)["reads"] >= 16  # they all came to the daemon


def test_requests_to_one_host_are_bounded_by_max_connections(srv, tmp_path, mount):
    """24 readers of 24 ranges (never merged), with a slow target: no more than
    ``max_connections`` requests are in flight at once, and all 24 get their bytes."""
    source, path, expected = one_target_set(srv, tmp_path, n=24, size=8 * KiB, spacing=256 * KiB)
    srv.add_fault(path, "delay", times=None, seconds=0.2)
    m = mount(source, "no_disk_cache", "max_readahead=0", "merge_gap=off", "max_connections=3")
    got = read_all_at_once(m.path, list(expected))
    assert all(got[k] == expected[k] for k in expected)
    log = srv.log(path)
    assert len(log) == 24
    events = sorted([(r.time, 1) for r in log] + [(r.end, -1) for r in log])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 3, f"{peak} requests in flight at once with max_connections=3"


def test_small_ranges_are_fetched_whole_and_big_ones_by_blocks(srv, tmp_path, mount):
    """A range reference up to ``whole_fetch_limit`` is fetched whole on its first read; a
    bigger one, and a whole file, by the ``block_size`` blocks that the reads touch."""
    blob = random.Random(12).randbytes(24 * 2**20)
    path = "/data/big.bin"
    url = srv.put(path, blob)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"small": [url, 777, 3 * 2**20], "big": [url, 999, 20 * 2**20],
                                  "whole": [url]}))
    m = mount(source, "no_disk_cache", "max_readahead=0", "whole_fetch_limit=4M", "block_size=1M")

    def pread(key: str, off: int) -> None:
        fd = os.open(m.path / key, os.O_RDONLY)
        try:
            base = {"small": 777, "big": 999, "whole": 0}[key]
            assert os.pread(fd, 4096, off) == blob[base + off : base + off + 4096]
        finally:
            os.close(fd)

    pread("small", 2 * 2**20)
    assert requested(srv, path) == [(777, 777 + 3 * 2**20)]
    srv.reset_log()
    pread("big", 5 * 2**20 + 10)
    assert requested(srv, path) == [(999 + 5 * 2**20, 999 + 6 * 2**20)]
    srv.reset_log()
    pread("whole", 7 * 2**20 + 10)
    assert requested(srv, path) == [(7 * 2**20, 8 * 2**20)]


def test_readahead_grows_while_a_reader_streams_and_stops_when_it_seeks(srv, tmp_path, mount):
    blob = random.Random(13).randbytes(64 * 2**20)
    path = "/data/stream.bin"
    url = srv.put(path, blob)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"f": [url]}))
    m = mount(source, "no_disk_cache", "block_size=1M", "max_readahead=16M")
    fd = os.open(m.path / "f", os.O_RDONLY)
    try:
        for off in range(0, 8 * 2**20, 2**20):  # streaming
            assert os.pread(fd, 2**20, off) == blob[off : off + 2**20]
        quiet(srv, path)
        ahead = max(end for _, end in requested(srv, path))
        # the window doubles per read up to max_readahead: blocks far past the last read
        assert ahead >= 8 * 2**20 + 8 * 2**20, f"fetched up to {ahead / 2**20:.1f} MiB after reading 8"
        assert ahead <= 8 * 2**20 + 16 * 2**20 + 2**20, "readahead past max_readahead"
        srv.reset_log()
        for off in (50 * 2**20, 30 * 2**20 + 4096, 60 * 2**20 + 8192):  # seeks
            assert os.pread(fd, 4096, off) == blob[off : off + 4096]
        quiet(srv, path)
        blocks = sorted(start // 2**20 for start, _ in requested(srv, path))
        assert blocks == [30, 50, 60], f"after seeks, fetched blocks {blocks}"
    finally:
        os.close(fd)


def test_every_request_goes_through_the_quick_request_wait(srv, tmp_path, mount):
    """pyfuse3's request loop waits with fuse/requestwait.py's lock and wait: every request
    the kernel sent (at least a LOOKUP and an OPEN a chunk) was counted by it, read at once
    or after a wait, as the daemon logs when it unmounts; and the chunks are right. The
    targets' file system was loaded ahead of the first fetch (``SetCore.warm``)."""
    source, _path, expected = one_target_set(srv, tmp_path, n=64, size=64 * KiB, spacing=64 * KiB)
    m = mount(source, "no_disk_cache")
    keys = list(expected)
    got = {}
    for i in range(0, len(keys), 16):  # 16 readers at a time
        got.update(read_all_at_once(m.path, keys[i : i + 16]))
    assert got == expected
    assert not m.unmount() and not m.reap()
    lines = log_lines(m, "requests read without waiting:")
    assert len(lines) == 1, lines
    fast, waited = (int(x) for x in re.findall(r"\d+", lines[0].split("without waiting:")[1]))
    assert fast + waited >= 2 * len(keys), lines
    # the HTTP file system was imported once the mount served, by a worker thread
    assert log_lines(m, "loaded the file systems of http ahead of the first fetch")
