#!/usr/bin/env python3
"""Large inline values: mount time and memory against value size, refmount vs. fsspec.

A Version 0 set ``{"small": "s", "big": VALUE}`` whose one value has N bytes, for N in
``--sizes`` (MiB; default 1 8 64 256) and each ``--kinds``:

* ``plain`` -- a plain string of N bytes;
* ``base64`` -- ``"base64:..."`` decoding to N bytes (the JSON holds 4N/3);
* ``object`` -- a JSON-object value (``{"a": "<N bytes>"}``), served as its JSON text;
* ``v1`` -- the plain string in the ``refs`` of a Version 1 set;
* ``parquet`` -- a Parquet reference set whose one chunk ``x/0`` is a ``raw`` cell of N bytes.

Rows (peers):

* refmount: ``refmount SOURCE MNT -o no_disk_cache,max_inline=<N rounded up>``, the time until
  the CLI returns (the mount answers, CLI startup included), the CLI's peak RSS (it parses),
  the daemon's peak RSS
  (VmHWM) after ``big`` was read whole through the mount and checked (sha256);
* fsspec: ``ReferenceFileSystem(fo=SOURCE)`` in a fresh process, then ``cat("big")``: the time of
  the two and the process's peak RSS.

Linear means: time and memory per MiB stay flat as N grows. Only processes started here are
signalled; every mount is unmounted in ``finally``.

Usage:
    .venv/bin/python scripts/bench_inline.py
    .venv/bin/python scripts/bench_inline.py --sizes 1 8 --kinds plain
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lib import fuse_unmount, refmount_daemon_pid

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
                       timeout=timeout)
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


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_refmount(src: Path, mnt: Path, size: int, key: str, digest: str) -> str:
    limit = max(size, 64 * MiB) + MiB
    cmd = [sys.executable, "-m", "refmount", str(src), str(mnt), "-o",
           f"no_disk_cache,max_inline={limit}"]
    res = measured(cmd, 600)
    if res["rc"] != 0:
        return f"refused: {res['err'].strip()}"
    pid = refmount_daemon_pid(mnt)
    try:
        h = hashlib.sha256()
        with open(mnt / key, "rb") as f:
            while chunk := f.read(4 * MiB):
                h.update(chunk)
        ok = h.hexdigest() == digest
        daemon = vm_hwm(pid) if pid else 0
    finally:
        fuse_unmount(mnt, [pid] if pid else [], print)
    return (f"{res['seconds']:7.2f} s  CLI peak {res['rss'] / MiB:6.0f} MiB  daemon peak "
            f"{daemon / MiB:6.0f} MiB  {'content ok' if ok else 'CONTENT DIFFERS'}")


def run_fsspec(src: Path, key: str, timeout: float) -> str:
    try:
        res = measured([sys.executable, "-c", FSSPEC_PEER, str(src), key], timeout)
    except subprocess.TimeoutExpired:
        return f"DNF >{timeout:g}s"
    if res["rc"] != 0:
        return "failed: " + (res["err"].strip().splitlines() or ["?"])[-1]
    own = json.loads(res["out"])
    return f"{own['seconds']:7.2f} s  peak {res['rss'] / MiB:6.0f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 256], metavar="MIB")
    kinds = ["plain", "base64", "object", "v1", "parquet"]
    p.add_argument("--kinds", nargs="+", default=kinds, choices=kinds)
    p.add_argument("--timeout", type=float, default=300.0, help="bound of each fsspec run")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} (the machine may be shared)")
    with tempfile.TemporaryDirectory(prefix="bench-inline-") as tmp:
        work = Path(tmp)
        mnt = work / "mnt"
        mnt.mkdir()
        for kind in args.kinds:
            for mib in args.sizes:
                src = work / f"{kind}-{mib}" if kind == "parquet" else work / f"{kind}-{mib}.json"
                key, digest = make(src, kind, mib * MiB)
                print(f"{kind:7} {mib:4d} MiB  refmount: "
                      f"{run_refmount(src, mnt, mib * MiB, key, digest)}")
                print(f"{'':7} {'':4}      fsspec:   {run_fsspec(src, key, args.timeout)}")
                shutil.rmtree(src) if src.is_dir() else src.unlink()
    print(f"bench peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
