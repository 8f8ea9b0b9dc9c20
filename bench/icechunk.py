"""The ``icechunk`` workload: an Icechunk repository of many virtual chunks, mounted by refmount
next to a Parquet reference set of the same chunks, and read cold next to icechunk's own store.

The repository (written once by icechunk 1.1.21 into the work directory, reused while its size
matches) holds one zarr v3 array ``x`` (``<f8``, no compressor) of ``--icechunk-chunks`` virtual
chunks (default 1,000,000) of ``--icechunk-chunk-size`` bytes (64 KiB), written in bulk
(``VirtualChunkSpec`` + ``store.set_virtual_refs``). Chunk ``i`` is the range ``i mod S`` of one
file of S = ``--icechunk-slab`` chunks (1,000) that nginx serves on 127.0.0.44:80 behind
``--icechunk-latency`` ms (20) before each response's first byte: port 80 because icechunk
1.1.21 drops the port of a virtual chunk's URL. The Parquet set (fsspec's LazyReferenceMapper
layout, ``record_size`` 10,000) names the same ranges as a zarr v2 array ``x``.

Columns: refmount mounting the repository (its virtual chunks authorised by a ``targets=`` rule),
refmount mounting the Parquet set, and icechunk 1.1.21's own store in the reading process
(``zarr.open_array(session.store)``, the container authorised by
``authorize_virtual_chunk_access``). Rows: ready (refmount's CLI from start to return, the
daemon serving; in-process: icechunk and zarr imported, repository, session and array opened),
RSS at ready (the daemon's VmRSS; in-process: the reading process's), a cold zarr read of the
first S chunks (seconds and MB/s, every byte checked against the file), RSS after it. Each
pass is cold: a fresh mount and a fresh ``cache_dir``, a fresh process for icechunk; each cell
the median of ``--repeat`` passes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table, fmt_value
from refmount.config import parse_size

WORKLOADS = {"icechunk": "an Icechunk repository of 1M virtual chunks next to a Parquet set of them: "
             "ready, RSS, a cold zarr read at 20 ms against icechunk's own store"}
PEERS = ("refmount", "icechunk")
HOST = "127.0.0.44"  # nginx on HOST:80 (icechunk 1.1.21 records a virtual chunk's URL without its port)
CONTAINER = f"http://{HOST}/"
RECORD_SIZE = 10_000
GOALS = "goals: ready ≤ 2 s and RSS ≤ 200 MiB for the repository; its cold read ≥ icechunk's store"


def add_arguments(p: Any) -> None:
    p.add_argument("--icechunk-chunks", type=int, default=None,
                   help="virtual chunks of the repository (default 1,000,000; --quick 10,000)")
    p.add_argument("--icechunk-chunk-size", default="64k", help="bytes of a virtual chunk (64k)")
    p.add_argument("--icechunk-slab", type=int, default=None,
                   help="chunks read cold, also the chunks of the served file (default 1,000; --quick 100)")
    p.add_argument("--icechunk-latency", type=float, default=20.0, help="ms before each response (20)")


# --------------------------------------------------------------------------------------------
# The repository and the Parquet set
# --------------------------------------------------------------------------------------------


def write_repository(root: Path, url: str, n: int, chunk: int, distinct: int,
                     log: Any = None, batch: int = 100_000) -> None:
    """An Icechunk repository at ``root`` (replaced) whose array ``x`` is ``n`` virtual chunks of
    ``url``: chunk i = bytes [(i mod distinct) * chunk, + chunk)."""
    import shutil

    import icechunk
    import zarr

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
        CONTAINER, icechunk.http_store({"allow_http": "true"})))  # plain http: nginx on loopback
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp)), config)
    session = repo.writable_session("main")
    group = zarr.group(store=session.store)
    elems = chunk // 8
    group.create_array("x", shape=(n * elems,), chunks=(elems,), dtype="<f8", compressors=None,
                       fill_value=0, dimension_names=["x"])
    for lo in range(0, n, batch):
        specs = [icechunk.VirtualChunkSpec(index=[i], location=url, offset=(i % distinct) * chunk,
                                           length=chunk) for i in range(lo, min(lo + batch, n))]
        failed = session.store.set_virtual_refs("x", specs, validate_containers=True)
        if failed:
            raise RuntimeError(f"icechunk refused {len(failed)} virtual refs, e.g. {failed[0]}")
        if log:
            log(f"  {min(lo + batch, n):,} of {n:,} virtual refs")
    session.commit(f"{n} virtual chunks")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


def write_parquet(root: Path, url: str, n: int, chunk: int, distinct: int) -> None:
    """The same chunks as a Parquet reference set (LazyReferenceMapper's layout) at ``root``."""
    import shutil

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "x").mkdir(parents=True)
    meta = {".zgroup": {"zarr_format": 2}, "x/.zarray": json.loads(h.zarray(n, chunk)),
            "x/.zattrs": {"_ARRAY_DIMENSIONS": ["x"]}}
    (tmp / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": RECORD_SIZE}))
    schema = pa.schema([pa.field("path", pa.string()), pa.field("offset", pa.int64(), nullable=False),
                        pa.field("size", pa.int64(), nullable=False), pa.field("raw", pa.binary())])
    raw = pa.nulls(RECORD_SIZE, pa.binary())
    for r in range(-(-n // RECORD_SIZE)):
        lo, hi = r * RECORD_SIZE, min((r + 1) * RECORD_SIZE, n)
        idx = np.arange(RECORD_SIZE, dtype=np.int64) + lo
        used = idx < hi  # rows past the last chunk: path null, offset/size 0 (as fsspec writes them)
        path = pa.array([url] * RECORD_SIZE, pa.string(), mask=~used)
        off = np.where(used, (idx % distinct) * chunk, 0)
        size = np.where(used, chunk, 0)
        table = pa.table([path, pa.array(off), pa.array(size), raw], schema=schema)
        pq.write_table(table, tmp / "x" / f"refs.{r}.parq", compression="zstd", write_statistics=True)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


# --------------------------------------------------------------------------------------------
# Measuring children (python -m bench.children icechunk_mount|icechunk_inproc SPEC)
# --------------------------------------------------------------------------------------------


def vm_rss() -> int:
    return h.proc_status(os.getpid()).get("VmRSS", 0)


def check_slab(data: Any, local: str) -> dict[str, Any]:
    import numpy as np

    raw = data.view(np.uint8)
    ok = bool(np.array_equal(raw, np.fromfile(local, dtype=np.uint8, count=raw.size)))
    return {"bytes": int(raw.size), "verified": "slab matches the file" if ok else "MISMATCH",
            "verify_failed": not ok}


def child_mount(spec: dict[str, Any]) -> None:
    """Read the first ``elems`` values of ``x`` through a mount (zarr over a LocalStore)."""
    import zarr

    store = zarr.storage.LocalStore(os.path.join(spec["root"], "x"), read_only=True)
    t0 = time.perf_counter()
    arr = zarr.open_array(store=store, mode="r", zarr_format=spec["zarr_format"])
    data = arr[: spec["elems"]]
    elapsed = time.perf_counter() - t0
    print(json.dumps({"elapsed": elapsed, **check_slab(data, spec["local"])}), flush=True)


def child_inproc(spec: dict[str, Any]) -> None:
    """icechunk's own store in this process: import, open (the container authorised), then the read."""
    t0 = time.perf_counter()
    import icechunk
    import zarr

    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(spec["repo"]),
                                    authorize_virtual_chunk_access={CONTAINER: None})
    session = repo.readonly_session(branch="main")
    arr = zarr.open_array(session.store, path="x", mode="r")
    ready = time.perf_counter() - t0
    rss_ready = vm_rss()
    t1 = time.perf_counter()
    data = arr[: spec["elems"]]
    elapsed = time.perf_counter() - t1
    print(json.dumps({"ready": ready, "rss_ready": rss_ready, "elapsed": elapsed, "rss_read": vm_rss(),
                      **check_slab(data, spec["local"])}), flush=True)


CHILDREN = {"icechunk_mount": child_mount, "icechunk_inproc": child_inproc}


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, peers: list[str], work: Path) -> None:
        self.args = args
        self.peers = peers
        self.work = work
        self.n = args.icechunk_chunks or (10_000 if args.quick else 1_000_000)
        self.chunk = parse_size(args.icechunk_chunk_size)
        if self.chunk % 8 or self.chunk <= 0:
            raise SystemExit("--icechunk-chunk-size: a positive multiple of 8 bytes")
        self.slab = min(self.n, args.icechunk_slab or (100 if args.quick else 1_000))
        self.timeout = args.timeout or 600.0
        self.data = work / "serve" / "data.bin"
        self.url = f"{CONTAINER}data.bin"
        self.repo = work / f"repo-{self.n}-{self.chunk}-{self.slab}"
        self.parquet = work / f"parquet-{self.n}-{self.chunk}-{self.slab}"
        self.mnt = work / "mnt"
        self.logs = work / "logs"
        self.caches = h.CacheDirs(work / "cache")
        self.live: list[h.Mount] = []

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def prepare(self) -> None:
        for d in (self.data.parent, self.mnt, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        h.ensure_data(self.data, self.slab * self.chunk, self.log)
        for path, write, what in ((self.repo, write_repository, "Icechunk repository"),
                                  (self.parquet, write_parquet, "Parquet set")):
            done = path.with_name(path.name + ".done")
            if done.exists() and path.exists():
                continue
            self.log(f"writing the {what} of {self.n:,} chunks at {path} ...")
            t0 = time.perf_counter()
            args: tuple[Any, ...] = (path, self.url, self.n, self.chunk, self.slab)
            write(*args, log=self.log) if write is write_repository else write(*args)
            done.write_text(f"{time.perf_counter() - t0:.1f} s\n")
            self.log(f"  written in {time.perf_counter() - t0:.1f} s")

    def unmount_all(self) -> None:
        while self.live:
            self.live.pop().unmount(self.log)

    def spec(self) -> dict[str, Any]:
        return {"elems": self.slab * self.chunk // 8, "local": str(self.data)}

    def child(self, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
        res = h.run_child(kind, spec, self.timeout, self.logs / f"{kind}.err")[-1]
        if res.get("verify_failed"):
            raise h.Failed("MISMATCH")
        return res

    def refmount_pass(self, source: Path, fmt: str, tag: str) -> dict[str, float]:
        h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        opts = [f"cache_dir={self.caches.fresh(tag)}", f"log={self.logs / f'refmount-{tag}.log'}"]
        if fmt == "icechunk":  # a rule covering the container authorises its virtual chunks
            opts.append("targets=" + json.dumps([{"prefix": CONTAINER}]))
        opts += list(filter(None, [self.args.refmount_opts]))
        probe = "x/zarr.json" if fmt == "icechunk" else "x/.zarray"
        m = h.mount_refmount(source, self.mnt, opts, self.timeout, self.log, probe=probe)
        self.live.append(m)
        try:
            rss_ready = h.proc_status(m.cpu_pid).get("VmRSS", 0)
            res = self.child("icechunk_mount", {**self.spec(), "root": str(self.mnt),
                                                "zarr_format": 3 if fmt == "icechunk" else 2})
            rss_read = h.proc_status(m.cpu_pid).get("VmRSS", 0)
        finally:
            self.unmount_all()
        return {"ready": m.seconds, "rss_ready": rss_ready, "elapsed": res["elapsed"],
                "bytes": res["bytes"], "rss_read": rss_read}

    def inproc_pass(self) -> dict[str, float]:
        h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        return self.child("icechunk_inproc", {**self.spec(), "repo": str(self.repo)})

    def column(self, name: str, one: Any) -> list[str]:
        passes: list[dict[str, float]] = []
        for i in range(self.args.repeat):
            self.log(f"{name}, pass {i + 1} ...")
            try:
                passes.append(one(i))
            except h.Failed as e:
                self.log(f"  {name}: {e}")
                return [str(e)] * 5
            self.log(f"  {passes[-1]}")

        def med(key: str) -> float:
            return statistics.median(p[key] for p in passes)

        return [f"{med('ready'):.2f}", f"{med('rss_ready') / h.MiB:,.0f}", f"{med('elapsed'):.2f}",
                fmt_value(statistics.median(p["bytes"] / p["elapsed"] / 1e6 for p in passes)),
                f"{med('rss_read') / h.MiB:,.0f}"]

    def run(self) -> tuple[list[str], list[list[str]]]:
        self.prepare()
        nginx = h.Nginx(self.data.parent, self.work / "nginx", latency_ms=self.args.icechunk_latency,
                        host=HOST, port=80)
        nginx.start()
        columns: list[tuple[str, list[str]]] = []
        try:
            h.warm_file(self.data)
            if "refmount" in self.peers:
                columns.append(("refmount, Icechunk", self.column(
                    "refmount icechunk", lambda i: self.refmount_pass(self.repo, "icechunk", f"ic-{i}"))))
                columns.append(("refmount, Parquet", self.column(
                    "refmount parquet", lambda i: self.refmount_pass(self.parquet, "parquet", f"pq-{i}"))))
            if "icechunk" in self.peers:
                columns.append(("icechunk 1.1.21 in-process", self.column(
                    "icechunk in-process", lambda i: self.inproc_pass())))
        finally:
            self.unmount_all()
            nginx.stop()
        mib = self.slab * self.chunk / h.MiB
        labels = ["ready (s): mount returned / imported, repository and array opened", "RSS at ready (MiB)",
                  f"cold zarr read of {self.slab:,} chunks ({mib:,.0f} MiB), s", "cold read, MB/s",
                  "RSS after the read (MiB)"]
        rows = [[label, *(cells[k] for _, cells in columns)] for k, label in enumerate(labels)]
        return [title for title, _ in columns], rows


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    r = Run(args, peers, work)
    try:
        titles, rows = r.run()
    finally:
        r.unmount_all()
        r.caches.cleanup()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    notes = [f"{r.n:,} virtual chunks of {r.chunk:,} bytes, read behind {args.icechunk_latency:g} ms; "
             f"RSS: the refmount daemon's VmRSS, in-process: the reading process's; {GOALS}",
             f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"kernel {platform.release()}; load average at the end (1/5/15 min): {load}"]
    return [Table("icechunk", f"An Icechunk repository of {r.n:,} virtual chunks (cold, median of "
                  f"{args.repeat})", ["", *titles], rows, notes, align="l" + "r" * len(titles))]
