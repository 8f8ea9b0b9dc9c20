#!/usr/bin/env python3
"""Benchmark of catalogue mounts (``-o catalog``) and reloading; standalone.

Measures, each printed as one line and, with --json, as one JSON object:

1. a catalogue of --sets small JSON sets: seconds until the mount is ready, seconds for
   ``ls`` of its root, the daemon's RSS after that (nothing indexed yet) and after reading one
   key of --touch sets;
2. a set of --keys keys inside the catalogue: seconds of the first access to it (indexing in
   the indexer process included) against the seconds a mount of that set alone takes to be
   ready;
3. a reload under --readers concurrent readers: a set rewritten --swaps times (SIGUSR1 after
   each), every reader opening and reading its key whole in small reads, counting read
   errors and reads that mixed bytes of two versions (must both be 0).

Usage: python bench/catalog.py [--sets 10000] [--keys 1000000] [--readers 16] [--json]
Runs refmount from the repository this file is in (python -m refmount); needs /dev/fuse.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEY_SIZE = 256 * 1024  # the reloaded key: several FUSE reads


def refmount(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "refmount", *args], env=env, capture_output=True,
                       text=True, timeout=1800)
    if check and r.returncode != 0:
        raise SystemExit(f"refmount {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def daemon_pid(mnt: Path) -> int:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "refmount.daemon" in " ".join(args) and str(mnt) in args:
            return int(pid)
    raise SystemExit(f"no daemon for {mnt}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def small_set(version: int = 1, size: int = 64) -> str:
    return json.dumps({".zgroup": '{"zarr_format": 2}',
                       "k": "base64:" + base64.b64encode(bytes([version]) * size).decode()})


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def big_set(path: Path, keys: int) -> None:
    """``keys`` keys: one array of 1-byte inline chunks (written as JSON, streamed)."""
    zarray = json.dumps({"shape": [keys], "chunks": [1], "dtype": "|u1", "compressor": None,
                         "fill_value": 0, "filters": None, "order": "C", "zarr_format": 2})
    with open(path, "w") as f:
        f.write(json.dumps({".zgroup": '{"zarr_format": 2}', "x/.zarray": zarray})[:-1])
        for i in range(keys):
            f.write(f', "x/{i}": "base64:AQ=="')
        f.write("}")


def unmount(mnt: Path) -> None:
    for _ in range(20):
        if subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", type=int, default=10_000, help="small sets in the catalogue")
    p.add_argument("--keys", type=int, default=1_000_000, help="keys of the large set")
    p.add_argument("--touch", type=int, default=8, help="small sets read after the ls")
    p.add_argument("--readers", type=int, default=16, help="concurrent readers during reloads")
    p.add_argument("--swaps", type=int, default=5, help="rewrites of the set during the readers")
    p.add_argument("--workdir", default=None, help="where the sets go (default: a temporary dir)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="refmount-bench-catalog-"))
    cat, mnt, single, cache = work / "cat", work / "mnt", work / "single", work / "cache"
    for d in (cat, mnt, single):
        d.mkdir(parents=True, exist_ok=True)
    out: dict[str, float | int] = {"sets": args.sets, "keys": args.keys, "readers": args.readers}

    t = time.monotonic()
    for i in range(args.sets):
        (cat / f"s{i:06d}.json").write_text(small_set())
    write_atomically(cat / "hot.json", small_set(1, KEY_SIZE))
    big_set(cat / "big.json", args.keys)
    out["generate_s"] = round(time.monotonic() - t, 2)

    opts = f"catalog,cache_dir={cache},log={work / 'mount.log'}"
    try:
        # 1. the catalogue: ready, ls, RSS
        t = time.monotonic()
        refmount(str(cat), str(mnt), "-o", opts)
        out["ready_s"] = round(time.monotonic() - t, 2)
        pid = daemon_pid(mnt)
        t = time.monotonic()
        names = os.listdir(mnt)
        out["ls_root_s"] = round(time.monotonic() - t, 3)
        assert len(names) == args.sets + 2, len(names)
        out["rss_after_ls_mib"] = round(rss_mib(pid), 1)
        t = time.monotonic()
        for i in range(args.touch):
            (mnt / f"s{i:06d}" / "k").read_bytes()
        out[f"first_read_of_{args.touch}_small_sets_s"] = round(time.monotonic() - t, 2)
        out["rss_after_touch_mib"] = round(rss_mib(pid), 1)

        # 2. the large set: first access in the catalogue against its own mount
        t = time.monotonic()
        os.stat(mnt / "big" / "x" / "0")
        out["big_first_access_in_catalogue_s"] = round(time.monotonic() - t, 2)
        out["rss_with_big_open_mib"] = round(rss_mib(pid), 1)
        t = time.monotonic()
        refmount(str(cat / "big.json"), str(single), "-o", f"no_disk_cache,log={work / 'single.log'}")
        out["big_single_mount_ready_s"] = round(time.monotonic() - t, 2)
        unmount(single)

        # 3. reloads under concurrent readers
        stop = threading.Event()
        counts = {"reads": 0, "errors": 0, "mixed": 0}
        seen: set[int] = set()
        lock = threading.Lock()

        def reader() -> None:
            while not stop.is_set():
                try:
                    with open(mnt / "hot" / "k", "rb", buffering=0) as f:
                        parts = []
                        while chunk := f.read(32 * 1024):
                            parts.append(chunk)
                    data = b"".join(parts)
                    first = data[:1]
                    mixed = len(data) != KEY_SIZE or data.count(first) != KEY_SIZE
                    with lock:
                        counts["reads"] += 1
                        counts["mixed"] += mixed
                        if data:
                            seen.add(data[0])
                except OSError:
                    with lock:
                        counts["errors"] += 1

        threads = [threading.Thread(target=reader) for _ in range(args.readers)]
        for th in threads:
            th.start()
        t = time.monotonic()
        swap_times = []
        for version in range(2, 2 + args.swaps):
            write_atomically(cat / "hot.json", small_set(version, KEY_SIZE))
            began = time.monotonic()
            os.kill(pid, signal.SIGUSR1)
            while time.monotonic() - began < 120:
                try:
                    if (mnt / "hot" / "k").read_bytes()[:1] == bytes([version]):
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            swap_times.append(time.monotonic() - began)
        stop.set()
        for th in threads:
            th.join(60)
        out["reload_swaps"] = args.swaps
        out["reload_swap_s_mean"] = round(sum(swap_times) / len(swap_times), 2)
        out["reload_reads"] = counts["reads"]
        out["reload_read_errors"] = counts["errors"]
        out["reload_mixed_reads"] = counts["mixed"]
        out["reload_versions_seen"] = len(seen)
        out["reads_per_s_during_reloads"] = round(counts["reads"] / (time.monotonic() - t), 1)
        out["rss_end_mib"] = round(rss_mib(pid), 1)
    finally:
        unmount(mnt)
        unmount(single)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:40} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
