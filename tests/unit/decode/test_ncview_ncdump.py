"""No decoded view of any array metadata makes netCDF-C fail: a generated matrix of dtypes x
shapes x chunkings x fill values x attributes, each written out as the view serves it
(``support.ncrender``: no FUSE) and read whole by ncdump (``#mode=zarr``, what a mount is read
as). ncdump must exit 0 on every one -- an array netCDF-C cannot read is left out of the view,
never handed to it -- and print the variables it shows with the values they hold."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np
import pytest
from support.ncrender import render

pytestmark = pytest.mark.timeout(600)

NCDUMP = shutil.which("ncdump")
DTYPES = ["<f4", ">f8", "|i1", "|u1", "<i2", ">u2", "<i4", "<u4", "<i8", ">u8", "|S1", "|S4", "|O",
          "|b1", "<f2", "<c8", "<M8[ns]", "<U3", [["a", "<i4"], ["b", "<f8"]]]
LAYOUTS = [([], []), ([3], [512]), ([5], [2]), ([2, 3], [2, 3]), ([0], [1]), ([4, 3], [3, 2]),
           ([3, 5], [10, 10]), ([2, 3], [1, 3])]
FILLS = [None, 0, "NaN", -9999, 9.969209968386869e36, "IA==", 1e300, -1, 2**64 - 1]
WKT = 'GEOGCS["WGS 84",DATUM["WGS_1984",SPHEROID["WGS 84",6378137,298.257223563]]' + " " * 4000
ATTRS = [
    {},
    {"valid_range": [0, 200], "flag_values": [1, 2, 300]},
    {"_FillValue": "x", "_Unsigned": "true"},
    {"units": "\u00b0C", "n": None, "e": [], "s": ["a", "b"], "nested": [[1], 2], "big": 2**63,
     "neg": -(2**40), "f": [0.5, 1e300], "wkt": WKT, "obj": {"a": [1, 2]}, "b": True},
    {"_ARRAY_DIMENSIONS": ["only_one"], "missing_value": -1, "valid_min": 0.5},
    {"_FillValue": 1e300, "scale_factor": 0.10000000149011612, "add_offset": 273.15},
    {"_NCZARR_ATTR": {"types": {"units": "<U1", "x": "<i2"}}, "x": 3, "units": "K"},
]


def chunk_bytes(dtype, chunks: list[int], compress: bool) -> str:
    n = int(np.prod(chunks)) if chunks else 1
    if dtype == "|O":
        raw = numcodecs.VLenUTF8().encode(np.array(["ab"] * n, dtype=object))
    else:
        dt = np.dtype([tuple(f) for f in dtype]) if isinstance(dtype, list) else np.dtype(dtype)
        raw = np.zeros(n, dt).tobytes() if dt.kind in "SUMVb" else np.arange(n).astype(dt).tobytes()
    return "base64:" + base64.b64encode(zlib.compress(raw) if compress else raw).decode()


def refset(cases: list[tuple]) -> dict:
    """One reference set with an array per case (name v<i>), each with its chunks inline."""
    refs: dict = {".zgroup": json.dumps({"zarr_format": 2}), ".zattrs": json.dumps({"title": "matrix"})}
    for i, (dtype, (shape, chunks), fill, attrs) in enumerate(cases):
        compress = i % 2 == 1 and dtype != "|O"
        meta = {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "fill_value": fill,
                "order": "C", "compressor": {"id": "zlib", "level": 1} if compress else None,
                "filters": [{"id": "vlen-utf8"}] if dtype == "|O" else None}
        dims = [f"d{n}" for n in shape]
        refs[f"v{i}/.zarray"] = json.dumps(meta)
        refs[f"v{i}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": dims, **attrs})
        grid = [max(1, -(-s // c)) for s, c in zip(shape, chunks, strict=True)]
        for idx in itertools.product(*[range(g) for g in grid]):
            refs[f"v{i}/" + (".".join(map(str, idx)) or "0")] = chunk_bytes(dtype, chunks, compress)
    return refs


def ncdump_whole(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NCDUMP, f"file://{tree}#mode=zarr,file"], capture_output=True, text=True,
                          timeout=60)


def cases() -> list[tuple]:
    out = []
    for i, (dtype, layout) in enumerate(itertools.product(DTYPES, LAYOUTS)):
        out.append((dtype, layout, FILLS[i % len(FILLS)], ATTRS[i % len(ATTRS)]))
    for dtype in ("<f4", "|u1", "<i2"):
        for fill, attrs in itertools.product(FILLS, ATTRS):
            out.append((dtype, ([4], [3]), fill, attrs))
    return out


@pytest.mark.skipif(NCDUMP is None, reason="ncdump is not installed (Debian package netcdf-bin)")
def test_no_decoded_view_of_the_matrix_fails_ncdump(tmp_path):
    all_cases = cases()
    assert len(all_cases) > 300

    def one(i: int) -> tuple[int, int, str, list[str]]:
        tree = tmp_path / f"t{i}"
        view = render(refset([all_cases[i]]), tree)
        r = ncdump_whole(tree)
        return r.returncode, len(view.left_out), r.stderr + r.stdout[-500:], sorted(view.left_out)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(len(all_cases))))
    failed = [(all_cases[i], rc, out) for i, (rc, _n, out, _l) in enumerate(results) if rc != 0]
    assert not failed, "\n".join(f"{c!r:.200} rc={rc} {o.strip()[-150:]}" for c, rc, o in failed)
    shown = [i for i, (_rc, n, _o, _l) in enumerate(results) if n == 0]
    left = {json.dumps(all_cases[i][0]) for i, (_rc, n, _o, _l) in enumerate(results) if n}
    # every netCDF type is shown in every layout with a length (char included)
    assert len(shown) > 200
    assert {'"|O"', '"|b1"', '"<f2"', '"<c8"', '"<M8[ns]"', '"<U3"'} <= left
    with_length = {json.dumps(c[0]) for i, c in enumerate(all_cases) if results[i][1] == 0}
    assert {'"|S1"', '"|S4"', '"|u1"', '"<i8"', '">u8"', '">f8"'} <= with_length


@pytest.mark.skipif(NCDUMP is None, reason="ncdump is not installed (Debian package netcdf-bin)")
def test_the_whole_matrix_in_one_tree_and_shared_dimension_names(tmp_path):
    """All the cases at once (one variable netCDF-C cannot read fails the whole file), and
    dimension names used with several lengths."""
    refs = refset(cases())
    for name, n in (("time", 3), ("a", 5), ("b", 3), ("c", 5)):
        refs[f"{name}/.zarray"] = json.dumps({"zarr_format": 2, "shape": [n], "chunks": [n], "dtype": "<i4",
                                              "fill_value": None, "order": "C", "compressor": None,
                                              "filters": None})
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["time"]})
        refs[f"{name}/0"] = "base64:" + base64.b64encode(np.arange(n, dtype="<i4").tobytes()).decode()
    view = render(refs, tmp_path / "all")
    r = ncdump_whole(tmp_path / "all")
    assert r.returncode == 0, r.stderr
    cdl = r.stdout
    assert "\ttime = 3 ;" in cdl and "\ttime_5 = 5 ;" in cdl, cdl[:2000]
    assert "int a(time_5) ;" in cdl and "int b(time) ;" in cdl and "int c(time_5) ;" in cdl
    assert " a = 0, 1, 2, 3, 4 ;" in cdl and " b = 0, 1, 2 ;" in cdl
    assert view.left_out and all(f"{p}/.zarray" in view.hidden for p in view.left_out)
    # a chunk of 512 for 3 values (an unlimited dimension) is cut: the values, not the chunk
    cut = [i for i, c in enumerate(cases()) if c[1] == ([3], [512]) and f"v{i}" not in view.left_out
           and c[0] not in ("|S1", "|S4")]
    assert len(cut) >= 8
    for i in cut:
        assert re.search(rf"^ v{i} = (0|_), 1, 2 ;$", cdl, re.M), (cases()[i], cdl[-3000:])
