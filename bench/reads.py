"""The read-path workloads (``seq``, ``m1``, ``f64``, ``batch``, ``zarr``, ``decode``): refmount
next to its peers reading one file served by nginx on loopback, one table.

The served file (incompressible bytes, ``--size``) is described by one Version 0 set:
``data.bin`` = the whole file; ``a/0`` ... = 64 KiB ranges (zarr array ``a``, ``<f8``, no
compressor); ``b/0`` ... = 1 MiB ranges (array ``b``). ``decode`` has a set of its own: a
float32 array ``z`` of 1 MiB chunks stored with shuffle+zlib as kerchunk describes HDF5,
read by zarr through ``-o decode`` (the mount decodes), through the raw mount (zarr decodes),
in-process (zarr decodes) and by ``ncdump -v z`` through ``-o decode``.

Peers: refmount (the CLI's daemon); fsspec-fuse (``fsspec.fuse.run`` over
``ReferenceFileSystem``, fusepy, single-threaded); inproc (``ReferenceFileSystem`` in the
reading process: ``cat_file`` per key from N threads, ``open().read(1 MiB)``, ``cat(all
keys)``, zarr over ``get_mapper("reference://...", asynchronous=True)``); curl (the same
ranges over HTTP, ``--parallel-max N``); local (the served file in the page cache; for zarr a
copy of the array's files in tmpfs; in the disk-cache warm rows the same bytes from the disk).

Cold = a fresh mount and a fresh ``cache_dir``, the page cache dropped and the served file
read back into it. Warm = a second pass on the same mount. Disk-cache warm = unmounted, page
cache dropped, mounted again with the same ``cache_dir``. Before each cold pass the run waits
for an idle machine; a pass during which other processes (or the hypervisor's steal time)
used more than ``--disturbed-load`` cores is redone (``--retries``), else the best attempt is
shown with a dagger. ``--profile`` adds py-spy passes of the daemon to the details.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table, fmt_value
from refmount.config import parse_size

PY = h.PY
REPO = h.REPO
KiB, MiB, GiB = h.KiB, h.MiB, h.GiB

PEERS = ("refmount", "fsspec-fuse", "inproc", "curl", "local")
PEER_TITLES = {
    "refmount": "refmount",
    "fsspec-fuse": "fsspec.fuse",
    "inproc": "fsspec in-process",
    "curl": "curl",
    "local": "local (page cache; disk in disk-warm rows)",
}
WORKLOADS = {
    "seq": "whole file, cold / second / disk-cache warm sequential read (dd bs=1M)",
    "m1": "1 MiB refs in key order, 1 reader: cold / second / disk-cache warm",
    "f64": "64 KiB files with 1, 8, 32 readers (--readers): cold / second / disk-cache warm",
    "batch": "64 KiB files in one batched fs.cat (in-process only)",
    "zarr": "zarr arrays of 64 KiB and 1 MiB chunks, full read: cold / second",
    "decode": "zlib+shuffle array: zarr via -o decode, via the raw mount, ncdump -v via -o decode",
}


# ============================================================================================
# Rows of the table
# ============================================================================================


@dataclass
class Row:
    id: str
    label: str
    unit: str  # "MB/s" | "GB/s" | "files/s"
    goal: str = ""
    threshold: float | None = None  # refmount >= threshold
    vs_inproc: bool = False  # refmount >= inproc_share x fsspec in-process
    inproc_share: float = 1.0


def make_rows(readers: list[int], n64: int, n1m: int, n_dec: int) -> list[Row]:
    rows = [
        Row("seq_cold", "whole file `[url]`: cold sequential read, dd bs=1M", "MB/s",
            "≥ 700 MB/s", 700),
        Row("seq_cold_nodisk", "whole file: cold sequential read, refmount `-o no_disk_cache` (what "
            "writing the disk cache costs)", "MB/s"),
        Row("seq_warm", "whole file: second read (warm, same mount)", "GB/s", "≥ 3 GB/s", 3),
        Row("seq_disk", "whole file: disk-cache warm (remount, page cache dropped)", "GB/s",
            "≥ 1 GB/s", 1),
        Row("m1_cold", f"{n1m:,} x 1 MiB refs in key order, 1 reader: cold", "MB/s"),
        Row("m1_warm", "1 MiB refs in key order: warm (second pass)", "MB/s"),
        Row("m1_disk", "1 MiB refs in key order: disk-cache warm", "MB/s", "≥ 1 GB/s", 1000),
    ]
    for kind, what in (("cold", "cold"), ("warm", "warm (second pass)"), ("disk", "disk-cache warm")):
        for n in readers:
            r = Row(f"f64_{kind}_{n}", f"{n64:,} x 64 KiB files, {n} reader{'s' * (n > 1)}: {what}",
                    "files/s")
            if kind == "cold" and n >= 8:
                r.goal, r.threshold = "≥ 2,000 files/s", 2000
            if kind == "warm" and n >= 8:
                r.goal, r.threshold = "≥ 3,000 files/s", 3000
            rows.append(r)
    rows.append(Row("batch", "64 KiB files: one batched `fs.cat(all keys)` (merges ranges)", "files/s"))
    for arr, what in (("a", f"64 KiB chunks, {n64 * 64 / 1024:,.0f} MiB"),
                      ("b", f"1 MiB chunks, {n1m:,} MiB")):
        rows.append(Row(f"zarr_{arr}_cold", f"zarr array `{arr}` ({what}) full read: cold", "MB/s",
                        "≥ in-process", vs_inproc=True))
        rows.append(Row(f"zarr_{arr}_warm", f"zarr array `{arr}`: second full read", "MB/s",
                        "≥ in-process", vs_inproc=True))
    dec = f"zlib+shuffle <f4 array, {n_dec:,} x 1 MiB chunks decoded"
    for kind, what in (("cold", "cold"), ("warm", "second full read")):
        rows.append(Row(f"dz_{kind}", f"{dec}: zarr via `-o decode` (refmount) / in-process zarr "
                        f"over fsspec refs: {what}", "MB/s", "≥ 80 % of in-process", vs_inproc=True,
                        inproc_share=0.8))
        rows.append(Row(f"dz_raw_{kind}", f"{dec}: zarr via the raw mount (zarr decodes): {what}", "MB/s"))
        rows.append(Row(f"dz_nc_{kind}", f"{dec}: `ncdump -v` via `-o decode`: {what}", "MB/s"))
    return rows


# ============================================================================================
# The data sets
# ============================================================================================


def build_refs(url: str, n64: int, n1m: int) -> dict[str, Any]:
    """Version 0 references: ``data.bin`` = the whole file; ``a/i`` = 64 KiB ranges at i*64 KiB
    (zarr array a, chunks of 8192 <f8); ``b/j`` = 1 MiB ranges at j*1 MiB (array b)."""
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "data.bin": [url],
        "a/.zarray": h.zarray(n64, 64 * KiB),
        "a/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
        "b/.zarray": h.zarray(n1m, MiB),
        "b/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y"]}),
    }
    for i in range(n64):
        refs[f"a/{i}"] = [url, i * 64 * KiB, 64 * KiB]
    for j in range(n1m):
        refs[f"b/{j}"] = [url, j * MiB, MiB]
    return refs


def ensure_decode_data(serve_dir: Path, n_chunks: int, log: Callable[[str], None]) -> tuple[Path, Path]:
    """A zlib+shuffle float32 array of ``n_chunks`` 1 MiB chunks (a smooth field with noise,
    compressing about 2:1 like model output) as HDF5 stores it: the encoded chunks back to back
    in ``decode-N.bin`` (served), with their lengths in ``decode-N.idx``; and the decoded values
    in ``decode-N.f4`` (to verify what readers get). Reused when present."""
    import numcodecs
    import numpy as np

    data = serve_dir / f"decode-{n_chunks}.bin"
    idx, values = data.with_suffix(".idx"), data.with_suffix(".f4")
    if data.exists() and idx.exists() and values.exists():
        return data, values
    log(f"generating the zlib+shuffle array: {n_chunks} x 1 MiB chunks in {data}")
    t0 = time.perf_counter()
    elems = MiB // 4
    rng = np.random.default_rng(16)
    x = np.arange(elems, dtype="f4")
    shuffle, zlib = numcodecs.Shuffle(elementsize=4), numcodecs.Zlib(level=4)
    lengths = []
    with open(str(data) + ".tmp", "wb") as out, open(str(values) + ".tmp", "wb") as vals:
        for i in range(n_chunks):
            chunk = (280 + 10 * np.sin(x / 3000 + i) + rng.normal(0, 0.25, elems)).astype("<f4")
            chunk = np.round(chunk, 2).astype("<f4")  # two decimals, as measured values often are
            encoded = zlib.encode(shuffle.encode(chunk))
            out.write(encoded)
            vals.write(chunk.tobytes())
            lengths.append(len(encoded))
    idx.write_text(json.dumps(lengths))
    os.replace(str(values) + ".tmp", values)
    os.replace(str(data) + ".tmp", data)
    log(f"  generated in {time.perf_counter() - t0:.1f} s, {sum(lengths) / MiB:.0f} MiB stored "
        f"for {n_chunks} MiB decoded")
    return data, values


def build_decode_refs(url: str, data: Path) -> dict[str, Any]:
    """Version 0 references to the zlib+shuffle array ``z`` in ``data`` (filters as kerchunk
    writes them for HDF5: shuffle, then zlib, no compressor)."""
    lengths = json.loads(data.with_suffix(".idx").read_text())
    elems = MiB // 4
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "z/.zarray": json.dumps({
            "zarr_format": 2, "shape": [len(lengths) * elems], "chunks": [elems], "dtype": "<f4",
            "compressor": None, "filters": [{"id": "shuffle", "elementsize": 4}, {"id": "zlib", "level": 4}],
            "fill_value": None, "order": "C",
        }),
        "z/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["t"], "units": "K"}),
    }
    off = 0
    for i, n in enumerate(lengths):
        refs[f"z/{i}"] = [url, off, n]
        off += n
    return refs


@dataclass
class Cell:
    value: float | None = None
    note: str = ""  # shown instead of / next to the value: timeout, error, n/a, ...
    mark: str = ""  # "†": every attempt was disturbed by other processes


@dataclass
class Attempt:
    """One measured run of a pass (or of a child measuring several passes)."""

    res: list[dict[str, Any]]
    failure: str = ""
    extra: list[str] = field(default_factory=list)
    others: float = 0.0  # cores used on average by other processes while it ran
    others_top: str = ""
    missed: float = 0.0  # warm passes: share of the bytes the daemon had to serve (page cache misses)
    steal: float = 0.0  # cores the hypervisor gave to other machines while this one wanted them


def fmt_cell(c: Cell | None) -> str:
    if c is None:
        return "—"
    if c.value is None:
        return c.note or "—"
    return fmt_value(c.value) + c.mark + (f" ({c.note})" if c.note else "")


def rate(res: dict[str, Any], unit: str) -> float:
    el = max(res["elapsed"], 1e-9)
    if unit == "files/s":
        return res["items"] / el
    if unit == "GB/s":
        return res["bytes"] / el / 1e9
    return res["bytes"] / el / 1e6


# ============================================================================================
# The benchmark
# ============================================================================================


class Bench:
    def __init__(self, args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> None:
        self.args = args
        self.workloads, self.peers = workloads, peers
        self.work = work
        self.serve_dir = self.work / "serve"
        self.data = self.serve_dir / f"data-{args.size_bytes}.bin"
        self.logs = self.work / "logs"
        self.mnt_root = self.work / "mnt"
        self.cache_root = self.work / "cache"
        self.caches = h.CacheDirs(self.cache_root)
        self.size = args.size_bytes
        self.n64 = args.files64k
        self.n1m = args.files1m
        self.timeout = args.reads_timeout
        self.rows = make_rows(args.readers_list, self.n64, self.n1m, args.decode_chunks)
        self.decode_refs = self.work / "decode-refs.json"
        self.decode_data: Path | None = None
        self.decode_values: Path | None = None
        self.cells: dict[tuple[str, str], Cell] = {}
        self.details: list[str] = []
        self.profiles: dict[str, str] = {}
        self.nginx: h.Nginx | None = None
        self.refs_path = self.work / "refs.json"
        self.live_mounts: dict[Path, list[int]] = {}
        self.live_children: set[int] = set()
        self.t_start = time.time()
        self.cold_method = "?"
        self.n_passes = 0
        self.n_busy = 0
        self.n_disturbed = 0
        self.quiet_waited = 0.0
        self.disk_rates: list[float] = []  # MB/s of re-reading the served file after drop_caches
        self.child_seq = 0
        self.log_file = None

    # ---- logging --------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        line = f"[{time.time() - self.t_start:7.1f}s] {msg}"
        print(line, file=sys.stderr, flush=True)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    # ---- setup ----------------------------------------------------------------------------
    def setup(self) -> None:
        for d in (self.serve_dir, self.logs, self.mnt_root, self.cache_root):
            d.mkdir(parents=True, exist_ok=True)
        self.log_file = open(self.logs / "bench.log", "w")  # noqa: SIM115
        for m in (self.mnt_root / "refmount", self.mnt_root / "fsspec-fuse"):
            m.mkdir(exist_ok=True)
            if h.mounted(m):
                raise SystemExit(f"{m} is still mounted (from an earlier run?): fusermount3 -u {m}")
        # Only our own data files: remove other sizes of ours to save disk.
        for old in self.serve_dir.glob("data-*.bin*"):
            if old != self.data and self.args.prune_data:
                old.unlink()
        h.ensure_data(self.data, self.size, self.log)
        self.nginx = h.Nginx(self.serve_dir, self.work / "nginx")
        self.nginx.start()
        self.log(f"nginx pid {self.nginx.proc.pid} on 127.0.0.1:{self.nginx.port}")
        url = self.nginx.url(self.data.name)
        refs = build_refs(url, self.n64, self.n1m)
        self.refs_path.write_text(json.dumps(refs))
        self.log(f"reference set {self.refs_path}: {len(refs):,} keys")
        if "decode" in self.workloads:
            self.decode_data, self.decode_values = ensure_decode_data(
                self.serve_dir, self.args.decode_chunks, self.log)
            refs = build_decode_refs(self.nginx.url(self.decode_data.name), self.decode_data)
            self.decode_refs.write_text(json.dumps(refs))
        r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-r", "0-9", url],
                           capture_output=True, text=True, timeout=30)
        if r.stdout != "206":
            raise SystemExit(f"nginx does not answer a Range request with 206: {r.stdout} {r.stderr}")

    def cleanup(self) -> None:
        for mnt, pids in list(self.live_mounts.items()):
            self.log(f"cleanup: unmounting {mnt}")
            with contextlib.suppress(Exception):
                h.fuse_unmount(mnt, pids, self.log, timeout=10)
            self.live_mounts.pop(mnt, None)
        for pid in list(self.live_children):
            h.stop_pid(pid, 2)
        if self.nginx is not None:
            self.nginx.stop()
            self.log("nginx stopped")
        if not self.args.keep_cache:
            self.caches.cleanup()

    # ---- primitives -----------------------------------------------------------------------
    def prepare_cold(self) -> None:
        t0 = time.perf_counter()
        self.cold_method = h.drop_page_cache([self.cache_root])
        warm = h.warm_file(self.data)
        if self.decode_data is not None:
            h.warm_file(self.decode_data)
        if self.cold_method == "drop_caches":
            self.disk_rates.append(self.size / max(warm, 1e-9) / 1e6)
        self.log(f"  page cache dropped ({self.cold_method}), served file re-read in {warm:.1f} s "
                 f"[{time.perf_counter() - t0:.1f} s]")

    def run_child(self, kind: str, spec: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
        """Run a measuring child; its JSON lines (h.Failed with the partial ones)."""
        self.child_seq += 1
        err_path = self.logs / f"child-{self.child_seq:03d}-{kind}.err"
        try:
            return h.run_child(kind, spec, timeout, err_path, self.live_children)
        except h.Failed as e:
            if str(e) == "error":
                self.log(f"    child failed: {e.__cause__} (see {err_path})")
            raise

    def timed_cmd(self, cmd: list[str], timeout: float) -> tuple[float, str, str, float]:
        """Run a command; wall seconds, stdout, stderr, CPU seconds of the command."""
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        self.live_children.add(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=30)
            raise h.Failed("timeout") from None
        finally:
            if proc.poll() is not None:
                self.live_children.discard(proc.pid)
        elapsed = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        if proc.returncode != 0:
            self.log(f"    {cmd[0]} exited {proc.returncode}: {err.strip()[-300:]}")
            raise h.Failed("error")
        return elapsed, out, err, cpu

    def dd(self, path: Path) -> list[dict[str, Any]]:
        elapsed, _, err, cpu = self.timed_cmd(["dd", f"if={path}", "of=/dev/null", "bs=1M"], self.timeout)
        m = re.search(r"^(\d+) bytes", err, re.M)
        got = int(m.group(1)) if m else -1
        res = {"elapsed": elapsed, "bytes": got, "items": 1, "errors": 0, "cpu": cpu}
        if got != self.size:
            res["errors"] = 1
            res["first_errors"] = [f"dd copied {got} bytes, expected {self.size}"]
        return [res]

    def curl(self, ranges: list[tuple[int, int]] | None, parallel: int) -> list[dict[str, Any]]:
        assert self.nginx is not None
        url = self.nginx.url(self.data.name)
        if ranges is None:
            cmd = ["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{http_code} %{size_download}\n", url]
        else:
            cfg = self.work / "curl.cfg"
            group = ('output = "/dev/null"\nwrite-out = "%{http_code} %{size_download}\\n"\n'
                     "silent\nshow-error\nfail\n")
            cfg.write_text("next\n".join(f'url = "{url}"\nrange = "{o}-{o + n - 1}"\n{group}'
                                         for o, n in ranges))
            cmd = ["curl", "-K", str(cfg)]
            if parallel > 1:
                cmd += ["--parallel", "--parallel-immediate", "--parallel-max", str(parallel)]
        elapsed, out, _, cpu = self.timed_cmd(cmd, self.timeout)
        codes = Counter()
        got = 0
        for ln in out.split("\n"):
            if ln.strip():
                code, n = ln.split()
                codes[code] += 1
                got += int(n)
        want_code = "200" if ranges is None else "206"
        items = len(ranges) if ranges is not None else 1
        want = self.size if ranges is None else sum(n for _, n in ranges)
        res = {"elapsed": elapsed, "bytes": got, "items": items, "errors": 0, "cpu": cpu}
        if got != want or codes[want_code] != items:
            res["errors"] = 1
            res["first_errors"] = [f"curl: {dict(codes)} bytes {got} (expected {want})"]
        return [res]

    # ---- recording ------------------------------------------------------------------------
    def row(self, rid: str) -> Row | None:
        return next((r for r in self.rows if r.id == rid), None)

    def put(self, rid: str, peer: str, res: dict[str, Any] | None, failure: str = "",
            extra: str = "", mark: str = "") -> None:
        row = self.row(rid)
        if row is None:
            return
        if res is None:
            self.cells[(rid, peer)] = Cell(None, failure)
            self.log(f"  {peer:12s} {rid:12s} {failure}")
            self.details.append(f"- {PEER_TITLES[peer]} · `{rid}`: {failure} {extra}".rstrip())
            return
        value = rate(res, row.unit)
        cell = Cell(value, mark=mark)
        if res.get("errors"):
            cell = Cell(None, f"error ({res['errors']} failed)")
        if res.get("verify_failed"):
            cell = Cell(None, "WRONG DATA")
        self.cells[(rid, peer)] = cell
        mb = res["bytes"] / 1e6
        text = (f"{res['items']:,} items, {mb:,.1f} MB in {res['elapsed']:.2f} s = "
                f"{fmt_value(value)} {row.unit}")
        if res.get("cpu") is not None:
            text += f"; client CPU {res['cpu']:.2f} s"
        if extra:
            text += f"; {extra}"
        if res.get("verified"):
            text += f"; {res['verified']}"
        if res.get("first_errors"):
            text += f"; errors: {' | '.join(res['first_errors'])}"
        self.details.append(f"- {PEER_TITLES[peer]} · `{rid}`: {text}")
        self.log(f"  {peer:12s} {rid:12s} {fmt_cell(cell):>14s} {row.unit}   ({text})")

    def wait_quiet(self) -> str:
        """Wait (up to --quiet-wait s) until the machine is nearly idle: other sessions' work on a
        2-core machine would show up in our numbers. Returns a note for the details."""
        self.n_passes += 1
        if self.args.quiet_wait <= 0:
            return ""
        waited, load = h.wait_idle(self.args.quiet_wait, self.args.quiet_load)
        if load <= self.args.quiet_load:
            self.quiet_waited += waited
            return f"waited {waited:.0f} s for a quiet machine" if waited > 1 else ""
        self.log(f"    machine still busy ({load:.2f} cores) after {waited:.0f} s; measuring anyway")
        self.n_busy += 1
        return f"machine NOT quiet ({load:.2f} cores busy before the pass)"

    def rewarm_server(self) -> str:
        """Make sure the served file is all in the page cache (this VM may page idle cache out)."""
        frac = h.resident_fraction(self.data)
        if frac is None or frac >= 0.999:
            return ""
        t = h.warm_file(self.data)
        return f"served file was {100 * frac:.0f}% in the page cache, re-read in {t:.1f} s before the pass"

    def attempt(self, runner: Callable[[], list[dict[str, Any]]], mount: h.Mount | None = None,
                profile: Callable[[], contextlib.AbstractContextManager[dict[str, Any]]] | None = None,
                quiet: str | None = None) -> Attempt:
        """Run a measuring runner once, with the server side's CPU, the mount's counters and the
        CPU other processes on the machine used meanwhile (``profile``: py-spy around the run).
        ``quiet``: the note of a wait for a quiet machine already done (None: wait now)."""
        assert self.nginx is not None
        extra = []
        if quiet is None:
            quiet = self.wait_quiet()
        if quiet:
            extra.append(quiet)
        rewarm = self.rewarm_server()
        if rewarm:
            extra.append(rewarm)
        # Last thing before the pass: how fast this VM hands out memory right now.
        extra.append(f"fresh memory {h.fresh_memory_rate():.2f} GiB/s just before the pass")
        with (profile or (lambda: contextlib.nullcontext({})))() as box:
            att = self._attempt(runner, mount, extra)
            box["res"] = att.res[0] if att.res else None
        return att

    def warm_attempt(self, runner: Callable[[], list[dict[str, Any]]], mount: h.Mount) -> Attempt:
        """A warm pass: no wait for a quiet machine first; for refmount, note how much of it missed
        the kernel page cache (the VM may have paged it out: then it is redone)."""
        s0 = mount.stats()
        att = self.attempt(runner, mount, quiet="")
        s1 = mount.stats()
        if s0 and s1 and att.res and att.res[0]["bytes"]:
            att.missed = (s1.get("bytes_read", 0) - s0.get("bytes_read", 0)) / att.res[0]["bytes"]
        return att

    def _attempt(self, runner: Callable[[], list[dict[str, Any]]], mount: h.Mount | None,
                 extra: list[str]) -> Attempt:
        assert self.nginx is not None
        n0 = self.nginx.cpu()
        d0 = h.proc_cpu_split(mount.cpu_pid) if mount else None
        # refmount's disk-cache writer is a child of its daemon: its CPU is the mount's too
        helpers = h.children_of(mount.cpu_pid) if mount else []
        h0 = sum(h.proc_cpu(p) or 0.0 for p in helpers)
        s0 = mount.stats() if mount else None
        snap0 = h.cpu_by_pid()
        sys0, own0, steal0 = h.system_cpu(), h.own_cpu(), h.steal_cpu()
        t0 = time.perf_counter()
        try:
            results = runner()
            failure = "" if results else "error (no result)"
        except h.Failed as e:
            results, failure = getattr(e, "partial", []), str(e)
        window = max(time.perf_counter() - t0, 1e-3)
        sys1, own1, steal = h.system_cpu(), h.own_cpu(), h.steal_cpu() - steal0
        snap1 = h.cpu_by_pid()
        mine = {*self.nginx.pids(), *self.live_children, *(mount.pids if mount else []), *helpers}
        others, top = h.others_cpu(sys0, sys1, own1 - own0, snap0, snap1, mine)
        # Clock ticks are 10 ms: ignore a few of them in very short passes.
        others = max(others - 0.03, 0.0)
        wall = max(results[0]["elapsed"], 1e-9) if results else window
        extra.append(f"nginx CPU {self.nginx.cpu() - n0:.2f} s")
        if mount and d0 is not None:
            d1 = h.proc_cpu_split(mount.cpu_pid)
            if d1 is not None:
                us, sy = d1[0] - d0[0], d1[1] - d0[1]
                extra.insert(0, f"{mount.peer} daemon CPU {us + sy:.2f} s = {100 * (us + sy) / wall:.0f}% "
                                f"of wall (user {us:.2f} s, sys {sy:.2f} s)")
                if helpers:
                    h1 = sum(h.proc_cpu(p) or 0.0 for p in helpers)
                    extra.insert(1, f"its cache-writer process CPU {h1 - h0:.2f} s")
        s1 = mount.stats() if mount else None
        if s0 and s1:
            keys = ("requests", "bytes_fetched", "merged", "prefetched", "prefetch_hits", "reads",
                    "memory_hits", "disk_hits", "misses", "retries", "errors")
            delta = {k: s1.get(k, 0) - s0.get(k, 0) for k in keys if s1.get(k, 0) - s0.get(k, 0)}
            for k in ("bytes_fetched", "prefetched"):
                if k in delta:
                    delta[k] = f"{delta[k] / 1e6:,.1f} MB"
            extra.append("stats " + (", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
                                               for k, v in delta.items())
                                     or "unchanged (served by the kernel page cache)"))
        if steal >= 0.05:
            extra.append(f"host steal {steal:.2f} s = {steal / window:.2f} cores")
        top_text = ", ".join(f"{name} {cpu:.1f} s" for cpu, name in top if cpu >= 0.05)
        return Attempt(results, failure, extra, others / window, top_text,
                       steal=max(steal - 0.03, 0.0) / window)

    def disturbed(self, a: Attempt) -> bool:
        return bool(a.res) and (a.others > self.args.disturbed_load or a.missed > 0.1
                                or a.steal > self.args.disturbed_load)

    @staticmethod
    def why(a: Attempt) -> str:
        if a.missed > 0.1:
            return (f"{100 * a.missed:.0f}% of the bytes missed the page cache (paged out by the VM?)"
                    + (f", other processes used {a.others:.2f} cores" if a.others > 0.05 else ""))
        if a.steal > a.others:
            return f"the hypervisor took {a.steal:.2f} cores on average (steal time)"
        return f"other processes used {a.others:.2f} cores on average ({a.others_top})"

    def retry_loop(self, make: Callable[[int], Attempt]) -> list[Attempt]:
        """Attempts until one is not disturbed by other processes (at most 1 + --retries).
        Failures (timeouts, errors) are not retried."""
        atts: list[Attempt] = []
        for i in range(1 + self.args.retries):
            a = make(i)
            atts.append(a)
            if a.failure or not self.disturbed(a):
                break
            self.n_disturbed += 1
            self.log(f"    disturbed: {self.why(a)}; "
                     + (f"attempt {i + 2} of {1 + self.args.retries}" if i < self.args.retries
                        else "no attempts left"))
        return atts

    def record(self, rids: list[str], peer: str, atts: list[Attempt]) -> None:
        """Put the chosen attempt in the table: the first undisturbed one, else the best one (†)."""
        if not atts:
            return
        units = [self.row(r).unit if self.row(r) else "MB/s" for r in rids]
        ok = [a for a in atts if a.res]
        clean = [a for a in ok if not self.disturbed(a)]
        if clean:
            chosen, mark = clean[0], ""
        elif ok:
            chosen = max(ok, key=lambda a: rate(a.res[0], units[0]))
            mark = "‡" if chosen.missed > 0.1 else "†"
        else:
            chosen, mark = atts[-1], ""
        notes = list(chosen.extra)
        notes.append(f"other processes {chosen.others:.2f} cores"
                     + (f" ({chosen.others_top})" if chosen.others_top else ""))
        if chosen.missed > 0.01:
            notes.append(f"{100 * chosen.missed:.0f}% of the bytes missed the page cache")
        if len(atts) > 1:
            notes.append(f"attempt {atts.index(chosen) + 1} of {len(atts)}; others: " + ", ".join(
                (f"{fmt_value(rate(a.res[0], units[0]))} {units[0]} ({self.why(a)})"
                 if a.res else a.failure) for a in atts if a is not chosen))
        extra = "; ".join(notes)
        for i, rid in enumerate(rids):
            if i < len(chosen.res):
                self.put(rid, peer, chosen.res[i], extra=extra, mark=mark)
            else:
                self.put(rid, peer, None, chosen.failure or "error", extra)

    def measure(self, rid: str, peer: str, runner: Callable[[], list[dict[str, Any]]],
                cold: bool = True, from_disk: bool = False) -> None:
        """A pass of a peer without a mount (local, curl), retried while disturbed.
        ``from_disk``: the page cache is dropped and left empty (the pass reads the disk)."""
        if self.row(rid) is None:
            return

        def from_disk_runner() -> list[dict[str, Any]]:
            # Dropped here, after attempt() has made sure the served file is resident.
            self.log(f"  page cache dropped ({h.drop_page_cache([self.work])}), not re-read")
            return runner()

        def make(_: int) -> Attempt:
            quiet = self.wait_quiet()
            if cold and not from_disk:
                self.prepare_cold()
            return self.attempt(from_disk_runner if from_disk else runner, quiet=quiet)

        self.record([rid], peer, self.retry_loop(make))

    def put_passes(self, rids: list[str], peer: str, kind: str, spec: dict[str, Any]) -> None:
        """A child that measures ``len(rids)`` passes in one process (in-process fsspec)."""
        if all(self.row(r) is None for r in rids):
            return
        spec = dict(spec, passes=len(rids))

        def make(_: int) -> Attempt:
            quiet = self.wait_quiet()
            self.prepare_cold()
            return self.attempt(lambda: self.run_child(kind, spec, self.timeout * len(rids)), quiet=quiet)

        self.record(rids, peer, self.retry_loop(make))

    # ---- mounts ---------------------------------------------------------------------------
    def refmount_options(self, cache_dir: Path, tag: str, extra: str = "") -> str:
        opts = [f"cache_dir={cache_dir}", f"log={self.logs / f'refmount-{tag}.log'}",
                f"cache_size={max(2 * self.size, 4 * GiB)}"]
        if self.args.refmount_opts:
            opts.append(self.args.refmount_opts)
        if extra:
            opts.append(extra)
        return ",".join(opts)

    def mount(self, peer: str, cache_dir: Path | None, tag: str, extra_opts: str = "",
              refs: Path | None = None) -> h.Mount:
        mnt = self.mnt_root / peer
        if peer == "refmount":
            assert cache_dir is not None
            m = h.mount_refmount(refs or self.refs_path, mnt,
                                 self.refmount_options(cache_dir, tag, extra_opts).split(","), 180, self.log)
        else:
            self.child_seq += 1
            m = h.mount_fsspec_fuse(self.refs_path, mnt, self.logs / f"fsspec-fuse-{self.child_seq:03d}.log",
                                    120, threads=self.args.fsspec_fuse_threads)
            self.log(f"    fsspec.fuse mounted, pid {m.cpu_pid}")
        self.live_mounts[mnt] = m.pids
        return m

    def unmount(self, m: h.Mount) -> None:
        m.unmount(self.log)
        if h.mounted(m.mnt):
            self.log(f"    WARNING: {m.mnt} still mounted")
        else:
            self.live_mounts.pop(m.mnt, None)

    def mount_session(self, peer: str, tag: str, cold: str, warm: str | None, disk: str | None,
                      runner: Callable[[Path], Callable[[], list[dict[str, Any]]]],
                      verify: Callable[[Path], None] | None = None,
                      profile: str = "", extra_opts: str = "", refs: Path | None = None) -> None:
        """Fresh mount (fresh cache_dir, page cache dropped): cold pass; warm pass on the same
        mount; then (refmount) unmount, drop the page cache, remount with the same cache_dir:
        disk-cache warm pass. A disturbed cold or disk pass is redone from a fresh (re)mount.
        ``extra_opts``: more refmount -o options for these passes; ``refs``: another reference
        set than the main one (refmount only)."""
        if all(self.row(r) is None for r in (cold, warm, disk) if r):
            return
        cache_dir = self.cache_root / tag if peer == "refmount" else None
        self.log(f"[{PEER_TITLES[peer]}] {tag}")
        cur: list[h.Mount] = []  # the live mount of these passes, if any

        def drop_mount() -> None:
            while cur:
                self.unmount(cur.pop())

        def fresh(remount: bool, ptag: str) -> Attempt:
            drop_mount()
            if cache_dir is not None and not remount:
                self.caches.fresh(tag)
            quiet = self.wait_quiet()
            self.prepare_cold()
            try:
                m = self.mount(peer, cache_dir, tag + ("-remount" if remount else ""), extra_opts, refs)
            except h.Failed as e:
                return Attempt([], str(e))
            cur.append(m)
            spy = (lambda: self.profiled(profile, m, ptag)) if profile else None
            return self.attempt(runner(m.mnt), m, spy, quiet=quiet)

        try:
            self.record([cold], peer, self.retry_loop(lambda _: fresh(False, f"{tag}-cold")))
            if not cur:
                for r in (warm, disk):
                    if r and self.row(r) is not None and not (r == disk and peer != "refmount"):
                        self.put(r, peer, None, "mount failed")
                return
            m = cur[0]
            if warm and self.row(warm) is not None:
                # No wait for a quiet machine before a warm pass: this VM pages idle page cache
                # out after a few seconds (DAMON), which would turn "warm" into "disk cache".
                self.record([warm], peer, self.retry_loop(lambda _: self.warm_attempt(runner(m.mnt), m)))
            if verify is not None:
                verify(m.mnt)
            drop_mount()
            if disk and peer == "refmount" and self.row(disk) is not None:
                self.log(f"[{PEER_TITLES[peer]}] {tag}: disk-cache warm")
                self.record([disk], peer, self.retry_loop(lambda _: fresh(True, f"{tag}-disk")))
        finally:
            drop_mount()
            if cache_dir is not None:
                self.caches.set_aside(cache_dir)

    @contextlib.contextmanager
    def profiled(self, profile: str, m: h.Mount, tag: str) -> Iterator[dict[str, Any]]:
        """py-spy attached to the daemon while the body runs; the body puts its result in the box."""
        spy = self.start_pyspy(m, tag, profile)
        box: dict[str, Any] = {}
        try:
            yield box
        finally:
            if spy is not None:
                self.stop_pyspy(spy, tag, box.get("res"))

    def verify_whole(self, peer: str) -> Callable[[Path], None]:
        def check(mnt: Path) -> None:
            try:
                res = self.run_child("verify", {"path": str(mnt / "data.bin"), "local": str(self.data),
                                                "size": self.size}, 120)[0]
            except h.Failed as e:
                self.details.append(f"- {PEER_TITLES[peer]} · whole-file content check: {e}")
                return
            self.details.append(f"- {PEER_TITLES[peer]} · whole-file content check: {res['verified']}")
            if res.get("verify_failed"):
                for rid in ("seq_cold", "seq_warm"):
                    if (rid, peer) in self.cells:
                        self.cells[(rid, peer)] = Cell(None, "WRONG DATA")

        return check

    # ---- py-spy ---------------------------------------------------------------------------
    def start_pyspy(self, m: h.Mount, tag: str, mode: str) -> dict[str, Any] | None:
        spy = Path(PY).parent / "py-spy"
        if not spy.exists():
            spy = Path(shutil.which("py-spy") or "")
        if not spy.is_file():
            self.profiles[tag] = f"py-spy not installed: no profile for {tag}"
            return None
        raw = self.logs / f"pyspy-{tag}.txt"
        raw.unlink(missing_ok=True)
        cmd = [str(spy), "record", "--pid", str(m.cpu_pid), "--rate", str(self.args.pyspy_rate),
               "--format", "raw", "--threads", "--nonblocking", "-o", str(raw)]
        if mode == "gil":
            cmd.append("--gil")
        with open(self.logs / f"pyspy-{tag}.err", "w") as err:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.live_children.add(p.pid)
        time.sleep(1.0)  # let it attach

        def dump() -> None:  # one snapshot of all stacks, one second into the pass
            with contextlib.suppress(Exception):
                r = subprocess.run([str(spy), "dump", "--pid", str(m.cpu_pid), "--nonblocking"],
                                   capture_output=True, text=True, timeout=60)
                (self.logs / f"pyspy-{tag}-dump.txt").write_text(r.stdout + r.stderr)

        timer = threading.Timer(1.0, dump)
        timer.start()
        return {"proc": p, "t0": time.perf_counter(), "raw": raw, "timer": timer, "mode": mode}

    def stop_pyspy(self, spy: dict[str, Any], tag: str, res: dict[str, Any] | None) -> None:
        duration = time.perf_counter() - spy["t0"]
        p: subprocess.Popen = spy["proc"]
        spy["timer"].join()
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        self.live_children.discard(p.pid)
        raw = spy["raw"]
        if not raw.exists():
            self.profiles[tag] = f"### {tag}\npy-spy wrote no profile (see {self.logs}/pyspy-{tag}.err)"
            return
        head = f"### {tag}"
        if res:
            head += (f" (profiled pass: {res['items']:,} items, {res['bytes'] / 1e6:,.0f} MB "
                     f"in {res['elapsed']:.2f} s; sampled {duration:.1f} s)")
        self.profiles[tag] = (head + "\n" + summarize_pyspy(raw, duration, self.args.pyspy_rate,
                                                            spy["mode"] == "gil")
                              + f"\n- raw stacks: {raw}; stack dump 1 s into the pass: "
                              f"{self.logs / f'pyspy-{tag}-dump.txt'}")

    # ---- workload families ----------------------------------------------------------------
    def want(self, peer: str) -> bool:
        return peer in self.peers

    def fam_seq(self) -> None:
        if self.want("local"):
            self.log("[local] dd of the served file from the page cache")
            self.measure("seq_cold", "local", lambda: self.dd(self.data))
            self.measure("seq_warm", "local", lambda: self.dd(self.data), cold=False)
            if self.row("seq_disk") is not None:
                self.log("[local] dd of the served file from the disk (page cache dropped)")
                self.measure("seq_disk", "local", lambda: self.dd(self.data), from_disk=True)
        if self.want("curl"):
            self.log("[curl] whole file")
            self.measure("seq_cold", "curl", lambda: self.curl(None, 1))
        if self.want("inproc"):
            self.log("[fsspec in-process] whole file, fs.open().read(1 MiB) loop")
            self.put_passes(["seq_cold", "seq_warm"], "inproc", "inproc",
                            {"refs": str(self.refs_path), "mode": "seq"})
        for peer in ("fsspec-fuse", "refmount"):
            if self.want(peer):
                self.mount_session(peer, "seq", "seq_cold", "seq_warm", "seq_disk",
                                   lambda mnt: lambda: self.dd(mnt / "data.bin"),
                                   verify=self.verify_whole(peer))
        if self.want("refmount"):
            self.mount_session("refmount", "seq-nodisk", "seq_cold_nodisk", None, None,
                               lambda mnt: lambda: self.dd(mnt / "data.bin"), extra_opts="no_disk_cache")

    def files_spec(self, mnt: Path, prefix: str, n: int, length: int, threads: int) -> dict[str, Any]:
        return {"dir": str(mnt), "prefix": prefix, "n": n, "length": length, "threads": threads,
                "local": str(self.data)}

    def fam_files(self, fam: str, prefix: str, n: int, length: int, threads: int) -> None:
        rid = f"{fam}_cold" if fam == "m1" else f"f64_cold_{threads}"
        warm = rid.replace("cold", "warm")
        disk = rid.replace("cold", "disk")
        if self.row(rid) is None:
            return
        if self.want("local"):
            self.log(f"[local] {fam} x{threads}: open + pread + close per item")
            spec = {"local": str(self.data), "n": n, "length": length, "threads": threads}
            self.measure(rid, "local", lambda: self.run_child("local", spec, self.timeout))
            self.measure(warm, "local", lambda: self.run_child("local", spec, self.timeout), cold=False)
            if fam == "m1" and self.row(disk) is not None:
                copy = self.local_files(prefix, n, length)
                try:
                    self.log(f"[local] {fam} x{threads}: {n:,} plain files in {copy} read from the "
                             "disk (page cache dropped)")
                    fspec = self.files_spec(copy, prefix, n, length, threads)
                    self.measure(disk, "local", lambda: self.run_child("files", fspec, self.timeout),
                                 from_disk=True)
                finally:
                    shutil.rmtree(copy, ignore_errors=True)
        if self.want("curl"):
            self.log(f"[curl] {fam} x{threads}: ranges from a config file")
            ranges = [(i * length, length) for i in range(n)]
            self.measure(rid, "curl", lambda: self.curl(ranges, threads))
        if self.want("inproc"):
            self.log(f"[fsspec in-process] {fam} x{threads}: fs.cat_file(key)")
            self.put_passes([rid, warm], "inproc", "inproc",
                            {"refs": str(self.refs_path), "mode": "files", "prefix": prefix, "n": n,
                             "threads": threads})
        for peer in ("fsspec-fuse", "refmount"):
            if self.want(peer):
                self.mount_session(
                    peer, f"{fam}-x{threads}", rid, warm, disk,
                    lambda mnt: lambda: self.run_child(
                        "files", self.files_spec(mnt, prefix, n, length, threads), self.timeout))

    def local_files(self, prefix: str, n: int, length: int) -> Path:
        """Keys PREFIX0 .. PREFIX{n-1} (``length`` bytes each, in order in the served file) as
        plain files in the work directory, on the disk that holds the cache directory too: the
        local peer of a disk-warm row."""
        root = Path(tempfile.mkdtemp(prefix="local-files-", dir=self.work))
        (root / prefix).mkdir(parents=True, exist_ok=True)
        with open(self.data, "rb") as f:
            for i in range(n):
                (root / f"{prefix}{i}").write_bytes(os.pread(f.fileno(), length, i * length))
        os.sync()
        return root

    def fam_batch(self) -> None:
        if self.want("inproc"):
            self.log("[fsspec in-process] batch fs.cat(all 64 KiB keys)")
            self.put_passes(["batch"], "inproc", "inproc",
                            {"refs": str(self.refs_path), "mode": "batch", "prefix": "a/", "n": self.n64})

    def zarr_copy(self, arr: str) -> Path:
        """The array's keys as files in a tmpfs directory: the local peer of the zarr rows."""
        return h.zarr_copy(self.refs_path, self.data, arr)

    def fam_zarr(self, arr: str) -> None:
        cold, warm = f"zarr_{arr}_cold", f"zarr_{arr}_warm"
        local = str(self.data)
        if self.want("local") and Path("/dev/shm").is_dir():
            root = self.zarr_copy(arr)
            try:
                self.log(f"[local] zarr {arr} over a copy of its files in {root} (tmpfs)")
                self.put_passes([cold, warm], "local", "zarr",
                                {"store": "mount", "root": str(root), "array": arr, "local": local})
            finally:
                shutil.rmtree(root, ignore_errors=True)
        if self.want("inproc"):
            self.log(f"[fsspec in-process] zarr {arr} via fsspec.get_mapper('reference://')")
            self.put_passes([cold, warm], "inproc", "zarr",
                            {"store": "mapper", "refs": str(self.refs_path), "array": arr, "local": local})
        for peer in ("fsspec-fuse", "refmount"):
            if self.want(peer):
                self.mount_session(
                    peer, f"zarr-{arr}", cold, warm, None,
                    lambda mnt: lambda: self.run_child(
                        "zarr", {"store": "mount", "root": str(mnt), "array": arr, "local": local,
                                 "passes": 1}, self.timeout))

    def fam_decode(self) -> None:
        """The zlib+shuffle array read in full: zarr through ``-o decode`` (the mount decodes),
        through the raw mount (zarr decodes), in-process zarr over fsspec's references, and
        ``ncdump -v`` through ``-o decode``."""
        assert self.decode_values is not None
        local, n = str(self.decode_values), self.args.decode_chunks
        if self.want("inproc"):
            self.log("[fsspec in-process] zlib+shuffle array via fsspec.get_mapper('reference://')")
            self.put_passes(["dz_cold", "dz_warm"], "inproc", "zarr",
                            {"store": "mapper", "refs": str(self.decode_refs), "array": "z", "local": local})
        if not self.want("refmount"):
            return

        def zarr_runner(mnt: Path) -> Callable[[], list[dict[str, Any]]]:
            return lambda: self.run_child("zarr", {"store": "mount", "root": str(mnt), "array": "z",
                                                   "local": local, "passes": 1}, self.timeout)

        def ncdump_runner(mnt: Path) -> Callable[[], list[dict[str, Any]]]:
            return lambda: self.run_child("ncdump", {"url": f"file://{mnt}#mode=zarr,file", "var": "z",
                                                     "bytes": n * MiB, "chunks": n}, self.timeout)

        self.mount_session("refmount", "decode-zarr", "dz_cold", "dz_warm", None, zarr_runner,
                           extra_opts="decode", refs=self.decode_refs)
        self.mount_session("refmount", "decode-raw", "dz_raw_cold", "dz_raw_warm", None, zarr_runner,
                           refs=self.decode_refs)
        self.mount_session("refmount", "decode-ncdump", "dz_nc_cold", "dz_nc_warm", None, ncdump_runner,
                           extra_opts="decode", refs=self.decode_refs)

    def run(self) -> None:
        wl = self.workloads
        if "seq" in wl:
            self.fam_seq()
        if "m1" in wl:
            self.fam_files("m1", "b/", self.n1m, MiB, 1)
        if "f64" in wl:
            for n in self.args.readers_list:
                self.fam_files("f64", "a/", self.n64, 64 * 1024, n)
        if "batch" in wl:
            self.fam_batch()
        if "zarr" in wl:
            self.fam_zarr("a")
            self.fam_zarr("b")
        if "decode" in wl:
            self.fam_decode()
        if self.args.profile and self.want("refmount"):
            self.run_profiles()

    def run_profiles(self) -> None:
        """Extra refmount passes with py-spy attached to the daemon (not in the table): cold and
        disk-cache warm, for 64 KiB files with 8 readers and for the whole file."""
        saved = self.cells.copy(), list(self.details)
        spec_rows = self.rows
        # Profiled passes are recorded under throwaway row ids, then only their details are kept.
        self.rows = [*spec_rows, Row("prof_f64_cold", "", "files/s"), Row("prof_f64_disk", "", "files/s"),
                     Row("prof_seq_cold", "", "MB/s"), Row("prof_seq_disk", "", "GB/s")]
        n = 8 if 8 in self.args.readers_list else self.args.readers_list[-1]
        modes = ["gil", "cpu"] if self.args.pyspy_mode == "both" else [self.args.pyspy_mode]
        for mode in modes:
            self.mount_session("refmount", f"prof_{mode}_f64-x{n}", "prof_f64_cold", None, "prof_f64_disk",
                               lambda mnt: lambda: self.run_child(
                                   "files", self.files_spec(mnt, "a/", self.n64, 64 * 1024, n), self.timeout),
                               profile=mode)
            if "seq" in self.workloads:
                self.mount_session("refmount", f"prof_{mode}_seq", "prof_seq_cold", None, "prof_seq_disk",
                                   lambda mnt: lambda: self.dd(mnt / "data.bin"), profile=mode)
        prof_details = [d for d in self.details if "`prof_" in d]
        self.cells, self.details = saved
        self.details += prof_details
        self.rows = spec_rows

    # ---- report ---------------------------------------------------------------------------
    def met(self, row: Row) -> str:
        c = self.cells.get((row.id, "refmount"))
        if c is None or (c.value is None and not c.note):
            return ""
        if row.threshold is None and not row.vs_inproc:
            return ""
        if c.value is None:
            return "no"
        if row.vs_inproc:
            o = self.cells.get((row.id, "inproc"))
            if o is None or o.value is None:
                return "?"
            return "yes" if c.value >= row.inproc_share * o.value else "no"
        assert row.threshold is not None
        return "yes" if c.value >= row.threshold else "no"

    def table(self) -> Table:
        peers = [p for p in PEERS if p in self.peers]
        t = Table("reads", "refmount read-path benchmark",
                  ["workload", "unit", *(PEER_TITLES[p] for p in peers), "goal (refmount)", "met"],
                  align="ll" + "r" * len(peers) + "ll")
        for row in self.rows:
            cells = [self.cells.get((row.id, p)) for p in peers]
            if all(c is None for c in cells):
                continue
            vals = [fmt_cell(c) for c in cells]
            if "refmount" in peers and self.met(row) == "no":
                i = peers.index("refmount")
                vals[i] = f"**{vals[i]}**"
            t.rows.append([row.label, row.unit, *vals, row.goal or "—", self.met(row) or "—"])
        return t

    def disk_fact(self) -> str:
        if not self.disk_rates:
            return "? MB/s"
        r = sorted(self.disk_rates)
        return f"{r[len(r) // 2]:,.0f} MB/s median ({r[0]:,.0f}-{r[-1]:,.0f}, {len(r)} times)"

    def machine(self) -> list[str]:
        def first(path: str, key: str) -> str:
            with contextlib.suppress(OSError), open(path) as f:
                for ln in f:
                    if ln.startswith(key):
                        return ln.split(":", 1)[1].strip()
            return "?"

        def version(mod: str) -> str:
            try:
                from importlib.metadata import version as v

                return v(mod)
            except Exception:
                return "?"

        def cmd_out(cmd: list[str]) -> str:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                return (r.stdout + r.stderr).strip().splitlines()[0]
            except (OSError, subprocess.SubprocessError, IndexError):
                return "?"

        head = cmd_out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
        dirty = cmd_out(["git", "-C", str(REPO), "status", "--porcelain", "--", "refmount"])
        max_pages = "?"
        with contextlib.suppress(OSError):
            max_pages = Path("/proc/sys/fs/fuse/max_pages_limit").read_text().strip()
        return [
            f"- nproc: {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}); CPU: "
            f"{first('/proc/cpuinfo', 'model name')}; memory: {first('/proc/meminfo', 'MemTotal')}",
            f"- kernel: {platform.release()} ({platform.machine()}); fuse max_pages_limit {max_pages}",
            f"- python {platform.python_version()}; refmount {version('refmount')} (git {head}"
            f"{', refmount/ modified in the working tree' if dirty and dirty != '?' else ''}); "
            f"fsspec {version('fsspec')}; aiohttp {version('aiohttp')}; pyfuse3 {version('pyfuse3')}; "
            f"trio {version('trio')}; fusepy {version('fusepy')}; zarr {version('zarr')}; "
            f"numpy {version('numpy')}",
            f"- {cmd_out(['/usr/sbin/nginx', '-v'])} (sendfile on, access_log off, workers auto); "
            f"{' '.join(cmd_out(['curl', '--version']).split()[:2])}",
            f"- proactive reclaim: {h.damon_reclaim() or 'none seen'} (page cache idle that long may be "
            "gone before a warm pass; the served file is re-read before each pass when it is not all "
            "resident, and the mount's own counters in the details show reads that missed the page cache)",
            f"- free page reporting (virtio-balloon): {h.free_page_reporting() or 'not seen'}. Memory a "
            "process touches for the first time then comes back from the host at a fraction of the "
            "usual speed; each pass's details give the rate measured just before it ('fresh memory'), "
            "and whatever a pass allocates anew (zarr's output array, the page cache a mount fills) "
            "may pay it",
            f"- local disk: the served file re-read from disk after drop_caches at "
            f"{self.disk_fact()} (the device under refmount's cache_dir too)",
            f"- data: {self.data} ({self.size / GiB:g} GiB); cold = {self.cold_method} + served file "
            f"re-read into the page cache; refmount options: {self.refmount_options(Path('DIR'), 'TAG')}",
        ]


_BOILERPLATE = ("threading.py", "<frozen runpy>", "refmount/daemon.py", "trio/_core/_thread_cache.py",
                "outcome/_impl.py", "trio/_threads.py", "asyncio/base_events.py", "asyncio/events.py",
                "trio/_core/_run.py")
_WAITING = ("EpollIOManager.get_events", "EpollSelector.select", "WorkerThread._work")


def summarize_pyspy(path: Path, duration: float, rate_hz: int, gil: bool, top: int = 10) -> str:
    """Where the daemon's time goes, from py-spy raw (collapsed) stacks recorded with --threads."""
    threads: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    leaf_pkg: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        name = "?"
        if frames and frames[0].startswith(("thread", "process")):
            name = re.sub(r"\d+", "N", frames[0].split(":", 1)[-1].strip())
            frames = frames[1:]
        total += n
        threads[name] += n
        if not frames:
            continue
        leaf[_short(frames[-1])] += n
        leaf_pkg[_package(frames[-1])] += n
        seen: set[str] = set()
        for f in frames:
            short = _short(f)
            if short in seen or any(b in f for b in _BOILERPLATE):
                continue
            seen.add(short)
            incl[short] += n
            if "refmount/" in f:
                own[short] += n
    if not total:
        return "no samples (the daemon was idle, or py-spy could not attach)"
    expect = max(duration * rate_hz, 1)

    def pct(counter: Counter[str], k: int, base: float) -> str:
        return "; ".join(f"{key} {100 * n / base:.0f}%" for key, n in counter.most_common(k))

    if gil:
        out = [f"GIL held during {100 * total / expect:.0f}% of the {duration:.1f} s pass "
               f"({total:,} samples at {rate_hz} Hz, py-spy --gil: only the thread holding the GIL "
               "is sampled). Share of the pass by thread: " + pct(threads, 6, expect)]
    else:
        out = [f"{total:,} samples of running threads over {duration:.1f} s at {rate_hz} Hz; "
               "busy % by thread: " + pct(threads, 6, expect)]
    out.append("self time by package (% of samples): " + pct(leaf_pkg, top, total))
    out.append("hottest functions, self (% of samples): " + pct(leaf, top, total)
               + (" -- " + "/".join(_WAITING) + " are the loops' wait points"
                  if any(w in k for k in leaf for w in _WAITING) else ""))
    out.append("inclusive (% of samples, thread/loop boilerplate left out): " + pct(incl, top + 4, total))
    if own:
        out.append("inclusive, refmount code only: " + pct(own, top, total))
    return "\n".join(f"- {ln}" for ln in out)


_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()[:60]
    return f"{m.group('fn')} ({'/'.join(Path(m.group('file')).parts[-2:])})"


def _package(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return "?"
    file = m.group("file").strip("<>").removeprefix("frozen ")
    parts = file.split("/")
    if parts[0] == "refmount" and len(parts) > 1:
        return "refmount." + parts[-1].removesuffix(".py")
    return parts[0].removesuffix(".py")


# ============================================================================================
# Options and run
# ============================================================================================


def add_arguments(p: Any) -> None:
    p.add_argument("--files64k", type=int, default=None, help="number of 64 KiB refs (10000; --quick 2000)")
    p.add_argument("--files1m", type=int, default=None, help="number of 1 MiB refs (1024; --quick 256)")
    p.add_argument("--decode-chunks", type=int, default=None,
                   help="1 MiB chunks of the zlib+shuffle array of the decode rows (1024; --quick 128)")
    p.add_argument("--readers", default="1,8,32", help="concurrent readers for the 64 KiB files")
    p.add_argument("--fsspec-fuse-threads", action="store_true",
                   help="run fsspec.fuse with threads=True (default: its default, single-threaded)")
    p.add_argument("--profile", action="store_true",
                   help="extra refmount passes (cold 64 KiB x8, cold sequential) under py-spy")
    p.add_argument("--pyspy-rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--pyspy-mode", choices=["gil", "cpu", "both"], default="both",
                   help="gil: sample only the thread holding the GIL; cpu: all running threads; "
                   "both (default): one profiled session each")
    p.add_argument("--disturbed-load", type=float, default=0.25,
                   help="a pass during which other processes used more cores than this on average is "
                   "redone (default 0.25)")
    p.add_argument("--retries", type=int, default=2,
                   help="redo a disturbed pass up to this many times (default 2); if all attempts are "
                   "disturbed the best is shown, marked †")
    p.add_argument("--keep-cache", action="store_true", help="keep refmount cache dirs afterwards")
    p.add_argument("--prune-data", action="store_true",
                   help="delete served files of other sizes in the work dir")


def configure(a: argparse.Namespace) -> None:
    a.size_bytes = parse_size(a.size or ("256M" if a.quick else "2G"))
    a.files64k = min(a.files64k or (2000 if a.quick else 10000), a.size_bytes // (64 * 1024))
    a.files1m = min(a.files1m or (256 if a.quick else 1024), a.size_bytes // MiB)
    a.decode_chunks = a.decode_chunks or (128 if a.quick else 1024)
    a.reads_timeout = a.timeout or (120.0 if a.quick else 300.0)
    a.readers_list = [int(x) for x in a.readers.split(",") if x.strip()]


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    configure(args)
    bench = Bench(args, workloads, peers, work)
    load0 = os.getloadavg()
    cpu0 = h.cpu_by_pid()
    interrupted = False
    try:
        bench.setup()
        bench.run()
    except KeyboardInterrupt:
        interrupted = True
        bench.log("interrupted: cleaning up")
    finally:
        bench.cleanup()
    cpu1 = h.cpu_by_pid()
    others = sorted(((c1 - cpu0[pid][0], h.short_cmd(pid)) for pid, (c1, _) in cpu1.items()
                     if pid in cpu0 and pid != os.getpid() and c1 - cpu0[pid][0] >= 1.0), reverse=True)
    notes = [
        *bench.machine(),
        f"- load average at start {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}; "
        "other processes that used >= 1 CPU-second during the run: "
        + ("; ".join(f"{cpu:.0f} s `{name[:70]}`" for cpu, name in others[:5]) or "none"),
        f"- before each measured child: waited for < {args.quiet_load:g} busy cores "
        f"(max {args.quiet_wait:g} s; {bench.quiet_waited:.0f} s waited in all); "
        f"{bench.n_busy} of {bench.n_passes} started on a busy machine anyway; {bench.n_disturbed} attempts "
        f"redone because other processes used > {args.disturbed_load:g} cores on average during them",
        "",
        "MB = 10^6 bytes, GB = 10^9 bytes. Bold: refmount misses the goal. '—': not applicable / not run. "
        "†: every attempt was disturbed by other processes on the machine or by the hypervisor "
        "(steal time; best attempt shown). "
        "‡: warm pass that missed the kernel page cache in every attempt (paged out in between).",
        "Peers: refmount = CLI daemon, defaults + the options above; fsspec.fuse = fsspec.fuse.run(...,"
        f" threads={args.fsspec_fuse_threads}) over ReferenceFileSystem, ops root=''; fsspec in-process = "
        "cat_file per key (N threads) / open().read(1 MiB) for the whole file / get_mapper('reference://ARRAY',"
        " asynchronous=True) for zarr,"
        " warm = second pass on the same instance; curl = one curl process, ranges from a config file,"
        " --parallel-max N; local = dd / open+pread+close per item on the served file in the page cache;"
        " in the disk-cache warm rows, the same bytes from the disk under the cache directory with the"
        " page cache dropped (dd of the served file; the 1 MiB refs as plain files, same reader);"
        " for zarr, zarr over a copy of the array's files in tmpfs (/dev/shm).",
    ]
    details = ["### Read path: details per measurement", *bench.details]
    if bench.profiles:
        details += ["", "### py-spy profiles of the refmount daemon (extra passes, not in the table)", "",
                    *bench.profiles.values()]
    table = bench.table()
    table.notes = notes
    table.details = details
    table.data = {"cells": {f"{r}|{p}": {"value": c.value, "note": c.note}
                            for (r, p), c in bench.cells.items()}}
    if interrupted:
        table.title += " (INTERRUPTED: partial)"
    (bench.logs / "report.md").write_text(table.markdown() + "\n\n" + "\n".join(details) + "\n")
    leftovers = [m for m in (bench.mnt_root / "refmount", bench.mnt_root / "fsspec-fuse") if h.mounted(m)]
    if leftovers:
        bench.log(f"WARNING: still mounted: {leftovers}")
    if interrupted:
        raise KeyboardInterrupt
    return [table]
