"""Zarr v3 arrays written by zarr-python 3 (dtypes x codecs x layouts, sharded ones too,
partly written) read by ncdump through the decoded view, without FUSE (``support.v3store``:
the tree as a mount serves it, written out): ncdump reads the whole set, and prints for every
array it is shown the values zarr-python reads from the v3 store, ``_`` exactly where they
equal a declared ``_FillValue`` (as xarray writes it for v3); the arrays netCDF-C has no type
for are left out, never handed to it."""

from __future__ import annotations

import base64
import itertools
import shutil
import struct
import subprocess
import warnings

import numpy as np
import pytest
from support.v3store import codec_sets, decoded_tree, ncdump_values, render_tree, sample, store_refs

pytestmark = pytest.mark.timeout(600)

NCDUMP = shutil.which("ncdump")
DTYPES = ["<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|S1", "|S4", "|b1",
          "<f2", "<c8", "<U3", "<M8[s]", "str"]
# (shape, chunks, shards, index_location, part written: None for all, else rows along axis 0)
LAYOUTS = [((), (), None, "end", None), ((5,), (2,), None, "end", None), ((4, 3), (3, 2), None, "end", 3),
           ((3,), (10,), None, "end", None), ((4, 6), (2, 3), (4, 6), "end", None),
           ((5, 7), (2, 2), (4, 4), "end", 3), ((6,), (2,), (6,), "start", 3)]
FILLS = {"f": [None, float("nan"), -9999.0, float("inf")], "i": [None, -1, 3], "u": [None, 7]}
NOT_NETCDF = {"|b1", "<f2", "<c8", "<U3", "<M8[s]", "str"}


def cases() -> list[tuple]:
    out = []
    names = list(codec_sets(2))
    for i, (dtype, layout) in enumerate(itertools.product(DTYPES, LAYOUTS)):
        codecs = names[i % len(names)]
        if (codecs, dtype) in (("nc_delta", "<i4"), ("nc_fixedscaleoffset", "<f8")) or not codecs.startswith(
                ("nc_delta", "nc_fixed")):
            out.append((dtype, layout, codecs, i))
    for i, (dtype, layout, codecs) in enumerate(itertools.product(["<f4", "<i2"], LAYOUTS, names)):
        if not codecs.startswith(("nc_delta", "nc_fixed")):
            out.append((dtype, layout, codecs, i))
    out += [("<i4", layout, "nc_delta", i) for i, layout in enumerate(LAYOUTS)]
    out += [("<f8", layout, "nc_fixedscaleoffset", i) for i, layout in enumerate(LAYOUTS)]
    return out


def write(store_dir, all_cases) -> tuple[dict, dict]:
    """Each case as array v<i> of one v3 store; (path -> (case, fill used), path -> why not made)."""
    import zarr

    made, refused = {}, {}
    store = zarr.storage.LocalStore(store_dir)
    root = zarr.create_group(store, zarr_format=3, attributes={"title": "v3 matrix"})
    for n, (dtype, (shape, chunks, shards, location, part), codecs, i) in enumerate(all_cases):
        dt = np.dtype(str if dtype == "str" else dtype) if dtype != "str" else str
        kind = np.dtype(dtype).kind if dtype != "str" else "O"
        fills = FILLS.get(kind, [None])
        fill = fills[i % len(fills)]
        kwargs = dict(codec_sets(len(shape))[codecs])
        if shards is not None:
            kwargs["shards"] = {"shape": shards, "index_location": location}
        name = f"v{n}"
        declared = fill if fill is not None and i % 2 == 0 and kind in "iuf" else None
        attrs = {"case": f"{dtype} {codecs}"}
        if declared is not None:  # a missing-value marker, as xarray writes it for v3
            attrs["_FillValue"] = (base64.b64encode(struct.pack("<d", declared)).decode() if kind == "f"
                                   else declared)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a = root.create_array(name, shape=shape, chunks=chunks, dtype=dt, fill_value=fill,
                                      dimension_names=[f"{name}_d{k}" for k in range(len(shape))] or None,
                                      attributes=attrs, **kwargs)
                data = sample(shape, dt if dtype != "str" else "U3").astype(dt if dtype != "str" else object)
                if part is None:
                    a[...] = data
                else:
                    a[:part] = data[:part]
        except Exception as e:  # a combination zarr-python itself refuses (delta on strings ...)
            refused[name] = f"{type(e).__name__}: {e}"
            continue
        made[name] = (all_cases[n], declared)
    return made, refused


def tokens_of(expected: np.ndarray, fill) -> list[str | float | int | None]:
    """What ncdump should print: None where the value is the declared fill value (``_``)."""
    out: list = []
    for v in expected.ravel().tolist():
        nan = isinstance(v, float) and np.isnan(v) and fill is not None and np.isnan(fill)
        is_fill = fill is not None and (v == fill or nan)
        out.append(None if is_fill else v)
    return out


def parse(token: str, kind: str) -> float | int | None:
    if token == "_":
        return None
    if kind == "f":
        return float(token.removesuffix("f").replace("Infinity", "inf").replace("NaN", "nan"))
    return int(token)


@pytest.mark.skipif(NCDUMP is None, reason="ncdump is not installed (Debian package netcdf-bin)")
def test_ncdump_reads_every_v3_array_it_is_shown_with_zarrs_values(tmp_path):
    import zarr

    store_dir = tmp_path / "store"
    made, refused = write(store_dir, cases())
    assert len(made) > 150, refused
    assert len(refused) < len(made) // 4, refused
    refs = store_refs(store_dir, ranges=True)
    tree = decoded_tree(refs)
    view = tree.view
    render_tree(tree, tmp_path / "view")
    r = subprocess.run([NCDUMP, "-p", "9,17", f"file://{tmp_path / 'view'}#mode=zarr,file"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cdl = r.stdout
    store = zarr.storage.LocalStore(store_dir, read_only=True)
    checked = 0
    for name, ((dtype, layout, codecs, _i), fill) in made.items():
        if dtype in NOT_NETCDF:
            assert name in view.left_out, (name, dtype)
            assert f"\t{name}:" not in cdl
            continue
        assert name not in view.left_out, (name, dtype, codecs, view.left_out.get(name))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = np.asarray(zarr.open_array(store, path=name, mode="r")[...])
        got = ncdump_values(cdl, name)
        if expected.dtype.kind == "S":  # char: one string per row of the last axis (|S1), or per value
            if expected.dtype.itemsize == 1:
                rows = expected.reshape(-1, expected.shape[-1] if expected.ndim else 1)
                want = [b"".join(row.tolist()).decode() for row in rows]
            else:
                want = [v.decode() for v in expected.ravel().tolist()]
            assert [g.replace("\\000", "") for g in got] == [w.replace("\0", "") for w in want], (
                name, codecs, got, want)
        else:
            kind = expected.dtype.kind
            want = tokens_of(expected, fill)
            have = [parse(t, kind) for t in got]
            assert len(have) == len(want), (name, dtype, layout, codecs, len(have), len(want))
            for h, w in zip(have, want, strict=True):
                if w is None or h is None:
                    assert h is None and w is None, (name, dtype, layout, codecs, have, want)
                elif kind == "f":
                    assert np.isclose(h, w, rtol=1e-6, equal_nan=True), (name, dtype, codecs, have, want)
                else:
                    assert h == w, (name, dtype, codecs, have, want)
        checked += 1
    assert checked > 120
    assert {c for (_d, _l, c, _i), _f in made.values()} == set(codec_sets(2))
    assert any(layout[2] is not None for (_d, layout, _c, _i), _f in made.values())
    assert "str" not in {d for (d, *_), _f in made.values()} or any(
        "variable-length" in why for why in view.left_out.values())
