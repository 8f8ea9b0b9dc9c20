"""The ``inline`` workload: mount time and memory against the size of one inline value.

A Version 0 set ``{"small": "s", "big": VALUE}`` whose one value has N bytes, for N in
``--sizes`` (MiB) and each of ``--kinds``: ``plain`` (a string), ``base64`` (``"base64:..."``
decoding to N bytes), ``object`` (a JSON object served as its text), ``v1`` (the string in a
Version 1 set's ``refs``), ``parquet`` (a Parquet set whose one chunk is a ``raw`` cell).
Peers: refmount (``-o no_disk_cache,max_inline=<N rounded up>``: time until the CLI returns,
the CLI's peak RSS, the daemon's peak RSS after ``big`` was read whole and checked) and
inproc (``ReferenceFileSystem(fo=SOURCE)`` and ``cat("big")`` in a fresh process: time and
peak RSS). Linear means: time and memory per MiB stay flat as N grows.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table

WORKLOADS = {"inline": "one inline value of 1-256 MiB (plain, base64, object, v1, parquet): ready, RSS"}
PEERS = ("refmount", "inproc")
KINDS = ("plain", "base64", "object", "v1", "parquet")
MiB = 1 << 20

FSSPEC_PEER = r"""
import json, sys, time
import fsspec
t = time.monotonic()
fs = fsspec.filesystem("reference", fo=sys.argv[1])
n = len(fs.cat(sys.argv[2]))
print(json.dumps({"seconds": time.monotonic() - t, "bytes": n}))
"""

# Peak RSS is measured by a small wrapper process: a child forked from this (large) process
# would report this process's RSS as its own peak (Linux carries it across fork and exec).
MEASURED = r"""
import json, resource, subprocess, sys, time
t = time.monotonic()
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
print(json.dumps({"rc": r.returncode, "seconds": time.monotonic() - t,
                  "out": r.stdout.decode(errors="replace"), "err": r.stderr.decode(errors="replace"),
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def measured(cmd: list[str], timeout: float) -> dict:
    r = subprocess.run([sys.executable, "-c", MEASURED, *cmd], capture_output=True, text=True,
                       timeout=timeout, env=h.checkout_env())
    return json.loads(r.stdout)


def make_parquet(root: Path, body: bytes) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir()
    zarray = {"zarr_format": 2, "shape": [len(body)], "chunks": [len(body)], "dtype": "|u1",
              "compressor": None, "filters": None, "fill_value": 0, "order": "C"}
    (root / ".zmetadata").write_text(json.dumps({"record_size": 10_000, "metadata": {
        ".zgroup": {"zarr_format": 2}, "x/.zarray": zarray}}))
    (root / "x").mkdir()
    pq.write_table(pa.table({"path": pa.array([None], pa.string()),
                             "offset": pa.array([0], pa.int64()), "size": pa.array([0], pa.int64()),
                             "raw": pa.array([body], pa.binary())}), root / "x" / "refs.0.parq")


def make(path: Path, kind: str, size: int) -> tuple[str, str]:
    """Write the set; returns the key to read and the sha256 of the bytes it must serve."""
    body = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    if kind == "parquet":
        make_parquet(path, body)
        return "x/0", hashlib.sha256(body).hexdigest()
    with open(path, "wb") as f:
        if kind == "v1":
            f.write(b'{"version": 1, "refs": {"small": "s", "big": "' + body + b'"}}')
            return "big", hashlib.sha256(body).hexdigest()
        f.write(b'{"small": "s", "big": ')
        if kind == "plain":
            f.write(b'"' + body + b'"')
            served = body
        elif kind == "base64":
            f.write(b'"base64:' + base64.b64encode(body) + b'"')
            served = body
        else:
            f.write(b'{"a": "' + body + b'"}')
            served = json.dumps({"a": body.decode()}).encode()
        f.write(b"}")
    return "big", hashlib.sha256(served).hexdigest()


def run_refmount(src: Path, mnt: Path, size: int, key: str, digest: str) -> str:
    limit = max(size, 64 * MiB) + MiB
    cmd = [sys.executable, "-m", "refmount", str(src), str(mnt), "-o", f"no_disk_cache,max_inline={limit}"]
    res = measured(cmd, 600)
    if res["rc"] != 0:
        return f"refused: {res['err'].strip()}"
    pid = h.refmount_daemon_pid(mnt)
    try:
        hsh = hashlib.sha256()
        with open(mnt / key, "rb") as f:
            while chunk := f.read(4 * MiB):
                hsh.update(chunk)
        ok = hsh.hexdigest() == digest
        daemon = h.proc_status(pid).get("VmHWM", 0) if pid else 0
    finally:
        h.fuse_unmount(mnt, [pid] if pid else [], print)
    return (f"{res['seconds']:.2f} s; CLI peak {res['rss'] / MiB:,.0f} MiB; daemon peak "
            f"{daemon / MiB:,.0f} MiB; {'content ok' if ok else 'CONTENT DIFFERS'}")


def run_fsspec(src: Path, key: str, timeout: float) -> str:
    try:
        res = measured([sys.executable, "-c", FSSPEC_PEER, str(src), key], timeout)
    except subprocess.TimeoutExpired:
        return f"DNF >{timeout:g}s"
    if res["rc"] != 0:
        return "failed: " + (res["err"].strip().splitlines() or ["?"])[-1]
    own = json.loads(res["out"])
    return f"{own['seconds']:.2f} s; peak {res['rss'] / MiB:,.0f} MiB"


def add_arguments(p: Any) -> None:
    p.add_argument("--sizes", default=None, help="MiB of the value, comma list (1,8,64,256; --quick 1,8)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {','.join(KINDS)}")


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    sizes = [int(x) for x in (args.sizes or ("1,8" if args.quick else "1,8,64,256")).split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    if bad := set(kinds) - set(KINDS):
        raise SystemExit(f"unknown kinds: {sorted(bad)}")
    timeout = args.timeout or 300.0
    t = Table("inline", "large inline values: ready; CLI peak RSS; daemon peak RSS",
              ["value", "MiB", *({"refmount": "refmount", "inproc": "fsspec in-process"}[p] for p in peers)],
              align="lrll")
    shutil.rmtree(work, ignore_errors=True)
    mnt = work / "mnt"
    mnt.mkdir(parents=True)
    try:
        for kind in kinds:
            for mib in sizes:
                h.wait_idle(args.quiet_wait, args.quiet_load)
                src = work / f"{kind}-{mib}" if kind == "parquet" else work / f"{kind}-{mib}.json"
                key, digest = make(src, kind, mib * MiB)
                row = [kind, str(mib)]
                if "refmount" in peers:
                    row.append(run_refmount(src, mnt, mib * MiB, key, digest))
                if "inproc" in peers:
                    row.append(run_fsspec(src, key, timeout))
                print(" | ".join(row), file=sys.stderr, flush=True)
                t.rows.append(row)
                shutil.rmtree(src) if src.is_dir() else src.unlink()
    finally:
        h.fuse_unmount(mnt, [], print)
        shutil.rmtree(work, ignore_errors=True)
    return [t]
