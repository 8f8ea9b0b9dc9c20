#!/usr/bin/env python3
"""Object-store latency benchmark: refmount next to its peers behind a server that answers late.

One file of incompressible bytes is served by nginx (own configuration, 127.0.0.1, free port)
whose every response waits ``LATENCY`` ms before its first byte (Debian's echo module: a timer,
no CPU per byte; Range requests and sendfile unchanged) and, with ``--bandwidth``, is capped
per response by ``limit_rate``. For each chunk size, a reference set describes the start of
the file as one zarr v2 array ``x`` (``<f8``, no compressor, chunks laid out in key order:
by default 4,096 x 64 KiB = 256 MiB, 1,024 x 1 MiB and 128 x 8 MiB = 1 GiB, so that each
pass lasts long enough for readahead to reach its steady state) plus ``data.bin`` = the whole
file (``--size``, 1 GiB).

Rows, for each latency: zarr reading the whole array (one row per chunk size) and a sequential
read of the whole file (1 MiB reads). Columns:

* refmount -- the CLI daemon, a fresh mount and a fresh ``cache_dir`` per measurement (cold);
* fsspec in-process -- zarr over ``fsspec.get_mapper("reference://x", asynchronous=True)``;
  for the whole file ``ReferenceFileSystem.open().read(1 MiB)``;
* fsspec.fuse -- ``fsspec.fuse.run`` over ``ReferenceFileSystem`` (fusepy, single-threaded);
* curl -- the whole file in one request (whole-file row only);
* tmpfs -- zarr over a copy of the array's files in ``/dev/shm`` (zarr rows only): what the
  machine's reader gets with no network and no FUSE at all, the bound of the zarr rows.

Each cell is the median of ``--repeat`` cold passes, in MB/s (10^6 bytes/s); every zarr pass
checks the array against the file. A pass longer than ``--timeout`` shows "timeout".

Usage:
    .venv/bin/python scripts/bench_latency.py                       # 0, 20, 50 ms; 64K/1M/8M chunks
    .venv/bin/python scripts/bench_latency.py --latencies 20 --chunks 1m:512 --repeat 3
    .venv/bin/python scripts/bench_latency.py --bandwidth 100m      # + 100 MB/s per response
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_lib as bl

from refmount.config import parse_size

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
BENCH = str(Path(__file__).resolve().parent / "bench.py")  # its ``_child`` entry point runs readers
PEERS = ["refmount", "inproc", "fsspec-fuse", "curl", "tmpfs"]
TITLES = {"refmount": "refmount", "inproc": "fsspec in-process", "fsspec-fuse": "fsspec.fuse",
          "curl": "curl", "tmpfs": "zarr on tmpfs"}


def human(n: int) -> str:
    for unit, size in (("MiB", bl.MiB), ("KiB", bl.KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


class Failed(Exception):
    """A measurement that produced no number (shown in its cell)."""


def write_refs(path: Path, url: str, n: int, chunk: int) -> None:
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "data.bin": [url],
        "x/.zarray": bl.zarray(n, chunk),
        "x/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
    }
    for i in range(n):
        refs[f"x/{i}"] = [url, i * chunk, chunk]
    path.write_text(json.dumps({"version": 1, "refs": refs}))


def child(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        r = subprocess.run([PY, BENCH, "_child", kind, json.dumps(spec)], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed("timeout") from None
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines or "fatal" in lines[-1]:
        raise Failed((lines[-1].get("fatal", "") if lines else r.stderr.strip()[-200:]) or "failed")
    res = lines[-1]
    if res.get("verify_failed"):
        raise Failed("MISMATCH")
    return res


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work).resolve()
        self.size = parse_size(args.size)
        # (chunk size, number of chunks): an array of the first chunk * count bytes of the file
        self.chunks: list[tuple[int, int]] = []
        for spec in args.chunks.split(","):
            size, _, count = spec.partition(":")
            chunk = parse_size(size)
            self.chunks.append((chunk, int(count) if count else self.size // chunk))
        self.file_size = max([self.size, *(c * n for c, n in self.chunks)])
        self.peers = args.peers.split(",")
        self.data = self.work / "serve" / "data.bin"
        self.mnt = self.work / "mnt"
        self.logs = self.work / "logs"
        self.live: list[tuple[Path, list[int]]] = []
        self.details: list[str] = []

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # ---- mounts ---------------------------------------------------------------------------
    def mount_refmount(self, refs: Path, tag: str) -> Path:
        cache = self.work / "cache" / tag
        shutil.rmtree(cache, ignore_errors=True)  # cold: a fresh cache_dir as well as a fresh mount
        cache.mkdir(parents=True)
        opts = [f"cache_dir={cache}", f"log={self.logs / f'refmount-{tag}.log'}"]
        if self.args.refmount_opts:
            opts.append(self.args.refmount_opts)
        r = subprocess.run([PY, "-m", "refmount", str(refs), str(self.mnt), "-o", ",".join(opts)],
                           capture_output=True, text=True, timeout=180, cwd=REPO)
        pid = bl.refmount_daemon_pid(self.mnt)
        self.live.append((self.mnt, [pid] if pid else []))
        if r.returncode != 0 or pid is None:
            raise Failed(f"mount failed: {r.stderr.strip()[-200:]}")
        return self.mnt

    def mount_fsspec_fuse(self, refs: Path, tag: str) -> Path:
        err = open(self.logs / f"fsspec-fuse-{tag}.log", "w")  # noqa: SIM115
        spec = {"refs": str(refs), "mnt": str(self.mnt), "threads": False}
        proc = subprocess.Popen([PY, BENCH, "_child", "fsspec_fuse", json.dumps(spec)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        err.close()
        self.live.append((self.mnt, [proc.pid]))
        if not bl.wait_mount_answers(self.mnt, ["data.bin", "x"], 60, proc):
            raise Failed("mount failed")
        return self.mnt

    def unmount_all(self) -> None:
        while self.live:
            mnt, pids = self.live.pop()
            bl.fuse_unmount(mnt, pids, self.log)

    # ---- one cell ---------------------------------------------------------------------------
    def measure(self, peer: str, row: str, refs: Path, url: str, chunk: int | None, tag: str) -> float:
        timeout = self.args.timeout
        if peer == "curl":
            if chunk is not None:
                raise Failed("—")
            t0 = time.perf_counter()
            r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", url],
                               capture_output=True, text=True, timeout=timeout)
            return int(r.stdout or 0) / (time.perf_counter() - t0) / 1e6
        if peer == "tmpfs":
            if chunk is None:
                raise Failed("—")
            root = bl.zarr_copy(refs, self.data, "x")
            try:
                res = child("zarr", {"store": "mount", "root": str(root), "array": "x", "passes": 1,
                                     "local": str(self.data)}, timeout)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            return res["bytes"] / res["elapsed"] / 1e6
        if peer == "inproc":
            if chunk is None:
                res = child("inproc", {"refs": str(refs), "mode": "seq", "passes": 1}, timeout)
            else:
                res = child("zarr", {"store": "inproc", "refs": str(refs), "array": "x", "passes": 1,
                                     "local": str(self.data)}, timeout)
            return res["bytes"] / res["elapsed"] / 1e6
        mount = self.mount_refmount if peer == "refmount" else self.mount_fsspec_fuse
        try:
            mnt = mount(refs, tag)
            if chunk is None:
                t0 = time.perf_counter()
                r = subprocess.run(["dd", f"if={mnt / 'data.bin'}", "of=/dev/null", "bs=1M"],
                                   capture_output=True, text=True, timeout=timeout)
                if r.returncode != 0:
                    raise Failed("dd failed")
                return self.file_size / (time.perf_counter() - t0) / 1e6
            res = child("zarr", {"store": "mount", "root": str(mnt), "array": "x", "passes": 1,
                                 "local": str(self.data)}, timeout)
            return res["bytes"] / res["elapsed"] / 1e6
        except subprocess.TimeoutExpired:
            raise Failed("timeout") from None
        finally:
            self.unmount_all()

    def cell(self, fn: Callable[[int], float]) -> str:
        values: list[float] = []
        for i in range(self.args.repeat):
            try:
                values.append(fn(i))
            except Failed as e:
                return str(e)
        return f"{statistics.median(values):,.0f}"

    # ---- the run ------------------------------------------------------------------------------
    def run(self) -> list[list[str]]:
        for d in (self.data.parent, self.mnt, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        bl.ensure_data(self.data, self.file_size, self.log)
        rows: list[list[str]] = []
        for latency in [float(x) for x in self.args.latencies.split(",")]:
            nginx = bl.Nginx(self.data.parent, self.work / "nginx", latency_ms=latency,
                             rate=self.args.bandwidth)
            nginx.start()
            try:
                bl.warm_file(self.data)
                url = nginx.url("data.bin")
                cases: list[tuple[str, int | None, int]] = [
                    (f"zarr, {n:,} x {human(c)} chunks", c, n) for c, n in self.chunks]
                cases.append((f"whole file ({human(self.file_size)}), sequential 1 MiB reads", None, 0))
                for label, chunk, count in cases:
                    refs = self.work / f"refs-{chunk or 0}.json"
                    write_refs(refs, url, count, chunk or bl.MiB)
                    row = [f"{latency:g} ms", label]
                    for peer in self.peers:
                        tag = f"{latency:g}ms-{chunk or 'seq'}-{peer}"
                        self.log(f"{tag} ...")
                        row.append(self.cell(lambda i, peer=peer, label=label, refs=refs, chunk=chunk,
                                             tag=tag, url=url: self.measure(peer, label, refs, url, chunk,
                                                                   f"{tag}-{i}")))
                        self.log(f"{tag}: {row[-1]}")
                    rows.append(row)
            finally:
                self.unmount_all()
                nginx.stop()
        return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latencies", default="0,20,50", help="ms before each response's first byte")
    p.add_argument("--bandwidth", default=None, help="nginx limit_rate per response, e.g. 100m")
    p.add_argument("--chunks", default="64k:4096,1m:1024,8m:128",
                   help="zarr arrays: chunk size[:number of chunks] (default number: --size / chunk)")
    p.add_argument("--size", default="1G", help="bytes of the file read whole (and the least it holds)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS)}")
    p.add_argument("--repeat", type=int, default=1, help="cold passes per cell (median shown)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per pass")
    p.add_argument("--refmount-opts", default="", help="extra refmount -o options")
    p.add_argument("--work", default=str(REPO / "bench-work" / "latency"), help="work directory")
    args = p.parse_args(argv)
    run = Run(args)
    t0 = time.time()
    try:
        rows = run.run()
    finally:
        run.unmount_all()
    head = ["latency", "workload", *[TITLES[x] for x in run.peers]]
    out = [
        "## refmount behind object-store latency (MB/s, cold, median of "
        f"{args.repeat})", "",
        f"command: `{shlex.join([PY, *sys.argv])}`, took {(time.time() - t0) / 60:.1f} min", "",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"kernel {platform.release()}; bandwidth cap per response: {args.bandwidth or 'none'}", "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * 2 + "---:|" * len(run.peers),
        *["| " + " | ".join(r) + " |" for r in rows],
    ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
