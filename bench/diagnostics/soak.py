"""Bounded soak test of a refmount mount: many random readers for a fixed time.

Serves a few hundred MiB of random data from a loopback HTTP server (Debian nginx, or the
tests' fault server without faults), mounts a reference set of ~5,000 byte-range references of
mixed sizes (plus a few whole-file references read in blocks) with the real CLI, and runs many
reader processes for a fixed time. Each reader opens random keys, drops the kernel's page cache
for the file (so every read goes through the daemon), reads the whole file or a random slice,
and compares the bytes with the served data. Meanwhile the daemon's RSS (VmRSS in
/proc/PID/status) is sampled.

Prints reads done, wrong bytes, unexpected errors, p50/p99 latency and the daemon's RSS at the
start, after warm-up, at its peak and at the end. Exits 1 on any wrong byte, any error, a dead
daemon, or RSS growth after warm-up beyond --max-rss-growth-mib; 0 otherwise.

    .venv/bin/python -m bench.diagnostics.soak                # 64 readers, 120 s
    .venv/bin/python -m bench.diagnostics.soak --procs 8 --seconds 20 --data-mib 64
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import mmap
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness as h

sys.path.insert(0, str(h.REPO / "tests"))

KiB, MiB = 1024, 1024 * 1024


# --- data and references ------------------------------------------------------------------------


def make_data(served: Path, total_mib: int, file_mib: int, seed: int) -> list[Path]:
    data = served / "data"
    data.mkdir(parents=True)
    n = max(1, total_mib // file_mib)
    files = []
    rng = random.Random(seed)
    for i in range(n):
        p = data / f"f{i:03d}.bin"
        size = file_mib * MiB - rng.randrange(0, 4096)  # odd sizes: no block-aligned ends
        p.write_bytes(os.urandom(size))
        files.append(p)
    return files


def make_refs(files: list[Path], base_url: str, n_keys: int, n_whole: int, seed: int):
    """Returns (refs dict for JSON, plan: key -> (file index, offset, length))."""
    rng = random.Random(seed)
    sizes = [f.stat().st_size for f in files]
    refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
    plan: dict[str, tuple[int, int, int]] = {}
    for i in range(n_keys):
        r = rng.random()
        if r < 0.70:
            length = rng.randint(1 * KiB, 64 * KiB)
        elif r < 0.95:
            length = rng.randint(64 * KiB, 1 * MiB)
        else:
            length = rng.randint(1 * MiB, 8 * MiB)
        fi = rng.randrange(len(files))
        length = min(length, sizes[fi])
        off = rng.randint(0, sizes[fi] - length)
        key = f"g{i % 50:02d}/v{i:05d}"
        refs[key] = [f"{base_url}/data/{files[fi].name}", off, length]
        plan[key] = (fi, off, length)
    for j in range(min(n_whole, len(files))):
        key = f"whole/{files[j].name}"
        refs[key] = [f"{base_url}/data/{files[j].name}"]
        plan[key] = (j, 0, sizes[j])
    return refs, plan


def rss_mib(pid: int) -> float | None:
    rss = h.proc_status(pid).get("VmRSS")
    return None if rss is None else rss / MiB


# --- readers ---------------------------------------------------------------------------------------

_PLAN: dict[str, tuple[int, int, int]] = {}
_FILES: list[Path] = []


def reader(idx: int, mnt: str, deadline: float, seed: int, progress, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    rng = random.Random(seed * 1000 + idx)
    maps = []
    for p in _FILES:
        with open(p, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    keys = list(_PLAN)
    lat = array.array("f")
    reads = nbytes = wrong = errors = 0
    messages: list[str] = []
    while time.monotonic() < deadline:
        key = rng.choice(keys)
        fi, off, length = _PLAN[key]
        whole = rng.random() < 0.7 or length == 0
        if whole:
            start, size = 0, length
        else:
            start = rng.randrange(length)
            size = rng.randint(1, min(length - start, 256 * KiB))
        t0 = time.perf_counter()
        try:
            fd = os.open(os.path.join(mnt, key), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                if whole:
                    parts = []
                    while chunk := os.read(fd, 1 * MiB):
                        parts.append(chunk)
                    got = b"".join(parts)
                else:
                    got = os.pread(fd, size, start)
            finally:
                os.close(fd)
        except OSError as e:
            errors += 1
            if len(messages) < 5:
                messages.append(f"{key}: {e}")
            continue
        lat.append(time.perf_counter() - t0)
        reads += 1
        nbytes += len(got)
        progress[idx] = reads
        expected = maps[fi][off + start : off + start + size]
        if got != expected:
            wrong += 1
            if len(messages) < 5:
                messages.append(f"{key} [{start}:{start + size}]: {len(got)} bytes differ from "
                                f"the served data")
    results.put({"idx": idx, "reads": reads, "bytes": nbytes, "wrong": wrong, "errors": errors,
                 "messages": messages, "lat": lat.tobytes()})


# --- main ------------------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=64, help="reader processes (default 64)")
    ap.add_argument("--seconds", type=float, default=120, help="duration (default 120)")
    ap.add_argument("--data-mib", type=int, default=320, help="data served (default 320 MiB)")
    ap.add_argument("--file-mib", type=int, default=16, help="size of each served file")
    ap.add_argument("--keys", type=int, default=5000, help="range references (default 5000)")
    ap.add_argument("--whole", type=int, default=8, help="whole-file references (default 8)")
    ap.add_argument("--server", choices=["nginx", "fault"], default="nginx")
    ap.add_argument("--options", default="memory_cache=64M",
                    help="extra -o options for refmount (default memory_cache=64M, so that the "
                         "memory cache fills early and RSS must then stay flat)")
    ap.add_argument("--warmup", type=float, default=15, help="seconds before the RSS baseline")
    ap.add_argument("--max-rss-growth-mib", type=float, default=100,
                    help="fail if RSS grows more than this after warm-up (default 100)")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--workdir", help="directory to use (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="refmount-soak-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    served, mnt, cache = work / "served", work / "mnt", work / "cache"
    mnt.mkdir(exist_ok=True)
    server = None
    procs: list[mp.Process] = []
    pid = None
    failed: list[str] = []
    try:
        t0 = time.monotonic()
        files = make_data(served, args.data_mib, args.file_mib, args.seed)
        if args.server == "nginx":
            from support.servers import NginxServer

            server = NginxServer(served, run_dir=work / "nginx").start()
        else:
            from support.faultserver import FaultServer

            server = FaultServer(served).start()
        refs, plan = make_refs(files, server.url, args.keys, args.whole, args.seed)
        src = work / "refs.json"
        src.write_text(json.dumps(refs))
        total_ref = sum(n for _f, _o, n in plan.values())
        print(f"soak: {len(files)} files, {sum(f.stat().st_size for f in files) / MiB:.0f} MiB "
              f"served by {args.server} at {server.url}; {args.keys} range refs + "
              f"{min(args.whole, len(files))} whole-file refs ({total_ref / MiB:.0f} MiB "
              f"referenced); setup {time.monotonic() - t0:.1f} s", flush=True)

        opts = f"cache_dir={cache},log={work / 'daemon.log'}"
        if args.options:
            opts += "," + args.options
        cmd = [sys.executable, "-m", "refmount", str(src), str(mnt), "-o", opts]
        env = h.checkout_env()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        if r.returncode != 0:
            print(f"soak: refmount failed ({r.returncode}): {r.stderr.strip()}", file=sys.stderr)
            return 1
        pid = h.refmount_daemon_pid(mnt)
        if pid is None:
            print("soak: no daemon process found", file=sys.stderr)
            return 1
        rss_start = rss_mib(pid)
        print(f"soak: mounted on {mnt} (daemon {pid}, -o {opts}); RSS {rss_start:.0f} MiB; "
              f"{args.procs} readers for {args.seconds:g} s", flush=True)

        global _PLAN, _FILES
        _PLAN, _FILES = plan, files
        ctx = mp.get_context("fork")
        progress = ctx.Array("q", args.procs, lock=False)
        results = ctx.Queue()
        start = time.monotonic()
        deadline = start + args.seconds
        procs = [ctx.Process(target=reader, args=(i, str(mnt), deadline, args.seed, progress,
                                                  results), daemon=True)
                 for i in range(args.procs)]
        for p in procs:
            p.start()

        samples: list[tuple[float, float]] = []
        rss_warm = None
        next_print = start + 10
        collected: list[dict] = []
        while time.monotonic() < deadline + 5 and len(collected) < len(procs):
            time.sleep(1)
            now = time.monotonic()
            rss = rss_mib(pid)
            if rss is None:
                failed.append("the daemon died during the soak")
                break
            samples.append((now - start, rss))
            if rss_warm is None and now - start >= args.warmup:
                rss_warm = rss
            while True:  # drain results as readers finish (the queue must not fill up)
                try:
                    collected.append(results.get_nowait())
                except Exception:
                    break
            if now >= next_print:
                next_print += 10
                print(f"  t={now - start:5.0f} s  reads={sum(progress):>9,}  RSS={rss:6.0f} MiB",
                      flush=True)
        end_wait = time.monotonic() + 60
        while len(collected) < len(procs) and time.monotonic() < end_wait:
            with contextlib.suppress(Exception):
                collected.append(results.get(timeout=1))
        for p in procs:
            p.join(timeout=5)
        stuck = [p.pid for p in procs if p.is_alive()]
        if stuck or len(collected) < len(procs):
            failed.append(f"{len(procs) - len(collected)} readers did not report (stuck: {stuck})")
        elapsed = time.monotonic() - start
        rss_end = rss_mib(pid)
        if rss_end is None:
            failed.append("the daemon is gone at the end")

        reads = sum(c["reads"] for c in collected)
        nbytes = sum(c["bytes"] for c in collected)
        wrong = sum(c["wrong"] for c in collected)
        errors = sum(c["errors"] for c in collected)
        messages = [m for c in collected for m in c["messages"]]
        lat = array.array("f")
        for c in collected:
            lat.frombytes(c["lat"])
        lat_ms = sorted(x * 1000 for x in lat)
        stats_r = subprocess.run([sys.executable, "-m", "refmount", "stats", str(mnt), "--json"],
                                 capture_output=True, text=True, env=env, timeout=30)
        try:
            dstats = json.loads(stats_r.stdout)
        except json.JSONDecodeError:
            dstats = {}
        peak = max((s for _t, s in samples), default=float("nan"))
        growth = (rss_end - rss_warm) if (rss_end is not None and rss_warm is not None) else None
        time.sleep(12)  # the daemon gives freed memory back after a few idle seconds
        rss_idle = rss_mib(pid)

        print()
        print(f"readers x duration:   {args.procs} x {elapsed:.0f} s")
        print(f"reads done:           {reads:,} ({reads / elapsed:,.0f}/s), "
              f"{nbytes / 2**30:.1f} GiB ({nbytes / MiB / elapsed:,.0f} MiB/s)")
        print(f"wrong bytes (reads):  {wrong}")
        print(f"unexpected errors:    {errors}")
        print(f"latency p50 / p99:    {percentile(lat_ms, 0.50):.1f} ms / "
              f"{percentile(lat_ms, 0.99):.1f} ms   (p99.9 {percentile(lat_ms, 0.999):.1f} ms, "
              f"max {lat_ms[-1] if lat_ms else float('nan'):.1f} ms)")
        print(f"daemon RSS:           start {rss_start:.0f} MiB, after {args.warmup:g} s warm-up "
              f"{rss_warm if rss_warm is not None else float('nan'):.0f} MiB, peak {peak:.0f} MiB, "
              f"end {rss_end if rss_end is not None else float('nan'):.0f} MiB, "
              f"12 s after the readers stopped {rss_idle if rss_idle is not None else float('nan'):.0f} MiB")
        if dstats:
            keep = ("reads", "bytes_read", "requests", "bytes_fetched", "prefetched", "prefetch_hits",
                    "pushed", "memory_hits",
                    "disk_hits", "misses", "retries", "errors")
            print("daemon stats:         " + ", ".join(f"{k}={dstats.get(k)}" for k in keep))
        for m in messages[:10]:
            print(f"  ! {m}")
        if wrong:
            failed.append(f"{wrong} reads returned wrong bytes")
        if errors:
            failed.append(f"{errors} reads failed")
        if reads == 0:
            failed.append("no reads were done")
        if growth is not None and growth > args.max_rss_growth_mib:
            failed.append(f"RSS grew {growth:.0f} MiB after warm-up "
                          f"(limit {args.max_rss_growth_mib:g})")
        if dstats.get("errors"):
            failed.append(f"the daemon counted {dstats['errors']} errors")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        h.fuse_unmount(mnt, [pid] if pid is not None else [], print)
        if server is not None:
            server.stop()
        if not args.keep and not h.mounted(mnt):
            shutil.rmtree(work, ignore_errors=True)
        elif args.keep:
            print(f"soak: kept {work}")
    print("RESULT: " + ("FAIL: " + "; ".join(failed) if failed else "PASS"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
