#!/usr/bin/env python3
"""How long ``refmount verify`` takes for a set of many distinct targets behind a slow store.

``--targets`` small files (1 KiB, two keys each) are served by nginx on 127.0.0.1 (a free
port, a configuration of its own in a temporary directory), every response held back
``--latency`` ms before its first byte by Debian's echo module (``echo_sleep``: a timer, no
worker busy). A Version 0 set names them all; ``refmount verify SOURCE --pin FILE`` runs as a
user runs it (a fresh process each time), ``--repeat`` times; the median wall time is printed
with the targets per second, and the run is checked (exit status 0, every target pinned).

Usage:
    .venv/bin/python bench/verify.py                         # 10,000 targets, 20 ms, 32 jobs
    .venv/bin/python bench/verify.py --targets 2000 --latency 50 --jobs 64 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import grp
import json
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NGINX = "/usr/sbin/nginx"
CONF = """\
load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;
user {user} {group};
worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    access_log off;
    client_body_temp_path {run}/client_body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    keepalive_timeout 120;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {root};
        location ~ ^/(?<name>[^/].*)$ {{ echo_sleep {latency}; echo_exec /_delayed/$name; }}
        location ^~ /_delayed/ {{ internal; alias {root}/; }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nginx(root: Path, run: Path, latency_ms: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = run / "nginx.conf"
    conf.write_text(CONF.format(user=pwd.getpwuid(os.geteuid()).pw_name,
                                group=grp.getgrgid(os.getegid()).gr_name, run=run, port=port,
                                root=root, latency=f"{latency_ms / 1000:.3f}"))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(run), "-e", str(run / "error.log"),
                             "-g", "daemon off;"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc, port
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"nginx did not start: {(run / 'error.log').read_text(errors='replace')[-500:]}")


async def heads(urls: list[str], jobs: int) -> None:
    import aiohttp

    limit = asyncio.Semaphore(jobs)
    async with aiohttp.ClientSession() as session:
        async def one(url: str) -> None:
            async with limit, session.head(url) as r:
                r.raise_for_status()

        await asyncio.gather(*(one(u) for u in urls))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", type=int, default=10_000, help="distinct targets (default 10000)")
    p.add_argument("--latency", type=float, default=20.0, help="ms before each response (default 20)")
    p.add_argument("--jobs", type=int, default=32, help="refmount verify --jobs (default 32)")
    p.add_argument("--max-connections", type=int, default=32,
                   help="-o max_connections, per host (default 32)")
    p.add_argument("--repeat", type=int, default=1, help="runs; the median is shown (default 1)")
    p.add_argument("--baseline", action="store_true",
                   help="also time plain aiohttp HEADs of every target, --jobs at a time, in "
                   "this process: the client's own cost on this machine, for comparison")
    args = p.parse_args()

    base = Path(tempfile.mkdtemp(prefix="refmount-bench-verify-"))
    proc = None
    try:
        root, run = base / "served", base / "run"
        root.mkdir()
        run.mkdir()
        payload = os.urandom(1024)
        refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
        proc, port = start_nginx(root, run, args.latency)
        for i in range(args.targets):
            (root / f"t{i}.bin").write_bytes(payload)
            url = f"http://127.0.0.1:{port}/t{i}.bin"
            refs[f"k/{i}.0"] = [url, 0, 512]
            refs[f"k/{i}.1"] = [url, 512, 512]
        source = base / "refs.json"
        source.write_text(json.dumps(refs))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        times = []
        for _ in range(args.repeat):
            pins = base / "pins.json"
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "refmount", "verify", str(source), "--pin",
                                str(pins), "--jobs", str(args.jobs), "-o",
                                f"max_connections={args.max_connections},no_disk_cache"],
                               capture_output=True, text=True, env=env)
            times.append(time.monotonic() - t0)
            if r.returncode != 0:
                print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
                return 1
            pinned = json.loads(pins.read_text())["targets"]
            assert len(pinned) == args.targets, len(pinned)
        if args.baseline:
            t0 = time.monotonic()
            asyncio.run(heads([f"http://127.0.0.1:{port}/t{i}.bin" for i in range(args.targets)],
                              args.jobs))
            print(f"plain aiohttp HEADs: {args.targets:,} targets, {args.jobs} at a time: "
                  f"{time.monotonic() - t0:.2f} s")
        median = statistics.median(times)
        print(f"refmount verify: {args.targets:,} targets, {args.latency:g} ms latency, "
              f"--jobs {args.jobs}, max_connections={args.max_connections}: "
              f"{median:.2f} s (median of {len(times)}; {args.targets / median:,.0f} targets/s; "
              f"runs {', '.join(f'{t:.2f}' for t in times)} s)")
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
