"""An Icechunk repository (written by xarray and zarr-python through icechunk 1.1.21) through
``-o decode``: netCDF-C (ncdump, CDO, NCO), GDAL and xarray read its Zarr v3 arrays as Zarr v2 —
an xarray Dataset (zstd, ``_FillValue``, coordinates), virtual chunks over a netCDF-4 file that
nginx serves, and a sharded array — and their values equal the data written, the netCDF file's
and icechunk's own store's; ``refmount serve -o decode`` gives xarray the same over HTTP."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from support import icechunk_data as ic
from support.clients import run_client as run
from support.clients import zarr_url as url
from support.v3store import ncdump_values

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

GDAL_ENV = {**os.environ, "GDAL_PAM_ENABLED": "NO"}


@pytest.fixture(scope="module")
def built(tmp_path_factory, nginx, nginx_root) -> ic.Decodable:
    root = tmp_path_factory.mktemp("icechunk-decode") / "repo"
    return ic.build_decodable(root, Path(nginx_root) / "icechunk-decode",
                              base_url="http://127.0.0.1/icechunk-decode")


@pytest.fixture(scope="module")
def authorise(nginx) -> str:
    rule = {"prefix": "http://127.0.0.1/icechunk-decode/", "rewrite": f"{nginx.url}/icechunk-decode/"}
    return "targets=" + json.dumps([rule])


@pytest.fixture(scope="module")
def decoded(built, authorise, tmp_path_factory):
    from support.mounts import Mounter

    mounter = Mounter(tmp_path_factory.mktemp("icechunk-decode-mounts"))
    try:
        yield mounter(built.root, authorise, "decode", "no_disk_cache")
    finally:
        mounter.cleanup()


def icechunk_dataset(built: ic.Decodable) -> xr.Dataset:
    """The repository as icechunk's own store gives it to xarray (virtual chunks left out:
    icechunk 1.1.21 recorded their URL without nginx's port)."""
    import icechunk

    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(built.root)))
    store = repo.readonly_session(snapshot_id=built.snapshot).store
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(store, consolidated=False, zarr_format=3, drop_variables=["virtual"]).load()


def floats(tokens: list[str]) -> list[float]:
    return [np.nan if t == "_" else float(t) for t in tokens]


def test_ncdump_reads_the_repositorys_arrays(decoded, built):
    cdl = run("ncdump", "-h", url(decoded))
    for decl in ("float temp(time, lat, lon) ;", "double time(time) ;", "float virtual(y, x) ;",
                 "short sharded(time, lat, lon) ;", "temp:_FillValue = -9999.f ;",
                 'temp:units = "K" ;', 'time:units = "days since 2000-01-01" ;',
                 ':title = "icechunk through -o decode" ;'):
        assert decl in cdl, (decl, cdl)
    temp = built.dataset["temp"].values
    got = floats(ncdump_values(run("ncdump", "-p", "9,17", "-v", "temp", url(decoded)), "temp"))
    np.testing.assert_allclose(got, temp.ravel(), rtol=1e-6)  # NaN where temp is NaN
    for coord in ("time", "lat", "lon"):
        got = floats(ncdump_values(run("ncdump", "-p", "9,17", "-v", coord, url(decoded)), coord))
        np.testing.assert_allclose(got, built.dataset[coord].values, rtol=1e-12)
    sharded = [int(t) for t in ncdump_values(run("ncdump", "-v", "sharded", url(decoded)), "sharded")]
    assert sharded == built.sharded.ravel().tolist()


def test_the_virtual_array_prints_as_the_netcdf_files_variable(decoded, built):
    original = ncdump_values(run("ncdump", "-v", "v", str(built.netcdf)), "v")
    through = ncdump_values(run("ncdump", "-v", "virtual", url(decoded)), "virtual")
    assert through == original and len(original) == ic.ROWS * ic.COLS


CDO_ROW = re.compile(r"\d+ : (\S+) (\S+) +(\S+) +(\d+) +(\d+) :(.*): (\S+)")


def test_cdo_and_ncks_read_the_compressed_and_sharded_arrays(decoded, built):
    rows = [CDO_ROW.fullmatch(line.strip()) for line in run("cdo", "-s", "infon", url(decoded)).splitlines()]
    stats: dict[str, list] = {}
    for m in filter(None, rows):
        numbers = [float(v) for v in m.group(6).split()]
        stats.setdefault(m.group(7), []).append((int(m.group(5)), numbers[0], numbers[2]))
    temp = built.dataset["temp"].values
    assert [s[0] for s in stats["temp"]] == [int(np.isnan(t).sum()) for t in temp]
    for (_miss, lo, hi), t in zip(stats["temp"], temp, strict=True):
        assert (lo, hi) == pytest.approx((np.nanmin(t), np.nanmax(t)), rel=1e-4)
    text = run("ncks", "-H", "-C", "-v", "sharded", url(decoded))
    assert [int(t) for t in ncdump_values(text, "sharded")] == built.sharded.ravel().tolist()


def test_gdal_reads_the_decoded_repository(decoded, built, tmp_path):
    info = json.loads(run("gdalmdiminfo", str(decoded), env=GDAL_ENV))
    assert {"temp", "sharded", "virtual", "time", "lat", "lon"} <= set(info["arrays"])
    dims = [d.rpartition("/")[2] for d in info["arrays"]["temp"]["dimensions"]]
    assert dims == ["time", "lat", "lon"]
    for name, array, dtype, want in (("virtual", "/virtual", "<f4", ncdump_file_values(built)),
                                     ("sharded", "/sharded:2", "<i2", built.sharded[2]),
                                     ("temp", "/temp:0", "<f4", built.dataset["temp"].values[0])):
        out = tmp_path / f"{name}.bin"
        run("gdal_translate", "-q", "-of", "ENVI", f'ZARR:"{decoded}":{array}', str(out), env=GDAL_ENV)
        np.testing.assert_array_equal(np.fromfile(out, dtype).reshape(want.shape), want)


def ncdump_file_values(built: ic.Decodable) -> np.ndarray:
    import netCDF4

    with netCDF4.Dataset(built.netcdf) as ds:
        return np.asarray(ds["v"][...])


def decoded_dataset(store: object, consolidated: bool, built: ic.Decodable) -> xr.Dataset:
    """xarray's read of the decoded view at ``store``, checked against icechunk's own read of
    the repository and, for the virtual array, against the original netCDF file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = xr.open_zarr(store, consolidated=consolidated, zarr_format=2).load()
    xr.testing.assert_identical(got.drop_vars("virtual"), icechunk_dataset(built))
    np.testing.assert_array_equal(got["virtual"].values, ncdump_file_values(built))
    return got


def test_xarray_over_the_decoded_mount_equals_icechunks_store(decoded, built):
    got = decoded_dataset(decoded.path, False, built)
    np.testing.assert_array_equal(got["temp"].values, built.dataset["temp"].values)


def test_serve_decode_gives_xarray_the_repository_over_http(built, authorise, serve):
    s = serve(built.root, authorise, "decode")
    decoded_dataset(s.url, True, built)
    # the consolidated metadata holds the v2 view's documents, each as served on its own
    consolidated = json.loads(s.request("GET", "/.zmetadata").body)["metadata"]
    assert {".zgroup", ".zattrs", "temp/.zarray", "temp/.zattrs", "sharded/.zarray", "virtual/.zarray",
            "time/.zarray"} <= set(consolidated)
    assert not any(k.endswith("zarr.json") for k in consolidated)
    for key in ("temp/.zarray", "temp/.zattrs", "sharded/.zarray", ".zattrs"):
        assert consolidated[key] == json.loads(s.request("GET", f"/{key}").body), key
    assert consolidated["temp/.zattrs"]["_ARRAY_DIMENSIONS"] == ["time", "lat", "lon"]


def test_serve_without_decode_synthesizes_no_v2_zmetadata(built, authorise, serve):
    s = serve(built.root, authorise)
    assert s.request("GET", "/.zmetadata").status == 404
    assert s.request("GET", "/zarr.json").status == 200
    assert b".zmetadata" not in s.request("GET", "/").body
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # zarr warns of an object it does not recognise (a v2 .zmetadata in a v3 group)
        warnings.filterwarnings("error", message=".*not recognized.*")
        got = xr.open_zarr(s.url.rstrip("/"), zarr_format=3, consolidated=False).load()
    np.testing.assert_array_equal(got["temp"].values, built.dataset["temp"].values)
