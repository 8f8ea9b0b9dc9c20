"""Reference sets as other projects write them.

- GDAL's autotest Parquet sets name their targets relative to the record files (``x/0`` ->
  ``0.bin`` beside ``x/refs.0.parq``), some rows without a size, some with ``..``.
- kerchunk's FITS converter gives a tile-compressed image the length of the uncompressed one,
  a range that runs past the end of the file; VirtualiZarr's GRIB1 output gives a chunk a
  length of 1,654,587,264 on a 1,056-byte file. fsspec serves the bytes that exist, and so
  does the mount (local files and HTTP alike), while a short answer to a range inside its
  target stays EIO.
"""

from __future__ import annotations

import errno
import json
import os
import zlib
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xarray as xr
from support.datasets import write_json
from support.paths import read_or_errno, walk
from support.servers import free_port

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

ZARRAY = {"zarr_format": 2, "chunks": [1], "dtype": "|u1", "compressor": None, "filters": None,
          "fill_value": 0, "order": "C"}


def log_lines(m, needle: str) -> list[str]:
    return [ln for ln in m.log.read_text(errors="replace").splitlines() if needle in ln]


def over_fsspec(refs: dict, **kw) -> xr.Dataset:
    """xarray over fsspec's ReferenceFileSystem (zarr wants its HTTP targets asynchronous)."""
    options = {"fo": refs}
    if any(isinstance(v, list) and v[0].startswith("http") for v in refs["refs"].values()):
        options |= {"remote_protocol": "http", "remote_options": {"asynchronous": True}}
    return xr.open_dataset("reference://", engine="zarr", consolidated=False,
                           backend_kwargs={"storage_options": options}, **kw)


# --- Parquet directories: relative targets beside the record files --------------------------------


def _record(path: Path, rows: list[tuple[str | None, int | None, int | None]]) -> None:
    """A record file as GDAL's autotest writes them (path, offset, size, raw; nulls allowed)."""
    paths, offsets, sizes = zip(*rows, strict=True)
    pq.write_table(pa.table({"path": pa.array(paths, pa.string()),
                             "offset": pa.array(offsets, pa.int64()),
                             "size": pa.array(sizes, pa.int64()),
                             "raw": pa.nulls(len(rows), pa.binary())}), path)


def gdal_layout(top: Path) -> Path:
    """``top/set``: array ``x`` whose chunks are files beside its record file, named relative
    to it (one row without offset or size, one with ``..``, one from an offset with no size,
    one as ``file://relative``), one under ``~`` (HOME is ``set/home``), and array ``esc``
    whose chunks leave the set's directory or name no file. Decoys with other bytes lie where
    a wrong rule would look (the set's directory and its parent, ``x/~``)."""
    root = top / "set"
    (root / "x").mkdir(parents=True)
    (root / "esc").mkdir()
    write_json(root / ".zmetadata", {"record_size": 10, "metadata": {
        ".zgroup": {"zarr_format": 2}, ".zattrs": {},
        "x/.zarray": {**ZARRAY, "shape": [6]}, "x/.zattrs": {"_ARRAY_DIMENSIONS": ["i"]},
        "esc/.zarray": {**ZARRAY, "shape": [2]}, "esc/.zattrs": {"_ARRAY_DIMENSIONS": ["j"]},
    }})
    for name, data in {"0.bin": b"\x01", "1.bin": b"\x02", "2.bin": b"\x03", "3.bin": b"ab\x04"}.items():
        (root / "x" / name).write_bytes(data)
        (root / name).write_bytes(b"\xee" * len(data))  # decoys
        (top / name).write_bytes(b"\xdd" * len(data))
    (top / "outside.bin").write_bytes(b"\x09")
    _record(root / "x" / "refs.0.parq", [
        ("0.bin", 0, 1),
        ("1.bin", None, None),  # no size: the whole target (GDAL's parquet_ref_0_dim_missing_size)
        ("../x/2.bin", 0, 1),  # GDAL's parquet_ref_0_dim_path_dot_dot
        ("3.bin", 2, None),  # no size: from the offset to the end of the target
        ("file://0.bin", 0, 1),  # a relative file:// URL: the same rule
        ("~/h.bin", 0, 1),  # the home directory's
    ])
    (root / "home").mkdir()
    (root / "home" / "h.bin").write_bytes(b"\x06")
    (root / "x" / "~").mkdir()
    (root / "x" / "~" / "h.bin").write_bytes(b"\xee")  # decoy
    _record(root / "esc" / "refs.0.parq", [("../../outside.bin", 0, 1),
                                           ("missing.bin", None, None)])  # no size, no target
    return root


def test_parquet_directory_relative_targets_resolve_beside_the_record_files(mount, tmp_path,
                                                                          monkeypatch):
    root = gdal_layout(tmp_path)
    monkeypatch.setenv("HOME", str(root / "home"))
    # A shared mount reads local files only in the set's own directory (by default).
    m = mount(root, "allow_other", "no_disk_cache")
    files, _dirs = walk(m.path)
    assert {"x/0", "x/1", "x/2", "x/3", "x/4", "x/5", "esc/0", "esc/1"} <= files
    for key in sorted(files):  # every listed entry stats (`ls -l` shows no ?????????)
        os.stat(m / key)
    want = {"x/0": b"\x01", "x/1": b"\x02", "x/2": b"\x03", "x/3": b"\x04", "x/4": b"\x01",
            "x/5": b"\x06"}
    for key, data in want.items():
        assert read_or_errno(m / key) == data, key
        assert os.stat(m / key).st_size == len(data), key
    with xr.open_zarr(str(m), consolidated=False) as ds:
        assert ds.x.values.tolist() == [1, 2, 3, 4, 1, 6]
    # leaving the set's directory: refused like any local file outside allow_local
    assert read_or_errno(m / "esc/0") == errno.EIO
    assert log_lines(m, "outside the allowed directories")
    # no size and no target: it stats (size unknown: 0), and opening it fails
    assert os.stat(m / "esc/1").st_size == 0
    assert read_or_errno(m / "esc/1") == errno.EIO
    assert log_lines(m, "size of key esc/1")

    # The same set named by its .zmetadata: the same rule, the same bytes.
    m2 = mount(root / ".zmetadata", "no_disk_cache")
    for key, data in want.items():
        assert read_or_errno(m2 / key) == data, key


# --- ranges longer than their target ------------------------------------------------------------


def make_fits(path: Path) -> np.ndarray:
    """A FITS file with a plain image (primary HDU) and a tile-compressed one."""
    from astropy.io import fits

    plain = (np.arange(40 * 50, dtype=">i2") % 1000).reshape(40, 50)
    image = (np.arange(300 * 220, dtype="f4") % 17).reshape(300, 220)
    fits.HDUList([fits.PrimaryHDU(plain),
                  fits.CompImageHDU(image, compression_type="RICE_1", name="COMP")]).writeto(path)
    return plain


def rewrite(refs: dict, old: str, new: str) -> dict:
    out = json.loads(json.dumps(refs))
    for v in out["refs"].values():
        if isinstance(v, list) and v[0] == old:
            v[0] = new
    return out


@pytest.mark.parametrize("where", ["local", "http"])
def test_fits_through_kerchunk_reads_as_over_fsspec(mount, tmp_path, nginx, nginx_root, where):
    import kerchunk.fits

    top = tmp_path if where == "local" else nginx_root / f"fits-{tmp_path.name}"
    top.mkdir(exist_ok=True)
    fits_path = top / "comp.fits"
    plain = make_fits(fits_path)
    made = kerchunk.fits.process_file(str(fits_path), extension=[0, 1])
    refs = {"version": 1, "refs": {k: v.decode() if isinstance(v, bytes) else v for k, v in made.items()}}
    if where == "http":
        refs = rewrite(refs, str(fits_path), f"{nginx.url}/{fits_path.relative_to(nginx_root)}")
    _url, offset, length = refs["refs"]["COMP/0.0"]
    size = fits_path.stat().st_size
    assert offset < size < offset + length, "kerchunk's range no longer runs past the end"
    src = write_json(tmp_path / "fits.json", refs)
    m = mount(src, "no_disk_cache")

    assert os.stat(m / "COMP/0.0").st_size == length  # stated, until a read learns otherwise
    fs = fsspec.filesystem("reference", fo=refs)
    for key in ("PRIMARY/0.0", "COMP/0.0", "COMP/.zarray"):
        assert read_or_errno(m / key) == fs.cat(key), key
    assert os.stat(m / "COMP/0.0").st_size == size - offset  # corrected once known
    assert len(log_lines(m, "key COMP/0.0: bytes")) == 1, m.log_text(30)

    # kerchunk gives both images the dimensions (y, x): one variable at a time
    with over_fsspec(refs, drop_variables=["COMP"]) as a, \
            xr.open_zarr(str(m), consolidated=False, drop_variables=["COMP"]) as b:
        xr.testing.assert_identical(a.load(), b.load())
        np.testing.assert_array_equal(np.nan_to_num(b.PRIMARY.values), plain)  # 0 is the fill value
    errors = []
    with over_fsspec(refs, drop_variables=["PRIMARY"]) as a, \
            xr.open_zarr(str(m), consolidated=False, drop_variables=["PRIMARY"]) as b:
        for ds in (a, b):  # raw RICE-compressed bytes: neither reader can shape them
            try:
                ds.COMP.values  # noqa: B018
            except ValueError as e:
                errors.append(str(e))
    assert len(errors) == 2 and errors[0] == errors[1], errors


GRIB_LENGTH = 1_654_587_264  # VirtualiZarr's GRIB1 length on a 1,056-byte file


def long_ranges(top: Path | None, base: str, put=None) -> tuple[dict, dict[str, bytes], np.ndarray]:
    """A zlib chunk referenced with VirtualiZarr's GRIB1 length (read in blocks), another with
    a length a few times its file (fetched whole), a range that starts past the end, and a
    range inside its target."""
    values = np.arange(32 * 32, dtype="<f4").reshape(32, 32) / 7
    files = {"grib.bin": zlib.compress(values.tobytes()),
             "small.bin": zlib.compress((values * 2).tobytes()),
             "plain.bin": bytes(range(256)) * 4}
    for name, data in files.items():
        if put is not None:
            put(name, data)
        else:
            (top / name).write_bytes(data)
    zarray = {"zarr_format": 2, "shape": [32, 32], "chunks": [32, 32], "dtype": "<f4",
              "compressor": {"id": "zlib", "level": 1}, "filters": None, "fill_value": None,
              "order": "C"}
    refs = {"version": 1, "refs": {
        ".zgroup": json.dumps({"zarr_format": 2}), "raw/.zgroup": json.dumps({"zarr_format": 2}),
        "grib/.zarray": json.dumps(zarray), "grib/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]}),
        "grib/0.0": [f"{base}/grib.bin", 0, GRIB_LENGTH],
        "small/.zarray": json.dumps(zarray), "small/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]}),
        "small/0.0": [f"{base}/small.bin", 0, 4 * len(files["small.bin"])],
        "raw/tail": [f"{base}/plain.bin", 1000, 100],  # 24 bytes exist
        "raw/beyond": [f"{base}/plain.bin", 2000, 10],  # none exist
        "raw/inside": [f"{base}/plain.bin", 100, 500],
    }}
    want = {"grib/0.0": files["grib.bin"], "small/0.0": files["small.bin"],
            "raw/tail": files["plain.bin"][1000:], "raw/beyond": b"",
            "raw/inside": files["plain.bin"][100:600]}
    return refs, want, values


@pytest.mark.parametrize("where", ["local", "http"])
def test_ranges_past_the_end_serve_the_bytes_that_exist(mount, tmp_path, srv, where):
    top = tmp_path if where == "local" else srv.root
    base = str(top) if where == "local" else srv.url
    refs, want, values = long_ranges(top, base)
    m = mount(write_json(tmp_path / "refs.json", refs), "no_disk_cache", "retries=3")
    assert os.stat(m / "grib/0.0").st_size == GRIB_LENGTH
    for key in ("grib/0.0", "raw/tail"):  # settled at open, before the kernel sends a READ
        with open(m / key, "rb") as f:
            assert os.fstat(f.fileno()).st_size == len(want[key]), key
    for key, data in want.items():
        assert read_or_errno(m / key) == data, key
        assert os.stat(m / key).st_size == len(data), key
    with xr.open_zarr(str(m), consolidated=False) as b:
        mounted = b.load()
    for key in ("grib/0.0", "small/0.0", "raw/tail", "raw/beyond"):
        assert len(log_lines(m, f"key {key}: bytes")) == 1, (key, m.log_text(30))
    assert not log_lines(m, "retry"), "a range past the end was retried"
    if where == "http":
        # one request per range (416 for the one that starts past the end), then the size is known
        assert srv.count("/grib.bin") == 1 and srv.count("/small.bin") == 1, srv.log()
    with over_fsspec(refs) as a:
        xr.testing.assert_identical(a.load(), mounted)
    np.testing.assert_array_equal(mounted.grib.values, values)
    np.testing.assert_array_equal(mounted.small.values, values * 2)


def test_a_short_answer_inside_the_target_stays_eio(mount, tmp_path, srv):
    refs, want, _ = long_ranges(srv.root, srv.url)
    srv.add_fault("/plain.bin", "short", times=None, fraction=0.5)
    m = mount(write_json(tmp_path / "refs.json", refs), "no_disk_cache", "retries=2")
    assert read_or_errno(m / "raw/inside") == errno.EIO
    assert srv.count("/plain.bin") >= 3  # retried, then refused: never served short
    assert os.stat(m / "raw/inside").st_size == 500
    # a range past the end answered short is refused too (the body is not all that exists)
    assert read_or_errno(m / "raw/tail") == errno.EIO
    assert read_or_errno(m / "grib/0.0") == want["grib/0.0"]  # other targets unaffected


@pytest.fixture
def s3(tmp_path):
    """moto's S3 server on loopback, and the s3fs options that reach it."""
    import s3fs
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {"key": "test", "secret": "test", "client_kwargs": {
        "endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"}}
    try:
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("refs-bucket")
        yield fs, options
    finally:
        server.stop()


def test_ranges_past_the_end_over_s3(mount, tmp_path, s3):
    """s3 tells neither where the target ends in a short answer nor in the error for a range
    that starts past it: the target's size (a HEAD) decides."""
    fs, options = s3
    refs, want, values = long_ranges(None, "s3://refs-bucket",
                                     put=lambda name, data: fs.pipe(f"refs-bucket/{name}", data))
    m = mount(write_json(tmp_path / "refs.json", refs), "no_disk_cache", "retries=3",
              f"remote_options={json.dumps(options)}")
    for key, data in want.items():
        assert read_or_errno(m / key) == data, key
        assert os.stat(m / key).st_size == len(data), key
    with xr.open_zarr(str(m), consolidated=False) as b:
        np.testing.assert_array_equal(b.grib.values, values)
        np.testing.assert_array_equal(b.small.values, values * 2)
    assert not log_lines(m, "retry"), "a range past the end was retried"
