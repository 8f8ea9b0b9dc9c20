"""The ``parse`` workload: how fast a large Version 0 JSON set becomes refmount's key index,
with and without bare ``NaN``/``Infinity`` (as Python's ``json`` writes a NaN ``fill_value``).

Two files of ``--parse-keys`` range references (default 2,000,000, ~130 MB), the same bytes
except that in the second every array's ``.zarray`` is a JSON object with ``"fill_value": NaN``
(and one ``Infinity`` attribute). Rows, each the best of ``--repeat`` runs in this process:
refmount's ``build_index`` + ``finish`` (what a mount does before serving, minus writing the
index file); ijson's yajl2_c ``kvitems`` alone (the floor; fails on the NaN file); Python's
``json.load`` (how fsspec's ReferenceFileSystem reads a JSON set). Run with
``PYTHONPATH=<another checkout>`` to time that checkout's parser on the same files.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import Table

WORKLOADS = {"parse": "Version 0 JSON of 2M keys, with and without bare NaN, parsed into the key index"}
PEERS = ("refmount", "inproc")
ARRAYS = 20


def generate(path: Path, keys: int, nan: bool) -> None:
    per = keys // ARRAYS
    with open(path, "w") as f:
        f.write('{".zgroup": "{\\"zarr_format\\": 2}"')
        for a in range(ARRAYS):
            meta = {"chunks": [1, 100], "compressor": None, "dtype": "<f4", "fill_value": "NaN",
                    "filters": None, "order": "C", "shape": [per, 100], "zarr_format": 2}
            if nan:
                meta["fill_value"] = float("nan")
                f.write(f', "var{a:02d}/.zarray": {json.dumps(meta)}')
                f.write(f', "var{a:02d}/.zattrs": {{"valid_max": Infinity, "_ARRAY_DIMENSIONS": ["t", "x"]}}')
            else:
                f.write(f', "var{a:02d}/.zarray": {json.dumps(json.dumps(meta))}')
                attrs = {"valid_max": 1e38, "_ARRAY_DIMENSIONS": ["t", "x"]}
                f.write(f', "var{a:02d}/.zattrs": {json.dumps(json.dumps(attrs))}')
            url = f"s3://bucket/some/prefix/file_{a:03d}.nc"
            f.write("".join(f', "var{a:02d}/{i}.0": ["{url}", {i * 4096 + 512}, 4000]' for i in range(per)))
        f.write("}\n")


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def add_arguments(p: Any) -> None:
    p.add_argument("--parse-keys", type=int, default=None, help="keys of each file (2000000; --quick 200000)")
    p.add_argument("--repeat-parse", type=int, default=3, help="runs of each parse (the best is shown)")


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    keys = args.parse_keys or (200_000 if args.quick else 2_000_000)
    repeat = args.repeat_parse
    import ijson

    import refmount
    from refmount.refs import build_index

    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for nan in (False, True):
        p = work / f"v0-{keys}-{'nan' if nan else 'plain'}.json"
        if not p.exists():
            generate(p, keys, nan)
        files[nan] = p
    t = Table("parse", f"parsing a Version 0 set of {keys:,} keys (best of {repeat})",
              ["file", "MB", "what", "seconds", "MB/s"], align="lrlrr",
              notes=[f"refmount from {os.path.dirname(refmount.__file__)}; ijson backend {ijson.backend}"])

    def row(nan: bool, what: str, fn: Callable[[], object]) -> None:
        size = files[nan].stat().st_size / 1e6
        try:
            secs, _ = best(fn, repeat)
            cells = [f"{secs:.2f}", f"{size / secs:,.0f}"]
        except Exception as e:
            cells = [f"fails ({type(e).__name__})", "—"]
        t.rows.append(["NaN" if nan else "plain", f"{size:,.0f}", what, *cells])
        print(" | ".join(t.rows[-1]), file=sys.stderr, flush=True)

    def refmount_parse(p: Path) -> Callable[[], object]:
        def run() -> object:
            table = build_index(str(p), {}).finish()
            assert table.num_rows == keys // ARRAYS * ARRAYS + 1 + 2 * ARRAYS, table.num_rows
            return table
        return run

    def yajl(p: Path) -> Callable[[], object]:
        def run() -> object:
            with open(p, "rb") as f:
                return sum(1 for _ in ijson.kvitems(f, "", use_float=True))
        return run

    def pyjson(p: Path) -> Callable[[], object]:
        def run() -> object:
            with open(p) as f:
                return len(json.load(f))
        return run

    for nan in (False, True):
        if "refmount" in peers:
            row(nan, "refmount build_index + finish", refmount_parse(files[nan]))
        if "inproc" in peers:
            row(nan, "ijson yajl2_c kvitems alone", yajl(files[nan]))
            row(nan, "json.load (fsspec's reader)", pyjson(files[nan]))
    return [t]
