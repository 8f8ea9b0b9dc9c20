"""Test data made with the real libraries, and the kerchunk reference sets that point at it.

``build(root)`` writes, under ``root``::

    data/nc4.nc        netCDF4/HDF5: chunked + zlib + shuffle variables (int16, int32, float32,
                       float64, uint8), _FillValue, scale_factor/add_offset, a CF time
                       coordinate, a contiguous dataset, uncompressed little-endian variables
                       (``le_int``, ``le_float``: checkable with ``ncdump -v`` through NCZarr),
                       a nested group ``sub`` with its own dimension and ``sub/deeper``.
    data/nc3.nc        netCDF3 classic (big-endian, a record dimension, packed int16 and a
                       float, each with _FillValue and points holding it, a float with
                       missing_value only).
    data/h5.h5         plain HDF5 written by h5py (gzip + shuffle): fill values declared the
                       netCDF way (a ``_FillValue`` attribute), and one dataset with HDF5's
                       default fill value (0, not a netCDF fill value) holding zeros.
    data/part0.nc, data/part1.nc
                       two netCDF4 files, consecutive in time (float with _FillValue, packed
                       int16), combined by kerchunk's MultiZarrToZarr into ``combined_local``.
    data/blob.bin      random bytes (odd size, > 1 MiB) for hand-written whole/range references.
    data/tiny.bin      one byte.
    *.json             Version 0 reference sets (``{key: value}``), next to data/ so that
                       refmount's default ``allow_local`` (the directory of a local SOURCE)
                       covers the local targets:
                       nc4_local, nc3_local, hand_local   (targets are absolute local paths)
                       h5_local, combined_local           (likewise)
                       nc4_http,  nc3_http,  hand_http    (after ``add_http_refs(base_url)``)
                       nc4_local.json.gz / .json.zst      (compressed copies)

kerchunk is run once against the local paths; the http sets are the same references with the
URL strings rewritten to ``{base_url}/data/<name>``, so both sets have exactly the same keys.

``expected_bytes(value)`` computes what a reference must read as, independently of refmount:
``base64:`` decoded, other strings UTF-8, JSON objects as ``json.dumps(obj)``, ``[url]`` the whole
target, ``[url, off, len]`` that range of it (http URLs are mapped back to the local file).

Standalone use::

    python tests/support/datasets.py DIR     # builds DIR and prints a summary
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np

# Inline threshold for SingleHdf5ToZarr: small chunks (coordinates, the uint8 flags, the nested
# int16) get inlined, the rest stay byte-range references.
HDF5_INLINE_THRESHOLD = 300
NC3_INLINE_THRESHOLD = 100

BLOB_SIZE = 1_500_007  # odd, and larger than any single FUSE read
SEED = 20240601

# Variables whose values ncdump can check through NCZarr (uncompressed, little-endian).
NCDUMP_VALUE_VARS = ("le_int", "le_float")


@dataclass
class Datasets:
    root: Path
    data_dir: Path
    refs_dir: Path
    nc4: Path
    nc3: Path
    h5: Path
    parts: tuple[Path, ...]
    blob: Path
    tiny: Path
    refs: dict[str, Path] = field(default_factory=dict)  # name -> refs JSON file
    http_base: str | None = None  # e.g. http://127.0.0.1:PORT (serving ``root``)

    # --- reading back -----------------------------------------------------------------------
    def load(self, name: str) -> dict:
        with open(self.refs[name]) as f:
            return json.load(f)

    def local_path(self, url: str) -> Path:
        """The local file behind a reference URL (local path, file:// or our http server)."""
        if self.http_base and url.startswith(self.http_base + "/"):
            return self.root / unquote(url[len(self.http_base) + 1 :])
        if url.startswith("file://"):
            return Path(unquote(urlparse(url).path))
        if "://" in url:
            raise ValueError(f"no local file for {url!r}")
        return Path(url)

    def expected_bytes(self, value) -> bytes:
        return expected_bytes(value, self.local_path)

    def expected_tree(self, name: str) -> dict[str, bytes]:
        return {k: self.expected_bytes(v) for k, v in self.load(name).items()}

    # --- http variants ------------------------------------------------------------------------
    def add_http_refs(self, base_url: str) -> None:
        """Write ``*_http.json`` copies of the local sets with URLs on ``base_url``."""
        self.http_base = base_url.rstrip("/")
        data_prefix = str(self.data_dir) + "/"
        for local in ("nc4_local", "nc3_local", "hand_local"):
            refs = self.load(local)
            out = {}
            for k, v in refs.items():
                if isinstance(v, list):
                    path = str(self.local_path(v[0]))
                    assert path.startswith(data_prefix), path
                    v = [f"{self.http_base}/data/{path[len(data_prefix):]}", *v[1:]]
                out[k] = v
            name = local.replace("_local", "_http")
            self.refs[name] = write_json(self.refs_dir / f"{name}.json", out)
        self.refs["hand_http_gz"] = compress_copy(self.refs["hand_http"], ".gz")


def expected_bytes(value, local_path=Path) -> bytes:
    """The bytes a Version 0 reference value stands for (computed without refmount)."""
    if isinstance(value, str):
        if value.startswith("base64:"):
            return base64.b64decode(value[len("base64:") :], validate=True)
        return value.encode("utf-8")
    if isinstance(value, dict):
        return json.dumps(value).encode("utf-8")
    if isinstance(value, list) and len(value) in (1, 3):
        with open(local_path(value[0]), "rb") as f:
            if len(value) == 1:
                return f.read()
            f.seek(value[1])
            return f.read(value[2])
    raise TypeError(f"not a Version 0 reference value: {value!r}")


def write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def compress_copy(src: Path, suffix: str) -> Path:
    """``src`` + ``.gz`` or ``.zst``."""
    dst = src.with_name(src.name + suffix)
    data = src.read_bytes()
    if suffix == ".gz":
        dst.write_bytes(gzip.compress(data))
    elif suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            subprocess.run(["zstd", "-q", "-f", "-o", str(dst), str(src)], check=True)
        else:
            dst.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        raise ValueError(suffix)
    return dst


# --- the netCDF files ---------------------------------------------------------------------------


def make_nc4(path: Path) -> None:
    import netCDF4

    rng = np.random.default_rng(SEED)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = "refmount test data"
        ds.Conventions = "CF-1.8"
        ds.createDimension("time", 6)
        ds.createDimension("y", 20)
        ds.createDimension("x", 30)

        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01 00:00:00"
        t.calendar = "standard"
        t.standard_name = "time"
        t[:] = np.arange(6) * 1.5
        y = ds.createVariable("y", "f4", ("y",))
        y.units = "km"
        y[:] = np.linspace(-10, 10, 20)
        x = ds.createVariable("x", "f4", ("x",))
        x.units = "km"
        x[:] = np.arange(30)

        # float32, chunked, zlib + shuffle, _FillValue with some masked points
        temp = ds.createVariable(
            "temp", "f4", ("time", "y", "x"), zlib=True, shuffle=True,
            chunksizes=(2, 10, 15), fill_value=np.float32(-9999.0),
        )
        temp.units = "K"
        temp.long_name = "air temperature"
        temp[:] = (rng.standard_normal((6, 20, 30)) * 10 + 280).astype("f4")
        temp[1, 0:2, 0:5] = np.ma.masked

        # int32, zlib + shuffle, _FillValue
        counts = ds.createVariable(
            "counts", "i4", ("time", "y", "x"), zlib=True, shuffle=True,
            chunksizes=(3, 20, 30), fill_value=np.int32(-1),
        )
        counts[:] = rng.integers(0, 100_000, (6, 20, 30), dtype="i4")
        counts[2, 5, 5] = np.ma.masked

        # int16 packed with scale_factor / add_offset, _FillValue
        packed = ds.createVariable(
            "packed", "i2", ("time", "y", "x"), zlib=True, shuffle=True,
            chunksizes=(1, 20, 30), fill_value=np.int16(-32767),
        )
        packed.scale_factor = 0.01
        packed.add_offset = 100.0
        packed.units = "m"
        packed.set_auto_maskandscale(False)
        raw = rng.integers(-30_000, 30_000, (6, 20, 30), dtype="i2")
        raw[3, 1, 1] = -32767
        packed[:] = raw

        # uint8, small chunks (these end up inlined as base64)
        flags = ds.createVariable(
            "flags", "u1", ("y", "x"), zlib=True, shuffle=True, chunksizes=(10, 10)
        )
        flags[:] = rng.integers(0, 4, (20, 30), dtype="u1")

        # float64, zlib + shuffle, NaN fill
        precise = ds.createVariable(
            "precise", "f8", ("time", "x"), zlib=True, shuffle=True,
            chunksizes=(6, 10), fill_value=np.nan,
        )
        precise[:] = rng.standard_normal((6, 30))

        # contiguous (unchunked) dataset
        contig = ds.createVariable("contig", "f8", ("y", "x"), contiguous=True)
        contig[:] = rng.standard_normal((20, 30))

        # uncompressed little-endian variables, for ncdump -v through NCZarr
        le_int = ds.createVariable("le_int", "i4", ("y", "x"), chunksizes=(10, 30),
                                   endian="little")
        le_int[:] = np.arange(600, dtype="i4").reshape(20, 30) * 7 - 2000
        le_float = ds.createVariable("le_float", "f8", ("x",), contiguous=True,
                                     endian="little")
        le_float[:] = np.arange(30) * 0.25 - 3

        # nested groups
        sub = ds.createGroup("sub")
        sub.description = "a nested group"
        sub.createDimension("z", 8)
        z = sub.createVariable("z", "i4", ("z",))
        z[:] = np.arange(8) * 10
        inner = sub.createVariable("inner", "f4", ("z", "x"), zlib=True, shuffle=True,
                                   chunksizes=(4, 30))
        inner.long_name = "inner variable"
        inner[:] = rng.standard_normal((8, 30)).astype("f4")
        deeper = sub.createGroup("deeper")
        deep16 = deeper.createVariable("deep16", "i2", ("z",), zlib=True, chunksizes=(8,))
        deep16[:] = np.arange(8, dtype="i2") * -3


def make_nc3(path: Path) -> None:
    import netCDF4

    rng = np.random.default_rng(SEED + 3)
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as ds:
        ds.history = "made for refmount tests"
        ds.createDimension("time", None)  # record dimension
        ds.createDimension("lat", 12)
        ds.createDimension("lon", 16)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "hours since 1990-01-01"
        t.calendar = "gregorian"
        t[:] = np.arange(5) * 6.0
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-55, 55, 12)
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = np.linspace(0, 337.5, 16)
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), fill_value=np.float32(1e20))
        tas.units = "K"
        tas[:] = rng.standard_normal((5, 12, 16)).astype("f4") + 290
        tas[1, 2, 3] = np.ma.masked
        pr = ds.createVariable("pr", "i2", ("time", "lat", "lon"), fill_value=np.int16(-999))
        pr.scale_factor = 0.5
        pr.add_offset = 10.0
        pr.set_auto_maskandscale(False)
        raw = rng.integers(-500, 500, (5, 12, 16), dtype="i2")
        raw[3, 4, 5:7] = -999
        pr[:] = raw
        # missing_value only (no _FillValue): kerchunk makes it the array's fill_value
        wind = ds.createVariable("wind", "f4", ("time", "lat", "lon"))
        wind.missing_value = np.float32(-99.0)
        wind.units = "m s-1"
        wind.set_auto_maskandscale(False)
        speed = (rng.random((5, 12, 16)) * 20).astype("f4")
        speed[0, 0, 0:4] = -99.0
        wind[:] = speed
        elev = ds.createVariable("elev", "i4", ("lat", "lon"))
        elev[:] = rng.integers(-100, 5000, (12, 16), dtype="i4")
        mask = ds.createVariable("mask", "i1", ("lat", "lon"))
        mask[:] = rng.integers(0, 2, (12, 16), dtype="i1")


def make_h5(path: Path) -> None:
    """Plain HDF5 (no netCDF dimensions: netCDF-C names them phony_dim_N, as kerchunk does)."""
    import h5py

    rng = np.random.default_rng(SEED + 5)
    with h5py.File(path, "w") as f:
        f.attrs["source"] = "h5py"
        sst = (rng.standard_normal((4, 10, 12)) * 3 + 290).astype("f4")
        sst[1, 2:4, 0:3] = -999.0
        d = f.create_dataset("sst", data=sst, chunks=(2, 10, 12), compression="gzip",
                             shuffle=True, fillvalue=np.float32(-999.0))
        d.attrs["_FillValue"] = np.float32(-999.0)
        d.attrs["units"] = "K"
        level = rng.integers(0, 5000, (4, 10, 12)).astype("i2")
        level[3, 9, 9:12] = -1
        d = f.create_dataset("level", data=level, chunks=(4, 5, 12), compression="gzip",
                             shuffle=True, fillvalue=np.int16(-1))
        d.attrs["_FillValue"] = np.int16(-1)
        # HDF5's default fill value (0) and zeros among the data: netCDF-C on the file does
        # not treat them as missing, kerchunk's fill_value (and so zarr and xarray) does
        zeros = rng.standard_normal((4, 10, 12)).astype("f4")
        zeros[0, 0, 0:3] = 0.0
        f.create_dataset("default_fill", data=zeros, chunks=(2, 10, 12), compression="gzip",
                         shuffle=True)


def make_nc4_part(path: Path, part: int) -> None:
    """One of two netCDF4 files, consecutive along ``time``, for MultiZarrToZarr."""
    import netCDF4

    rng = np.random.default_rng(SEED + 10 + part)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = "refmount combined test data"
        ds.createDimension("time", 3)
        ds.createDimension("lat", 8)
        ds.createDimension("lon", 10)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2001-01-01"
        t.calendar = "standard"
        t[:] = np.arange(3) + 3 * part
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-70, 70, 8)
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = np.arange(10) * 36.0
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True, shuffle=True,
                                chunksizes=(1, 8, 10), fill_value=np.float32(-9999.0))
        tas.units = "K"
        tas[:] = (rng.standard_normal((3, 8, 10)) * 5 + 285).astype("f4")
        tas[part, part : part + 2, 3] = np.ma.masked
        rain = ds.createVariable("rain", "i2", ("time", "lat", "lon"), zlib=True, shuffle=True,
                                 chunksizes=(1, 8, 10), fill_value=np.int16(-32767))
        rain.scale_factor = 0.1
        rain.add_offset = 0.0
        rain.units = "mm"
        rain.set_auto_maskandscale(False)
        raw = rng.integers(0, 3000, (3, 8, 10), dtype="i2")
        raw[2, 7, part] = -32767
        rain[:] = raw


def kerchunk_combined(parts: tuple[Path, ...]) -> dict:
    from kerchunk.combine import MultiZarrToZarr

    singles = [kerchunk_hdf5(p) for p in parts]
    return _refs_v0(MultiZarrToZarr(singles, concat_dims=["time"],
                                    identical_dims=["lat", "lon"]).translate())


def _refs_v0(translated: dict) -> dict:
    """``.translate()`` returns Version 1 (``{"version": 1, "refs": {...}}``); keep the refs."""
    refs = translated.get("refs", translated) if "version" in translated else translated
    assert isinstance(refs, dict) and refs
    return dict(refs)


def kerchunk_hdf5(path: Path) -> dict:
    from kerchunk.hdf import SingleHdf5ToZarr

    return _refs_v0(SingleHdf5ToZarr(str(path), inline_threshold=HDF5_INLINE_THRESHOLD).translate())


def kerchunk_nc3(path: Path) -> dict:
    from kerchunk.netCDF3 import NetCDF3ToZarr

    return _refs_v0(NetCDF3ToZarr(str(path), inline_threshold=NC3_INLINE_THRESHOLD).translate())


def hand_refs(blob: Path, tiny: Path) -> dict:
    """Small hand-written Version 0 references covering every value form."""
    rng = np.random.default_rng(SEED + 7)
    all_bytes = bytes(range(256)) + rng.integers(0, 256, 300, dtype="u1").tobytes()
    size = blob.stat().st_size
    return {
        "hello.txt": "hello world\n",
        "unicode.txt": "h\u00e9llo \u2713 \u2014 \u00fcn\u00efc\u00f6de \U0001f600\n",
        "empty.txt": "",
        "control.txt": "nul\x00tab\tnewline\nend",
        "b64/all_bytes.bin": "base64:" + base64.b64encode(all_bytes).decode(),
        "b64/short": "base64:" + base64.b64encode(b"ab").decode(),  # padded
        "b64/empty": "base64:",
        "json/obj.json": {"a": 1, "nested": {"b": [1, 2.5, None, True]}, "s": "x\u00e9y"},
        "json/empty.json": {},
        "json/.zattrs": {"_ARRAY_DIMENSIONS": ["x"], "units": "m"},
        "whole/blob.bin": [str(blob)],
        "whole/tiny.bin": [str(tiny)],
        "whole/file-url.bin": ["file://" + str(tiny)],
        "range/first": [str(blob), 0, 100],
        "range/middle": [str(blob), 12_345, 4_321],
        "range/large": [str(blob), 1_000, 700_001],  # spans several FUSE reads
        "range/last": [str(blob), size - 10, 10],
        "range/one": [str(blob), 777, 1],
        "a/b/c/d/e/deep.txt": "deep down\n",
        "a/b/sibling": "sibling",
        "a/top": "top",
        "dir with space/file name.txt": "spaces are fine\n",
        ".zgroup": '{"zarr_format":2}',
        # names that sort around "p/" (".", "-" before "/", "0" after): directory ranges
        # found by prefix search must not pick these up or lose them
        "p/q": "p/q",
        "p.q": "p.q",
        "p-q": "p-q",
        "p0": "p0",
        "p/q.r": "p/q.r",
        "p/q-r": "p/q-r",
        "p/q0": "p/q0",
        "p/r/s": "p/r/s",
        "p/r.s": "p/r.s",
        "\u00fcn\u00ef/c\u00f8d\u00e9 \u2603.txt": "unicode names",
        "long/" + "L" * 255: "a 255-byte name",
        # JSON rendering exactly as json.dumps: float forms, big ints, escapes, key order
        "json/numbers.json": {"z": 1e20, "y": 1e-07, "x": -0.0, "w": 1.0, "v": 0.1,
                              "t": -7, "s": 3.141592653589793, "r": 2**62},
        "json/strings.json": {"q": 'quote" backslash\\ nl\n tab\t', "snow": "\u2603",
                              "ctl": "\u0001", "emoji": "\U0001f600", "": "empty key"},
        "json/list-in-obj.json": {"l": [[], {}, [{"a": None}]], "b": False},
    }


def build(root: str | os.PathLike) -> Datasets:
    root = Path(root).resolve()
    data_dir = root / "data"
    refs_dir = root  # the refs sit above data/: refmount allows local targets below SOURCE's dir
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    ds = Datasets(
        root=root, data_dir=data_dir, refs_dir=refs_dir,
        nc4=data_dir / "nc4.nc", nc3=data_dir / "nc3.nc", h5=data_dir / "h5.h5",
        parts=(data_dir / "part0.nc", data_dir / "part1.nc"),
        blob=data_dir / "blob.bin", tiny=data_dir / "tiny.bin",
    )
    make_nc4(ds.nc4)
    make_nc3(ds.nc3)
    make_h5(ds.h5)
    for i, part in enumerate(ds.parts):
        make_nc4_part(part, i)
    ds.blob.write_bytes(np.random.default_rng(SEED + 1).bytes(BLOB_SIZE))
    ds.tiny.write_bytes(b"!")

    ds.refs["nc4_local"] = write_json(refs_dir / "nc4_local.json", kerchunk_hdf5(ds.nc4))
    ds.refs["nc3_local"] = write_json(refs_dir / "nc3_local.json", kerchunk_nc3(ds.nc3))
    ds.refs["h5_local"] = write_json(refs_dir / "h5_local.json", kerchunk_hdf5(ds.h5))
    ds.refs["combined_local"] = write_json(refs_dir / "combined_local.json",
                                           kerchunk_combined(ds.parts))
    ds.refs["hand_local"] = write_json(refs_dir / "hand_local.json", hand_refs(ds.blob, ds.tiny))
    ds.refs["nc4_local_gz"] = compress_copy(ds.refs["nc4_local"], ".gz")
    ds.refs["nc4_local_zst"] = compress_copy(ds.refs["nc4_local"], ".zst")
    ds.refs["hand_local_gz"] = compress_copy(ds.refs["hand_local"], ".gz")
    ds.refs["hand_local_zst"] = compress_copy(ds.refs["hand_local"], ".zst")
    _check_refs(ds)
    return ds


def _check_refs(ds: Datasets) -> None:
    """The data really exercises what the tests claim: inlined and range chunks both exist."""
    for name in ("nc4_local", "nc3_local"):
        refs = ds.load(name)
        chunks = {k: v for k, v in refs.items() if not k.rsplit("/", 1)[-1].startswith(".")}
        n_inline = sum(isinstance(v, str) for v in chunks.values())
        n_range = sum(isinstance(v, list) and len(v) == 3 for v in chunks.values())
        assert n_inline > 0 and n_range > 0, (name, n_inline, n_range)
    nc4 = ds.load("nc4_local")
    assert any(isinstance(v, str) and v.startswith("base64:") for v in nc4.values())
    for var in NCDUMP_VALUE_VARS:
        zarray = json.loads(nc4[f"{var}/.zarray"])
        assert zarray["compressor"] is None and not zarray["filters"], zarray
        assert zarray["dtype"].startswith("<"), zarray


def _main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "refmount-test-data")
    ds = build(root)
    total = sum(p.stat().st_size for p in ds.root.rglob("*") if p.is_file())
    print(f"built {ds.root}: {total} bytes")
    for name, p in sorted(ds.refs.items()):
        print(f"  {name:16s} {p}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
