"""Faults: a real HTTP server that misbehaves on purpose (faultserver.py), a damaged
or full disk cache, signals and killed daemons — through real mounts.

Every test checks what the reader gets (right bytes, or EIO — never wrong bytes), what the
daemon logs (``read failed: key=<key> <url>: ...``) and that the daemon is still serving
afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from support.faultserver import FaultServer
from support.mounts import (
    CLI,
    REPO,
    cli_env,
    daemon_procs,
    fusermount_u,
    is_mounted,
    opts_arg,
    run_cli,
    wait_gone,
)
from support.paths import read_or_errno
from support.probes import HEADER, log_lines, run_readers, stats, wait_for

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

KiB = 1024
SLACK = 1.5  # seconds allowed on top of -o timeout= for an EIO to reach the reader


# --- helpers -----------------------------------------------------------------------------------


class HttpSet:
    """Range references ``[url, OFFSET, size]`` into one target file per key on ``srv``."""

    OFFSET = 7

    def __init__(self, srv: FaultServer, tmp_path: Path, sizes: dict[str, int],
                 whole: dict[str, int] | None = None, name: str = "refs.json", seed: int = 5):
        rng = random.Random(seed)
        self.srv = srv
        self.expected: dict[str, bytes] = {}
        self.paths: dict[str, str] = {}  # key -> URL path on the server
        self.urls: dict[str, str] = {}
        refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
        for key, size in sizes.items():
            path = "/data/" + key.replace("/", "_") + ".bin"
            blob = rng.randbytes(size + 2 * self.OFFSET)
            url = srv.put(path, blob)
            refs[key] = [url, self.OFFSET, size]
            self.expected[key] = blob[self.OFFSET : self.OFFSET + size]
            self.paths[key], self.urls[key] = path, url
        for key, size in (whole or {}).items():
            path = "/whole/" + key.replace("/", "_") + ".bin"
            blob = rng.randbytes(size)
            url = srv.put(path, blob)
            refs[key] = [url]
            self.expected[key] = blob
            self.paths[key], self.urls[key] = path, url
        self.refs = refs
        self.source = tmp_path / name
        self.source.write_text(json.dumps(refs))


def fresh_read(path) -> bytes:
    """Read through the daemon, not the kernel's page cache (the mount sets keep_cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_eventually(path, expected: bytes, within: float = 5.0) -> bytes | int:
    """Read until the bytes are right or ``within`` seconds passed (a failure may be
    remembered briefly, so that the kernel's immediate re-read fails fast); the last result."""
    deadline = time.monotonic() + within
    while True:
        got = read_or_errno(path)
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def assert_failure_logged(m, key: str, url: str) -> None:
    needle = f"read failed: key={key} {url}: "
    assert wait_for(lambda: log_lines(m, needle), 5), (
        f"no log line {needle!r}; log tail:\n{m.log_text(30)}")


def assert_serving(m, key: str | None = None, expected: bytes | None = None) -> None:
    """The daemon recorded at mount time is alive, the mount answers, and (optionally) a key
    still reads right."""
    p = the_daemon(m)
    assert p.status() != psutil.STATUS_ZOMBIE, f"daemon {p.pid} died"
    assert is_mounted(m.path), f"{m.path} is no longer mounted"
    os.listdir(m.path)
    if key is not None:
        got = read_or_errno(m / key)
        assert got == expected, f"{key}: {got if isinstance(got, int) else len(got)} after faults"


def http_opts(*extra: str) -> tuple[str, ...]:
    return ("no_disk_cache", *extra)


# --- transient errors: retried with backoff, right bytes -------------------------------------------


TRANSIENT = {
    "5xx": [("status", {"status": 500}), ("status", {"status": 503}), ("status", {"status": 500})],
    "drop-mid-body": [("drop", {}), ("drop", {"fraction": 0.9})],
    "short-body": [("short", {}), ("short", {"fraction": 0.0})],
    "mixed": [("status", {"status": 503}), ("drop", {}), ("short", {}), ("extra", {}),
              ("wrong_range", {})],
}
# (A 200 to a Range request - a server without Range support - is never served either, but
# it may be treated as permanent: see test_short_or_wrong_responses_are_never_served.)


@pytest.mark.parametrize("script", list(TRANSIENT), ids=list(TRANSIENT))
def test_transient_errors_are_retried_with_backoff(srv, tmp_path, mount, script):
    faults = TRANSIENT[script]
    ds = HttpSet(srv, tmp_path, {"v/0": 300 * KiB, "v/1": 10 * KiB})
    m = mount(ds.source, *http_opts("retries=5", "timeout=30"))
    for kind, params in faults:
        srv.add_fault(ds.paths["v/0"], kind, times=1, **params)
    t0 = time.monotonic()
    got = read_or_errno(m / "v/0")
    elapsed = time.monotonic() - t0
    assert got == ds.expected["v/0"], f"got {got if isinstance(got, int) else len(got)} bytes"
    reqs = srv.log(ds.paths["v/0"])
    assert len(reqs) == len(faults) + 1, [(r.fault, r.status) for r in reqs]
    assert [r.fault for r in reqs] == [k for k, _ in faults] + [None]
    # exponential backoff: attempt k waits 0.1 * 2**(k-1) s times a jitter in [0.5, 1.5)
    gaps = [b.time - a.time for a, b in itertools.pairwise(reqs)]
    for k, gap in enumerate(gaps, start=1):
        assert gap >= 0.1 * 2 ** (k - 1) * 0.5 - 0.02, f"retry {k} after {gap:.3f} s: {gaps}"
    assert sum(gaps) >= 0.05 * (2 ** len(gaps) - 1) - 0.05, gaps
    assert elapsed < 15, elapsed
    assert stats(m)["retries"] == len(faults)
    assert not log_lines(m, "read failed"), m.log_text(20)
    assert_serving(m, "v/1", ds.expected["v/1"])


def test_concurrent_readers_through_a_fault_storm(srv, tmp_path, mount):
    """Many readers, every target failing one to three times in random ways: every read
    returns the right bytes once the retries get through."""
    rng = random.Random(11)
    sizes = {f"g{i % 4}/{i}": rng.choice([1, 5, 40, 200, 900]) * KiB for i in range(32)}
    ds = HttpSet(srv, tmp_path, sizes)
    m = mount(ds.source, *http_opts("retries=6", "timeout=30", "max_connections=8"))
    kinds = [("status", {"status": 500}), ("status", {"status": 503}), ("drop", {}),
             ("short", {}), ("extra", {}), ("wrong_range", {})]
    for key in sizes:
        for kind, params in rng.sample(kinds, rng.randint(1, 3)):
            srv.add_fault(ds.paths[key], kind, **params)
    keys = list(sizes)
    problems: list[str] = []

    def reader(seed: int) -> None:
        r = random.Random(seed)
        for key in r.sample(keys, len(keys)):
            got = read_or_errno(m / key)
            if got != ds.expected[key]:
                problems.append(f"{key}: {got if isinstance(got, int) else f'{len(got)} bytes'}")

    run_readers(reader, 8)
    assert not problems, problems[:10]
    assert stats(m)["retries"] >= len(keys)
    assert not log_lines(m, "read failed"), "\n".join(log_lines(m, "read failed")[:5])
    assert_serving(m, keys[0], ds.expected[keys[0]])


# --- permanent errors: EIO with a log line, nothing cached -----------------------------------------


def test_errors_after_the_last_retry_give_eio(srv, tmp_path, mount):
    ds = HttpSet(srv, tmp_path, {"bad": 50 * KiB, "good": 20 * KiB})
    m = mount(ds.source, *http_opts("retries=2", "timeout=30"))
    srv.add_fault(ds.paths["bad"], "status", times=None, status=503)
    t0 = time.monotonic()
    assert read_or_errno(m / "bad") == errno.EIO
    assert time.monotonic() - t0 < 10
    n = srv.count(ds.paths["bad"])
    assert n >= 3 and n % 3 == 0, f"{n} requests: expected 3 (1 + retries=2) per FUSE read"
    assert_failure_logged(m, "bad", ds.urls["bad"])
    assert_serving(m, "good", ds.expected["good"])
    # the failure is not cached for long: once the target recovers, the key reads right
    srv.clear_faults()
    assert read_eventually(m / "bad", ds.expected["bad"]) == ds.expected["bad"]


def test_404_gives_eio_at_once_without_retries(srv, tmp_path, mount):
    ds = HttpSet(srv, tmp_path, {"gone": 10 * KiB, "here": 10 * KiB})
    blob = (srv.root / ds.paths["gone"].lstrip("/")).read_bytes()
    (srv.root / ds.paths["gone"].lstrip("/")).unlink()
    m = mount(ds.source, *http_opts("retries=4", "timeout=30"))
    t0 = time.monotonic()
    assert read_or_errno(m / "gone") == errno.EIO
    assert time.monotonic() - t0 < 2.0, "a 404 must not go through the retry backoff"
    n = srv.count(ds.paths["gone"])
    assert 1 <= n <= 2, f"{n} requests for a 404 (one per FUSE read, no retries)"
    assert stats(m)["retries"] == 0
    assert_failure_logged(m, "gone", ds.urls["gone"])
    assert_serving(m, "here", ds.expected["here"])
    srv.put(ds.paths["gone"], blob)
    assert read_eventually(m / "gone", ds.expected["gone"]) == ds.expected["gone"]


BAD_RESPONSES = {
    "short-body": ("short", {}),
    "empty-body": ("short", {"fraction": 0.0}),
    "drop-mid-body": ("drop", {}),
    "extra-bytes": ("extra", {}),
    "range-ignored": ("ignore_range", {}),
    "wrong-content-range": ("wrong_range", {"shift": 3}),
}


@contextlib.contextmanager
def python_http_server(root: Path):
    """``python -m http.server`` on loopback: a real server without Range support."""
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (...)"
        port = int(line.split(" port ")[1].split()[0])
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(10)


def test_server_that_ignores_range_is_named_once_and_not_retried(tmp_path, mount):
    """A target server without Range support: each read fails at once (no retries), and one
    log line names the server and what to do."""
    served = tmp_path / "served"
    served.mkdir()
    blob = random.Random(7).randbytes(200 * KiB)
    (served / "blob.bin").write_bytes(blob)
    with python_http_server(served) as (url, proc):
        refs = {"a": [f"{url}/blob.bin", 1000, 5000], "b": [f"{url}/blob.bin", 9000, 100],
                "here": "inline"}
        src = tmp_path / "refs.json"
        src.write_text(json.dumps(refs))
        m = mount(src, *http_opts("retries=3", "timeout=30"))
        t0 = time.monotonic()
        assert read_or_errno(m / "a") == errno.EIO
        assert read_or_errno(m / "b") == errno.EIO
        assert time.monotonic() - t0 < 5
        assert (m / "here").read_bytes() == b"inline"
        proc.terminate()
        requests = [ln for ln in proc.stderr.read().splitlines() if '"GET /blob.bin' in ln]
    assert 2 <= len(requests) <= 4, requests  # one per read that reached the daemon
    assert stats(m)["retries"] == 0
    named = log_lines(m, "ignores Range requests (it answers 200 with the whole file)")
    assert len(named) == 1 and url.removeprefix("http://") in named[0], m.log_text(20)


@pytest.mark.parametrize("layout", ["range-ref", "whole-file-blocks"])
def test_short_or_wrong_responses_are_never_served(srv, tmp_path, mount, layout):
    """Every kind of bad answer, on every attempt: EIO (logged with key and URL), never the
    bytes of the bad answer. Afterwards the same keys read right."""
    names = list(BAD_RESPONSES)
    if layout == "range-ref":
        ds = HttpSet(srv, tmp_path, {f"k/{n}": 40 * KiB for n in names} | {"ok": 10 * KiB})
        opts = http_opts("retries=2", "timeout=30")
    else:  # whole-file targets read in 64 KiB blocks (their size comes from HEAD)
        ds = HttpSet(srv, tmp_path, {"ok": 10 * KiB},
                     whole={f"k/{n}": 200 * KiB + 17 for n in names})
        opts = http_opts("retries=2", "timeout=30", "block_size=64K")
    m = mount(ds.source, *opts)
    problems = []
    for name, (kind, params) in BAD_RESPONSES.items():
        key = f"k/{name}"
        srv.add_fault(ds.paths[key], kind, times=None, **params)
        got = read_or_errno(m / key)
        if got != errno.EIO:
            what = errno.errorcode.get(got, got) if isinstance(got, int) else (
                "the right bytes?!" if got == ds.expected[key] else f"{len(got)} WRONG bytes")
            problems.append(f"{name}: expected EIO, got {what}")
            continue
        try:
            assert_failure_logged(m, key, ds.urls[key])
        except AssertionError as e:
            problems.append(f"{name}: {e}")
    assert not problems, "\n".join(problems)
    assert_serving(m, "ok", ds.expected["ok"])
    srv.clear_faults()
    for name in names:
        got = read_eventually(m / f"k/{name}", ds.expected[f"k/{name}"])
        assert got == ds.expected[f"k/{name}"], (
            f"{name}: the target answers right again, but the mount returns "
            f"{errno.errorcode.get(got, got) if isinstance(got, int) else 'WRONG bytes'} "
            "(bad bytes kept in a cache?)")


# --- stalls and dead targets: EIO in bounded time, everything else keeps answering --------------


@contextlib.contextmanager
def blackhole():
    """A TCP port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def refused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there any more: connections are refused
    return port


@pytest.mark.parametrize("how", ["stall", "stall-mid-body", "blackhole", "refused"])
def test_stalled_or_dead_target_gives_eio_in_bounded_time(srv, tmp_path, mount, how):
    timeout = 2.0
    ds = HttpSet(srv, tmp_path, {"slow": 64 * KiB, "fast/a": 30 * KiB, "fast/b": 300 * KiB})
    with blackhole() as hole:
        if how == "stall":
            srv.add_fault(ds.paths["slow"], "stall", times=None, seconds=60)
        elif how == "stall-mid-body":
            srv.add_fault(ds.paths["slow"], "stall_body", times=None, seconds=60)
        else:
            port = hole if how == "blackhole" else refused_port()
            ds.refs["slow"] = [f"http://127.0.0.1:{port}/data/slow.bin", 0, 64 * KiB]
            ds.source.write_text(json.dumps(ds.refs))
        m = mount(ds.source, *http_opts("retries=3", f"timeout={timeout:g}"))
        result: dict[str, object] = {}

        def slow_read() -> None:
            t0 = time.monotonic()
            result["got"] = read_or_errno(m / "slow")
            result["seconds"] = time.monotonic() - t0

        t = threading.Thread(target=slow_read)
        t.start()
        time.sleep(0.3)
        # meanwhile, everything else answers at once
        slowest = {}
        def read_right(key: str) -> None:
            assert (m / key).read_bytes() == ds.expected[key], key

        ops = {
            "listdir": lambda: os.listdir(m.path),
            "stat": lambda: os.stat(m / "fast/a"),
            "ls -la": lambda: subprocess.run(["ls", "-la", str(m / "fast")], check=True,
                                             capture_output=True, timeout=10),
            "read fast/a": lambda: read_right("fast/a"),
            "read fast/b": lambda: read_right("fast/b"),
            "stat slow": lambda: os.stat(m / "slow"),
            "xattr": lambda: os.getxattr(m / "slow", "user.refmount.url"),
        }
        for name, op in ops.items():
            t0 = time.monotonic()
            op()
            slowest[name] = time.monotonic() - t0
        during = "got" not in result
        t.join(30)
        assert not t.is_alive(), "the stalled read never returned"
    if how != "refused":  # a refused connection fails fast; the others hang until the timeout
        assert during, f"the stalled read ended before the other operations were done: {result}"
    assert all(s < 1.0 for s in slowest.values()), f"operations blocked by the stall: {slowest}"
    assert result["got"] == errno.EIO, result
    assert result["seconds"] <= timeout + SLACK, (
        f"EIO after {result['seconds']:.2f} s with -o timeout={timeout:g} "
        f"(allowed {timeout + SLACK:g} s); failures logged: "
        f"{len(log_lines(m, 'read failed: key=slow'))}")
    assert wait_for(lambda: log_lines(m, "read failed: key=slow "), 5), m.log_text(20)
    assert_serving(m, "fast/a", ds.expected["fast/a"])


# --- disk cache: corrupt blocks are refetched; unwritable/full directories degrade -----------------


def block_files(cache_dir: Path) -> set[Path]:
    root = cache_dir / "blocks"
    if not root.is_dir():
        return set()
    return {p for p in root.glob("*/*") if p.is_file() and not p.name.endswith(".tmp")}


CORRUPTIONS = {
    "flip-data-byte": lambda b: b[: HEADER + 100] + bytes([b[HEADER + 100] ^ 0xFF]) + b[HEADER + 101:],
    "flip-last-byte": lambda b: b[:-1] + bytes([b[-1] ^ 1]),
    "flip-header-length": lambda b: b[:8] + bytes([b[8] ^ 4]) + b[9:],
    "flip-checksum": lambda b: b[:16] + bytes([b[16] ^ 0x80]) + b[17:],
    "truncated-data": lambda b: b[: len(b) // 2],
    "truncated-header": lambda b: b[:40],
    "empty-file": lambda b: b"",
    "appended-garbage": lambda b: b + b"garbage",
    "other-block": None,  # replaced by another key's (valid) block file
}


def test_corrupt_or_truncated_cache_blocks_are_refetched(srv, tmp_path, mount):
    names = list(CORRUPTIONS)
    ds = HttpSet(srv, tmp_path, {f"c/{n}": 20 * KiB + 3 * i for i, n in enumerate(names)}
                 | {"control": 12 * KiB})
    cache = tmp_path / "cache"
    opts = (f"cache_dir={cache}", "retries=0")
    m1 = mount(ds.source, *opts)
    owner: dict[str, Path] = {}
    for key in [*(f"c/{n}" for n in names), "control"]:
        before = block_files(cache)
        assert read_or_errno(m1 / key) == ds.expected[key]
        new = wait_for(lambda b=before: block_files(cache) - b, 10)
        assert len(new) == 1, f"{key}: expected one new block file, got {new}"
        owner[key] = new.pop()
        assert owner[key].stat().st_size == HEADER + len(ds.expected[key])
    assert owner["c/flip-data-byte"].parent.parent == cache / "blocks"
    assert len(owner["c/flip-data-byte"].name) == 64
    problems = m1.cleanup()
    assert not problems and not is_mounted(m1.path), problems

    for name, damage in CORRUPTIONS.items():
        p = owner[f"c/{name}"]
        if damage is None:
            p.write_bytes(owner["control"].read_bytes())
        else:
            p.write_bytes(damage(p.read_bytes()))
    srv.reset_log()
    m2 = mount(ds.source, *opts)
    assert read_or_errno(m2 / "control") == ds.expected["control"]
    assert srv.count(ds.paths["control"]) == 0, "an intact block was not served from disk"
    wrong = []
    for name in names:
        key = f"c/{name}"
        got = read_or_errno(m2 / key)
        if got != ds.expected[key]:
            wrong.append(f"{name}: {got if isinstance(got, int) else f'{len(got)} wrong bytes'}")
        elif srv.count(ds.paths[key]) != 1:
            wrong.append(f"{name}: fetched {srv.count(ds.paths[key])} times, expected once")
    assert not wrong, "\n".join(wrong)
    dropped = log_lines(m2, "dropping corrupt block")
    assert len(dropped) == len(names), "\n".join(dropped)
    for name in names:
        assert any(str(owner[f"c/{name}"]) in ln for ln in dropped), name
    # the refetched blocks are written again, whole
    for name in names:
        p, size = owner[f"c/{name}"], HEADER + len(ds.expected[f"c/{name}"])
        assert wait_for(lambda p=p, size=size: p.is_file() and p.stat().st_size == size, 10), name
    assert_serving(m2, "control", ds.expected["control"])


@pytest.fixture
def tmpfs(mount, tmp_path):
    """``tmpfs(size, ro=False) -> Path``: a small tmpfs mounted for this test. Torn down
    before the ``mount`` fixture: refmount mounts are cleaned up first, then the tmpfs."""
    made: list[Path] = []

    def make(size: str = "1m", ro: bool = False) -> Path:
        d = tmp_path / f"tmpfs{len(made)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(d)],
                       check=True, capture_output=True)
        made.append(d)
        if ro:
            subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True, capture_output=True)
        return d

    try:
        yield make
    finally:
        mount.cleanup()
        for d in reversed(made):
            r = subprocess.run(["umount", str(d)], capture_output=True, text=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.mark.parametrize("how", ["read-only-tmpfs", "blocks-is-a-file"])
def test_unwritable_cache_dir_degrades_with_one_warning(srv, tmp_path, mount, tmpfs, how):
    ds = HttpSet(srv, tmp_path, {f"u/{i}": 30 * KiB for i in range(6)})
    if how == "read-only-tmpfs":
        cache = tmpfs("1m", ro=True)
    else:
        cache = tmp_path / "cache"
        cache.mkdir()
        (cache / "blocks").write_text("not a directory\n")
    m = mount(ds.source, f"cache_dir={cache}")
    for key in ds.expected:
        assert read_or_errno(m / key) == ds.expected[key], key
    warned = wait_for(lambda: log_lines(m, "cannot write to"), 10)
    time.sleep(0.5)  # any further (wrong) warnings would be in by now
    warned = log_lines(m, "cannot write to")
    assert len(warned) == 1, "\n".join(warned) or m.log_text(30)
    assert "WARNING" in warned[0], warned[0]
    assert not log_lines(m, "read failed"), m.log_text(20)
    for key in ds.expected:  # again, from memory: still right
        assert fresh_read(m / key) == ds.expected[key], key
    assert not block_files(cache)
    assert_serving(m)


def test_full_cache_dir_degrades_with_one_warning(srv, tmp_path, mount, tmpfs):
    cache = tmpfs("1m")
    sizes = {f"f/{i}": 200 * KiB + i for i in range(12)}  # 2.4 MB into a 1 MiB tmpfs
    ds = HttpSet(srv, tmp_path, sizes)
    m = mount(ds.source, f"cache_dir={cache}")
    for key in sizes:
        assert read_or_errno(m / key) == ds.expected[key], key
        time.sleep(0.05)  # let the background writes fill the disk while we read
    assert wait_for(lambda: log_lines(m, "cannot write to"), 10), m.log_text(30)
    time.sleep(0.5)
    warned = log_lines(m, "cannot write to")
    assert len(warned) == 1, "\n".join(warned)
    assert "No space left" in warned[0], warned[0]
    assert not log_lines(m, "read failed"), m.log_text(20)
    for key in sizes:
        assert fresh_read(m / key) == ds.expected[key], key
    # whatever did fit is whole: nothing half-written is left
    for p in block_files(cache):
        assert p.stat().st_size in {HEADER + s for s in sizes.values()}, p
    assert not [p for p in (cache / "blocks").glob("*/*.tmp")], "temporary files left behind"
    assert_serving(m)


def test_two_mounts_sharing_a_cache_dir_under_concurrent_reads(srv, tmp_path, mount):
    """Small memory caches and a disk cache smaller than the data: blocks are written,
    read, evicted and rewritten by two daemons at once. Every read returns the right bytes."""
    rng = random.Random(3)
    sizes = {f"s/{i:02d}": rng.choice([3, 30, 120, 250, 500]) * KiB + i for i in range(40)}
    ds = HttpSet(srv, tmp_path, sizes)
    cache = tmp_path / "shared-cache"
    opts = (f"cache_dir={cache}", "cache_size=3M", "memory_cache=1M")
    m1 = mount(ds.source, *opts)
    m2 = mount(ds.source, *opts)
    keys = list(sizes)
    problems: list[str] = []
    counts = [0]
    deadline = time.monotonic() + 6

    def reader(seed: int) -> None:
        r = random.Random(seed)
        while time.monotonic() < deadline and len(problems) < 10:
            m = r.choice((m1, m2))
            key = r.choice(keys)
            try:
                got = fresh_read(m / key)
            except OSError as e:
                problems.append(f"{m.path.name}/{key}: {e}")
                continue
            counts[0] += 1
            if got != ds.expected[key]:
                problems.append(f"{m.path.name}/{key}: {len(got)} wrong bytes")

    run_readers(reader, 8)
    assert not problems, problems
    assert counts[0] > 100, counts
    s1, s2 = stats(m1), stats(m2)
    assert s1["disk_hits"] > 0 and s2["disk_hits"] > 0, (s1, s2)
    assert not log_lines(m1, "read failed") and not log_lines(m2, "read failed")
    assert_serving(m1)
    assert_serving(m2)


# --- signals, killed daemons, stale mounts -------------------------------------------------------


_REAPER = r"""
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl failed")
err = open(sys.argv[1], "wb")
r = subprocess.run(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
print("cli", r.returncode, flush=True)
if r.returncode == 0:
    pid, status = os.wait()  # the daemon, orphaned by the CLI, is reparented to us
    print("daemon", pid, os.waitstatus_to_exitcode(status), flush=True)
"""


def the_daemon(m) -> psutil.Process:
    """The serving process of ``m`` (not a helper whose command line names the mountpoint)."""
    m.refresh_procs()
    found = []
    for p in m.procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and "refmount.fuse.daemon" in " ".join(p.cmdline()):
                found.append(p)
    assert len(found) == 1, f"expected one daemon for {m.path}, found {found}"
    return found[0]


class Reaped:
    """Runs the CLI under a child subreaper, so that the detached daemon's exit status can be
    collected (it is not our child: the CLI that started it has exited)."""

    def __init__(self, mounter, source, *opts: str):
        self.m = mounter.track(source, *opts)
        self.err = self.m.log.with_suffix(".cli-stderr")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(self.err), *CLI, str(source), str(self.m.path),
             *opts_arg(self.m.opts)],
            stdout=subprocess.PIPE, text=True, env=cli_env(), cwd=str(REPO))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def line(self, prefix: str, timeout: float) -> str | None:
        return wait_for(lambda: next((ln for ln in self.lines if ln.startswith(prefix)), None),
                        timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_unmounts_and_daemon_exits_0(srv, tmp_path, mount, sig):
    ds = HttpSet(srv, tmp_path, {"a": 10 * KiB})
    r = Reaped(mount, ds.source, "no_disk_cache")
    try:
        assert r.line("cli", 60) == "cli 0", (r.lines, r.err.read_text(errors="replace"))
        assert is_mounted(r.m.path)
        assert read_or_errno(r.m / "a") == ds.expected["a"]
        daemon = the_daemon(r.m)
        daemon.send_signal(sig)
        done = r.line("daemon", 20)
        assert done is not None, f"daemon still running 20 s after {sig.name}"
        assert done == f"daemon {daemon.pid} 0", done
        assert not is_mounted(r.m.path), f"still mounted after {sig.name}"
        assert log_lines(r.m, f"received {sig.name}, unmounting"), r.m.log_text(10)
    finally:
        r.close()


def test_sigterm_with_a_read_stalled_in_flight(srv, tmp_path, mount):
    """A fetch that hangs does not keep the daemon from unmounting and exiting 0 within 5 s,
    whatever ``timeout`` is (systemd's stop timeout is shorter than a long fetch timeout), and
    the stalled reader gets an error rather than hanging."""
    ds = HttpSet(srv, tmp_path, {"slow": 20 * KiB, "a": 10 * KiB})
    srv.add_fault(ds.paths["slow"], "stall", times=None, seconds=90)
    r = Reaped(mount, ds.source, "no_disk_cache", "timeout=60")
    try:
        assert r.line("cli", 60) == "cli 0", (r.lines, r.err.read_text(errors="replace"))
        daemon = the_daemon(r.m)
        result: dict[str, object] = {}
        t = threading.Thread(target=lambda: result.setdefault("got", read_or_errno(r.m / "slow")))
        t.start()
        assert wait_for(lambda: srv.count(ds.paths["slow"]) >= 1, 5)
        t0 = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        done = r.line("daemon", 20)
        assert done == f"daemon {daemon.pid} 0", (done, r.m.log_text(20))
        assert time.monotonic() - t0 < 5, time.monotonic() - t0
        t.join(10)
        assert not t.is_alive(), "the stalled reader hangs after the daemon exited"
        assert isinstance(result["got"], int), result
        assert not is_mounted(r.m.path)
    finally:
        r.close()


def _kill_daemon(m) -> None:
    daemon = the_daemon(m)
    daemon.send_signal(signal.SIGKILL)
    assert not wait_gone([daemon], 10), "daemon survived SIGKILL"
    # stale: still listed, and anything that reaches the (dead) daemon fails with ENOTCONN
    # (a stat of the root may still be answered from the kernel's attribute cache)
    assert is_mounted(m.path), "the killed daemon's mount should still be listed (stale)"
    assert_enotconn(m.path)


def assert_enotconn(path) -> None:
    with pytest.raises(OSError) as info:
        os.listdir(path)
    assert info.value.errno == errno.ENOTCONN, info.value


def test_new_mount_on_a_stale_mountpoint_explains_it(srv, tmp_path, mount):
    """After SIGKILL of the daemon, ``refmount SRC MNT`` fails with one line that says the
    mount is stale and how to clear it, and changes nothing."""
    ds = HttpSet(srv, tmp_path, {"a": 10 * KiB})
    m = mount(ds.source, "no_disk_cache")
    assert read_or_errno(m / "a") == ds.expected["a"]
    _kill_daemon(m)
    r = run_cli(str(ds.source), str(m.path), *opts_arg(m.opts))
    lines = r.stderr_lines
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert lines[0].startswith("refmount: error:"), lines[0]
    assert "stale FUSE mount" in lines[0] and f"fusermount3 -uz {m.path}" in lines[0], lines[0]
    assert not [p for p in daemon_procs(m.path) if p.is_running()], "a daemon was left running"
    assert is_mounted(m.path)
    assert_enotconn(m.path)


@pytest.mark.parametrize("recovery", ["-o recover", "fusermount3 -uz"])
def test_stale_mount_after_sigkill_is_recovered(srv, tmp_path, mount, recovery):
    ds = HttpSet(srv, tmp_path, {"a": 10 * KiB, "b/c": 5 * KiB})
    m = mount(ds.source, "no_disk_cache")
    assert read_or_errno(m / "a") == ds.expected["a"]
    _kill_daemon(m)
    if recovery == "-o recover":
        m2 = mount(ds.source, "no_disk_cache", "recover", mnt=m.path)
        assert log_lines(m2, "clearing stale mount") or "stale" in m2.result.stderr
    else:  # the documented manual step
        res = fusermount_u(m.path, lazy=True)
        assert res.returncode == 0, res.stderr
        assert not is_mounted(m.path)
        m2 = mount(ds.source, "no_disk_cache", mnt=m.path)
    assert read_or_errno(m2 / "b/c") == ds.expected["b/c"]
    assert read_or_errno(m2 / "a") == ds.expected["a"]
    assert_serving(m2)


def test_recover_leaves_a_live_mount_alone(srv, tmp_path, mount):
    ds = HttpSet(srv, tmp_path, {"a": 10 * KiB})
    m = mount(ds.source, "no_disk_cache")
    r = run_cli(str(ds.source), str(m.path), *opts_arg([*m.opts, "recover"]))
    assert r.returncode != 0 and len(r.stderr_lines) == 1, r.stderr
    assert "already mounted" in r.stderr, r.stderr
    assert_serving(m, "a", ds.expected["a"])
