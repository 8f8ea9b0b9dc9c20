"""``-o decode`` read by real clients: ncdump (NCZarr), GDAL, xarray, each compared with the
original file's values; arrays that cannot be decoded; corrupt chunks; Parquet and Version 1."""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import subprocess
import zlib
from pathlib import Path

import netCDF4
import numcodecs
import numpy as np
import pytest
import xarray as xr
from support.clients import run_client as run
from support.clients import zarr_url as url
from support.datasets import write_json
from support.mounts import run_cli
from support.xrcompare import netcdf_dims

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

GDAL_ENV = {**os.environ, "GDAL_PAM_ENABLED": "NO"}  # no .aux.xml next to a read-only mount


def ncdump_values(mnt, var: str) -> list[str]:
    """The values ``ncdump -v`` prints for ``var`` (a path like /sub/inner), as tokens."""
    cdl = run("ncdump", "-p", "9,17", "-v", var, url(mnt))
    name = var.rsplit("/", 1)[-1]
    m = re.search(r"^\s*" + re.escape(name) + r" =\s*(.*?);", cdl.split("data:", 1)[1], re.S | re.M)
    assert m, f"{var} not in ncdump's data section:\n{cdl[-1500:]}"
    return [t.strip() for t in m.group(1).replace("\n", " ").split(",") if t.strip()]


def check_ncdump(mnt, var: str, expected: np.ndarray, fill) -> None:
    """Every value ncdump prints equals the original's (``_``: the original holds the fill)."""
    tokens = ncdump_values(mnt, var)
    flat = np.asarray(expected).ravel()
    assert len(tokens) == flat.size, (var, len(tokens), flat.size)
    filled = np.array([t == "_" for t in tokens])
    got = np.array([0 if t == "_" else float(t) for t in tokens]).astype(flat.dtype)
    np.testing.assert_array_equal(got[~filled], flat[~filled], err_msg=var)
    if filled.any():
        assert fill is not None, (var, "ncdump shows fill values, the variable has none")
        np.testing.assert_array_equal(flat[filled], np.full(filled.sum(), fill, flat.dtype), err_msg=var)


def nc_variables(path: Path):
    """(name, or a path like /sub/inner in a group; raw values; fill value) of every numeric
    variable of a netCDF file. The fill value is what kerchunk records as ``fill_value``:
    ``_FillValue``, else (netCDF3) ``missing_value``; the decoded view's ``_FillValue``."""
    out = []
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)

        def walk(group, prefix):
            for name, v in group.variables.items():
                if v.dtype.kind in "iuf":
                    fill = next((v.getncattr(a) for a in ("_FillValue", "missing_value")
                                 if a in v.ncattrs()), None)
                    out.append((f"{prefix}/{name}" if prefix else name, np.asarray(v[:]), fill))
            for gname, g in group.groups.items():
                walk(g, f"{prefix}/{gname}")

        walk(ds, "")
    return out


# --- netCDF4 (shuffle + zlib, nested groups) and big-endian netCDF3 -------------------------------


@pytest.mark.parametrize("name, attr", [("nc4_local", "nc4"), ("nc3_local", "nc3")])
def test_ncdump_reads_every_variable_through_decode(shared_mounts, name, attr):
    m = shared_mounts.get(name, "decode")
    variables = nc_variables(getattr(shared_mounts.datasets, attr))
    assert len(variables) >= 7
    for var, values, fill in variables:
        check_ncdump(m, var, values, fill)
    # the raw mount still serves the stored bytes and metadata: nothing changes without -o decode
    raw = shared_mounts.get(name)
    refs = shared_mounts.datasets.load(name)
    for key in ("temp/.zarray", "temp/0.0.0") if attr == "nc4" else ("tas/.zarray", "tas/0.0.0"):
        assert (raw / key).read_bytes() == shared_mounts.datasets.expected_bytes(refs[key])
    zarray = json.loads((m / ("temp/.zarray" if attr == "nc4" else "tas/.zarray")).read_text())
    assert zarray["compressor"] is None and zarray["filters"] is None
    assert zarray["dtype"] == "<f4"


def assert_sizes_are_bytes(mnt) -> int:
    """Every file's st_size equals the bytes a read gives; returns the number of files."""
    n = 0
    for dirpath, _dirs, files in os.walk(mnt):
        for f in files:
            p = os.path.join(dirpath, f)
            size = os.stat(p).st_size
            with open(p, "rb") as fh:
                data = fh.read()
            assert len(data) == size, (p, size, len(data))
            n += 1
    return n


def assert_same_dataset(a: xr.Dataset, b: xr.Dataset) -> None:
    assert set(a.data_vars) == set(b.data_vars)
    for v in a.data_vars:
        xr.testing.assert_identical(a[v].load(), b[v].load())


@pytest.mark.parametrize("name, attr", [("nc4_local", "nc4"), ("nc3_local", "nc3")])
def test_xarray_through_decode_equals_raw_mount_and_original(shared_mounts, name, attr):
    dec, raw = shared_mounts.get(name, "decode"), shared_mounts.get(name)
    original = shared_mounts.datasets.__dict__[attr]
    assert assert_sizes_are_bytes(dec) > 10
    groups = [None, "sub", "sub/deeper"] if attr == "nc4" else [None]
    for group in groups:
        d = xr.open_zarr(dec, group=group, consolidated=False)
        r = netcdf_dims(xr.open_zarr(raw, group=group, consolidated=False))
        o = xr.open_dataset(original, group=group)
        assert_same_dataset(d, r)
        assert_like_original(d, o)


def assert_like_original(d: xr.Dataset, o: xr.Dataset) -> None:
    """Every variable of the original file (data or coordinate) has its values (kerchunk
    names the dimensions of nested groups by their path)."""
    assert set(o.variables) <= set(d.variables), (set(o.variables), set(d.variables))
    for v in o.variables:
        np.testing.assert_array_equal(d[v].values, o[v].values, err_msg=v)


def gdal_slice(mnt, array: str, tmp_path: Path, shape: tuple[int, int], dtype: str) -> np.ndarray:
    """``gdal_translate`` of a 2-D (slice of an) array to raw ENVI, read back."""
    out = tmp_path / (re.sub(r"\W", "_", array) + ".bin")
    run("gdal_translate", "-q", "-of", "ENVI", f'ZARR:"{mnt}":{array}', str(out), env=GDAL_ENV)
    return np.fromfile(out, np.dtype(dtype).newbyteorder("<")).reshape(shape)


def gdal_stats(mnt, array: str) -> dict[str, float]:
    text = run("gdalinfo", "-stats", f'ZARR:"{mnt}":{array}', env=GDAL_ENV)
    return {k.lower(): float(v) for k, v in re.findall(r"STATISTICS_(MINIMUM|MAXIMUM|MEAN)=(\S+)", text)}


def test_gdal_reads_compressed_and_big_endian_arrays(shared_mounts, tmp_path):
    ds = shared_mounts.datasets
    nc4, nc3 = shared_mounts.get("nc4_local", "decode"), shared_mounts.get("nc3_local", "decode")
    with netCDF4.Dataset(ds.nc4) as f:
        f.set_auto_maskandscale(False)
        temp, precise, flags = f["temp"][:], f["precise"][:], f["flags"][:]
    with netCDF4.Dataset(ds.nc3) as f:
        f.set_auto_maskandscale(False)
        tas = f["tas"][:]
    for t in (0, 1, 5):  # 3-D shuffle+zlib float32, slices along time (1 holds fill values)
        np.testing.assert_array_equal(gdal_slice(nc4, f"/temp:{t}", tmp_path, (20, 30), "f4"), temp[t])
    np.testing.assert_array_equal(gdal_slice(nc4, "/precise", tmp_path, (6, 30), "f8"), precise)
    np.testing.assert_array_equal(gdal_slice(nc4, "/flags", tmp_path, (20, 30), "u1"), flags)
    np.testing.assert_array_equal(gdal_slice(nc3, "/tas:1", tmp_path, (12, 16), "f4"), tas[1])
    valid = temp[1][temp[1] != -9999.0]
    stats = gdal_stats(nc4, "/temp:1")
    assert stats["minimum"] == pytest.approx(valid.min(), rel=1e-6)
    assert stats["maximum"] == pytest.approx(valid.max(), rel=1e-6)
    assert stats["mean"] == pytest.approx(valid.astype("f8").mean(), rel=1e-6)
    stats = gdal_stats(nc3, "/tas:2")
    assert stats["mean"] == pytest.approx(tas[2].astype("f8").mean(), rel=1e-6)
    stats = gdal_stats(nc4, "/precise")  # 2-D shuffle+zlib float64
    # (gdalinfo prints 14 significant digits)
    assert (stats["minimum"], stats["maximum"]) == pytest.approx((precise.min(), precise.max()), rel=1e-12)
    assert stats["mean"] == pytest.approx(precise.mean(), rel=1e-12)


# --- HDF5 with blosc (lz4, zstd, bitshuffle), zstd, big-endian shuffle+zlib ------------------------


MAKE_CODEC_FILE = """
import sys
import h5py, hdf5plugin, numpy as np
rng = np.random.default_rng(16)
arrays = {
    "blosc_lz4_bitshuffle": ((rng.standard_normal((40, 50)) * 100).astype("<f4"), (10, 25),
                             hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE)),
    "blosc_zstd": (rng.integers(-2000, 2000, (40, 50, 8)).astype("<i2"), (10, 25, 8),
                   hdf5plugin.Blosc(cname="zstd", clevel=3, shuffle=hdf5plugin.Blosc.SHUFFLE)),
    "zstd": (rng.standard_normal((40, 50)), (20, 50), hdf5plugin.Zstd(clevel=5)),
    "be_zlib": (rng.standard_normal((40, 50)).astype(">f4"), (10, 50), None),
}
with h5py.File(sys.argv[1], "w") as f:
    for name, (values, chunks, codec) in arrays.items():
        kw = dict(codec) if codec is not None else {"compression": "gzip", "shuffle": True}
        f.create_dataset(name, data=values, chunks=chunks, **kw)
np.savez(sys.argv[2], **{k: v[0] for k, v in arrays.items()})
"""


@pytest.fixture(scope="module")
def codec_set(tmp_path_factory):
    """An HDF5 file written by h5py with hdf5plugin's filters, and its kerchunk references.
    Written in a process of its own without HDF5_PLUGIN_PATH: importing netCDF4 points that at
    netCDF4's bundled plugins, built for another HDF5 library than h5py's."""
    import sys

    from kerchunk.hdf import SingleHdf5ToZarr

    root = tmp_path_factory.mktemp("codecs")
    path = root / "data" / "codecs.h5"
    path.parent.mkdir()
    subprocess.run([sys.executable, "-c", MAKE_CODEC_FILE, str(path), str(root / "values.npz")],
                   check=True, timeout=60, cwd=root,
                   env={k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"})
    refs = SingleHdf5ToZarr(str(path), inline_threshold=0).translate()
    src = write_json(root / "codecs.json", refs.get("refs", refs) if "version" in refs else refs)
    with np.load(root / "values.npz") as values:
        return src, {k: values[k] for k in values.files}


def test_hdf5_codecs_through_decode(mount, codec_set, tmp_path):
    src, originals = codec_set
    dec, raw = mount(src, "decode"), mount(src)
    zarrays = {k: json.loads((raw / k / ".zarray").read_text()) for k in originals}
    used = {f["id"] for z in zarrays.values() for f in (z["filters"] or [])}
    assert {"blosc", "zstd", "shuffle", "zlib"} <= used, used  # the codecs really are in play
    assert zarrays["be_zlib"]["dtype"] == ">f4"
    assert assert_sizes_are_bytes(dec) >= len(originals) * 2
    for name, values in originals.items():
        # kerchunk records HDF5's fill value (0) as fill_value: the decoded view's _FillValue
        check_ncdump(dec, name, values, zarrays[name]["fill_value"])
    d = xr.open_zarr(dec, consolidated=False, mask_and_scale=False)  # kerchunk's fill_value is 0
    r = xr.open_zarr(raw, consolidated=False, mask_and_scale=False)
    assert_same_dataset(d, r)
    for name, values in originals.items():
        np.testing.assert_array_equal(d[name].values, values)
    np.testing.assert_array_equal(
        gdal_slice(dec, "/blosc_zstd:2", tmp_path, (50, 8), "i2"), originals["blosc_zstd"][2])
    np.testing.assert_array_equal(
        gdal_slice(dec, "/blosc_lz4_bitshuffle", tmp_path, (40, 50), "f4"),
        originals["blosc_lz4_bitshuffle"])
    for name in ("blosc_lz4_bitshuffle", "zstd", "be_zlib"):  # 2-D, three codecs
        stats, values = gdal_stats(dec, f"/{name}"), originals[name].astype("f8")
        assert (stats["minimum"], stats["maximum"]) == pytest.approx(
            (values.min(), values.max()), rel=1e-6), name
        assert stats["mean"] == pytest.approx(values.mean(), rel=1e-6), name


# --- what cannot be decoded; corrupt chunks ------------------------------------------------------


def b64(data: bytes) -> str:
    return "base64:" + base64.b64encode(data).decode()


def zarray(dtype, shape, chunks, compressor=None, filters=None) -> str:
    return json.dumps({"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype,
                       "compressor": compressor, "filters": filters, "fill_value": None,
                       "order": "C"})


@pytest.fixture
def odd_set(tmp_path):
    data = tmp_path / "data" / "junk.bin"
    data.parent.mkdir()
    junk = np.random.default_rng(3).bytes(4000)
    data.write_bytes(junk)
    names = numcodecs.VLenUTF8().encode(np.array(["a", "bb", "ccc"], dtype=object))
    zl = {"id": "zlib", "level": 1}
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "names/.zarray": zarray("|O", [3], [3], filters=[{"id": "vlen-utf8"}]),
        "names/0": b64(bytes(names)),
        "odd/.zarray": zarray("<i4", [4], [4], compressor={"id": "refmount-test-no-such-codec"}),
        "odd/0": [str(data), 100, 50],
        "good/.zarray": zarray("<i4", [8], [4], compressor=zl),
        "good/0": b64(zlib.compress(np.arange(4, dtype="<i4").tobytes())),
        "good/1": [str(data), 0, 200],  # not zlib data
        "short/.zarray": zarray(">i4", [4], [4], compressor=zl),
        "short/0": b64(zlib.compress(np.arange(3, dtype=">i4").tobytes())),  # 3 values, not 4
    }
    return write_json(tmp_path / "odd.json", refs), refs, junk


def test_not_decodable_arrays_are_served_as_referenced_with_a_warning(mount, odd_set):
    src, refs, junk = odd_set
    m = mount(src, "decode")
    # left out of the netCDF side: their metadata is not listed (netCDF-C would fail the whole
    # file on them), their chunks are as referenced
    for name in ("names", "odd"):
        assert not (m / name / ".zarray").exists() and sorted(os.listdir(m / name)) == ["0"]
    assert (m / "names/0").read_bytes() == base64.b64decode(refs["names/0"][7:])
    assert (m / "odd/0").read_bytes() == junk[100:150]
    left_out = json.loads(os.getxattr(m.path, "user.refmount.netcdf_left_out"))
    assert set(left_out) == {"names", "odd"} and "variable-length" in left_out["names"], left_out
    lines = [line for line in m.log_text(tail=1000).splitlines() if "netCDF clients" in line]
    assert len(lines) == 1 and "names: variable-length" in lines[0] and "odd: not decoded" in lines[0]
    assert json.loads((m / "good/.zarray").read_text())["compressor"] is None
    not_decoded = json.loads(os.getxattr(m.path, "user.refmount.not_decoded"))
    assert set(not_decoded) == {"names", "odd"}, not_decoded
    assert "refmount-test-no-such-codec" in not_decoded["odd"] and "object" in not_decoded["names"]
    assert os.getxattr(m.path, "user.refmount.decoded_arrays") == b"2"
    warnings = [line for line in m.log_text(tail=1000).splitlines()
                if "WARNING" in line and "served as referenced" in line]
    assert len(warnings) == 2, warnings
    assert any(" names " in w for w in warnings) and any(" odd " in w for w in warnings)
    said = [line for line in m.result.stderr.splitlines() if "served as referenced" in line]
    assert len(said) == 2, m.result.stderr  # also on the terminal of whoever mounted
    info = json.loads(run_cli("inspect", str(src), "--json").stdout)
    assert info["arrays"]["odd"]["decode"].startswith("as referenced: codec")
    assert info["arrays"]["names"]["decode"].startswith("as referenced: object dtype")
    assert info["arrays"]["good"]["decoded_bytes"] == 32 and info["arrays"]["good"]["codecs"] == ["zlib"]
    table = run_cli("inspect", str(src)).stdout
    assert "not decoded with -o decode" in table and "odd: codec" in table
    assert "not seen by netCDF clients with -o decode" in table
    assert info["arrays"]["names"]["netcdf"].startswith("left out: variable-length values")
    assert info["arrays"]["odd"]["netcdf"].startswith("left out: not decoded: codec")


def test_corrupt_chunks_are_eio_and_the_mount_keeps_serving(mount, odd_set):
    src, _refs, _junk = odd_set
    m = mount(src, "decode")
    assert os.stat(m / "good/1").st_size == 16 and os.stat(m / "short/0").st_size == 16
    for key in ("good/1", "short/0"):
        with pytest.raises(OSError) as e:
            (m / key).read_bytes()
        assert e.value.errno == errno.EIO, key
    assert (m / "good/0").read_bytes() == np.arange(4, dtype="<i4").tobytes()
    assert sorted(os.listdir(m / "good")) == [".zarray", "0", "1"]
    log = m.log_text(tail=1000)
    assert re.search(r"decode failed: key=good/1 codecs=zlib", log), log
    assert re.search(r"decode failed: key=short/0 codecs=zlib: .*expected 16", log), log


def test_missing_chunks_stay_missing_and_decoding_is_counted(mount, tmp_path):
    """A chunk the set does not hold is not listed through ``-o decode`` and readers use the
    fill value; a decoded chunk's size needs no fetch, and its bytes reach the kernel once."""
    import zarr

    meta = {"zarr_format": 2, "shape": [12], "chunks": [4], "dtype": ">i4",
            "compressor": {"id": "zlib", "level": 1}, "filters": None, "fill_value": 7,
            "order": "C"}
    refs = {".zgroup": '{"zarr_format": 2}', "s/.zarray": json.dumps(meta),
            "s/0": b64(zlib.compress(np.arange(4, dtype=">i4").tobytes())),
            "s/2": b64(zlib.compress(np.arange(8, 12, dtype=">i4").tobytes()))}
    m = mount(write_json(tmp_path / "sparse.json", refs), "decode")
    assert sorted(os.listdir(m / "s")) == [".zarray", "0", "2"]
    assert not (m / "s" / "1").exists()
    assert [os.stat(m / "s" / k).st_size for k in ("0", "2")] == [16, 16]
    stats = json.loads(os.getxattr(m.path, "user.refmount.stats"))
    assert stats["decoded"] == 0, stats  # sizes come from .zarray: nothing decoded to stat
    values = zarr.open_array(str(m / "s"), mode="r")[:]
    assert values.tolist() == [0, 1, 2, 3, 7, 7, 7, 7, 8, 9, 10, 11]
    for _ in range(3):  # read again: from the page cache, not decoded again
        assert (m / "s" / "2").read_bytes() == np.arange(8, 12, dtype="<i4").tobytes()
    assert json.loads(os.getxattr(m.path, "user.refmount.stats"))["decoded"] == 2


def test_python_api_takes_decode(odd_set, tmp_path):
    import refmount

    src, _refs, _junk = odd_set
    with refmount.mounted(src, decode=True, cache_dir=str(tmp_path / "cache"),
                          log=str(tmp_path / "api.log")) as path:
        assert Path(path, "good/0").read_bytes() == np.arange(4, dtype="<i4").tobytes()
        assert json.loads(Path(path, "good/.zarray").read_text())["compressor"] is None


# --- Parquet and Version 1 sets -------------------------------------------------------------------


def test_parquet_and_version1_sets_decode(mount, shared_mounts, tmp_path):
    from support.parquet_data import kerchunk_to_parquet

    ds = shared_mounts.datasets
    refs = ds.load("nc4_local")
    pq = kerchunk_to_parquet(refs, ds.root / "nc4_decode.parq", record_size=7)
    nc4 = str(ds.nc4)
    v1 = {"version": 1, "templates": {"f": nc4},
          "refs": {k: (["{{f}}", *v[1:]] if isinstance(v, list) and v[0] == nc4 else v)
                   for k, v in refs.items()}}
    assert any(isinstance(v, list) and v[0] == "{{f}}" for v in v1["refs"].values())
    meta = {k: json.loads(v) for k, v in refs.items() if k.rsplit("/", 1)[-1].startswith(".z")}
    v1["refs"][".zmetadata"] = json.dumps({"zarr_consolidated_format": 1, "metadata": meta})
    v1_src = write_json(ds.root / "nc4_decode_v1.json", v1)
    original = xr.open_dataset(ds.nc4)
    with netCDF4.Dataset(ds.nc4) as f:
        f.set_auto_maskandscale(False)
        counts = f["counts"][:]
    for src in (pq, v1_src):
        m = mount(src, "decode")
        assert json.loads((m / "temp/.zarray").read_text())["filters"] is None
        assert assert_sizes_are_bytes(m) > 10
        d = xr.open_zarr(m, consolidated=False)
        assert_like_original(d, original)
        # consolidated metadata (Parquet: the set's own file), rewritten like each .zarray
        zmeta = json.loads((m / ".zmetadata").read_text())["metadata"]
        assert zmeta["temp/.zarray"] == json.loads((m / "temp/.zarray").read_text())
        assert zmeta["temp/.zarray"]["filters"] is None
        assert_like_original(xr.open_zarr(m, consolidated=True), original)
        check_ncdump(m, "counts", counts, -1)


# --- codecs off the allow-list: isolated in codec worker processes -------------------------------


def codec_workers(mnt) -> list[str]:
    """Command lines of the codec workers serving the mount at ``mnt``."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        args = p.info["cmdline"] or []
        if "refmount.decode.codecworker" in args and str(mnt) in args:
            found.append(" ".join(args))
    return found


def read_errno(path) -> int | None:
    try:
        path.read_bytes()
    except OSError as e:
        return e.errno
    return None


def test_a_crashing_codec_is_eio_and_the_mount_keeps_serving(mount, tmp_path, monkeypatch):
    """Codecs that abort or segfault (as eccodes does on fuzzed GRIB) are EIO for that read and
    a log line; the mount serves every other file, and the next read gets a new worker."""
    from support.crashcodec import codec_env

    monkeypatch.setenv("PYTHONPATH", codec_env(tmp_path / "codecs"))
    four = np.arange(4, dtype=">i4").tobytes()
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "boom/.zarray": zarray("<i4", [4], [4], compressor={"id": "refmount-test-abort"}),
        "boom/0": b64(four),
        "segv/.zarray": zarray("<i4", [4], [4], filters=[{"id": "refmount-test-segv"}]),
        "segv/0": b64(four),
        "odd/.zarray": zarray(">i4", [4], [4], filters=[{"id": "refmount-test-plain"}]),
        "odd/0": b64(four),
        "good/.zarray": zarray(">i4", [4], [4], compressor={"id": "zlib"}),
        "good/0": b64(zlib.compress(four)),
    }
    m = mount(write_json(tmp_path / "crash.json", refs), "decode")
    assert os.getxattr(m.path, "user.refmount.decoded_arrays") == b"4"
    assert read_errno(m / "boom/0") == errno.EIO
    assert (m / "good/0").read_bytes() == np.arange(4, dtype="<i4").tobytes()
    assert read_errno(m / "segv/0") == errno.EIO
    assert (m / "odd/0").read_bytes() == np.arange(4, dtype="<i4").tobytes()  # a new worker
    assert read_errno(m / "boom/0") == errno.EIO
    assert m.procs and all(p.is_running() for p in m.procs)  # the same daemon serves on
    assert codec_workers(m.path) == []  # the last one died; the next chunk starts one
    assert sorted(os.listdir(m.path)) == [".zgroup", "boom", "good", "odd", "segv"]
    log = m.log_text(tail=1000)
    assert re.search(r"decode failed: key=boom/0 codecs=refmount-test-abort: the codec worker "
                     r"died of SIGABRT", log), log
    assert re.search(r"decode failed: key=segv/0 codecs=refmount-test-segv: the codec worker "
                     r"died of SIGSEGV", log), log
    # one line per death (the kernel may ask twice for a page that failed)
    assert len(re.findall(r"codec worker pid \d+: the codec worker died", log)) >= 3, log


def test_grib_decodes_in_a_codec_worker_and_corrupted_messages_are_eio(mount, tmp_path):
    """A real GRIB set (eccodes' sample, kerchunk's scan_grib): kerchunk's ``grib`` codec runs
    in a codec worker, never in the daemon; truncated and corrupted messages are EIO (or, when
    eccodes finds nothing wrong, a chunk of the right size), and the mount keeps serving."""
    from kerchunk.codecs import GRIBCodec
    from kerchunk.grib2 import scan_grib
    from support.producers import make_grib

    grib = tmp_path / "data" / "t.grib2"
    grib.parent.mkdir()
    make_grib(grib)
    message = scan_grib(str(grib))[0]
    refs = {k: ([str(grib), *v[1:]] if isinstance(v, list) else v)
            for k, v in message["refs"].items()}
    _url, offset, length = refs["t/0.0"]
    raw = grib.read_bytes()[offset : offset + length]
    flipped = bytearray(raw)
    rng = np.random.default_rng(7)
    for where in rng.integers(length // 3, length - 4, 40):  # sections 3 to 7: grid, packing, data
        flipped[where] ^= 0xFF
    bad = tmp_path / "data" / "bad.grib2"
    bad.write_bytes(bytes(flipped))
    meta = refs["t/.zarray"]
    for name, ref in (("cut", [str(grib), offset, length // 2]), ("flip", [str(bad), 0, length]),
                      ("junk", b64(b"GRIB" + bytes(rng.integers(0, 256, 1500, dtype=np.uint8))))):
        refs[f"{name}/.zarray"] = meta
        refs[f"{name}/0.0"] = ref
    m = mount(write_json(tmp_path / "grib.json", refs), "decode")
    assert codec_workers(m.path) == []  # started on the first chunk that needs one
    want = np.asarray(GRIBCodec(var="t", dtype="float64").decode(raw), "<f8").tobytes()
    assert (m / "t/0.0").read_bytes() == want
    assert len(codec_workers(m.path)) == 1
    assert read_errno(m / "cut/0.0") == errno.EIO
    for name in ("flip", "junk"):
        e = read_errno(m / f"{name}/0.0")
        assert e in (None, errno.EIO), (name, e)
        if e is None:
            assert os.stat(m / f"{name}/0.0").st_size == len(want)
    assert (m / "latitude/0").read_bytes()
    assert sorted(os.listdir(m / "t")) == [".zarray", ".zattrs", "0.0"]
    assert re.search(r"decode failed: key=cut/0.0 codecs=grib", m.log_text(tail=1000))
    assert len(codec_workers(m.path)) <= 1  # one, unless a corrupted message ended it
    assert m.cleanup() == []  # the daemon and its worker end when unmounted
    assert codec_workers(m.path) == []
