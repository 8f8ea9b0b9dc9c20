"""netCDF-C's tools read ordinary CF files through ``-o decode`` as the originals: unlimited
``time`` (HDF5 chunks of 512 for 3 steps), char station names, fill values, a packed short, a
CF ``crs`` scalar with a WKT and ``grid_mapping``, a netCDF4 group, int64 and uint8 with
``valid_range``, variable-length strings, netCDF3 classic with ``missing_value`` and char, and
three files combined along ``time`` by kerchunk's MultiZarrToZarr (compared with ``ncrcat`` of
the three). ``support/cfcorpus.py`` writes them; kerchunk references them.

For each: ``ncdump -h`` exits 0 and declares the original's variables and fill values;
``ncdump -v`` and ``ncks -H`` of every variable print what they print on the original; ``cdo
infon`` and ``gdalinfo -stats`` agree with the original; xarray over the decoded mount equals
xarray over the raw mount. The documented differences (docs/semantics.md) are the only ones
allowed: variable-length strings are left out of the netCDF side (one warning line), a netCDF3
``missing_value`` is read as ``_FillValue``, char variables are read by xarray through the raw
view, scalars have the dimension ``_zdim_1``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr
from support.cfcorpus import build
from support.clients import run_client as run
from support.clients import zarr_url
from support.mounts import LIVE_MOUNTERS, Mounter, warn_problems

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

SETS = ["cf4", "cf3", "combined"]
LEFT_OUT = {"cf4": {"remark"}, "cf3": set(), "combined": set()}
# (set, variable) -> value kerchunk records as fill value that the original only declares as
# missing_value (netCDF-C does not print it as _ on the original)
MISSING_VALUE_ONLY = {("cf3", "wind"): "-99"}


@pytest.fixture(scope="module")
def cf(tmp_path_factory):
    root = tmp_path_factory.mktemp("cf")
    sets = build(root / "data")
    mounter = Mounter(root / "mounts")
    LIVE_MOUNTERS.append(mounter)
    try:
        out = {}
        for name, (ref, orig) in sets.items():
            out[name] = (mounter(ref, "decode"), mounter(ref), orig)
        yield out
    finally:
        LIVE_MOUNTERS.remove(mounter)
        warn_problems("cf mounts", mounter.cleanup())


def url(m) -> str:
    return zarr_url(m.path)


def variables(path: Path) -> list[str]:
    """Every variable of a file netCDF-C's zarr reader can show (``/group/name`` in groups)."""
    out = []
    with netCDF4.Dataset(path) as ds:

        def walk(group, prefix):
            for name, v in group.variables.items():
                if v.dtype is not str:
                    out.append(f"{prefix}/{name}" if prefix else name)
            for gname, g in group.groups.items():
                walk(g, f"{prefix}/{gname}")

        walk(ds, "")
    return out


def data_tokens(text: str, var: str) -> list[str]:
    """The values ncdump or ncks prints for ``var`` (its data section), as tokens."""
    *groups, name = var.strip("/").split("/")
    for group in groups:
        text = text.split(f"group: {group} {{", 1)[1]
    m = re.search(r"^\s*" + re.escape(name) + r" =\s*(.*?);$", text.split("data:", 1)[1], re.S | re.M)
    assert m, f"{var} not in the data section:\n{text[-1500:]}"
    return [t.strip() for t in m.group(1).replace("\n", " ").split(",") if t.strip()]


# netCDF's default fill values as ncks prints them: ncdump prints them as _ on the original, ncks
# only through the view (kerchunk records them as fill_value, the view declares them)
DEFAULT_FILLS = {"-127", "255", "-32767", "65535", "-2147483647", "4294967295", "9.96921e+36"}


def compare(name: str, var: str, orig: list[str], got: list[str], ncks: bool = False) -> None:
    special = MISSING_VALUE_ONLY.get((name, var))
    if special is not None:
        assert special in orig
        orig = ["_" if t == special else t for t in orig]
    if ncks:
        orig = ["_" if t in DEFAULT_FILLS else t for t in orig]
    assert orig == got, (name, var, orig, got)


@pytest.mark.parametrize("name", SETS)
def test_ncdump_header_declares_the_originals_variables(cf, name):
    dec, _raw, orig = cf[name]
    header = run("ncdump", "-h", url(dec))
    original = run("ncdump", "-h", str(orig))
    for var in variables(orig):
        short = var.rpartition("/")[2]
        assert re.search(rf"^\s*\w+ {re.escape(short)}(\(.*\))? ;$", header, re.M), (var, header)
    for line in re.findall(r"^\s*\w+:(?:_FillValue|comment|crs_wkt|units|flag_meanings) = .*;$",
                           original, re.M):
        assert line in header, (line, header)  # the WKT, and text beyond ASCII ("°C")
    for line in re.findall(r"^\s*(?:char|short|float|double|int64|ubyte) \w+\(.*\) ;$", original, re.M):
        assert line.replace("time", "time") in header, (line, header)  # types and dimensions
    left_out = json.loads(os.getxattr(dec.path, "user.refmount.netcdf_left_out"))
    assert set(left_out) == LEFT_OUT[name], left_out
    lines = [line for line in dec.log_text(tail=2000).splitlines() if "netCDF clients" in line]
    assert len(lines) == (1 if LEFT_OUT[name] else 0), lines
    for var in LEFT_OUT[name]:
        assert "variable-length" in left_out[var] and var in lines[0]


@pytest.mark.parametrize("name", SETS)
def test_ncdump_and_ncks_print_the_original_values(cf, name):
    dec, _raw, orig = cf[name]
    checked = 0
    for var in variables(orig):
        want = data_tokens(run("ncdump", "-p", "9,17", "-v", var, str(orig)), var)
        got = data_tokens(run("ncdump", "-p", "9,17", "-v", var, url(dec)), var)
        compare(name, var, want, got)
        nvar = var if "/" in var else "/" + var
        want = data_tokens(run("ncks", "-H", "-C", "-v", nvar, str(orig)), var)
        got = data_tokens(run("ncks", "-H", "-C", "-v", nvar, url(dec)), var)
        compare(name, var, want, got, ncks=True)
        checked += 1
    assert checked >= 5
    text = run("ncdump", url(dec))
    assert '"Aberdeen"' in text and '"Cork"' in text  # the char station names
    assert re.search(r"^ crs = (_|0) ;$", text, re.M)


CDO_ROW = re.compile(r"\d+ : (\S+) (\S+) +(\S+) +(\d+) +(\d+) : +(.*?) +: (\S+)")


def cdo_rows(target: str) -> dict[tuple[str, str, str], list[str]]:
    rows = {}
    for line in run("cdo", "-s", "infon", target).splitlines():
        m = CDO_ROW.fullmatch(line.strip())
        if m is None:
            assert "Parameter name" in line, line
            continue
        date, time, level, size, miss, stats, param = m.groups()
        rows[(f"{date} {time}", level, param)] = [size, miss, *stats.split()]  # min mean max, or the value
    return rows


@pytest.mark.parametrize("name", SETS)
def test_cdo_infon_agrees_with_the_original(cf, name):
    dec, _raw, orig = cf[name]
    got, want = cdo_rows(url(dec)), cdo_rows(str(orig))
    with netCDF4.Dataset(orig) as ds:
        scalars = {v for v, x in ds.variables.items() if x.ndim == 0}
    # a scalar has the dimension _zdim_1 through the view: CDO lists it as a one-point field
    assert want and set(want) == {k for k in got if k[2] not in scalars}
    assert {k[2] for k in got} - {k[2] for k in want} <= scalars
    for key, row in want.items():  # (CDO treats missing_value as missing on the original too)
        assert got[key] == row, (key, got[key], row)
    assert sum(int(r[1]) for r in want.values()) >= 2  # missing values counted


def gdal_stats(dataset: str) -> dict[str, float]:
    out = run("gdalinfo", "-stats", dataset)
    return {k: float(v) for k, v in re.findall(r"STATISTICS_(MINIMUM|MAXIMUM|MEAN|VALID_PERCENT)=(\S+)", out)}


@pytest.mark.parametrize("name, var", [("cf4", "temp"), ("cf3", "wind"), ("combined", "temp")])
def test_gdalinfo_stats_agree_with_the_original(cf, name, var):
    dec, _raw, orig = cf[name]
    got = gdal_stats(f'ZARR:"{dec.path}":/{var}')
    want = gdal_stats(f'NETCDF:"{orig}":{var}')
    assert set(got) >= {"MINIMUM", "MAXIMUM", "MEAN"}, got
    for k in ("MINIMUM", "MAXIMUM", "MEAN"):
        assert got[k] == pytest.approx(want[k], rel=1e-6), (k, got, want)
    info = json.loads(run("gdalmdiminfo", str(dec.path)))
    original = json.loads(run("gdalmdiminfo", str(orig)))
    assert var in info["arrays"] and var in original["arrays"]
    assert [d.rpartition("/")[2] for d in info["arrays"][var]["dimensions"]] == \
        [d.rpartition("/")[2] for d in original["arrays"][var]["dimensions"]]
    assert info["arrays"][var]["datatype"] == original["arrays"][var]["datatype"]


@pytest.mark.parametrize("name", SETS)
def test_xarray_over_the_decoded_mount_equals_the_raw_mount(cf, name):
    dec, raw, _orig = cf[name]
    char = [v for v in xr.open_zarr(raw.path, consolidated=False).variables
            if json.loads((raw.path / v / ".zarray").read_text())["dtype"] == "|S1"]
    assert char, "the corpus has char variables"
    r = xr.open_zarr(raw.path, consolidated=False, drop_variables=char)
    d = xr.open_zarr(dec.path, consolidated=False, drop_variables=char)
    assert set(d.variables) == set(r.variables) - set(char) - LEFT_OUT[name]
    for v in d.variables:
        a, b = d[v].load(), r[v].load()
        if b.ndim == 0:  # a scalar: length-1 dimension _zdim_1 through the decoded view
            assert a.dims == ("_zdim_1",) and a.attrs == b.attrs, (v, a.attrs, b.attrs)
            np.testing.assert_array_equal(a.values[0], b.values)
            continue
        xr.testing.assert_identical(a, b)
    if name == "cf4":
        g = xr.open_zarr(dec.path, group="obs", consolidated=False)
        # a group's dimension (kerchunk: obs/level) is named as netCDF-C shows it
        graw = xr.open_zarr(raw.path, group="obs", consolidated=False).rename({"obs/level": "level"})
        xr.testing.assert_identical(g.load(), graw.load())


def test_xarray_over_http_reads_char_and_left_out_variables_through_consolidated_metadata(cf, serve):
    """``refmount serve -o decode``: its synthesized ``.zmetadata`` is zarr's side of the view
    (char arrays ``|S1``, the variable-length strings netCDF clients do not see): xarray reads the
    whole set, as through the raw mount."""
    _dec, raw, orig = cf["cf4"]
    s = serve(orig.with_suffix(".json"), "decode")
    d = xr.open_zarr(s.url, consolidated=True)
    r = xr.open_zarr(raw.path, consolidated=False)
    assert set(d.variables) == set(r.variables) and "remark" in d and "station_name" in d
    for v in ("station_name", "remark", "temp", "pres", "time"):
        xr.testing.assert_identical(d[v].load(), r[v].load())


def test_fixed_width_strings_read_as_char_with_a_string_length_dimension(mount, tmp_path):
    """An HDF5 fixed-width string dataset (``|S8``: h5py; netCDF has no such type): netCDF-C
    reads it as char with a dimension ``string8``, each chunk listed with ``.0`` added."""
    import h5py
    from support.cfcorpus import kerchunk_refs

    path = tmp_path / "strings.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("names", data=np.array([b"Aberdeen", b"Bergen", b"Cork", b"Dundee"], "S8"),
                             chunks=(2,), compression="gzip")
        d.attrs["long_name"] = "station name"
    ref = tmp_path / "strings.json"
    ref.write_text(json.dumps(kerchunk_refs(path)))
    dec = mount(ref, "decode")
    assert sorted(os.listdir(dec.path / "names")) == [".zarray", ".zattrs", "0.0", "1.0"]
    assert (dec.path / "names" / "1.0").read_bytes() == b"Cork\0\0\0\0Dundee\0\0"
    text = run("ncdump", url(dec))
    assert re.search(r"^\tchar names\(\w+, string8\) ;$", text, re.M), text
    assert data_tokens(text, "names") == ['"Aberdeen"', '"Bergen"', '"Cork"', '"Dundee"']
