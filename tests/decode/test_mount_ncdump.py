"""netCDF-C (Debian's ncdump, NCZarr) reading the mount as a Zarr store.

Debian's netcdf-c 4.9.0 has no zlib filter plugin for NCZarr and byte-swaps big-endian data, so
values are checked (``ncdump -v``) on the uncompressed little-endian variables only; ``-h``
(metadata) is checked for everything."""

from __future__ import annotations

import re
import shutil
import subprocess

import netCDF4
import numpy as np
import pytest
from support.datasets import NCDUMP_VALUE_VARS

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

NC4_ROOT_VARS = {"time", "y", "x", "temp", "counts", "packed", "flags", "precise", "contig",
                 "le_int", "le_float"}
NC3_VARS = {"time", "lat", "lon", "tas", "pr", "wind", "elev", "mask"}


def nczarr_url(mnt) -> str:
    return f"file://{mnt}#mode=zarr,file"


def ncdump(*args: str) -> str:
    exe = shutil.which("ncdump")
    assert exe, "ncdump is not installed (Debian package netcdf-bin)"
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"ncdump {' '.join(args)} failed ({r.returncode}): {r.stderr}"
    return r.stdout


def header_variables(cdl: str) -> dict[str, set[str]]:
    """{group path: variable names} from ncdump -h output."""
    out: dict[str, set[str]] = {}
    stack: list[str] = []
    section = None
    for line in cdl.splitlines():
        s = line.strip()
        if m := re.match(r"group: (\S+) \{", s):
            stack.append(m.group(1))
            section = None
            continue
        if s.startswith("} // group"):
            stack.pop()
            continue
        if s in ("variables:", "dimensions:", "data:") or s.startswith("// global attributes"):
            section = s
            continue
        if section == "variables:" and (m := re.match(r"\w+ (\w+)\(.*\) ;$|\w+ (\w+) ;$", s)):
            out.setdefault("/".join(stack), set()).add(m.group(1) or m.group(2))
    return out


def data_values(cdl: str, var: str) -> np.ndarray:
    m = re.search(r"^\s*" + re.escape(var) + r" =\s*(.*?);", cdl.split("data:", 1)[1],
                  re.S | re.M)
    assert m, f"{var} not in ncdump data section"
    return np.array([float(v) for v in m.group(1).replace("\n", " ").split(",") if v.strip()])


@pytest.mark.parametrize("name", ["nc4_local", "nc4_http"])
def test_ncdump_header_nc4(shared_mounts, name):
    m = shared_mounts.get(name)
    cdl = ncdump("-h", nczarr_url(m))
    groups = header_variables(cdl)
    assert groups[""] == NC4_ROOT_VARS, groups
    assert groups["sub"] == {"z", "inner"}, groups
    assert groups["sub/deeper"] == {"deep16"}, groups
    assert ':title = "refmount test data"' in cdl
    assert 'time:units = "days since 2000-01-01 00:00:00"' in cdl
    assert "packed:scale_factor = 0.01" in cdl
    assert re.search(r"\bfloat temp\(time, y, x\)", cdl), cdl
    assert re.search(r"\bubyte flags\(y, x\)", cdl), cdl
    assert re.search(r"\bint le_int\(y, x\)", cdl), cdl


@pytest.mark.parametrize("name", ["nc3_local", "nc3_http"])
def test_ncdump_header_nc3(shared_mounts, name):
    m = shared_mounts.get(name)
    cdl = ncdump("-h", nczarr_url(m))
    assert header_variables(cdl)[""] == NC3_VARS, cdl
    assert ':history = "made for refmount tests"' in cdl
    assert re.search(r"\bshort pr\(time, lat, lon\)", cdl), cdl


@pytest.mark.parametrize("name", ["nc4_local", "nc4_http"])
def test_ncdump_values_little_endian(shared_mounts, name):
    m = shared_mounts.get(name)
    cdl = ncdump("-v", ",".join(NCDUMP_VALUE_VARS), nczarr_url(m))
    with netCDF4.Dataset(shared_mounts.datasets.nc4) as orig:
        for var in NCDUMP_VALUE_VARS:
            expected = np.asarray(orig[var][:], dtype="f8").ravel()
            got = data_values(cdl, var)
            np.testing.assert_array_equal(got, expected, err_msg=var)
