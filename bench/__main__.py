"""``python -m bench run --workloads W[,W...] [--peers P[,P...]] [--quick] [--json FILE]``: run
any workloads of any peers through one harness; ``python -m bench list``: what there is."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from bench import (
    catalog,
    icechunk,
    inline,
    latency,
    metrics,
    nativechunks,
    parse,
    reads,
    s3,
    scale,
    serve,
    verify,
    workers,
)
from bench.harness import PY, REPO
from bench.report import Table, write_json

MODULES: list[ModuleType] = [reads, latency, scale, inline, parse, serve, catalog, verify, workers, icechunk,
                             metrics, nativechunks, s3]
GROUPS = {"reads": list(reads.WORKLOADS)}  # the read-path table: bench run --workloads reads


def workload_module(name: str) -> ModuleType | None:
    return next((m for m in MODULES if name in m.WORKLOADS), None)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the workloads and the peers each knows")
    p = sub.add_parser("run", help="run workloads")
    p.add_argument("--workloads", default="reads",
                   help="comma list of workloads (see `list`); `reads` = the read-path table (default)")
    p.add_argument("--peers", default="", help="comma list of peers (default: every peer a workload knows)")
    p.add_argument("--quick", action="store_true", help="smoke run: small data, short bounds")
    p.add_argument("--json", default=None, help="also write every table as JSON to this file")
    p.add_argument("--work", default=str(REPO / "bench-work"), help="work directory (one folder a workload)")
    p.add_argument("--size", default=None, help="bytes of the served file (reads: 2G, --quick 256M; "
                   "latency: 1G, --quick 128M)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per measured pass "
                   "(reads: 300, --quick 120; latency: 180; inline: each fsspec run, 300; "
                   "catalog: each mount, 1800; verify: each refmount verify, 600)")
    p.add_argument("--repeat", type=int, default=1, help="runs per cell, the median shown (latency: cold "
                   "passes; verify: runs of each peer)")
    p.add_argument("--refmount-opts", default="", help="more refmount -o options, e.g. max_connections=64")
    p.add_argument("--quiet-wait", type=float, default=180.0,
                   help="before each cold pass wait up to this many seconds for the machine to be idle "
                   "(other work on it shows up in the numbers); 0: don't wait")
    p.add_argument("--quiet-load", type=float, default=0.3,
                   help="busy cores that still count as idle for --quiet-wait (default 0.3)")
    for m in MODULES:
        group = p.add_argument_group(f"{m.__name__.removeprefix('bench.')} ({', '.join(m.WORKLOADS)})")
        m.add_arguments(group)
    return ap


def main(argv: list[str]) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.command == "list":
        for m in MODULES:
            for name, what in m.WORKLOADS.items():
                print(f"{name:8} {what}")
            print(f"{'':8} peers: {', '.join(m.PEERS)}")
        print(f"groups: {'; '.join(g + ' = ' + ','.join(ws) for g, ws in GROUPS.items())}")
        return 0
    names = [w for x in args.workloads.split(",") if x.strip() for w in GROUPS.get(x.strip(), [x.strip()])]
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    for w in names:
        if workload_module(w) is None:
            ap.error(f"unknown workload {w!r} (python -m bench list)")
    known = {p for m in MODULES for p in m.PEERS}
    for x in peers:
        if x not in known:
            ap.error(f"unknown peer {x!r}: one of {', '.join(sorted(known))}")

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    command = shlex.join([PY, "-m", "bench", *argv])
    t0 = time.time()
    tables: list[Table] = []
    status = 0
    for m in MODULES:
        mine = [w for w in names if w in m.WORKLOADS]
        if not mine:
            continue
        work = Path(args.work).resolve() / m.__name__.removeprefix("bench.")
        try:
            tables += m.run(args, mine, [p for p in (peers or m.PEERS) if p in m.PEERS], work)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            status = 130
            break
    out = [f"command: `{command}`, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
           f"took {(time.time() - t0) / 60:.1f} min"]
    for t in tables:
        out += ["", t.markdown()]
    details = [d for t in tables for d in t.details]
    if details:
        out += ["", "## Details", "", *details]
    print("\n".join(out))
    if args.json:
        write_json(Path(args.json), command, tables)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
