"""The ``catalog`` workload: catalogue mounts (``-o catalog``) and reloading.

Rows, one measure each (the raw values also in the JSON):

1. a catalogue of ``--sets`` small JSON sets: seconds until the mount is ready (``--ready-passes``
   cold mounts, interleaved with as many of ``--base``'s checkout when given), seconds for
   ``ls`` of its root, the daemon's RSS after that (nothing indexed yet) and after reading one
   key of ``--touch`` sets;
2. a set of ``--catalog-keys`` keys inside the catalogue: seconds of the first access to it
   (indexing in the indexer process included) against the seconds a mount of that set alone
   takes to be ready;
3. a reload under ``--reload-readers`` concurrent readers: a set rewritten ``--swaps`` times
   (SIGUSR1 after each), every reader opening and reading its key whole in small reads,
   counting read errors and reads that mixed bytes of two versions (must both be 0).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table

WORKLOADS = {"catalog": "a catalogue of 10,000 sets and a 1M-key set: ready, ls, RSS; reloads under readers"}
PEERS = ("refmount",)
KEY_SIZE = 256 * 1024  # the reloaded key: several FUSE reads


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


def rss_mib(pid: int) -> float:
    return round(h.proc_status(pid).get("VmRSS", 0) / h.MiB, 1)


def reloads(mnt: Path, cat: Path, pid: int, readers: int, swaps: int, out: dict[str, Any]) -> None:
    """``hot.json`` rewritten ``swaps`` times (SIGUSR1 after each) under ``readers`` threads."""
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
                mixed = len(data) != KEY_SIZE or data.count(data[:1]) != KEY_SIZE
                with lock:
                    counts["reads"] += 1
                    counts["mixed"] += mixed
                    if data:
                        seen.add(data[0])
            except OSError:
                with lock:
                    counts["errors"] += 1

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for th in threads:
        th.start()
    t = time.monotonic()
    swap_times = []
    try:
        for version in range(2, 2 + swaps):
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
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    out["reload_swaps"] = swaps
    out["reload_swap_s_mean"] = round(sum(swap_times) / len(swap_times), 2)
    out["reload_reads"] = counts["reads"]
    out["reload_read_errors"] = counts["errors"]
    out["reload_mixed_reads"] = counts["mixed"]
    out["reload_versions_seen"] = len(seen)
    out["reads_per_s_during_reloads"] = round(counts["reads"] / (time.monotonic() - t), 1)


def measure(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    sets = args.sets or (500 if args.quick else 10_000)
    keys = args.catalog_keys or (20_000 if args.quick else 1_000_000)
    cat, mnt, single = work / "cat", work / "mnt", work / "single"
    cat.mkdir(parents=True)
    out.update(sets=sets, keys=keys, readers=args.reload_readers)
    t = time.monotonic()
    for i in range(sets):
        (cat / f"s{i:06d}.json").write_text(small_set())
    write_atomically(cat / "hot.json", small_set(1, KEY_SIZE))
    big_set(cat / "big.json", keys)
    out["generate_s"] = round(time.monotonic() - t, 2)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    caches = h.CacheDirs(work / "cache")
    timeout = args.timeout or 1800.0
    extra = list(filter(None, [args.refmount_opts]))
    h.wait_idle(args.quiet_wait, args.quiet_load)
    ready_passes(args, cat, work, caches, extra, timeout, log, out)
    # 1. the catalogue: ready, ls, RSS
    m = h.mount_refmount(cat, mnt, ["catalog", f"cache_dir={caches.fresh('catalog')}",
                                    f"log={work / 'mount.log'}", *extra], timeout, log, probe="hot")
    try:
        pid = m.pids[0]
        out["ready_s"] = round(m.seconds, 2)
        t = time.monotonic()
        names = os.listdir(mnt)
        out["ls_root_s"] = round(time.monotonic() - t, 3)
        assert len(names) == sets + 2, len(names)
        out["rss_after_ls_mib"] = rss_mib(pid)
        t = time.monotonic()
        for i in range(args.touch):
            (mnt / f"s{i:06d}" / "k").read_bytes()
        out[f"first_read_of_{args.touch}_small_sets_s"] = round(time.monotonic() - t, 2)
        out["rss_after_touch_mib"] = rss_mib(pid)

        # 2. the large set: first access in the catalogue against its own mount
        t = time.monotonic()
        os.stat(mnt / "big" / "x" / "0")
        out["big_first_access_in_catalogue_s"] = round(time.monotonic() - t, 2)
        out["rss_with_big_open_mib"] = rss_mib(pid)
        alone = h.mount_refmount(cat / "big.json", single,
                                 ["no_disk_cache", f"log={work / 'single.log'}", *extra], timeout, log)
        alone.unmount(log)
        out["big_single_mount_ready_s"] = round(alone.seconds, 2)

        # 3. reloads under concurrent readers
        reloads(mnt, cat, pid, args.reload_readers, args.swaps, out)
        out["rss_end_mib"] = rss_mib(pid)
    finally:
        m.unmount(log)
        caches.cleanup()


def ready_passes(args: argparse.Namespace, cat: Path, work: Path, caches: h.CacheDirs,
                 extra: list[str], timeout: float, log: Callable[[str], None], out: dict[str, Any]) -> None:
    """``--ready-passes`` cold mounts of the catalogue (each with a fresh ``cache_dir``), and as
    many of ``--base``'s checkout interleaved with them: seconds until each is ready."""
    checkouts = [("ready", None), *([("ready_base", Path(args.base))] if getattr(args, "base", None) else [])]
    times: dict[str, list[float]] = {label: [] for label, _ in checkouts}
    for i in range(args.ready_passes):
        for label, repo in checkouts if i % 2 == 0 else checkouts[::-1]:
            m = h.mount_refmount(cat, work / "mnt-ready", ["catalog", f"cache_dir={caches.fresh(label)}",
                                                          *extra], timeout, log, probe="hot", repo=repo)
            times[label].append(m.seconds)
            m.unmount(log)
    for label, seconds in times.items():
        if seconds:
            out[f"{label}_s_min_median_max"] = " / ".join(
                f"{v:.2f}" for v in (min(seconds), statistics.median(seconds), max(seconds)))


def add_arguments(p: Any) -> None:
    p.add_argument("--ready-passes", type=int, default=5,
                   help="cold mounts of the catalogue timed until ready (interleaved with --base's)")
    p.add_argument("--sets", type=int, default=None, help="small sets in the catalogue (10000; --quick 500)")
    p.add_argument("--catalog-keys", type=int, default=None,
                   help="keys of the large set (1000000; --quick 20000)")
    p.add_argument("--touch", type=int, default=8, help="small sets read after the ls")
    p.add_argument("--reload-readers", type=int, default=16, help="concurrent readers during reloads")
    p.add_argument("--swaps", type=int, default=5, help="rewrites of the set during the readers")


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    if not peers:
        return []
    shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {}
    try:
        measure(args, work, out)
    except h.Failed as e:
        out["failed"] = str(e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [Table("catalog", "catalogue mounts and reloads (refmount, -o catalog)", ["measure", "value"],
                  [[k, str(v)] for k, v in out.items()], data=out, align="lr")]
