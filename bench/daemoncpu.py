"""``python -m bench.daemoncpu``: the CPU seconds refmount's daemon spends per MB it serves.

The ``workers`` workload's dataset (one file of incompressible bytes behind nginx, optionally
answering late; a reference set describing it as one zarr v2 array ``x`` of ``--chunk``-sized
chunks) is read cold by ``--readers`` processes, each its own contiguous slab of chunks, all at
once: through a fresh mount (its own ``cache_dir``; each chunk opened and read whole) or a fresh
``refmount serve`` (one HTTP/1.1 keep-alive connection a reader, one GET a chunk). Every chunk is
checked against the file.

Reported per pass: the daemon's CPU seconds (user + system, from ``/proc/PID/stat``) per MB
served, its child processes' (a mount's cache writer), the readers' CPU seconds per MB, the
wall time and refmount's demand misses. CPU seconds
depend far less on other work on the machine than wall time does, so the numbers of two
checkouts (``--base CHECKOUT``, interleaved pass by pass) compare on a busy machine too.

``--profile DIR``: py-spy (``pip install py-spy``) samples the daemon during each pass and writes
its collapsed stacks (``DIR/TAG.txt``, one ``stack count`` a line) plus a summary of the
functions with the most samples (self and total) to stderr.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.latency import write_refs
from refmount.config import parse_size


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- the readers (forked processes) -----------------------------------------------------------
def _read_mount(where: str, lo: int, hi: int) -> list[bytes]:
    out = []
    for i in range(lo, hi):
        with open(os.path.join(where, "x", str(i)), "rb", buffering=0) as f:  # no isatty: no IOCTL
            out.append(f.read())
    return out


def _read_serve(where: str, lo: int, hi: int) -> list[bytes]:
    u = urllib.parse.urlsplit(where)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    out = []
    for i in range(lo, hi):
        conn.request("GET", f"{u.path}x/{i}")
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"GET x/{i}: {r.status}")
        out.append(body)
    conn.close()
    return out


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` by name (threads of one name summed)."""
    out: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        name = text[text.index("(") + 1: text.rindex(")")]
        rest = text[text.rindex(")") + 2:].split()
        out[name if tid != str(pid) else "main"] += (int(rest[11]) + int(rest[12])) / h.CLK_TCK
    return out


def reader(kind: str, where: str, lo: int, hi: int, chunk: int, data: str, go: Any, q: Any) -> None:
    go.wait()
    c0, t0 = time.process_time(), time.time()
    got = (_read_mount if kind == "mount" else _read_serve)(where, lo, hi)
    cpu, t1 = time.process_time() - c0, time.time()
    with open(data, "rb") as f:
        ok = all(os.pread(f.fileno(), chunk, (lo + j) * chunk) == b for j, b in enumerate(got))
    q.put({"start": t0, "end": t1, "cpu": cpu, "bytes": sum(map(len, got)), "ok": ok})


# ---- py-spy -------------------------------------------------------------------------------------
class Profile:
    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        spy = shutil.which("py-spy") or str(Path(h.PY).parent / "py-spy")
        cmd = [spy, "record", "-p", str(pid), "-r", "1000", "--nonblocking", "-f", "raw", "-o", str(out)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches

    def stop(self, top: int) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.out.exists():
            log(f"  no profile in {self.out}")
            return
        own: collections.Counter[str] = collections.Counter()
        total: collections.Counter[str] = collections.Counter()
        n = 0
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            c = int(count)
            n += c
            own[frames[-1]] += c
            for f in set(frames):
                total[f] += c
        log(f"  profile {self.out}: {n} samples; most own samples:")
        for f, c in own.most_common(top):
            log(f"    {c / n:6.1%}  {f}")
        log("  most total samples:")
        for f, c in total.most_common(top):
            log(f"    {c / n:6.1%}  {f}")


COUNTERS = ("requests", "lookups", "opens", "reads", "pushed", "memory_hits", "disk_hits", "prefetch_hits",
            "readahead_streams", "http_waited_on_loop", "http_planned_in_trio")


# ---- one pass -----------------------------------------------------------------------------------
def one_pass(args: argparse.Namespace, kind: str, repo: Path | None, refs: Path, work: Path, tag: str,
             chunk: int, n: int, data: Path) -> dict[str, Any]:
    from bench.serve import Serve

    caches = h.CacheDirs(work / "cache")
    mount: h.Mount | None = None
    serve: Serve | None = None
    opts = [o for o in args.refmount_opts.split(",") if o]
    if kind == "mount":
        mount = h.mount_refmount(refs, work / "mnt", [f"cache_dir={caches.fresh(tag)}",
                                                      f"log={work / 'logs' / f'{tag}.log'}", *opts],
                                 180, log, probe="x/.zarray", repo=repo)
        pid, where = mount.cpu_pid, str(work / "mnt")
    else:
        serve = Serve(refs, work / "logs", repo or h.REPO, ",".join(opts))
        serve.start()
        pid, where = serve.pid, serve.url
    try:
        profile = Profile(pid, Path(args.profile) / f"{tag}.txt") if args.profile else None
        strace = None
        if args.strace:  # slows the daemon down: this pass's CPU seconds are not comparable
            out = Path(args.strace) / f"{tag}.txt"
            strace = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        ctx = multiprocessing.get_context("fork")
        go, q = ctx.Event(), ctx.Queue()
        per = n // args.readers
        procs = [ctx.Process(target=reader, args=(kind, where, w * per, n if w == args.readers - 1 else
                                                  (w + 1) * per, chunk, str(data), go, q))
                 for w in range(args.readers)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        kids = h.children_of(pid)  # the cache writer process of a mount
        cpu0, threads0, kids0 = h.proc_cpu_split(pid), threads_cpu(pid), sum(h.proc_cpu(k) or 0 for k in kids)
        faults0 = int((h.proc_stat(pid) or ["0"] * 8)[7])
        go.set()
        results = [q.get(timeout=args.timeout) for _ in procs]
        faults1 = int((h.proc_stat(pid) or ["0"] * 8)[7])
        cpu1, threads1, kids1 = h.proc_cpu_split(pid), threads_cpu(pid), sum(h.proc_cpu(k) or 0 for k in kids)
        for p in procs:
            p.join(30)
        if profile is not None:
            profile.stop(args.top)
        if strace is not None:
            strace.send_signal(signal.SIGINT)
            strace.wait(timeout=60)
            log(f"  syscalls of the daemon ({n} chunks):\n" + (Path(args.strace) / f"{tag}.txt").read_text())
        if not all(r["ok"] for r in results):
            raise h.Failed("MISMATCH")
        counters = (mount.stats() if mount else serve.stats() if serve else None) or {}
    finally:
        if mount is not None:
            mount.unmount(log)
        if serve is not None:
            serve.stop()
        caches.cleanup()
    assert cpu0 is not None and cpu1 is not None
    mb = sum(r["bytes"] for r in results) / 1e6
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    return {"mb": mb, "wall": wall, "user": user, "sys": system,
            "daemon_ms_per_mb": (user + system) / mb * 1e3, "children_ms_per_mb": (kids1 - kids0) / mb * 1e3,
            "page_faults_per_chunk": (faults1 - faults0) / n,
            "readers_ms_per_mb": sum(r["cpu"] for r in results) / mb * 1e3, "misses": counters.get("misses"),
            "counters": {k: counters.get(k) for k in COUNTERS if k in counters},
            "threads": {k: round(v - threads0.get(k, 0.0), 2) for k, v in threads1.items()
                        if v - threads0.get(k, 0.0) > 0}}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.daemoncpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="mount,serve", help="mount, serve or both")
    ap.add_argument("--chunk", default="64k", help="bytes of a chunk")
    ap.add_argument("--chunks", type=int, default=2048, help="chunks in the array")
    ap.add_argument("--readers", type=int, default=4, help="reader processes, a slab each")
    ap.add_argument("--latency", type=float, default=20.0, help="ms nginx waits before each response")
    ap.add_argument("--repeat", type=int, default=3, help="passes per checkout and kind (median shown)")
    ap.add_argument("--base", default=None, help="another checkout, measured interleaved with this one")
    ap.add_argument("--refmount-opts", default="", help="more -o options of the mount and serve")
    ap.add_argument("--profile", default=None, help="directory for py-spy's samples of the daemon")
    ap.add_argument("--strace", default=None, help="directory for strace -c's syscall counts of the daemon "
                    "(its CPU seconds are then not comparable)")
    ap.add_argument("--top", type=int, default=25, help="functions shown of each profile")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a pass may take")
    ap.add_argument("--work", default=str(h.REPO / "bench-work" / "daemoncpu"))
    args = ap.parse_args(argv)
    work = Path(args.work)
    chunk = parse_size(args.chunk)
    n = args.chunks
    data = work / "serve" / "data.bin"
    for d in (data.parent, work / "logs", work / "mnt", *[Path(d) for d in (args.profile, args.strace) if d]):
        d.mkdir(parents=True, exist_ok=True)
    h.ensure_data(data, chunk * n, log)
    checkouts: list[tuple[str, Path | None]] = [("this", None)]
    if args.base:
        checkouts.append(("base", Path(args.base).resolve()))
    nginx = h.Nginx(data.parent, work / "nginx", latency_ms=args.latency)
    nginx.start()
    got: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    try:
        h.warm_file(data)
        refs = work / f"refs-{chunk}.json"
        write_refs(refs, nginx.url("data.bin"), n, chunk)
        for i in range(args.repeat):
            for kind in args.kinds.split(","):
                for name, repo in checkouts:
                    tag = f"{kind}-{name}-{i}"
                    r = one_pass(args, kind, repo, refs, work, tag, chunk, n, data)
                    got[(kind, name)].append(r)
                    log(f"{tag}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in r.items()))
    finally:
        nginx.stop()
    print(f"\n{n} chunks of {chunk} B, {args.readers} readers, {args.latency:g} ms; median of {args.repeat}")
    print("| kind | checkout | daemon CPU ms/MB | (user + sys) | its children (cache writer) ms/MB "
          "| readers CPU ms/MB | MB/s | misses |")
    print("|---|---|---|---|---|---|---|---|")
    for (kind, name), rs in got.items():
        med = statistics.median(r["daemon_ms_per_mb"] for r in rs)
        r = min(rs, key=lambda r: abs(r["daemon_ms_per_mb"] - med))
        each = ", ".join(f"{x['daemon_ms_per_mb']:.2f}" for x in rs)
        print(f"| {kind} | {name} | {med:.2f} ({each}) "
              f"| {r['user'] / r['mb'] * 1e3:.2f} + {r['sys'] / r['mb'] * 1e3:.2f} "
              f"| {statistics.median(x['children_ms_per_mb'] for x in rs):.2f} "
              f"| {statistics.median(x['readers_ms_per_mb'] for x in rs):.2f} "
              f"| {statistics.median(x['mb'] / x['wall'] for x in rs):.0f} | {r['misses']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
