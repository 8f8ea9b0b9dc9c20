"""The ``serve`` workload: ``refmount serve`` next to nginx and the Python peers, zarr reading
a whole array over HTTP, and requests per second.

One data file (random bytes) is the origin, served by nginx on loopback. These servers (peers)
give the same zarr arrays (``a``: 64 KiB chunks, ``b``: 1 MiB chunks, no compression) over HTTP:

* ``refmount``: ``refmount serve`` over a reference set whose targets are ranges of the origin;
  with ``--base CHECKOUT`` also ``refmount serve`` of another checkout (``serve/base``: the
  version to compare with), run alternately with this one, since the machine's load changes;
* ``nginx-mount``: nginx serving a refmount FUSE mount of the same reference set;
* ``nginx-files``: nginx serving the original chunk files from the page cache (the bound; it
  has no cache of its own, so cold and warm are the same for it);
* the Python peers (``serve_peers.py``; skipped when not installed: ``pip install '.[bench]'``):
  ``xpublish`` with its zarr plugin over the set opened with fsspec (zarr v3 keys, chunks
  encoded per request) and, for requests per second only, ``hypercorn-trio``, a prototype of
  the other design considered for ``refmount serve`` (hypercorn's trio worker in the core's
  nursery). zarr-python's own HTTP server needs Python 3.12 and is not run on older ones;
* ``aiohttp-constant`` (requests per second only): aiohttp's low-level server as ``refmount
  serve`` configures it, answering every key with constant bytes of its size: the ceiling of
  the HTTP server refmount is built on, on this machine.

A client is a process reading its share of the array with zarr (FsspecStore over fsspec's
HTTP file system); N clients (``--clients``) read disjoint slices at once, started together.
``cold``: a fresh server or mount with empty caches (the origin stays in the page cache: it
stands for a fast store); ``warm``: the same read again. Every read is compared with the file.

Requests per second (``wrk`` for GET, ``ab`` for HEAD, 16 keep-alive connections, a few seconds
each, the servers measured in turn for ``--rounds`` rounds, the median kept, the load average
and the server process's CPU time per request noted): ``HEAD`` of a 1 MiB chunk (and the fetch
counter after it), ``GET`` of a missing key, ``GET`` of a 64 KiB and of a 1 MiB chunk already
read (warm). Also: the server's RSS before and with 64 clients that request a large file and
never read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table

MiB = h.MiB
PY = h.PY
WORKLOADS = {"serve": "refmount serve, nginx over a mount, nginx on the files, xpublish: zarr over HTTP, "
             "requests/s, RSS"}
PEERS = ("refmount", "nginx-mount", "nginx-files", "xpublish", "hypercorn-trio", "aiohttp-constant")
TITLES = {"refmount": "refmount serve", "nginx-mount": "nginx/mount", "nginx-files": "nginx/files"}

CLIENT = r"""
import json, sys, time
import numpy as np, zarr
url, local, fmt = sys.argv[1], sys.argv[5], int(sys.argv[6])
lo, hi, start_at = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store = zarr.storage.FsspecStore.from_url(url, read_only=True)
arr = zarr.open_array(store=store, mode="r", zarr_format=fmt)
time.sleep(max(0.0, start_at - time.time()))
t0 = time.time()
data = arr[lo:hi]
t1 = time.time()
raw = data.view(np.uint8)
with open(local, "rb") as f:
    f.seek(lo * 8)
    expect = np.frombuffer(f.read(raw.size), np.uint8)
print(json.dumps({"start": t0, "end": t1, "bytes": int(raw.size), "ok": bool(np.array_equal(raw, expect))}))
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(work: Path, origin_url: str, data: Path, n64: int, n1m: int) -> Path:
    """The reference set (targets on the origin; ``whole`` = the origin file) and the original
    chunk files."""
    refs: dict[str, Any] = {".zgroup": json.dumps({"zarr_format": 2}), "whole": [origin_url]}
    files = work / "files"
    for name, n, size in (("a", n64, 64 * 1024), ("b", n1m, MiB)):
        meta = h.zarray(n, size)
        refs[f"{name}/.zarray"] = meta
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": [name]})
        for i in range(n):
            refs[f"{name}/{i}"] = [origin_url, i * size, size]
        d = files / name
        if not (d / str(n - 1)).exists():
            d.mkdir(parents=True, exist_ok=True)
            (d / ".zarray").write_text(meta)
            (d / ".zattrs").write_text(refs[f"{name}/.zattrs"])
            with open(data, "rb") as f:
                for i in range(n):
                    (d / str(i)).write_bytes(f.read(size))
    (files / ".zgroup").write_text(refs[".zgroup"])
    path = work / "refs.json"
    path.write_text(json.dumps(refs))
    return path


def read_array(base: str, arr: str, n_chunks: int, chunk: int, clients: int, local: Path,
               zarr_format: int = 2) -> dict[str, Any]:
    """``clients`` processes read disjoint slices of ``arr`` at once; MB/s and chunks/s."""
    elems = chunk // 8
    per = n_chunks // clients
    start_at = time.time() + 6.0  # after every child's imports
    procs = []
    for c in range(clients):
        lo, hi = c * per * elems, (c + 1) * per * elems
        procs.append(subprocess.Popen([PY, "-c", CLIENT, base + arr, str(lo), str(hi), str(start_at),
                                       str(local), str(zarr_format)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"client failed: {err[-1500:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    if min(r["start"] for r in results) < start_at - 0.5:
        log("  warning: a client started late")
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    total = sum(r["bytes"] for r in results)
    return {"MB/s": total / elapsed / 1e6, "chunks/s": per * clients / elapsed,
            "verified": all(r["ok"] for r in results), "seconds": elapsed, "load": os.getloadavg()[0]}


def request_rate(url: str, method: str, seconds: float = 3.0, conns: int = 16,
                 pid: int | None = None) -> dict[str, Any]:
    """Requests per second of ``method url`` over ``conns`` keep-alive connections, by ``wrk``
    (one thread) for a GET and ``ab -i`` for a HEAD (wrk waits for a HEAD answer's body), with
    the count of answers other than 2xx/3xx and the load average; with the server's ``pid``,
    its CPU time per request (what the rate would be on a core of its own: 1/that), which
    the other jobs on a shared machine change far less than the rate."""
    if method == "HEAD":
        cmd = ["ab", "-q", "-k", "-i", f"-c{conns}", f"-t{seconds:g}", "-n100000000", url]
        rate_line, other_line = "Requests per second:", "Non-2xx responses:"
    else:
        cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", url]
        rate_line, other_line = "Requests/sec:", "Non-2xx or 3xx responses:"
    cpu0 = h.proc_cpu(pid) if pid else None
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    cpu1 = h.proc_cpu(pid) if pid else None
    rate = other = 0.0
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith(rate_line):
            rate = float(line[len(rate_line):].split()[0])
        if line.startswith(other_line):
            other = float(line[len(other_line):].split()[0])
    done = rate * seconds
    cpu_us = (cpu1 - cpu0) / done * 1e6 if cpu0 is not None and cpu1 is not None and done else None
    return {"rate": rate, "non_2xx_3xx": other, "load": os.getloadavg()[0], "cpu_us": cpu_us}


class Serve:
    """``refmount serve`` of the reference set, detached, stopped by its PID."""

    def __init__(self, refs: Path, work: Path, repo: Path = h.REPO, opts: str = "") -> None:
        self.refs, self.work, self.repo, self.opts = refs, work, repo, opts
        self.url, self.pid = "", 0

    def start(self) -> None:
        opts = ",".join(filter(None, ["no_disk_cache", f"log={self.work / 'serve.log'}", self.opts]))
        r = subprocess.run([PY, "-m", "refmount", "serve", str(self.refs), "--listen", "127.0.0.1:0",
                            "-o", opts],
                           capture_output=True, text=True, cwd=self.repo, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(self.repo)))
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        url, pid = r.stdout.split()
        self.url, self.pid = url, int(pid)

    def stats(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(self.url + ".refmount/stats") as f:
            return json.loads(f.read())

    def rss(self) -> int:
        return h.proc_status(self.pid).get("VmRSS", 0)

    def stop(self) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            h.wait_gone(self.pid, 20)
            self.pid = 0


class Peer:
    """A server of ``serve_peers.py`` (a child process, stopped by its PID)."""

    def __init__(self, kind: str, refs: Path, work: Path, prefix: str = "") -> None:
        self.kind, self.refs, self.work, self.prefix = kind, refs, work, prefix
        self.url, self.proc = "", None

    def start(self) -> None:
        err = open(self.work / f"{self.kind}.stderr", "wb")  # noqa: SIM115 (the child's)
        self.proc = subprocess.Popen([PY, "-m", "bench.serve_peers", self.kind, str(self.refs)],
                                     stdout=subprocess.PIPE, stderr=err, text=True, env=h.checkout_env())
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().strip()
        if not port:
            raise RuntimeError(f"{self.kind} did not start: see {err.name}")
        self.url = f"http://127.0.0.1:{port}/{self.prefix}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", int(port)), 0.2):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.kind} does not answer")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


class FuseMount:
    def __init__(self, refs: Path, work: Path) -> None:
        self.refs, self.mnt = refs, work / "mnt"
        self.mount: h.Mount | None = None

    def start(self) -> None:
        self.mount = h.mount_refmount(self.refs, self.mnt, ["no_disk_cache"], 300, log)

    def stop(self) -> None:
        if self.mount is not None:
            self.mount.unmount(log)
            self.mount = None


def slow_clients_rss(serve: Serve, n: int = 64) -> tuple[int, int]:
    """The server's RSS before and with ``n`` clients that each request the whole origin file
    (key ``whole``) and never read."""
    before = serve.rss()
    socks = []
    try:
        for _ in range(n):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", int(serve.url.rsplit(":", 1)[1].strip("/"))))
            c.sendall(b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(c)
        time.sleep(5)
        return before, serve.rss()
    finally:
        for c in socks:
            c.close()


RATE_TESTS = (  # (name, method, path under a server's base URL)
    ("HEAD 1 MiB chunk", "HEAD", "{b}/0"),
    ("GET missing key (404)", "GET", "nope/0"),
    ("GET 64 KiB chunk, warm", "GET", "{a}/0"),
    ("GET 1 MiB chunk, warm", "GET", "{b}/0"),
)


def have(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def add_arguments(p: Any) -> None:
    p.add_argument("--mib-64k", type=int, default=None, help="MiB of the 64 KiB-chunk array (64; --quick 4)")
    p.add_argument("--mib-1m", type=int, default=None, help="MiB of the 1 MiB-chunk array (256; --quick 16)")
    p.add_argument("--clients", default=None, help="concurrent zarr clients (1,16; --quick 1,4)")
    p.add_argument("--base", type=Path, help="another refmount checkout to compare with (serve/base)")
    p.add_argument("--array-rounds", type=int, default=1,
                   help="rounds of the zarr array reads (each cell: the median, [min, max])")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the requests-per-second tests (3; --quick 1)")
    p.add_argument("--rate-seconds", type=float, default=3.0)
    p.add_argument("--no-arrays", action="store_true", help="requests per second and RSS only")
    p.add_argument("--no-rates", action="store_true", help="zarr reading arrays and RSS only")


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    work.mkdir(parents=True, exist_ok=True)
    n64 = (args.mib_64k or (4 if args.quick else 64)) * 16
    n1m = args.mib_1m or (16 if args.quick else 256)
    clients = [int(c) for c in (args.clients or ("1,4" if args.quick else "1,16")).split(",")]
    rounds = args.rounds or (1 if args.quick else 3)
    size = max(n64 * 64 * 1024, n1m * MiB)
    origin_dir = work / "origin"
    origin_dir.mkdir(exist_ok=True)
    data = origin_dir / "data.bin"
    h.ensure_data(data, size, log)
    origin = h.Nginx(origin_dir, work / "nginx-origin")
    origin.start()
    results: dict[str, Any] = {"rows": [], "rates": {}, "load_start": os.getloadavg()}
    xpublish_ok = "xpublish" in peers and have("xpublish", "xpublish_zarr", "uvicorn")
    hypercorn_ok = "hypercorn-trio" in peers and have("hypercorn")
    if ("xpublish" in peers and not xpublish_ok) or ("hypercorn-trio" in peers and not hypercorn_ok):
        log("some Python peers are not installed (pip install '.[bench]'): skipped")

    def record(server: str, arr: str, c: int, p: str, r: dict[str, Any]) -> None:
        results["rows"].append({"server": server, "array": arr, "clients": c, "pass": p, **r})
        log(f"{server} {arr} x{c} {p}: {r['MB/s']:.0f} MB/s {r['chunks/s']:.0f} chunks/s "
            f"(load {r['load']:.1f}){'' if r['verified'] else ' MISMATCH'}")

    running: list[Any] = []

    def started(server: Any) -> Any:
        server.start()
        running.append(server)
        return server

    def stop(server: Any) -> None:
        server.stop()
        running.remove(server)

    def serves() -> list[tuple[str, Any]]:
        """Fresh servers of the set with empty caches, this checkout's and the base's."""
        if "refmount" not in peers:
            return []
        out = [("refmount serve", started(Serve(refs, work)))]
        if args.base is not None:
            out.append(("serve/base", started(Serve(refs, work / "base", args.base))))
        return out

    (work / "base").mkdir(exist_ok=True)
    try:
        refs = build(work, origin.url("data.bin"), data, n64, n1m)
        arrays = (("a", n64, 64 * 1024), ("b", n1m, MiB))
        files_nginx = started(h.Nginx(work / "files", work / "nginx-files"))
        base_files = f"http://127.0.0.1:{files_nginx.port}/"

        # ---- requests per second: every server up at once, measured in turn, round by round
        rate_servers: list[tuple[str, str, dict[str, str], Any]] = []  # label, base URL, names, server
        plain = {"a": "a", "b": "b"}
        for label, s in serves():
            rate_servers.append((label, s.url, plain, s))
        if hypercorn_ok:
            hc = started(Peer("hypercorn-trio", refs, work))
            rate_servers.append(("hypercorn-trio", hc.url, plain, hc))
        if "aiohttp-constant" in peers:
            ac = started(Peer("aiohttp-constant", refs, work))
            rate_servers.append(("aiohttp-constant", ac.url, plain, ac))
        if xpublish_ok:
            x = started(Peer("xpublish", refs, work, "zarr/"))
            rate_servers.append(("xpublish", x.url, {"a": "a/c", "b": "b/c"}, x))
        mount = None
        if "nginx-mount" in peers:
            mount = started(FuseMount(refs, work))
            mount_nginx = started(h.Nginx(mount.mnt, work / "nginx-mount"))
            rate_servers.append(("nginx/mount", f"http://127.0.0.1:{mount_nginx.port}/", plain, mount_nginx))
        if "nginx-files" in peers:
            rate_servers.append(("nginx/files", base_files, plain, files_nginx))
        rates: dict[str, dict[str, list[dict[str, Any]]]] = results["rates"]
        for rnd in range(0 if args.no_rates else rounds):
            for name, method, path in RATE_TESTS:
                for label, url, names, server in rate_servers:
                    pid = server.pid if isinstance(server, Serve) else (
                        server.proc.pid if isinstance(server, Peer) and server.proc else None)
                    r = request_rate(url + path.format(**names), method, args.rate_seconds, pid=pid)
                    rates.setdefault(name, {}).setdefault(label, []).append(r)
                    other = f" non-2xx/3xx: {r['non_2xx_3xx']:.0f}" if r["non_2xx_3xx"] else ""
                    cpu = f", {r['cpu_us']:.0f} µs CPU each" if r["cpu_us"] else ""
                    log(f"round {rnd} {name} {label}: {r['rate']:.0f}/s{cpu} (load {r['load']:.1f}){other}")
                if rnd == 0 and method == "HEAD":
                    for label, _, _, server in rate_servers:
                        if isinstance(server, Serve):
                            results[f"head_fetches {label}"] = server.stats()["requests"]
        for _, _, _, server in rate_servers:
            if server is not files_nginx:
                stop(server)
        if mount is not None:
            stop(mount)

        # ---- zarr reading whole arrays (--array-rounds times; the tables keep each cell's median)
        for arr, n, chunk, c in [(arr, n, chunk, c) for _ in range(args.array_rounds)
                                 for arr, n, chunk in ([] if args.no_arrays else arrays)
                                 for c in clients]:
            h.wait_idle(args.quiet_wait, args.quiet_load)
            if "nginx-files" in peers:
                record("nginx/files", arr, c, "cold", read_array(base_files, arr, n, chunk, c, data))
            if "nginx-mount" in peers:
                mount = started(FuseMount(refs, work))
                mount_nginx = started(h.Nginx(mount.mnt, work / "nginx-mount"))
                base = f"http://127.0.0.1:{mount_nginx.port}/"
                for p in ("cold", "warm"):
                    record("nginx/mount", arr, c, p, read_array(base, arr, n, chunk, c, data))
                stop(mount_nginx)
                stop(mount)
            fresh = serves()
            if xpublish_ok:
                fresh.append(("xpublish", started(Peer("xpublish", refs, work, "zarr/"))))
            for p in ("cold", "warm"):  # the servers alternate within each pass
                for label, s in fresh:
                    fmt = 3 if label == "xpublish" else 2
                    record(label, arr, c, p, read_array(s.url, arr, n, chunk, c, data, fmt))
            for _, s in fresh:
                stop(s)

        # ---- memory with slow clients
        for label, s in serves():
            results[f"slow_clients_rss {label}"] = slow_clients_rss(s)
            stop(s)
    finally:
        for s in [*reversed(running), origin]:
            with contextlib.suppress(Exception):
                s.stop()
    servers = [*(["refmount serve"] if "refmount" in peers else []), *(["serve/base"] if args.base else []),
               *(["nginx/mount"] if "nginx-mount" in peers else []),
               *(["nginx/files"] if "nginx-files" in peers else []), *(["xpublish"] if xpublish_ok else [])]
    return tables(results, clients, servers)


def tables(results: dict[str, Any], clients: list[int], servers: list[str]) -> list[Table]:
    rows = results["rows"]
    out = []

    def cell(server: str, arr: str, c: int, p: str) -> str:
        runs = [r for r in rows if (r["server"], r["array"], r["clients"]) == (server, arr, c) and (
                r["pass"] == p or server == "nginx/files")]
        if not runs:
            return "—"
        r = sorted(runs, key=lambda r: r["MB/s"])[len(runs) // 2]
        mark = "" if all(r["verified"] for r in runs) else " MISMATCH"
        speeds = [x["MB/s"] for x in runs]
        spread = f" [{min(speeds):.0f}, {max(speeds):.0f}]" if len(runs) > 1 else ""
        return f"{r['MB/s']:.0f} ({r['chunks/s']:.0f}, L{r['load']:.0f}){spread}{mark}"

    if rows:
        t = Table("serve", "MB/s (chunks/s, load average) of zarr reading a whole array over HTTP "
                  "(the median of the rounds, [min, max])",
                  ["chunks", "clients", "pass", *servers], align="lrl" + "r" * len(servers),
                  data={"rows": rows})
        for arr, chunk in (("a", "64 KiB"), ("b", "1 MiB")):
            for c in clients:
                for p in ("cold", "warm"):
                    t.rows.append([chunk, str(c), p, *(cell(s, arr, c, p) for s in servers)])
        out.append(t)
    rates = results["rates"]
    notes = []
    for key, value in results.items():
        if key.startswith("head_fetches"):
            notes.append(f"{key.split(' ', 1)[1]}: fetches after the HEAD round: {value}")
        if key.startswith("slow_clients_rss"):
            b, a = value
            notes.append(f"{key.split(' ', 1)[1]} RSS: {b / MiB:.0f} MiB before, {a / MiB:.0f} MiB with 64 "
                         "clients not reading")
    if rates:
        labels = list(next(iter(rates.values())))
        t = Table("serve", "requests/s (median of the rounds; load average at that round, the server's CPU "
                  "time per request)", ["request", *labels], notes=notes, data={"rates": rates})
        for name, by in rates.items():
            cells = []
            for label in labels:
                runs = by.get(label, [])
                if not runs:
                    cells.append("—")
                    continue
                mid = sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]
                bad = " (not 2xx/3xx)" if mid["non_2xx_3xx"] and not name.startswith("GET missing") else ""
                cpu = f", {mid['cpu_us']:.0f} µs" if mid.get("cpu_us") else ""
                cells.append(f"{mid['rate']:,.0f} (L{mid['load']:.1f}{cpu}){bad}")
            t.rows.append([name, *cells])
        out.append(t)
    elif out:
        out[-1].notes = notes
    return out
