"""A virtual chunk whose target answers 404 is an error, never the array's fill value: EIO
through a mount (raw and ``-o decode``), 502 over ``refmount serve`` (raw and decoded), so
that zarr, xarray and netCDF-C fail the read instead of returning fill values (GDAL's
OSGeo/gdal#14829 list). The repository is written by icechunk 1.1.21 (support/icechunk_data.py),
its netCDF file served by nginx and then removed."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import zarr
from support import icechunk_data as ic

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

BASE = "http://127.0.0.1/icechunk-gone"


@pytest.fixture(scope="module")
def gone(tmp_path_factory, nginx, nginx_root) -> tuple[ic.Built, str]:
    files = Path(nginx_root) / "icechunk-gone"
    built = ic.build_repository(tmp_path_factory.mktemp("icechunk-gone") / "repo", files, BASE,
                                checksum=False)
    built.netcdf.unlink()  # nginx now answers 404 for every virtual chunk
    rule = {"prefix": f"{BASE}/", "rewrite": f"{nginx.url}/icechunk-gone/"}
    return built, "targets=" + json.dumps([rule])


def test_a_404_virtual_chunk_is_eio_through_a_mount(mount, gone) -> None:
    built, authorise = gone
    m = mount(built.root, authorise, "no_disk_cache", "retries=0")
    assert (m / "native/c/0/0").read_bytes()
    with pytest.raises(OSError) as info:
        (m / "virtual/c/0/0").read_bytes()
    assert info.value.errno == errno.EIO
    with pytest.raises(OSError):  # zarr does not take it for a missing chunk (fill values)
        zarr.open_array(str(m / "virtual"), mode="r", zarr_format=3)[...]
    log = m.log_text()
    assert "virtual.nc" in log and "FileNotFoundError" in log


def test_a_404_virtual_chunk_is_eio_through_decode(mount, gone) -> None:
    built, authorise = gone
    m = mount(built.root, authorise, "decode", "no_disk_cache", "retries=0")
    assert (m / "native/0.0").read_bytes()
    with pytest.raises(OSError) as info:
        (m / "virtual/0.0").read_bytes()
    assert info.value.errno == errno.EIO
    with pytest.raises(OSError):
        zarr.open_array(str(m / "virtual"), mode="r", zarr_format=2)[...]


@pytest.mark.parametrize("decode", [False, True])
def test_a_404_virtual_chunk_is_502_over_serve(serve, gone, decode) -> None:
    built, authorise = gone
    s = serve(built.root, authorise, "retries=0", *(["decode"] if decode else []))
    native, virtual = ("/native/0.0", "/virtual/0.0") if decode else ("/native/c/0/0", "/virtual/c/0/0")
    assert s.request("GET", native).status == 200
    assert s.request("GET", virtual).status == 502
