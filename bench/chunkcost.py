"""``python -m bench.chunkcost``: what one chunk file costs the daemon, cold and warm, against
the floor (``bench/floorfs.py``: a minimal pyfuse3 filesystem with the bytes in memory).

``--chunks`` files of ``--chunk`` bytes, ranges of one local file (in the page cache), are read
whole through a fresh mount (``--list``: after listing their directory, which looks them all
up): once cold (the mount's first read of each; a fresh ``cache_dir``), once warm (read
again), by one of two readers: ``open`` (Python's ``open(p, 'rb').read()``, which also asks
``isatty``: an ``IOCTL`` a file) and ``osread`` (``os.open``/``os.read``/``os.close``).
Reported per peer and reader: the daemon's CPU µs a file (user + system, from
``/proc/PID/stat``; median of ``--repeat`` passes, peers interleaved pass by pass) and, from a
counting pass with libfuse's debug log (``-o debug``, every request the kernel sends), the
requests a file by kind. Peers: ``refmount`` (this checkout), ``base`` (``--base CHECKOUT``,
another checkout's refmount), ``refmount+OPT+OPT`` (with more ``-o`` options), ``floor``
(opens files) and ``floor-noopen`` (answers ``OPEN`` with ``ENOSYS``: needs pyfuse3 with
``patches/pyfuse3-noopen.patch``). Every read is checked against the file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness as h
from refmount.config import parse_size


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_refs(path: Path, data: Path, n: int, chunk: int) -> None:
    refs: dict[str, Any] = {".zgroup": json.dumps({"zarr_format": 2}), "x/.zarray": h.zarray(n, chunk)}
    for i in range(n):
        refs[f"x/{i}"] = [str(data), i * chunk, chunk]
    path.write_text(json.dumps({"version": 1, "refs": refs}))


def read_all(mnt: Path, n: int, reader: str, blob: bytes, chunk: int) -> None:
    for i in range(n):
        p = f"{mnt}/x/{i}"
        if reader == "open":
            with open(p, "rb") as f:
                got = f.read()
        else:
            fd = os.open(p, os.O_RDONLY)
            try:
                got = os.read(fd, chunk + 1)
            finally:
                os.close(fd)
        if got != blob[i * chunk: (i + 1) * chunk]:
            raise h.Failed(f"MISMATCH at x/{i}")


class Served:
    """One peer's mount, in the foreground: the started process serves it."""

    def __init__(self, peer: str, args: argparse.Namespace, work: Path, tag: str, debug: bool) -> None:
        self.mnt = work / "mnt"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.err = work / "logs" / f"{tag}.stderr"
        if peer.startswith("floor"):
            cmd = [h.PY, "-m", "bench.floorfs", str(args.data), str(args.chunks), str(args.chunk_bytes),
                   str(self.mnt), *(["--no-open"] if peer == "floor-noopen" else []),
                   *(["--debug"] if debug else [])]
            repo = None
        else:
            cache = work / "cache" / tag
            cache.mkdir(parents=True, exist_ok=True)
            opts = [f"cache_dir={cache}", f"log={work / 'logs' / f'{tag}.log'}",
                    *(["debug"] if debug else []), *[o for o in args.refmount_opts.split(",") if o],
                    *peer.split("+")[1:]]
            cmd = [h.PY, "-P", "-m", "refmount", str(args.refs), str(self.mnt), "-f", "-o", ",".join(opts)]
            repo = args.base if peer.split("+")[0] == "base" else None
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                         env=h.checkout_env(repo), cwd=str(work))
        if not h.wait_answers(self.mnt, "x", 120, proc=self.proc):
            self.stop()
            raise h.Failed(f"{peer}: mount failed, see {self.err}")

    def cpu(self) -> float:
        t = h.proc_cpu(self.proc.pid)
        assert t is not None
        return t

    def requests(self) -> int:
        return len(self.err.read_bytes())

    def counted(self, since: int) -> collections.Counter[str]:
        text = self.err.read_bytes()[since:].decode(errors="replace")
        return collections.Counter(re.findall(r"opcode: ([A-Z_]+)", text))

    def stop(self) -> None:
        h.fuse_unmount(self.mnt, [self.proc.pid], log)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            h.stop_pid(self.proc.pid)


def cpu_pass(peer: str, reader: str, args: argparse.Namespace, work: Path, tag: str, blob: bytes
             ) -> tuple[float, float]:
    """µs of daemon CPU a file, cold and warm."""
    s = Served(peer, args, work, tag, debug=False)
    try:
        if args.list:  # pyfuse3 answers READDIRPLUS: the listing looks every file up
            os.listdir(s.mnt / "x")
        time.sleep(0.2)
        c0 = s.cpu()
        read_all(s.mnt, args.chunks, reader, blob, args.chunk_bytes)
        c1 = s.cpu()
        read_all(s.mnt, args.chunks, reader, blob, args.chunk_bytes)
        c2 = s.cpu()
    finally:
        s.stop()
    return (c1 - c0) / args.chunks * 1e6, (c2 - c1) / args.chunks * 1e6


def count_pass(peer: str, reader: str, args: argparse.Namespace, work: Path, blob: bytes
               ) -> tuple[dict[str, float], dict[str, float]]:
    """Requests a file by kind, cold and warm, from libfuse's debug log."""
    n = min(args.chunks, 200)
    s = Served(peer, args, work, f"count-{peer}-{reader}", debug=True)
    try:
        if args.list:
            os.listdir(s.mnt / "x")
        time.sleep(0.3)
        a = s.requests()
        read_all(s.mnt, n, reader, blob, args.chunk_bytes)
        time.sleep(0.5)  # RELEASE comes after close returns
        b = s.requests()
        read_all(s.mnt, n, reader, blob, args.chunk_bytes)
        time.sleep(0.5)
        cold, warm = s.counted(a), s.counted(b)
        cold.subtract(warm)  # counted() reads to the end: warm's are in cold's too
    finally:
        s.stop()
    return ({k: v / n for k, v in cold.items() if v}, {k: v / n for k, v in warm.items() if v})


def fmt_counts(c: dict[str, float]) -> str:
    total = sum(c.values())
    kinds = " ".join(f"{k} {v:g}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))
    return f"{total:g} ({kinds})" if kinds else "0"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chunkcost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", default="64k", help="bytes of a chunk file")
    ap.add_argument("--chunks", type=int, default=2000, help="chunk files")
    ap.add_argument("--repeat", type=int, default=3, help="passes per peer and reader (median shown)")
    ap.add_argument("--readers", default="open,osread", help="open, osread or both")
    ap.add_argument("--peers", default="refmount,refmount+no_open,floor,floor-noopen",
                    help="refmount, floor, floor-noopen (base is added by --base); refmount+OPT+OPT: "
                         "refmount with more -o options (base+OPT too)")
    ap.add_argument("--base", default=None, help="another checkout, measured interleaved as the peer base")
    ap.add_argument("--refmount-opts", default="", help="more -o options of refmount's mounts")
    ap.add_argument("--list", action="store_true", help="list x/ before the cold reads (no LOOKUP then)")
    ap.add_argument("--no-count", action="store_true", help="skip the counting passes (libfuse's debug log)")
    ap.add_argument("--work", default=str(h.REPO / "bench-work" / "chunkcost"))
    args = ap.parse_args(argv)
    work = Path(args.work)
    for d in (work / "logs", work / "cache"):
        d.mkdir(parents=True, exist_ok=True)
    args.chunk_bytes = parse_size(args.chunk)
    args.data = work / "data.bin"
    args.refs = work / "refs.json"
    args.base = Path(args.base).resolve() if args.base else None
    h.ensure_data(args.data, args.chunk_bytes * args.chunks, log)
    write_refs(args.refs, args.data, args.chunks, args.chunk_bytes)
    blob = args.data.read_bytes()[: args.chunk_bytes * args.chunks]
    peers = args.peers.split(",") + (["base"] if args.base else [])
    readers = args.readers.split(",")
    cpu: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    counts: dict[tuple[str, str], tuple[dict[str, float], dict[str, float]]] = {}
    try:
        for i in range(args.repeat):
            for reader in readers:
                for peer in peers:
                    r = cpu_pass(peer, reader, args, work, f"{peer}-{reader}-{i}", blob)
                    cpu[(peer, reader)].append(r)
                    log(f"pass {i} {peer} {reader}: cold {r[0]:.0f} µs, warm {r[1]:.0f} µs a file")
        if not args.no_count:
            for reader in readers:
                for peer in peers:
                    counts[(peer, reader)] = count_pass(peer, reader, args, work, blob)
    finally:
        h.CacheDirs(work / "cache").cleanup()
    print(f"\n{args.chunks} files of {args.chunk_bytes} B from one local file; daemon CPU µs a file, "
          f"median of {args.repeat} (each pass); requests a file from libfuse's debug log")
    print("| reader | peer | cold µs | warm µs | cold requests | warm requests |")
    print("|---|---|---|---|---|---|")
    for reader in readers:
        for peer in peers:
            rs = cpu[(peer, reader)]
            cold = statistics.median(r[0] for r in rs)
            warm = statistics.median(r[1] for r in rs)
            c = counts.get((peer, reader))
            print(f"| {reader} | {peer} | {cold:.0f} ({', '.join(f'{r[0]:.0f}' for r in rs)}) "
                  f"| {warm:.0f} ({', '.join(f'{r[1]:.0f}' for r in rs)}) "
                  f"| {fmt_counts(c[0]) if c else '-'} | {fmt_counts(c[1]) if c else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
