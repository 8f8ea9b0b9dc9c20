"""Icechunk repositories and Zarr v3 stores made the ways people make them
(``support/icechunkcorpus.py``: xarray ``to_zarr`` into icechunk sessions, VirtualiZarr
``to_icechunk`` of netCDF4 files, a zarr-python 3 sharded store as a v3 JSON set) through every
front end — the mount, ``-o decode``, ``refmount serve`` (the README's URL, trailing slash
included, ``consolidated`` True and False) and ``serve -o decode`` — read by zarr/xarray,
ncdump and ncks, the values compared with the data written."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from support import icechunkcorpus as corpus
from support.clients import run_client as run
from support.clients import zarr_url
from support.mounts import Mounter
from support.serving import Servers
from support.v3store import ncdump_values

pytestmark = [pytest.mark.fuse, pytest.mark.long(120), pytest.mark.timeout(900)]

SETS = ("xarray", "virtualizarr", "sharded")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, corpus.Repo]:
    pytest.importorskip("icechunk")
    base = tmp_path_factory.mktemp("producers-icechunk")
    return {
        "xarray": corpus.xarray_repo(base / "xarray-repo"),
        "virtualizarr": corpus.virtualizarr_repo(base / "vz-repo", base / "netcdf"),
        "sharded": corpus.sharded_store(base / "v3" / "store", base / "v3" / "refs.json"),
    }


def options(repo: corpus.Repo) -> list[str]:
    return [f"allow_local={repo.files}"] if repo.files is not None else []


@pytest.fixture(scope="module")
def mounter(tmp_path_factory):
    m = Mounter(tmp_path_factory.mktemp("producers-icechunk-mounts"))
    try:
        yield m
    finally:
        m.cleanup()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = Servers(tmp_path_factory.mktemp("producers-icechunk-serve"))
    try:
        yield s
    finally:
        s.cleanup()


def opened(url: str, *, decoded: bool = False, **kwargs) -> xr.Dataset:
    """``decoded``: the v2 view without its ``.zmetadata``, where zarr reads a netCDF char
    array (``<U1``) as four bytes a character (docs/semantics.md): left out."""
    if decoded and not kwargs.get("consolidated"):
        kwargs["drop_variables"] = ["station_name"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(url, decode_times=False, **kwargs).load()


def same(ds: xr.Dataset, want: xr.Dataset, *, char: bool = True) -> None:
    """The values xarray decoded equal the data written (packed temp as stored)."""
    np.testing.assert_allclose(ds["temp"].values, want["temp"].values, rtol=1e-6, equal_nan=True)
    for name in ("time", "lat", "lon"):
        np.testing.assert_array_equal(ds[name].values, want[name].values)
    assert np.asarray(ds["crs"].values).item() == 0  # never written: the fill value
    assert ds["crs"].attrs["grid_mapping_name"] == "latitude_longitude"
    if char and "station_name" in want:
        got = np.asarray(ds["station_name"].values)  # xarray joins a char dimension's bytes
        rows = [b"".join(r) if got.ndim == 2 else r for r in got.tolist()]
        assert [bytes(r).rstrip() for r in rows] == [b"".join(r).rstrip()
                                                    for r in want["station_name"].values.tolist()]


@pytest.mark.parametrize("name", SETS)
def test_the_mount_gives_xarray_the_data_written(made, mounter, name) -> None:
    repo = made[name]
    m = mounter(repo.root, *options(repo))
    same(opened(str(m.path), zarr_format=3, consolidated=False), repo.expected)


@pytest.mark.parametrize("name", SETS)
def test_decode_gives_ncdump_ncks_and_xarray_the_data_written(made, mounter, name, tmp_path) -> None:
    """A never-written 0-d ``crs`` through ``-o decode``: ncdump and ncks read it (it was EIO)."""
    repo = made[name]
    m = mounter(repo.root, "decode", *options(repo))
    url = zarr_url(m.path)
    assert re.search(r"crs = 0 ;", run("ncdump", "-v", "crs", url))
    temp = ncdump_values(run("ncdump", "-p", "9,17", "-v", "temp", url), "temp")
    stored = [-32768 if t == "_" else int(t) for t in temp]  # the packed shorts as stored
    want = np.round((repo.expected["temp"].values.ravel() - 270.0) / 0.01)
    assert stored == np.where(np.isnan(want), -32768, want).astype(int).tolist()
    out = tmp_path / "copy.nc"
    run("ncks", "-O", "-v", "temp,crs", url, str(out))  # NCO pulls crs in as temp's grid_mapping
    with xr.open_dataset(out, decode_times=False) as copy:
        np.testing.assert_allclose(copy["temp"].values, repo.expected["temp"].values, rtol=1e-6,
                                   equal_nan=True)
        assert np.asarray(copy["crs"].values).item() == 0
    same(opened(str(m.path), decoded=True, consolidated=False), repo.expected, char=False)


@pytest.mark.parametrize("name", SETS)
def test_serve_with_the_readmes_url_gives_the_data_written(made, servers, name) -> None:
    """``http://host:port/`` as the README gives it: zarr lists ``http://host:port//``."""
    repo = made[name]
    s = servers(repo.root, *options(repo))
    assert s.url.endswith("/")
    same(opened(s.url, zarr_format=3, consolidated=False), repo.expected)
    assert s.stats()["errors"] == 0


@pytest.mark.parametrize("consolidated", [True, False])
@pytest.mark.parametrize("name", SETS)
def test_serve_decode_gives_xarray_the_data_written(made, servers, name, consolidated) -> None:
    repo = made[name]
    s = servers(repo.root, "decode", "cors=*", *options(repo))
    same(opened(s.url, decoded=True, consolidated=consolidated), repo.expected, char=consolidated)
    stats = s.stats()
    assert stats["errors"] == 0 and "500" not in stats["http_status"], stats


@pytest.mark.parametrize(("option", "snapshot"), [("tag=v1", "first"), ("branch=dev", "dev")])
def test_a_tag_and_a_branch_written_by_xarray(made, mounter, option, snapshot) -> None:
    repo = made["xarray"]
    m = mounter(repo.root, "decode", option)
    ds = opened(str(m.path), decoded=True, consolidated=False)
    want = repo.dev_expected if snapshot == "dev" else repo.expected.isel(time=slice(0, corpus.NT // 2))
    assert want is not None
    np.testing.assert_allclose(ds["temp"].values, want["temp"].values, rtol=1e-6, equal_nan=True)
    assert np.asarray(ds["crs"].values).item() == 0


def test_virtual_chunks_are_listed_and_refused_with_the_option_that_authorises_them(made,
                                                                                   mounter) -> None:
    """Without ``allow_local``: one warning at start names the container and the option; the
    chunks list and stat (``ls -la``), reading one is EIO, the repository's own chunks read."""
    import subprocess

    repo = made["virtualizarr"]
    m = mounter(repo.root)
    assert f"-o allow_local={repo.files}" in m.log_text()
    listing = subprocess.run(["ls", "-la", str(m.path / "temp" / "c" / "0" / "0")],
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "Input/output error" not in listing.stderr, listing
    chunk = next(p for p in (m.path / "temp" / "c").rglob("*") if p.is_file())
    with pytest.raises(OSError):
        chunk.read_bytes()
    assert Path(m.path / "time" / "c" / "0").read_bytes()  # a native chunk


def test_a_catalogue_merges_empty_path_components_too(made, servers, tmp_path) -> None:
    import shutil

    refs = made["sharded"].root
    catalogue = tmp_path / "catalogue"
    catalogue.mkdir()
    shutil.copy(refs, catalogue / "one.json")
    s = servers(catalogue, "catalog", f"allow_local={tmp_path}:{refs.parent}")
    for path in ("/one/zarr.json", "//one//zarr.json", "/one//crs//zarr.json", "//one//", "//"):
        assert s.request("GET", path).status == 200, path
    assert s.request("GET", "//one/temp").status == 301
