"""The ``s3`` workload: ``refmount serve``'s S3 dialect against its HTTP view and a real
S3-compatible server (moto's, holding the same objects).

* Listing: ``ListObjectsV2`` pages of 1,000 keys per second, walking the whole bucket by
  continuation tokens over one keep-alive connection (the XML parsed by a regular expression
  only: the client's cost kept small), for a set of ``--s3-keys`` keys (1,000,000; ``--quick``
  50,000) in directories of 1,000; moto holds ``--s3-moto-keys`` of them (its puts are slow).
* GET: requests per second of one 1 KiB object by ``wrk`` (16 connections, one thread) through
  the S3 dialect (``/bucket/key``), the HTTP view (``/key``) and moto, passes interleaved,
  the median of ``--repeat`` shown, with the server's CPU time per request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import socket
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import harness as h
from bench.report import Table
from bench.serve import request_rate

WORKLOADS = {
    "s3": "serve's S3 dialect: ListObjectsV2 pages/s on a large set; GET req/s vs the HTTP view and moto"
}
PEERS = ("refmount-s3", "refmount-http", "moto")
_TOKEN = re.compile(rb"<NextContinuationToken>([^<]*)</NextContinuationToken>")
_KEYS = re.compile(rb"<Key>")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def list_pages(port: int, path: str, seconds: float) -> tuple[float, int]:
    """(pages per second, keys seen) listing ``path`` by continuation tokens for at most ``seconds``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    token, pages, keys = None, 0, 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        query = "list-type=2&max-keys=1000" + (f"&continuation-token={token}" if token else "")
        conn.request("GET", f"{path}?{query}")
        body = conn.getresponse().read()
        pages += 1
        keys += len(_KEYS.findall(body))
        m = _TOKEN.search(body)
        if m is None:
            break
        token = m.group(1).decode()
    elapsed = time.monotonic() - t0
    conn.close()
    return pages / elapsed, keys


def add_arguments(p: Any) -> None:
    p.add_argument(
        "--s3-keys", type=int, default=None, help="keys of the listed set (1000000; --quick 50000)"
    )
    p.add_argument(
        "--s3-moto-keys", type=int, default=None, help="of them, put into moto (5000; --quick 2000)"
    )


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    n = args.s3_keys or (50_000 if args.quick else 1_000_000)
    n_moto = min(n, args.s3_moto_keys or (2_000 if args.quick else 5_000))
    seconds = 3.0 if args.quick else 10.0
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    blob = work / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 4)
    refs = {".zgroup": '{"zarr_format": 2}'}
    refs.update({f"d{i // 1000:04d}/k{i % 1000:03d}": [str(blob), 0, 1024] for i in range(n)})
    source = work / "refs.json"
    source.write_text(json.dumps(refs))
    del refs
    port = free_port()
    r = subprocess.run(
        [
            h.PY,
            "-m",
            "refmount",
            "serve",
            str(source),
            "--listen",
            "127.0.0.1:0",
            "-o",
            f"no_disk_cache,s3_listen=127.0.0.1:{port},s3_bucket=bkt,log={work / 'serve.log'}",
        ],
        capture_output=True,
        text=True,
        env=h.checkout_env(),
        timeout=900,
    )
    if r.returncode != 0:
        raise h.Failed(r.stderr)
    url, pid = r.stdout.split()
    moto = moto_port = None
    listing = Table(
        "s3",
        f"ListObjectsV2, pages of 1,000 keys per second (median of {args.repeat})",
        ["peer", "keys in the bucket", "pages/s", "keys listed", "runs"],
    )
    gets = Table(
        "s3",
        f"GET of a 1 KiB object, requests/s (wrk -c16, {seconds:g} s, median of {args.repeat})",
        ["peer", "req/s", "server CPU µs/req", "runs"],
    )
    try:
        if "moto" in peers:
            moto_port = free_port()
            moto = subprocess.Popen(
                [str(Path(h.PY).parent / "moto_server"), "-p", str(moto_port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _fill_moto(moto_port, n_moto)
        targets = {
            "refmount-s3": (port, "/bkt", f"http://127.0.0.1:{port}/bkt/d0000/k000", int(pid), n),
            "refmount-http": (None, None, url + "d0000/k000", int(pid), n),
            "moto": (
                moto_port,
                "/bkt",
                f"http://127.0.0.1:{moto_port}/bkt/d0000/k000",
                moto.pid if moto else None,
                n_moto,
            ),
        }
        rates: dict[str, list[dict[str, Any]]] = {p: [] for p in peers}
        pages: dict[str, list[tuple[float, int]]] = {p: [] for p in peers if targets[p][0]}
        for _ in range(args.repeat):
            for peer in peers:  # interleaved passes
                lport, path, get_url, ppid, _count = targets[peer]
                h.wait_idle(args.quiet_wait, args.quiet_load)
                if lport:
                    pages[peer].append(list_pages(lport, path, 60.0))
                rates[peer].append(request_rate(get_url, "GET", seconds=seconds, pid=ppid))
        for peer, runs in pages.items():
            listing.rows.append(
                [
                    peer,
                    f"{targets[peer][4]:,}",
                    f"{statistics.median(r[0] for r in runs):,.0f}",
                    f"{runs[-1][1]:,}",
                    ", ".join(f"{r[0]:.0f}" for r in runs),
                ]
            )
        for peer, runs in rates.items():
            cpu = [r["cpu_us"] for r in runs if r["cpu_us"]]
            gets.rows.append(
                [
                    peer,
                    f"{statistics.median(r['rate'] for r in runs):,.0f}",
                    f"{statistics.median(cpu):.0f}" if cpu else "—",
                    ", ".join(f"{r['rate']:.0f}" for r in runs),
                ]
            )
        listing.data, gets.data = pages, rates
    finally:
        h.stop_pid(int(pid))
        if moto is not None:
            moto.terminate()
            moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return [listing, gets]


def _fill_moto(port: int, n: int) -> None:
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(s3={"addressing_style": "path"}),
    )
    deadline = time.monotonic() + 120
    while True:  # moto starts slowly on a busy machine
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise h.Failed("moto_server did not start") from None
            time.sleep(0.2)
    s3.create_bucket(Bucket="bkt")
    body = bytes(range(256)) * 4
    for i in range(n):
        s3.put_object(Bucket="bkt", Key=f"d{i // 1000:04d}/k{i % 1000:03d}", Body=body)
