"""netCDF-C's command-line tools (CDO, NCO's ncks, ncdump) through ``-o decode`` see what the
original files say: the same values, the same missing values, ``_FillValue`` with the
variable's own type. And xarray reads the decoded view as it reads the raw one.

Sets: netCDF4 (zlib + shuffle, fill values, a packed short, groups), netCDF3 (big-endian,
packed short, ``missing_value``), plain HDF5 written by h5py, and two netCDF4 files combined by
kerchunk's MultiZarrToZarr. Where kerchunk's reference set itself differs from what netCDF-C
reads in the original (a netCDF3 ``missing_value`` recorded as the fill value; HDF5's default
fill value 0), the tests check the documented rule instead: netCDF clients through the mount
treat as missing exactly what xarray treats as missing through the mount.
"""

from __future__ import annotations

import re
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr
from support.clients import run_client as run
from support.clients import zarr_url as url
from support.xrcompare import netcdf_dims

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

SETS = ["nc4_local", "nc3_local", "h5_local", "combined_local"]
# (set, variable): the value the reference set records as fill value although netCDF-C does not
# treat it as missing in the original (netCDF3 missing_value only; HDF5's default fill value)
NOT_A_NETCDF_FILL = {("nc3_local", "wind"): -99.0, ("h5_local", "default_fill"): 0.0}


def originals(datasets, name: str) -> list[Path]:
    return {"nc4_local": [datasets.nc4], "nc3_local": [datasets.nc3], "h5_local": [datasets.h5],
            "combined_local": list(datasets.parts)}[name]


def variables(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(path like temp or /sub/inner, dimension names) of every numeric variable of a file."""
    out = []
    with netCDF4.Dataset(path) as ds:

        def walk(group, prefix):
            for name, v in group.variables.items():
                if v.dtype.kind in "iuf":
                    out.append((f"{prefix}/{name}" if prefix else name, v.dimensions))
            for gname, g in group.groups.items():
                walk(g, f"{prefix}/{gname}")

        walk(ds, "")
    return out


def raw_values(path: Path, var: str) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return np.asarray(ds[var][:]).ravel()


def data_tokens(text: str, var: str) -> list[str]:
    """The values ncdump or ncks prints for ``var`` (its data section), as tokens."""
    *groups, name = var.strip("/").split("/")
    for group in groups:  # the group's own part of the output
        text = text.split(f"group: {group} {{", 1)[1]
    m = re.search(r"^\s*" + re.escape(name) + r" =\s*(.*?);", text.split("data:", 1)[1], re.S | re.M)
    assert m, f"{var} not in the data section:\n{text[-1500:]}"
    return [t.strip() for t in m.group(1).replace("\n", " ").split(",") if t.strip()]


def original_tokens(tool, files: list[Path], var: str, dims: tuple[str, ...]) -> list[str]:
    """The tokens of the original: for the combined set, the files' values along time."""
    parts = files if dims[:1] == ("time",) else files[:1]
    return [t for f in parts for t in tool(str(f), var)]


def ncdump_tokens(target: str, var: str) -> list[str]:
    return data_tokens(run("ncdump", "-p", "9,17", "-v", var, target), var)


def ncks_tokens(target: str, var: str) -> list[str]:
    return data_tokens(run("ncks", "-H", "-C", "-v", var if "/" in var else "/" + var, target), var)


def assert_same_tokens(name: str, var: str, orig: list[str], got: list[str], files) -> int:
    """Equal tokens; for a value recorded as fill value that netCDF-C does not treat as missing
    in the original, ``_`` exactly where the original holds it. Returns the number of ``_``."""
    assert len(orig) == len(got), (name, var, len(orig), len(got))
    special = NOT_A_NETCDF_FILL.get((name, var))
    if special is None:
        assert orig == got, (name, var, [(a, b) for a, b in zip(orig, got, strict=True) if a != b][:10])
        return got.count("_")
    values = np.concatenate([raw_values(f, var) for f in files])
    held = values == special
    assert held.any(), (name, var, "the test data must hold the value")
    assert [t == "_" for t in got] == held.tolist(), (name, var)
    assert [a for a, h in zip(orig, held, strict=True) if not h] == \
        [b for b, h in zip(got, held, strict=True) if not h], (name, var)
    return int(held.sum())


# --- CDO -------------------------------------------------------------------------------------


CDO_ROW = re.compile(r"\d+ : (\S+) (\S+) +(\S+) +(\d+) +(\d+) : +(\S+) +(\S+) +(\S+) : (\S+)")


def cdo_rows(*targets: str) -> dict[tuple[str, str, str], list[str]]:
    """``cdo infon``: {(date time, level, parameter): [gridsize, miss, min, mean, max]}."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for target in targets:
        for line in run("cdo", "-s", "infon", target).splitlines():
            m = CDO_ROW.fullmatch(line.strip())
            if m is None:
                assert "Parameter name" in line, line
                continue
            date, time, level, size, miss, lo, mean, hi, param = m.groups()
            key = (f"{date} {time}", level, param)
            assert key not in rows, key
            rows[key] = [size, miss, lo, mean, hi]
    return rows


@pytest.mark.parametrize("name", SETS)
def test_cdo_infon_through_decode_equals_the_original(shared_mounts, name):
    ds = shared_mounts.datasets
    files = originals(ds, name)
    got = cdo_rows(url(shared_mounts.get(name, "decode")))
    want = cdo_rows(*map(str, files))
    assert set(got) == set(want)
    missing = 0
    for key, row in want.items():
        if (name, key[2]) in NOT_A_NETCDF_FILL and name == "h5_local":
            continue  # below
        assert got[key] == row, (key, got[key], row)
        missing += int(row[1])
    assert missing >= 3, "the data must hold missing values"
    if name == "h5_local":
        # HDF5's default fill value: netCDF-C on the file counts no missing value; through the
        # mount CDO counts the zeros, as xarray masks them through the mount
        values = raw_values(files[0], "default_fill").reshape(4, -1)
        for key, row in want.items():
            if key[2] == "default_fill":
                assert row[1] == "0"
                assert int(got[key][1]) == int((values[int(key[1]) - 1] == 0).sum())


# --- NCO and ncdump ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SETS)
def test_ncks_prints_the_original_values(shared_mounts, name):
    files = originals(shared_mounts.datasets, name)
    m = url(shared_mounts.get(name, "decode"))
    filled = 0
    for var, dims in variables(files[0]):
        orig = original_tokens(ncks_tokens, files, var, dims)
        filled += assert_same_tokens(name, var, orig, ncks_tokens(m, var), files)
    assert filled >= 3


@pytest.mark.parametrize("name", SETS)
def test_ncdump_prints_fill_where_the_original_does(shared_mounts, name):
    files = originals(shared_mounts.datasets, name)
    m = url(shared_mounts.get(name, "decode"))
    filled = 0
    for var, dims in variables(files[0]):
        orig = original_tokens(ncdump_tokens, files, var, dims)
        filled += assert_same_tokens(name, var, orig, ncdump_tokens(m, var), files)
    assert filled >= 3
    # _FillValue as the original declares it, with the variable's own type (-9999.f, -1s)
    header = run("ncdump", "-h", m)
    declared = re.findall(r"^\s*\w+:_FillValue = .*;$", run("ncdump", "-h", str(files[0])), re.M)
    assert declared
    for line in declared:
        assert line in header, (line, header)


# --- xarray ------------------------------------------------------------------------------------


def assert_same_dataset(a: xr.Dataset, b: xr.Dataset) -> None:
    assert set(a.variables) == set(b.variables)
    for v in a.variables:
        xr.testing.assert_identical(a[v].load(), b[v].load())
        fa, fb = a[v].encoding.get("_FillValue"), b[v].encoding.get("_FillValue")
        assert fa == fb or bool(np.isnan(fa) and np.isnan(fb)), (v, fa, fb)


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("mask_and_scale", [True, False])
def test_xarray_reads_the_decoded_view_as_the_raw_one(shared_mounts, name, mask_and_scale):
    dec, raw = shared_mounts.get(name, "decode"), shared_mounts.get(name)
    files = originals(shared_mounts.datasets, name)
    groups = [None, "sub", "sub/deeper"] if name == "nc4_local" else [None]
    for group in groups:
        d = xr.open_zarr(dec, group=group, consolidated=False, mask_and_scale=mask_and_scale)
        r = netcdf_dims(xr.open_zarr(raw, group=group, consolidated=False, mask_and_scale=mask_and_scale))
        assert_same_dataset(d, r)
    if not mask_and_scale:
        return
    d = xr.open_zarr(dec, consolidated=False)
    if name == "combined_local":
        o = xr.concat([xr.open_dataset(f) for f in files], "time", data_vars="minimal")
    else:
        o = xr.open_dataset(files[0])
    masked = 0
    for v in o.variables:
        if (name, v) == ("h5_local", "default_fill"):
            # kerchunk's fill_value 0: masked through the mount, not in the file
            held = o[v].values == 0
            assert held.any() and bool(d[v].isnull().values[held].all())
            np.testing.assert_array_equal(d[v].values[~held], o[v].values[~held])
            continue
        assert d[v].dtype == o[v].dtype, (v, d[v].dtype, o[v].dtype)
        np.testing.assert_array_equal(d[v].values, o[v].values, err_msg=v)
        if d[v].dtype.kind == "f":
            masked += int(d[v].isnull().sum())
    assert masked >= 3
