#!/usr/bin/env python3
"""Parse benchmark: how fast a large Version 0 JSON set becomes refmount's key index, with and
without bare ``NaN``/``Infinity`` (as Python's ``json`` writes a NaN ``fill_value``).

Two files of ``--keys`` range references each (default 2,000,000, ~130 MB), the same bytes
except that in the second one every array's ``.zarray`` is a JSON object with ``"fill_value":
NaN`` (and one ``Infinity`` attribute). Rows, each the best of ``--repeat`` runs in this process:

* refmount ``build_index`` + ``finish`` (what a mount does before serving, minus writing the
  index file): the plain file takes the unfiltered path; the NaN file is first seen by the
  watch, then parsed through the tokenizer filter;
* ijson's yajl2_c ``kvitems`` alone over the file (the floor; fails on the NaN file);
* Python's ``json.load`` of the whole file (how fsspec's ReferenceFileSystem reads a JSON
  set; it accepts NaN), with its peak memory left aside.

Usage: .venv/bin/python scripts/bench_parse.py [--keys N] [--repeat R] [--workdir DIR]
Run it with ``PYTHONPATH=<another checkout>`` to time that checkout's parser on the same files.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

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


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default="bench-work/parse")
    args = ap.parse_args()

    import ijson

    import refmount
    from refmount.refs import build_index

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for nan in (False, True):
        p = work / f"v0-{args.keys}-{'nan' if nan else 'plain'}.json"
        if not p.exists():
            generate(p, args.keys, nan)
        files[nan] = p
    print(f"refmount from {os.path.dirname(refmount.__file__)}; ijson backend {ijson.backend}")
    print(f"{'file':8} {'MB':>6}  {'what':44} {'seconds':>8} {'MB/s':>7}")

    def row(nan: bool, what: str, fn) -> None:
        size = files[nan].stat().st_size / 1e6
        try:
            secs, _ = best(fn, args.repeat)
            print(f"{'NaN' if nan else 'plain':8} {size:6.0f}  {what:44} {secs:8.2f} {size / secs:7.0f}",
                  flush=True)
        except Exception as e:
            print(f"{'NaN' if nan else 'plain':8} {size:6.0f}  {what:44} {'fails':>8}  ({type(e).__name__})",
                  flush=True)

    def refmount_parse(p: Path):
        def run():
            b = build_index(str(p), {})
            t = b.finish()
            assert t.num_rows == args.keys // ARRAYS * ARRAYS + 1 + 2 * ARRAYS, t.num_rows
            return t
        return run

    def yajl(p: Path):
        def run():
            with open(p, "rb") as f:
                return sum(1 for _ in ijson.kvitems(f, "", use_float=True))
        return run

    def pyjson(p: Path):
        def run():
            with open(p) as f:
                return len(json.load(f))
        return run

    for nan in (False, True):
        row(nan, "refmount build_index + finish", refmount_parse(files[nan]))
        row(nan, "ijson yajl2_c kvitems alone", yajl(files[nan]))
        row(nan, "json.load (fsspec's reader)", pyjson(files[nan]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
