"""The ``native`` workload: an Icechunk repository of many small native chunks, read cold through a
mount next to icechunk's own store in the reading process, and by CDO through ``-o decode`` next
to the same array as a plain Zarr v2 directory.

The repository (written once by icechunk 1.1.21 and zarr into the work directory, reused while
its size matches) holds one array ``t`` (``int8``, shape ``(--native-steps, 1000, 1000)``, chunks
1x50x50: 400 chunks a step, 80,000 for 200 steps, zstd), every chunk an object of its own. Rows:

* a cold zarr read of the first ``--native-read`` chunks (2,000: five steps), seconds, for each
  latency of ``--native-latencies`` (ms before each response; 0: the repository on local disk,
  mounted from its directory; otherwise nginx serves the repository's directory and refmount
  mounts its URL). Columns: refmount (a fresh mount and a fresh ``cache_dir`` per pass), the
  ``--base`` checkout's refmount the same way (when given), and icechunk's own store in a fresh
  process (``zarr.open_array(session.store)``: the local directory; behind latency icechunk
  1.1.21 has no HTTP storage of repositories, so that cell is empty). Every value is checked.
* with ``cdo`` among the peers: ``cdo -s output -fldmean`` of the whole array through a fresh ``-o
  decode`` mount (netCDF-C's NCZarr reading the decoded Zarr v2 view), against the same
  command over a plain Zarr v2 copy of the array (no compressor) on local disk.

Passes of the columns are interleaved (refmount, base, icechunk, refmount, ...), each cell the
median of ``--repeat`` passes.
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
from functools import partial
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table

WORKLOADS = {"native": "an Icechunk repository of 80,000 native chunks: a cold zarr read of 2,000 "
             "against icechunk's store, local and behind latency; CDO fldmean via -o decode"}
PEERS = ("refmount", "icechunk", "cdo")
HOST = "127.0.0.45"
SIDE = 1000
CHUNK = 50
PER_STEP = (SIDE // CHUNK) ** 2


def add_arguments(p: Any) -> None:
    p.add_argument("--native-steps", type=int, default=None,
                   help="steps of the array, 400 chunks each (default 200; --quick 20)")
    p.add_argument("--native-read", type=int, default=None,
                   help="chunks read cold, whole steps (default 2,000; --quick 800)")
    p.add_argument("--native-latencies", default="0,20", help="ms before each response, 0 = local (0,20)")


def write_repository(root: Path, steps: int) -> None:
    import icechunk
    import numpy as np
    import zarr

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp)))
    session = repo.writable_session("main")
    group = zarr.group(store=session.store)
    arr = group.create_array("t", shape=(steps, SIDE, SIDE), chunks=(1, CHUNK, CHUNK), dtype="i1",
                             compressors=zarr.codecs.ZstdCodec(), fill_value=0,
                             dimension_names=["time", "y", "x"])
    for k in range(steps):
        arr[k] = step_values(np, k)
    session.commit(f"{steps} steps")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


def step_values(np: Any, k: int) -> Any:
    """The values of step ``k``: noise (compresses to about half) plus the step number."""
    rng = np.random.default_rng(k)
    return (rng.integers(0, 16, size=(SIDE, SIDE)) + k % 100).astype("i1")


def write_plain_v2(root: Path, steps: int) -> None:
    """The same array as a Zarr v2 directory without a compressor (what NCZarr reads fastest)."""
    import numpy as np
    import zarr

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    group = zarr.open_group(str(tmp), mode="w", zarr_format=2)
    arr = group.create_array("t", shape=(steps, SIDE, SIDE), chunks=(1, CHUNK, CHUNK), dtype="i1",
                             compressors=None, fill_value=0,
                             attributes={"_ARRAY_DIMENSIONS": ["time", "y", "x"]})
    for k in range(steps):
        arr[k] = step_values(np, k)
    zarr.consolidate_metadata(str(tmp))
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


# ---- measuring children (python -m bench.children native_mount|native_inproc SPEC) -----------


def check(data: Any, steps: int) -> dict[str, Any]:
    import numpy as np

    ok = all(np.array_equal(data[k], step_values(np, k)) for k in range(steps))
    return {"verify_failed": not ok, "verified": "values match" if ok else "MISMATCH"}


def child_mount(spec: dict[str, Any]) -> None:
    import zarr

    store = zarr.storage.LocalStore(os.path.join(spec["root"], "t"), read_only=True)
    t0 = time.perf_counter()
    data = zarr.open_array(store=store, mode="r", zarr_format=3)[: spec["steps"]]
    elapsed = time.perf_counter() - t0
    print(json.dumps({"elapsed": elapsed, **check(data, spec["steps"])}), flush=True)


def child_inproc(spec: dict[str, Any]) -> None:
    import icechunk
    import zarr

    t0 = time.perf_counter()
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(spec["repo"]))
    arr = zarr.open_array(repo.readonly_session(branch="main").store, path="t", mode="r")
    data = arr[: spec["steps"]]
    elapsed = time.perf_counter() - t0
    print(json.dumps({"elapsed": elapsed, **check(data, spec["steps"])}), flush=True)


CHILDREN = {"native_mount": child_mount, "native_inproc": child_inproc}


# ---- the run ---------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, peers: list[str], work: Path) -> None:
        self.args = args
        self.peers = peers
        self.work = work
        self.steps = args.native_steps or (20 if args.quick else 200)
        read = args.native_read or (800 if args.quick else 2000)
        self.read_steps = max(1, min(self.steps, read // PER_STEP))
        self.latencies = [float(x) for x in args.native_latencies.split(",") if x.strip()]
        self.base = Path(args.base).resolve() if getattr(args, "base", None) else None
        self.timeout = args.timeout or 900.0
        self.repo = work / f"repo-{self.steps}"
        self.plain = work / f"plain-v2-{self.steps}"
        self.mnt = work / "mnt"
        self.logs = work / "logs"
        self.caches = h.CacheDirs(work / "cache")
        self.live: list[h.Mount] = []
        self.nginx: dict[float, h.Nginx] = {}

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def prepare(self) -> None:
        for d in (self.mnt, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        todo = [(self.repo, write_repository, "Icechunk repository")]
        if "cdo" in self.peers:
            todo.append((self.plain, write_plain_v2, "plain Zarr v2 copy"))
        for path, write, what in todo:
            done = path.with_name(path.name + ".done")
            if done.exists() and path.exists():
                continue
            self.log(f"writing the {what} of {self.steps * PER_STEP:,} chunks at {path} ...")
            t0 = time.perf_counter()
            write(path, self.steps)
            done.write_text(f"{time.perf_counter() - t0:.1f} s\n")

    def unmount_all(self) -> None:
        while self.live:
            self.live.pop().unmount(self.log)

    def source(self, latency: float) -> str:
        if not latency:
            return str(self.repo)
        nginx = self.nginx.get(latency)
        if nginx is None:
            nginx = self.nginx[latency] = h.Nginx(self.work, self.work / f"nginx-{latency:g}",
                                                  latency_ms=latency, host=HOST)
            nginx.start()
        return f"http://{HOST}:{nginx.port}/{self.repo.name}"

    def mount(self, source: str, tag: str, repo: Path | None, extra: list[str]) -> h.Mount:
        h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        opts = [f"cache_dir={self.caches.fresh(tag)}", f"log={self.logs / f'refmount-{tag}.log'}", *extra]
        opts += list(filter(None, [self.args.refmount_opts]))
        probe = "t/.zarray" if "decode" in extra else "t/zarr.json"
        # a URL as it is: Path() would merge the slashes of http://
        m = h.mount_refmount(source, self.mnt, opts, self.timeout, self.log,  # type: ignore[arg-type]
                             probe=probe, repo=repo)
        self.live.append(m)
        return m

    def mount_pass(self, latency: float, tag: str, repo: Path | None) -> float:
        self.mount(self.source(latency), tag, repo, [])
        try:
            res = self.child("native_mount", {"root": str(self.mnt), "steps": self.read_steps})
        finally:
            self.unmount_all()
        return float(res["elapsed"])

    def inproc_pass(self) -> float:
        h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        spec = {"repo": str(self.repo), "steps": self.read_steps}
        return float(self.child("native_inproc", spec)["elapsed"])

    def child(self, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
        res = h.run_child(kind, spec, self.timeout, self.logs / f"{kind}.err")[-1]
        if res.get("verify_failed"):
            raise h.Failed("MISMATCH")
        return res

    def cdo(self, url: str) -> tuple[float, str]:
        t0 = time.perf_counter()
        r = subprocess.run(["cdo", "-s", "output", "-fldmean", url],
                           capture_output=True, text=True, timeout=self.timeout)
        if r.returncode:
            raise h.Failed(f"cdo failed: {r.stderr.strip()[-200:]}")
        return time.perf_counter() - t0, r.stdout

    def cdo_mount_pass(self, tag: str, repo: Path | None) -> tuple[float, str]:
        self.mount(str(self.repo), tag, repo, ["decode"])
        try:
            return self.cdo(f"file://{self.mnt}#mode=zarr,file")
        finally:
            self.unmount_all()

    def cdo_plain_pass(self) -> tuple[float, str]:
        h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        h.drop_page_cache([self.plain])
        return self.cdo(f"file://{self.plain}#mode=zarr,file")

    def run(self) -> tuple[list[str], list[list[str]]]:
        self.prepare()
        ice, plain = "icechunk 1.1.21 in-process", "plain Zarr v2 on disk (cdo)"
        cols = ["refmount", *(["refmount (base)"] if self.base else []),
                *([ice] if "icechunk" in self.peers else []), *([plain] if "cdo" in self.peers else [])]
        cells: dict[tuple[str, str], list[float]] = {}

        def measure(row: str, col: str, one: Any) -> Any:
            try:
                value = one()
            except h.Failed as e:
                self.log(f"  {row} / {col}: {e}")
                cells.setdefault((row, col), [])
                return None
            self.log(f"  {row} / {col}: {value if isinstance(value, float) else value[0]:.2f} s")
            cells.setdefault((row, col), []).append(value if isinstance(value, float) else value[0])
            return value

        rows = []
        for lat in self.latencies:
            rows.append(f"cold zarr read of {self.read_steps * PER_STEP:,} chunks, "
                        + ("local" if not lat else f"behind {lat:g} ms") + ", s")
        cdo_row = f"cdo fldmean of {self.steps * PER_STEP:,} chunks, s"
        for i in range(self.args.repeat):
            for lat, row in zip(self.latencies, rows, strict=True):
                if "refmount" in self.peers:
                    measure(row, "refmount", partial(self.mount_pass, lat, f"r{i}", None))
                    if self.base:
                        measure(row, "refmount (base)", partial(self.mount_pass, lat, f"b{i}", self.base))
                if "icechunk" in self.peers and not lat:
                    measure(row, ice, self.inproc_pass)
            if "cdo" in self.peers:
                mine = measure(cdo_row, "refmount", partial(self.cdo_mount_pass, f"c{i}", None))
                if self.base:
                    measure(cdo_row, "refmount (base)", partial(self.cdo_mount_pass, f"cb{i}", self.base))
                theirs = measure(cdo_row, plain, self.cdo_plain_pass)
                if mine and theirs and mine[1].split() != theirs[1].split():
                    self.log("  cdo: the means through the mount differ from the plain copy's")
                    cells[(cdo_row, "refmount")] = []

        def cell(row: str, col: str) -> str:
            got = cells.get((row, col))
            if got is None:
                return "—"
            return f"{statistics.median(got):.2f}" if got else "failed"

        table = [[row, *(cell(row, c) for c in cols)] for row in rows]
        for row, col, goal in [*((r, ice, "icechunk") for r in rows), (cdo_row, plain, "the plain copy")]:
            mine, theirs = cells.get((row, "refmount")), cells.get((row, col))
            if mine and theirs:
                table.append([f"  refmount's speed relative to {goal} ({row.removesuffix(', s')})",
                              f"{statistics.median(theirs) / statistics.median(mine):.2f}x",
                              *([""] * (len(cols) - 1))])
        if "cdo" in self.peers:
            table.append([cdo_row, *(cell(cdo_row, c) for c in cols)])
        return cols, table


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    r = Run(args, peers, work)
    try:
        cols, rows = r.run()
    finally:
        r.unmount_all()
        for nginx in r.nginx.values():
            nginx.stop()
        r.caches.cleanup()
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    notes = [f"{r.steps:,} steps of 400 native chunks (int8, 1x50x50, zstd); each cell the median of "
             f"{args.repeat} cold passes, interleaved; goals: ≥ 1.0x icechunk locally, ≥ 1.5x behind "
             "20 ms, CDO within 3x of the plain copy",
             f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
             f"load average at the end (1/5/15 min): {load}"]
    return [Table("native", "Icechunk native chunks (cold)", ["", *cols], rows, notes,
                  align="l" + "r" * len(cols))]
