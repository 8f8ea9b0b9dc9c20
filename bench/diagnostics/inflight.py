"""What a mount had in flight over time, from its debug log (``-o log=FILE,log_level=debug``).

The daemon logs, at debug level, each request to a target (``request URL bytes A-B: N
bytes, began T, took D s``), each LOOKUP, each OPEN (``open ino I: pushed N bytes, began T,
took D s``), each READ (``read ino I bytes A-B: began T, took D s``), each RELEASE and, with
``-o decode``, each chunk decoded (``decode KEY: began T, stored bytes in S s, waited W s
for a thread, decoded in D s``), on the trio clock. This prints, per time slice, how many
requests were in flight and how many bytes they carried, how many OPENs and READs were
waiting, how many decodes waited for a worker thread (dec-q) and ran (dec), and a summary:
requests by size, time spent in each kind of operation, and the share of the run with no
request in flight.

Usage:
    .venv/bin/python -m bench.diagnostics.inflight refmount.log [--slice 0.01] [--rows 60]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import Counter

REQUEST = re.compile(r"request \S+ bytes (\d+)-(\d+): (\d+) bytes, began ([\d.]+), took ([\d.]+) s")
OPEN = re.compile(r"open ino (\d+): pushed (\d+) bytes, began ([\d.]+), took ([\d.]+) s")
READ = re.compile(r"read ino (\d+) bytes (\d+)-(\d+): began ([\d.]+), took ([\d.]+) s")
DECODE = re.compile(r"decode \S+: began ([\d.]+), stored bytes in ([\d.]+) s, "
                    r"waited ([\d.]+) s for a thread, decoded in ([\d.]+) s")
OTHER = re.compile(r"(lookup|release) (?:ino|fh) \d+: began ([\d.]+), took ([\d.]+) s")


def parse(path: str) -> dict[str, list[tuple[float, float, int]]]:
    """Per kind, (began, ended, bytes) of each operation."""
    out: dict[str, list[tuple[float, float, int]]] = {"request": [], "lookup": [], "open": [], "read": [],
                                                      "release": [], "decode queued": [], "decode": []}
    with open(path, errors="replace") as f:
        for line in f:
            if (m := REQUEST.search(line)) is not None:
                t0, d = float(m[4]), float(m[5])
                out["request"].append((t0, t0 + d, int(m[3])))
            elif (m := DECODE.search(line)) is not None:
                # from the stored bytes' arrival: waiting for a thread (and the bound on
                # decoded bytes in flight), then decoding
                t0 = float(m[1]) + float(m[2])
                out["decode queued"].append((t0, t0 + float(m[3]), 0))
                out["decode"].append((t0 + float(m[3]), t0 + float(m[3]) + float(m[4]), 0))
            elif (m := OPEN.search(line)) is not None:
                t0, d = float(m[3]), float(m[4])
                out["open"].append((t0, t0 + d, int(m[2])))
            elif (m := READ.search(line)) is not None:
                t0, d = float(m[4]), float(m[5])
                out["read"].append((t0, t0 + d, int(m[3]) - int(m[2])))
            elif (m := OTHER.search(line)) is not None:
                t0, d = float(m[2]), float(m[3])
                out[m[1]].append((t0, t0 + d, 0))
    return out


def in_flight(ops: list[tuple[float, float, int]], t0: float, t1: float) -> tuple[float, float]:
    """Mean number of operations, and of their bytes, in flight during [t0, t1)."""
    n = b = 0.0
    span = t1 - t0
    for s, e, size in ops:
        overlap = min(e, t1) - max(s, t0)
        if overlap > 0:
            n += overlap / span
            b += size * overlap / span
    return n, b


def idle_share(ops: list[tuple[float, float, int]]) -> float:
    """Share of the time from the first operation's start to the last one's end with none in flight."""
    if not ops:
        return 0.0
    spans = sorted((s, e) for s, e, _ in ops)
    first, last = spans[0][0], max(e for _, e in spans)
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return 1 - busy / (last - first) if last > first else 0.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log")
    p.add_argument("--slice", type=float, default=0.01, help="seconds per row")
    p.add_argument("--rows", type=int, default=60, help="rows of the timeline shown (from the start)")
    a = p.parse_args(argv)
    ops = parse(a.log)
    reqs = ops["request"]
    if not reqs:
        print("no requests in the log (was it written with log_level=debug?)", file=sys.stderr)
        return 1
    start = min(s for kind in ops.values() for s, _, _ in kind)
    end = max(e for kind in ops.values() for _, e, _ in kind)
    print(f"{len(reqs)} requests, {sum(b for *_, b in reqs) / 1e6:.1f} MB, "
          f"{len(ops['open'])} opens, {len(ops['read'])} reads, {end - start:.3f} s")
    sizes = Counter(b for *_, b in reqs)
    print("requests by size: " + ", ".join(f"{n} x {b / 2**20:g} MiB" for b, n in sizes.most_common(6)))
    for kind, items in ops.items():
        if items:
            d = [e - s for s, e, _ in items]
            print(f"{kind:8s} took: median {statistics.median(d) * 1e3:.1f} ms, "
                  f"mean {statistics.mean(d) * 1e3:.1f} ms, max {max(d) * 1e3:.1f} ms; sum {sum(d):.2f} s")
    n, b = in_flight(reqs, start, end)
    print(f"requests in flight: mean {n:.1f}, bytes in flight mean {b / 2**20:.1f} MiB; "
          f"no request in flight {idle_share(reqs):.0%} of the time")
    print(f"\n{'t (ms)':>8} {'reqs':>5} {'MiB':>6} {'opens':>5} {'reads':>5} {'dec-q':>5} {'dec':>5}"
          "  started/ended")
    t, row = start, 0
    while t < end and row < a.rows:
        t1 = t + a.slice
        rn, rb = in_flight(reqs, t, t1)
        on, _ = in_flight(ops["open"], t, t1)
        rdn, _ = in_flight(ops["read"], t, t1)
        dq, _ = in_flight(ops["decode queued"], t, t1)
        dn, _ = in_flight(ops["decode"], t, t1)
        began = sum(1 for s, _, _ in reqs if t <= s < t1)
        ended = sum(1 for _, e, _ in reqs if t <= e < t1)
        print(f"{(t - start) * 1e3:8.0f} {rn:5.1f} {rb / 2**20:6.1f} {on:5.1f} {rdn:5.1f} {dq:5.1f} "
              f"{dn:5.1f}  +{began}/-{ended}")
        t, row = t1, row + 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
