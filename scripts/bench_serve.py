#!/usr/bin/env python3
"""Benchmark ``refmount serve`` against nginx: zarr reading a whole array over HTTP.

    .venv/bin/python scripts/bench_serve.py [--dir DIR] [--mib-64k 64] [--mib-1m 256] [--clients 1,16]

One data file (random bytes) is the origin, served by nginx on loopback. Three servers give the
same zarr arrays (``a``: 64 KiB chunks, ``b``: 1 MiB chunks, no compression) over HTTP:

* ``refmount serve`` over a reference set whose targets are ranges of the origin file on nginx;
* nginx serving a refmount FUSE mount of the same reference set (``nginx/mount``);
* nginx serving the original chunk files on local disk, in the page cache (``nginx/files``:
  the bound; it has no cache of its own, so cold and warm are the same for it).

A client is a process reading its share of the array with zarr (FsspecStore over fsspec's
HTTP file system); N clients read disjoint slices at once, started together. ``cold``: a fresh
server or mount with empty caches (the origin file stays in the page cache: it stands for a
fast store); ``warm``: the same read again. Every read is compared with the file.

Also measured: HEAD requests per second (4 keep-alive connections) and the fetch counter
after them; the server's RSS before and with 64 clients that request a large file and never
read. Results are printed as a table and written as JSON next to the data.

Nothing here is imported by refmount or its tests.
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
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_lib import MiB, Nginx, ensure_data, fuse_unmount, refmount_daemon_pid, wait_gone

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

CLIENT = r"""
import json, sys, time
import numpy as np, zarr
url, local = sys.argv[1], sys.argv[5]
lo, hi, start_at = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store = zarr.storage.FsspecStore.from_url(url, read_only=True)
arr = zarr.open_array(store=store, mode="r", zarr_format=2)
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


def zarray(n_chunks: int, chunk_bytes: int) -> dict[str, Any]:
    elems = chunk_bytes // 8
    return {"zarr_format": 2, "shape": [n_chunks * elems], "chunks": [elems], "dtype": "<f8",
            "compressor": None, "filters": None, "fill_value": None, "order": "C",
            "dimension_separator": "."}


def build(work: Path, origin_url: str, data: Path, n64: int, n1m: int) -> Path:
    """The reference set (targets on the origin) and the original chunk files."""
    refs: dict[str, Any] = {".zgroup": json.dumps({"zarr_format": 2})}
    files = work / "files"
    for name, n, size in (("a", n64, 64 * 1024), ("b", n1m, MiB)):
        meta = json.dumps(zarray(n, size))
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


def read_array(base: str, arr: str, n_chunks: int, chunk: int, clients: int, local: Path) -> dict[str, Any]:
    """``clients`` processes read disjoint slices of ``arr`` at once; MB/s and chunks/s."""
    elems = chunk // 8
    per = n_chunks // clients
    start_at = time.time() + 6.0  # after every child's imports
    procs = []
    for c in range(clients):
        lo, hi = c * per * elems, (c + 1) * per * elems
        procs.append(subprocess.Popen([PY, "-c", CLIENT, base + arr, str(lo), str(hi), str(start_at),
                                       str(local)], stdout=subprocess.PIPE,
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
            "verified": all(r["ok"] for r in results), "seconds": elapsed}


def head_rate(host: str, port: int, path: str, seconds: float = 4.0, conns: int = 4) -> float:
    """HEAD requests per second over ``conns`` keep-alive connections (one thread each)."""
    counts = [0] * conns
    stop = time.monotonic() + seconds
    request = f"HEAD {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()

    def worker(i: int) -> None:
        with socket.create_connection((host, port)) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            while time.monotonic() < stop:
                s.sendall(request)
                while b"\r\n\r\n" not in buf:
                    buf += s.recv(65536)
                buf = buf.split(b"\r\n\r\n", 1)[1]
                counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(conns)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


class Serve:
    """``refmount serve`` of the reference set, detached, stopped by its PID."""

    def __init__(self, refs: Path, work: Path) -> None:
        self.refs, self.work = refs, work
        self.url, self.pid = "", 0

    def start(self) -> None:
        r = subprocess.run([PY, "-m", "refmount", "serve", str(self.refs), "--listen", "127.0.0.1:0",
                            "-o", f"no_disk_cache,log={self.work / 'serve.log'}"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        url, pid = r.stdout.split()
        self.url, self.pid = url, int(pid)

    def stats(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(self.url + ".refmount/stats") as f:
            return json.loads(f.read())

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            wait_gone(self.pid, 20)
            self.pid = 0


class FuseMount:
    def __init__(self, refs: Path, work: Path) -> None:
        self.refs, self.mnt = refs, work / "mnt"

    def start(self) -> None:
        self.mnt.mkdir(exist_ok=True)
        r = subprocess.run([PY, "-m", "refmount", str(self.refs), str(self.mnt), "-o", "no_disk_cache"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)

    def stop(self) -> None:
        pid = refmount_daemon_pid(self.mnt)
        fuse_unmount(self.mnt, [pid] if pid else [], log)


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "refmount-bench-serve"))
    ap.add_argument("--mib-64k", type=int, default=64, help="MiB of the 64 KiB-chunk array")
    ap.add_argument("--mib-1m", type=int, default=256, help="MiB of the 1 MiB-chunk array")
    ap.add_argument("--clients", default="1,16")
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    n64, n1m = args.mib_64k * 16, args.mib_1m
    size = max(n64 * 64 * 1024, n1m * MiB)
    origin_dir = work / "origin"
    origin_dir.mkdir(exist_ok=True)
    data = origin_dir / "data.bin"
    ensure_data(data, size, log)
    origin = Nginx(origin_dir, work / "nginx-origin")
    origin.start()
    results: dict[str, Any] = {"rows": []}

    def record(server: str, arr: str, c: int, p: str, r: dict[str, Any]) -> None:
        results["rows"].append({"server": server, "array": arr, "clients": c, "pass": p, **r})
        log(f"{server} {arr} x{c} {p}: {r['MB/s']:.0f} MB/s {r['chunks/s']:.0f} chunks/s")
    serve = mount = files_nginx = mount_nginx = None
    try:
        refs = build(work, origin.url("data.bin"), data, n64, n1m)
        refs_obj = json.loads(refs.read_text())
        refs_obj["whole"] = [origin.url("data.bin")]
        refs.write_text(json.dumps(refs_obj))
        clients = [int(c) for c in args.clients.split(",")]
        arrays = (("a", n64, 64 * 1024), ("b", n1m, MiB))

        files_nginx = Nginx(work / "files", work / "nginx-files")
        files_nginx.start()
        base_files = f"http://127.0.0.1:{files_nginx.port}/"
        for arr, n, chunk in arrays:
            for c in clients:
                record("nginx/files", arr, c, "cold", read_array(base_files, arr, n, chunk, c, data))
        results["head_nginx_files"] = head_rate("127.0.0.1", files_nginx.port, "/b/0")

        for arr, n, chunk in arrays:
            for c in clients:
                mount = FuseMount(refs, work)
                mount.start()
                mount_nginx = Nginx(mount.mnt, work / "nginx-mount")
                mount_nginx.start()
                base = f"http://127.0.0.1:{mount_nginx.port}/"
                for p in ("cold", "warm"):
                    record("nginx/mount", arr, c, p, read_array(base, arr, n, chunk, c, data))
                mount_nginx.stop()
                mount.stop()
                mount = mount_nginx = None

        for arr, n, chunk in arrays:
            for c in clients:
                serve = Serve(refs, work)
                serve.start()
                for p in ("cold", "warm"):
                    record("refmount serve", arr, c, p, read_array(serve.url, arr, n, chunk, c, data))
                serve.stop()
                serve = None

        serve = Serve(refs, work)
        serve.start()
        port = int(serve.url.rsplit(":", 1)[1].strip("/"))
        results["head_serve"] = head_rate("127.0.0.1", port, "/b/0")
        results["head_serve_fetches"] = serve.stats()["requests"]
        results["slow_clients_rss"] = slow_clients_rss(serve)
        serve.stop()
        serve = None
    finally:
        for s in (serve, mount_nginx, mount, files_nginx, origin):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.stop()
    out = work / "results.json"
    out.write_text(json.dumps(results, indent=2))
    print("| array | clients | pass | refmount serve MB/s (chunks/s) | nginx/mount | nginx/files |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    rows = results["rows"]

    def cell(server: str, arr: str, c: int, p: str) -> str:
        for r in rows:
            if (r["server"], r["array"], r["clients"]) == (server, arr, c) and r["pass"] in (p, "cold"):
                if server != "nginx/files" and r["pass"] != p:
                    continue
                mark = "" if r["verified"] else " MISMATCH"
                return f"{r['MB/s']:.0f} ({r['chunks/s']:.0f}){mark}"
        return "—"

    for arr, _, chunk in (("a", 0, 64), ("b", 0, 1024)):
        for c in [int(x) for x in args.clients.split(",")]:
            for p in ("cold", "warm"):
                print(f"| {chunk} KiB | {c} | {p} | {cell('refmount serve', arr, c, p)} | "
                      f"{cell('nginx/mount', arr, c, p)} | {cell('nginx/files', arr, c, p)} |")
    print(f"\nHEAD/s: refmount serve {results['head_serve']:.0f} "
          f"(fetches after: {results['head_serve_fetches']}), nginx/files {results['head_nginx_files']:.0f}")
    b, a = results["slow_clients_rss"]
    print(f"refmount serve RSS: {b / MiB:.0f} MiB before, {a / MiB:.0f} MiB with 64 clients not reading")
    print(f"(results: {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
