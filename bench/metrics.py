"""The ``metrics`` workload: what the Prometheus metrics cost on the read path.

N keys of 64 KiB (one file on nginx, a range each) read one after the other, cold, through a
fresh mount (``-o no_disk_cache``) and through a fresh ``refmount serve`` (then once more, warm,
from its memory cache), by three variants, pass by pass interleaved (``--repeat``):
``base`` (``--base CHECKOUT``: refmount without the metrics' counting), ``no-metrics`` (this
checkout, nobody scraping) and ``metrics`` (this checkout with ``-o metrics=...`` for the mount,
``/.refmount/metrics`` for the server, scraped every ``--scrape-interval`` seconds during the
pass). Medians of MB/s, requests/s and the daemon's CPU ms per MB.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table
from bench.serve import Serve

WORKLOADS = {"metrics": "64 KiB keys read cold through a mount and serve (and warm over serve), "
                        "with and without metrics scraped, against --base: MB/s, CPU ms/MB"}
PEERS = ("refmount",)
PIECE = 1 << 16


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_arguments(p: Any) -> None:
    p.add_argument("--metrics-keys", type=int, default=None, help="keys of 64 KiB (2048; --quick 256)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (metrics)")


class Scraper(threading.Thread):
    def __init__(self, url: str, interval: float, headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.interval, self.headers = url, interval, headers or {}
        self.stop = threading.Event()
        self.scrapes = 0
        self.failures = 0

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                with urllib.request.urlopen(urllib.request.Request(self.url, headers=self.headers),
                                            timeout=10) as r:
                    r.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1


def build(work: Path, url: str, n: int) -> Path:
    refs = {".zgroup": '{"zarr_format": 2}'}
    refs.update({f"k/{i}": [url, i * PIECE, PIECE] for i in range(n)})
    path = work / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def fuse_pass(refs: Path, work: Path, n: int, repo: Path, metrics: bool, interval: float) -> dict[str, float]:
    mnt = work / "mnt"
    opts = ["no_disk_cache", f"log={work / 'mount.log'}"]
    port = h.free_port() if metrics else 0
    if metrics:
        opts.append(f"metrics=127.0.0.1:{port}")
    m = h.mount_refmount(refs, mnt, opts, 120, log, repo=repo if repo != h.REPO else None)
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", interval) if metrics else None
    try:
        if scraper:
            scraper.start()
        cpu0 = h.proc_cpu(m.cpu_pid) or 0.0
        t0 = time.perf_counter()
        for i in range(n):
            fd = os.open(mnt / "k" / str(i), os.O_RDONLY)
            try:
                assert len(os.read(fd, PIECE)) == PIECE
            finally:
                os.close(fd)
        seconds = time.perf_counter() - t0
        cpu = (h.proc_cpu(m.cpu_pid) or 0.0) - cpu0
    finally:
        if scraper:
            scraper.stop.set()
            scraper.join()
        m.unmount(log)
    if scraper and scraper.scrapes == 0 and seconds > 2 * interval:
        raise h.Failed("no scrape answered")
    mb = n * PIECE / 1e6
    return {"fuse_mbps": mb / seconds, "fuse_cpu_ms_mb": 1000 * cpu / mb}


def serve_pass(refs: Path, work: Path, n: int, repo: Path, metrics: bool,
               interval: float) -> dict[str, float]:
    s = Serve(refs, work, repo=repo)
    s.start()
    scraper = Scraper(s.url + ".refmount/metrics", interval) if metrics else None
    out: dict[str, float] = {}
    try:
        if scraper:
            scraper.start()
        host, port = s.url.split("//")[1].rstrip("/").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        for phase in ("cold", "warm"):
            cpu0 = h.proc_cpu(s.pid) or 0.0
            t0 = time.perf_counter()
            for i in range(n):
                conn.request("GET", f"/k/{i}")
                r = conn.getresponse()
                assert r.status == 200 and len(r.read()) == PIECE
            seconds = time.perf_counter() - t0
            cpu = (h.proc_cpu(s.pid) or 0.0) - cpu0
            mb = n * PIECE / 1e6
            out[f"serve_{phase}_rps"] = n / seconds
            out[f"serve_{phase}_cpu_ms_mb"] = 1000 * cpu / mb
        conn.close()
    finally:
        if scraper:
            scraper.stop.set()
            scraper.join()
        s.stop()
    return out


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}, {max(values):.1f}]"


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    n = args.metrics_keys or (256 if args.quick else 2048)
    work.mkdir(parents=True, exist_ok=True)
    root = work / "root"
    root.mkdir(exist_ok=True)
    data = root / "data.bin"
    if not data.exists() or data.stat().st_size != n * PIECE:
        data.write_bytes(os.urandom(n * PIECE))
    nginx = h.Nginx(root, work / "nginx")
    nginx.start()
    variants: list[tuple[str, Path, bool]] = []
    if args.base is not None:  # serve's --base: a checkout without the metrics' counting
        variants.append(("base", args.base.resolve(), False))
    variants += [("no-metrics", h.REPO, False), ("metrics", h.REPO, True)]
    results: dict[str, list[dict[str, float]]] = {v[0]: [] for v in variants}
    try:
        refs = build(work, nginx.url("data.bin"), n)
        for rep in range(args.repeat):
            for name, repo, metrics in variants:
                h.wait_idle(args.quiet_wait, args.quiet_load)
                r = fuse_pass(refs, work, n, repo, metrics, args.scrape_interval)
                r.update(serve_pass(refs, work, n, repo, metrics, args.scrape_interval))
                log(f"pass {rep + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))
                results[name].append(r)
    finally:
        nginx.stop()
    columns = [("fuse_mbps", "mount cold MB/s"), ("fuse_cpu_ms_mb", "mount CPU ms/MB"),
               ("serve_cold_rps", "serve cold req/s"), ("serve_cold_cpu_ms_mb", "serve cold CPU ms/MB"),
               ("serve_warm_rps", "serve warm req/s"),
               ("serve_warm_cpu_ms_mb", "serve warm CPU ms/MB")]
    t = Table("metrics", f"metrics on the read path: {n} keys of 64 KiB, median [lowest, highest] of "
              f"{args.repeat} interleaved passes", ["variant", *(c[1] for c in columns)])
    for name, _, _ in variants:
        t.rows.append([name, *(cell([r[k] for r in results[name]]) for k, _ in columns)])
    t.data = {"results": results, "keys": n, "scrape_interval": args.scrape_interval}
    return [t]
