"""The ``workers`` workload: many readers of one dataset, as Dask computes over it.

One file of incompressible bytes is served by nginx (without and with added latency, as in
``latency``); for each chunk size a reference set describes it as one zarr v2 array ``x``
(``<f8``, no compressor, chunks in key order: by default 4,096 x 64 KiB (256 MiB) and 1,024 x
1 MiB (1 GiB): with eight workers, 512 and 128 chunks a worker, so that the few chunks each
worker reads before its readahead starts are not most of what it reads). A
``dask.distributed`` ``LocalCluster`` of 1, 4 or 8 worker processes (one thread each) reads
the array cold, each worker its own contiguous slab of chunks (a quarter with four workers),
all at once: zarr in each worker, each worker reading its part of the one target file at its
own place.

Peers: ``refmount`` (a fresh mount and ``cache_dir`` per pass; the workers read it as a
directory), ``serve`` (a fresh ``refmount serve`` per pass; ``zarr.open_array(URL)`` over
fsspec's HTTP file system in each worker; ``--refmount-opts`` apply to it too), ``inproc``
(fsspec's ``reference://`` in each worker over the same nginx), and with ``--base CHECKOUT``
the other checkout's mount and ``serve``, interleaved with this one's pass by pass.

Each cell: MB/s of the whole array (its bytes over the time from the first worker's start to
the last one's end), then the demand misses as a fraction of the chunks (refmount's
``misses``: reads that waited for a fetch of their own; for fsspec every chunk is one), the
requests nginx answered per chunk, and the busy cores of the machine during the pass (of 2;
near 2 the cores are the bound, not the link). Every worker checks its slab against the file.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.latency import human, write_refs
from bench.report import Table
from refmount.config import parse_size

WORKLOADS = {"workers": "1, 4, 8 Dask worker processes reading one dataset cold: a mount, serve, "
                        "fsspec reference:// in each worker (64 KiB / 1 MiB chunks; 0 and 20 ms)"}
PEERS = ("refmount", "serve", "inproc")
TITLES = {"refmount": "mount", "refmount/base": "mount (base)", "serve": "serve",
          "serve/base": "serve (base)", "inproc": "fsspec in each worker"}


def add_arguments(p: Any) -> None:
    p.add_argument("--workers", default="1,4,8", help="Dask worker processes (workers workload)")
    p.add_argument("--worker-chunks", default=None, help="workers: chunk size[:number of chunks] "
                   "(default 64k:4096,1m:1024; --quick 64k:512,1m:128)")
    p.add_argument("--worker-latencies", default="0,20", help="workers: ms before each response's first byte")


# ---- in the Dask workers ----------------------------------------------------------------------
def read_slab(kind: str, where: str, refs: str, lo: int, hi: int, data: str) -> dict[str, Any]:
    """Chunks [lo, hi) of array ``x``: through a mount's directory, serve's URL or fsspec's
    reference:// (``refs``); checked against the file ``data``."""
    import numpy as np
    import zarr

    c0 = time.process_time()
    t0 = time.time()
    if kind == "mount":
        store: Any = zarr.storage.LocalStore(os.path.join(where, "x"), read_only=True)
    elif kind == "serve":
        store = where + "x"
    else:
        import fsspec

        store = fsspec.get_mapper("reference://x", fo=refs, remote_protocol="http",
                                  remote_options={"asynchronous": True}, asynchronous=True,
                                  skip_instance_cache=True)
    arr = zarr.open_array(store=store, mode="r", zarr_format=2)
    elems = arr.chunks[0]
    got = arr[lo * elems: hi * elems]
    t1 = time.time()
    cpu = time.process_time() - c0
    expect = np.memmap(data, dtype="<f8", mode="r", offset=lo * elems * 8, shape=((hi - lo) * elems,))
    ok = bool(np.array_equal(got.view(np.uint8), np.asarray(expect).view(np.uint8)))
    return {"start": t0, "end": t1, "bytes": int(got.nbytes), "cpu": cpu, "ok": ok}


# ---- the run ------------------------------------------------------------------------------------
class Run:
    def __init__(self, args: argparse.Namespace, peers: list[str], work: Path) -> None:
        self.args = args
        self.work = work
        self.timeout = args.timeout or 300.0
        chunks = args.worker_chunks or ("64k:512,1m:128" if args.quick else "64k:4096,1m:1024")
        self.chunks: list[tuple[int, int]] = []
        for spec in chunks.split(","):
            size, _, count = spec.partition(":")
            self.chunks.append((parse_size(size), int(count)))
        self.file_size = max(c * n for c, n in self.chunks)
        self.columns = [p for p in ("refmount", "refmount/base", "serve", "serve/base", "inproc")
                        if p.split("/")[0] in peers and (not p.endswith("/base") or args.base)]
        self.data = work / "serve" / "data.bin"
        self.mnt = work / "mnt"
        self.logs = work / "logs"
        self.caches = h.CacheDirs(work / "cache")
        self.live: list[h.Mount] = []
        self.servers: list[Any] = []

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def stop_all(self) -> None:
        while self.live:
            self.live.pop().unmount(self.log)
        while self.servers:
            self.servers.pop().stop()

    def pass_(self, client: Any, peer: str, refs: Path, chunk: int, n: int, workers: int,
              nginx: h.Nginx, tag: str) -> dict[str, Any]:
        """One cold pass of ``peer``: the workers' results and the counters."""
        from bench.serve import Serve

        repo = self.args.base if peer.endswith("/base") else None
        kind, where, daemon = "inproc", "", None
        stats: Any = None
        if peer.startswith("refmount"):
            opts = [f"cache_dir={self.caches.fresh(tag)}", f"log={self.logs / f'{tag}.log'}",
                    *filter(None, [self.args.refmount_opts])]
            m = h.mount_refmount(refs, self.mnt, opts, 180, self.log, probe="x/.zarray", repo=repo)
            self.live.append(m)
            kind, where, daemon, stats = "mount", str(self.mnt), m.cpu_pid, m.stats
        elif peer.startswith("serve"):
            s = Serve(refs, self.logs, repo or h.REPO, self.args.refmount_opts or "")
            s.start()
            self.servers.append(s)
            kind, where, daemon, stats = "serve", s.url, s.pid, s.stats
        per = n // workers
        addresses = sorted(client.scheduler_info()["workers"])
        kids = h.children_of(daemon) if daemon else []  # a mount's cache writer
        cpu0 = h.proc_cpu(daemon) if daemon else None
        kids0 = sum(h.proc_cpu(k) or 0.0 for k in kids)
        nginx0, requests0, busy0 = nginx.cpu(), nginx.requests(), h.machine_busy()
        t0 = time.time()
        futures = [client.submit(read_slab, kind, where, str(refs), w * per,
                                 n if w == workers - 1 else (w + 1) * per, str(self.data),
                                 workers=[addresses[w]], pure=False)
                   for w in range(workers)]
        results = client.gather(futures)
        wall = time.time() - t0
        busy = (h.machine_busy() - busy0) / wall
        if not all(r["ok"] for r in results):
            raise h.Failed("MISMATCH")
        counters = stats() if stats else None
        cpu1 = h.proc_cpu(daemon) if daemon else None
        kids1 = sum(h.proc_cpu(k) or 0.0 for k in kids)
        seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
        counters = counters or {}
        mb = sum(r["bytes"] for r in results) / 1e6
        daemon_s = (cpu1 - cpu0) + (kids1 - kids0) if cpu0 is not None and cpu1 is not None else 0.0
        return {"mbs": mb / seconds,
                "workers_ms_mb": sum(r["cpu"] for r in results) / mb * 1e3,
                "daemon_ms_mb": daemon_s / mb * 1e3,
                "misses": counters.get("misses"), "requests": nginx.requests() - requests0, "busy": busy,
                "daemon_cpu": (cpu1 - cpu0) / wall if cpu0 is not None and cpu1 is not None else None,
                "workers_cpu": sum(r["cpu"] for r in results) / seconds,
                "nginx_cpu": (nginx.cpu() - nginx0) / wall, "streams": counters.get("readahead_streams")}

    def cell(self, results: list[dict[str, Any]], n: int, peer: str) -> str:
        if not results:
            return "—"
        mbs = statistics.median(r["mbs"] for r in results)
        r = sorted(results, key=lambda r: r["mbs"])[len(results) // 2]
        miss = "1" if peer == "inproc" else (f"{r['misses'] / n:.2f}" if r["misses"] is not None else "?")
        return f"{mbs:,.0f} ({miss}, {r['requests'] / n:.2f}, {r['busy']:.1f})"

    @staticmethod
    def cpu_cell(results: list[dict[str, Any]]) -> str:
        """CPU milliseconds per MB read, the workers' and the daemon's (with its children), of
        the median pass: what one MB costs the machine's cores, whatever else runs on them."""
        if not results:
            return "—"
        r = sorted(results, key=lambda r: r["mbs"])[len(results) // 2]
        return f"{r['workers_ms_mb']:.1f} + {r['daemon_ms_mb']:.1f}"

    def run(self) -> tuple[list[list[str]], list[str]]:
        from dask.distributed import Client, LocalCluster

        for d in (self.data.parent, self.mnt, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        h.ensure_data(self.data, self.file_size, self.log)
        rows: list[list[str]] = []
        self.cpu_rows: list[list[str]] = []
        details: list[str] = []
        for workers in [int(x) for x in self.args.workers.split(",")]:
            with LocalCluster(n_workers=workers, processes=True, threads_per_worker=1, dashboard_address=None,
                              host="127.0.0.1") as cluster, Client(cluster) as client:
                client.wait_for_workers(workers, timeout=120)
                client.run(lambda: __import__("zarr") and __import__("fsspec") and None)
                for latency in [float(x) for x in self.args.worker_latencies.split(",")]:
                    nginx = h.Nginx(self.data.parent, self.work / "nginx", latency_ms=latency,
                                    access_log=self.work / "nginx" / "access.log")
                    nginx.start()
                    try:
                        h.warm_file(self.data)
                        for chunk, n in self.chunks:
                            refs = self.work / f"refs-{chunk}.json"
                            write_refs(refs, nginx.url("data.bin"), n, chunk)
                            got: dict[str, list[dict[str, Any]]] = {p: [] for p in self.columns}
                            for i in range(self.args.repeat):  # interleaved: each peer once a round
                                for peer in self.columns:
                                    tag = f"{workers}w-{latency:g}ms-{chunk}-{peer.replace('/', '-')}-{i}"
                                    h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
                                    try:
                                        r = self.pass_(client, peer, refs, chunk, n, workers, nginx, tag)
                                        got[peer].append(r)
                                        self.log(f"{tag}: {r}")
                                        details.append(f"- {tag}: " + ", ".join(
                                            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in r.items()))
                                    except (h.Failed, subprocess.TimeoutExpired, RuntimeError) as e:
                                        self.log(f"{tag}: {e}")
                                        details.append(f"- {tag}: {e}")
                                    finally:
                                        self.stop_all()
                            rows.append([f"{latency:g} ms", f"{n:,} x {human(chunk)}", str(workers),
                                         *[self.cell(got[p], n, p) for p in self.columns]])
                            self.cpu_rows.append([*rows[-1][:3],
                                                  *[self.cpu_cell(got[p]) for p in self.columns]])
                    finally:
                        self.stop_all()
                        nginx.stop()
        return rows, details


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    r = Run(args, peers, work)
    try:
        rows, details = r.run()
    finally:
        r.stop_all()
        r.caches.cleanup()
    notes = [f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
             "each cell: MB/s (demand misses per chunk, nginx requests per chunk, busy cores of the "
             f"machine), median of {args.repeat}; base: {args.base or 'none'}"]
    t = Table("workers", "Dask worker processes reading one array cold, each its own slab (MB/s; misses "
              "and requests per chunk; busy cores)",
              ["latency", "array", "workers", *[TITLES[c] for c in r.columns]],
              rows, notes, align="lll" + "r" * len(r.columns))
    t.details = details
    cpu = Table("workers-cpu", "the same passes: CPU milliseconds per MB read, the workers' + refmount's "
                "daemon's (with its cache writer); fsspec in each worker has no daemon",
                ["latency", "array", "workers", *[TITLES[c] for c in r.columns]],
                r.cpu_rows, ["CPU seconds from /proc (user + system) and the workers' process_time, over "
                             "the MB of the whole array; the median pass by MB/s"],
                align="lll" + "r" * len(r.columns))
    return [t, cpu]
