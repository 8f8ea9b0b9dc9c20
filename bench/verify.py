"""The ``verify`` workload: how long ``refmount verify`` takes for a set of many distinct
targets behind a slow store.

``--verify-targets`` small files (1 KiB, two keys each) are served by nginx whose every
response is held back ``--verify-latency`` ms before its first byte (the harness's nginx with
added latency). A Version 0 set names them all. Peers: refmount (``refmount verify SOURCE
--pin FILE --jobs N -o no_disk_cache``, a fresh process each time, as a user runs it; checked:
exit status 0, every target pinned; ``--refmount-opts max_connections=64`` for more
connections per host) and aiohttp (plain ``HEAD``s of every target, ``--jobs`` at a time, in
this process: the client's own cost on this machine). Each row: the median wall time of
``--repeat`` runs and the targets per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table

WORKLOADS = {"verify": "refmount verify of 10,000 targets of 1 KiB behind 20 ms latency; plain aiohttp HEADs"}
PEERS = ("refmount", "aiohttp")
TITLES = {"refmount": "refmount verify", "aiohttp": "plain aiohttp HEADs"}


async def heads(urls: list[str], jobs: int) -> None:
    import aiohttp

    limit = asyncio.Semaphore(jobs)
    async with aiohttp.ClientSession() as session:
        async def one(url: str) -> None:
            async with limit, session.head(url) as r:
                r.raise_for_status()

        await asyncio.gather(*(one(u) for u in urls))


def timed_heads(urls: list[str], jobs: int) -> float:
    t0 = time.monotonic()
    asyncio.run(heads(urls, jobs))
    return time.monotonic() - t0


def verify_once(source: Path, pins: Path, n: int, jobs: int, opts: list[str], timeout: float) -> float:
    t0 = time.monotonic()
    cmd = [h.PY, "-m", "refmount", "verify", str(source), "--pin", str(pins), "--jobs", str(jobs),
           "-o", ",".join(opts)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=h.checkout_env(), timeout=timeout)
    elapsed = time.monotonic() - t0
    if r.returncode != 0:
        print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
        raise h.Failed(f"exit {r.returncode}")
    pinned = json.loads(pins.read_text())["targets"]
    if len(pinned) != n:
        raise h.Failed(f"{len(pinned)} of {n} pinned")
    return elapsed


def add_arguments(p: Any) -> None:
    p.add_argument("--verify-targets", type=int, default=None, help="distinct targets (10000; --quick 500)")
    p.add_argument("--verify-latency", type=float, default=20.0, help="ms before each response (default 20)")
    p.add_argument("--jobs", type=int, default=32, help="verify --jobs; aiohttp HEADs at a time (32)")


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    n = args.verify_targets or (500 if args.quick else 10_000)
    timeout = args.timeout or 600.0
    opts = ["no_disk_cache", *filter(None, [args.refmount_opts])]
    t = Table("verify", f"checking targets: {n:,} of 1 KiB behind {args.verify_latency:g} ms latency, "
              f"--jobs {args.jobs} (seconds, median of {args.repeat})",
              ["peer", "seconds", "targets/s", "runs (s)"], notes=[f"refmount -o {','.join(opts)}"])
    shutil.rmtree(work, ignore_errors=True)
    root = work / "served"
    root.mkdir(parents=True)
    payload = (bytes(range(256)) * 4)[:1024]
    for i in range(n):
        (root / f"t{i}.bin").write_bytes(payload)
    nginx = h.Nginx(root, work / "nginx", workers=1, latency_ms=args.verify_latency)
    nginx.start()
    try:
        urls = [nginx.url(f"t{i}.bin") for i in range(n)]
        refs: dict[str, Any] = {".zgroup": '{"zarr_format": 2}'}
        for i, url in enumerate(urls):
            refs[f"k/{i}.0"] = [url, 0, 512]
            refs[f"k/{i}.1"] = [url, 512, 512]
        source = work / "refs.json"
        source.write_text(json.dumps(refs))
        runs = {"refmount": lambda: verify_once(source, work / "pins.json", n, args.jobs, opts, timeout),
                "aiohttp": lambda: timed_heads(urls, args.jobs)}
        for peer in peers:
            h.wait_idle(args.quiet_wait, args.quiet_load)
            try:
                times = [runs[peer]() for _ in range(args.repeat)]
            except Exception as e:  # a failed run is a cell of the table
                t.rows.append([TITLES[peer], f"failed: {e}", "—", "—"])
                continue
            median = statistics.median(times)
            t.rows.append([TITLES[peer], f"{median:.2f}", f"{n / median:,.0f}",
                           ", ".join(f"{x:.2f}" for x in times)])
            t.data[peer] = times
    finally:
        nginx.stop()
        shutil.rmtree(work, ignore_errors=True)
    return [t]
