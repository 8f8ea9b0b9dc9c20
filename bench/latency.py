"""The ``latency`` workload: refmount next to its peers behind a server that answers late.

One file of incompressible bytes is served by nginx whose every response waits ``LATENCY`` ms
before its first byte (Debian's echo module: a timer, no CPU per byte; Range requests and
sendfile unchanged) and, with ``--bandwidth``, is capped per response by ``limit_rate``. For
each chunk size a reference set describes the start of the file as one zarr v2 array ``x``
(``<f8``, no compressor, chunks in key order: by default 4,096 x 64 KiB = 256 MiB, 1,024 x
1 MiB and 128 x 8 MiB = 1 GiB, so that each pass lasts long enough for readahead to reach its
steady state) plus ``data.bin`` = the whole file (``--size``, 1 GiB).

Rows, for each latency: zarr reading the whole array (one row per chunk size) and a
sequential read of the whole file (1 MiB reads). Peers: refmount (a fresh mount and a fresh
``cache_dir`` per pass), inproc (zarr over ``fsspec.get_mapper("reference://x",
asynchronous=True)``; ``ReferenceFileSystem.open().read(1 MiB)`` for the whole file),
fsspec-fuse, curl (the whole file in one request), local (zarr over a copy of the array's
files in tmpfs: the bound of the zarr rows). Each cell is the median of ``--repeat`` cold
passes in MB/s; every zarr pass checks the array against the file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table
from refmount.config import parse_size

WORKLOADS = {"latency": "zarr 64 KiB / 1 MiB / 8 MiB chunks and the whole file behind 0, 20, 50 ms"}
PEERS = ("refmount", "inproc", "fsspec-fuse", "curl", "local")
TITLES = {"refmount": "refmount", "inproc": "fsspec in-process", "fsspec-fuse": "fsspec.fuse",
          "curl": "curl", "local": "zarr on tmpfs"}


def add_arguments(p: Any) -> None:
    p.add_argument("--latencies", default="0,20,50", help="ms before each response's first byte")
    p.add_argument("--bandwidth", default=None, help="nginx limit_rate per response, e.g. 100m")
    p.add_argument("--chunks", default=None, help="zarr arrays: chunk size[:number of chunks] "
                   "(default 64k:4096,1m:1024,8m:128; --quick 64k:512,1m:128,8m:16)")


def human(n: int) -> str:
    for unit, size in (("MiB", h.MiB), ("KiB", h.KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def write_refs(path: Path, url: str, n: int, chunk: int) -> None:
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "data.bin": [url],
        "x/.zarray": h.zarray(n, chunk),
        "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
    }
    for i in range(n):
        refs[f"x/{i}"] = [url, i * chunk, chunk]
    path.write_text(json.dumps({"version": 1, "refs": refs}))


def child(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    res = h.run_child(kind, dict(spec, passes=1), timeout)[-1]
    if res.get("verify_failed"):
        raise h.Failed("MISMATCH")
    return res


class Run:
    def __init__(self, args: argparse.Namespace, peers: list[str], work: Path) -> None:
        self.args = args
        self.work = work
        self.size = parse_size(args.size or ("128M" if args.quick else "1G"))
        self.timeout = args.timeout or 180.0
        chunks = args.chunks or ("64k:512,1m:128,8m:16" if args.quick else "64k:4096,1m:1024,8m:128")
        # (chunk size, number of chunks): an array of the first chunk * count bytes of the file
        self.chunks: list[tuple[int, int]] = []
        for spec in chunks.split(","):
            size, _, count = spec.partition(":")
            chunk = parse_size(size)
            self.chunks.append((chunk, int(count) if count else self.size // chunk))
        self.file_size = max([self.size, *(c * n for c, n in self.chunks)])
        self.peers = peers
        self.data = self.work / "serve" / "data.bin"
        self.mnt = self.work / "mnt"
        self.logs = self.work / "logs"
        self.caches = h.CacheDirs(self.work / "cache")
        self.live: list[h.Mount] = []

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def mount(self, peer: str, refs: Path, tag: str) -> Path:
        h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        if peer == "refmount":  # cold: a fresh cache_dir as well as a fresh mount
            opts = [f"cache_dir={self.caches.fresh(tag)}", f"log={self.logs / f'refmount-{tag}.log'}"]
            m = h.mount_refmount(refs, self.mnt, [*opts, *filter(None, [self.args.refmount_opts])], 180,
                                 self.log, probe="data.bin")
        else:
            log = self.logs / f"fsspec-fuse-{tag}.log"
            m = h.mount_fsspec_fuse(refs, self.mnt, log, 60, probe="data.bin")
        self.live.append(m)
        return self.mnt

    def unmount_all(self) -> None:
        while self.live:
            self.live.pop().unmount(self.log)

    # ---- one cell ---------------------------------------------------------------------------
    def measure(self, peer: str, refs: Path, url: str, chunk: int | None, tag: str) -> float:
        timeout = self.timeout
        if peer == "curl":
            if chunk is not None:
                raise h.Failed("—")
            t0 = time.perf_counter()
            r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", url],
                               capture_output=True, text=True, timeout=timeout)
            return int(r.stdout or 0) / (time.perf_counter() - t0) / 1e6
        if peer == "local":
            if chunk is None:
                raise h.Failed("—")
            root = h.zarr_copy(refs, self.data, "x")
            try:
                res = child("zarr", {"store": "mount", "root": str(root), "array": "x",
                                     "local": str(self.data)}, timeout)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            return res["bytes"] / res["elapsed"] / 1e6
        if peer == "inproc":
            if chunk is None:
                res = child("inproc", {"refs": str(refs), "mode": "seq"}, timeout)
            else:
                res = child("zarr", {"store": "inproc", "refs": str(refs), "array": "x",
                                     "local": str(self.data)}, timeout)
            return res["bytes"] / res["elapsed"] / 1e6
        try:
            mnt = self.mount(peer, refs, tag)
            if chunk is None:
                t0 = time.perf_counter()
                r = subprocess.run(["dd", f"if={mnt / 'data.bin'}", "of=/dev/null", "bs=1M"],
                                   capture_output=True, text=True, timeout=timeout)
                if r.returncode != 0:
                    raise h.Failed("dd failed")
                return self.file_size / (time.perf_counter() - t0) / 1e6
            res = child("zarr", {"store": "mount", "root": str(mnt), "array": "x",
                                 "local": str(self.data)}, timeout)
            return res["bytes"] / res["elapsed"] / 1e6
        except subprocess.TimeoutExpired:
            raise h.Failed("timeout") from None
        finally:
            self.unmount_all()

    def cell(self, fn: Callable[[int], float]) -> str:
        values: list[float] = []
        for i in range(self.args.repeat):
            try:
                values.append(fn(i))
            except h.Failed as e:
                return str(e)
        return f"{statistics.median(values):,.0f}"

    # ---- the run ------------------------------------------------------------------------------
    def run(self) -> list[list[str]]:
        for d in (self.data.parent, self.mnt, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        h.ensure_data(self.data, self.file_size, self.log)
        rows: list[list[str]] = []
        for latency in [float(x) for x in self.args.latencies.split(",")]:
            nginx = h.Nginx(self.data.parent, self.work / "nginx", latency_ms=latency,
                            rate=self.args.bandwidth)
            nginx.start()
            try:
                h.warm_file(self.data)
                url = nginx.url("data.bin")
                cases: list[tuple[str, int | None, int]] = [
                    (f"zarr, {n:,} x {human(c)} chunks", c, n) for c, n in self.chunks]
                cases.append((f"whole file ({human(self.file_size)}), sequential 1 MiB reads", None, 0))
                for label, chunk, count in cases:
                    refs = self.work / f"refs-{chunk or 0}.json"
                    write_refs(refs, url, count, chunk or h.MiB)
                    row = [f"{latency:g} ms", label]
                    for peer in self.peers:
                        tag = f"{latency:g}ms-{chunk or 'seq'}-{peer}"
                        self.log(f"{tag} ...")
                        row.append(self.cell(lambda i, peer=peer, refs=refs, chunk=chunk, tag=tag,
                                             url=url: self.measure(peer, refs, url, chunk, f"{tag}-{i}")))
                        self.log(f"{tag}: {row[-1]}")
                    rows.append(row)
            finally:
                self.unmount_all()
                nginx.stop()
        return rows


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    r = Run(args, peers, work)
    try:
        rows = r.run()
    finally:
        r.unmount_all()
        r.caches.cleanup()
    notes = [f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"kernel {platform.release()}; bandwidth cap per response: {args.bandwidth or 'none'}"]
    return [Table("latency", f"refmount behind object-store latency (MB/s, cold, median of {args.repeat})",
                  ["latency", "workload", *[TITLES[x] for x in r.peers]], rows, notes,
                  align="ll" + "r" * len(r.peers))]
