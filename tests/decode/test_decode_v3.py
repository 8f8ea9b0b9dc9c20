"""Zarr v3 through ``-o decode``: a reference set whose keys are a zarr-python 3 store's files
(``zarr.json`` inline, chunks and shards as ``[path]`` or ``[path, 0, size]``), mounted with
``-o decode`` and read by netCDF-C (ncdump, CDO, NCO), GDAL and xarray, which read no Zarr v3:
every array they are shown holds zarr-python's values of the v3 store; xarray over the
decoded mount (Zarr v2) and over ``refmount serve -o decode`` equals xarray over the store."""

from __future__ import annotations

import json
import os
import re
import warnings

import numpy as np
import pytest
import xarray as xr
from support.clients import run_client as run
from support.clients import zarr_url as url
from support.v3store import ncdump_values, store_refs

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

GDAL_ENV = {**os.environ, "GDAL_PAM_ENABLED": "NO"}
NUMERIC = ["time", "lat", "lon", "temp", "be", "sharded", "blosc", "tr", "packed", "delta", "nested"]


def build_store(root) -> dict[str, np.ndarray]:
    """A v3 store (zarr-python 3) of arrays covering the codecs, dtypes and layouts."""
    import zarr
    import zarr.codecs as zc
    import zarr.codecs.numcodecs as znc

    rng = np.random.default_rng(44)
    store = zarr.storage.LocalStore(root)
    g = zarr.create_group(store, zarr_format=3, attributes={"title": "v3 through -o decode", "version": 3})
    values: dict[str, np.ndarray] = {}

    def add(name, data, dims, part=None, group=g, **kw):
        a = group.create_array(name, shape=data.shape, dtype=data.dtype, dimension_names=dims, **kw)
        if part is None:
            a[...] = data
        else:
            a[part] = data[part]
        values[name] = data

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        add("time", np.arange(4, dtype="<f8"), ["time"], chunks=(4,),
            attributes={"units": "days since 2000-01-01", "calendar": "standard"})
        add("lat", np.linspace(-50, 50, 6), ["lat"], chunks=(6,), attributes={"units": "degrees_north"})
        add("lon", np.linspace(0, 350, 8), ["lon"], chunks=(8,), attributes={"units": "degrees_east"})
        temp = (rng.standard_normal((4, 6, 8)) * 10 + 280).astype("<f4")
        temp[1, 2, 3] = np.nan
        add("temp", temp, ["time", "lat", "lon"], chunks=(2, 3, 4), fill_value=float("nan"),
            compressors=[zc.ZstdCodec(level=3)],
            # a declared missing value, as xarray writes it for v3 (NaN: base64 of its double)
            attributes={"units": "K", "long_name": "temperature", "_FillValue": "AAAAAAAA+H8="})
        add("be", rng.standard_normal((6, 8)), ["lat", "lon"], chunks=(3, 8), fill_value=-9999.0,
            serializer=zc.BytesCodec(endian="big"), compressors=[zc.GzipCodec(level=6)])
        sharded = rng.integers(-500, 500, (4, 6, 8)).astype("<i2")
        add("sharded", sharded, ["time", "lat", "lon"], part=(slice(0, 3),), chunks=(1, 3, 4),
            shards=(2, 6, 8), fill_value=-999, compressors=[zc.ZstdCodec(), zc.Crc32cCodec()],
            attributes={"valid_range": [-500, 500], "_FillValue": -999})
        add("blosc", rng.integers(0, 60000, (6, 8)).astype("<u2"), ["lat", "lon"], chunks=(2, 4),
            compressors=[zc.BloscCodec(cname="zstd", shuffle="bitshuffle")])
        add("tr", rng.standard_normal((6, 8)), ["lat", "lon"], chunks=(6, 4),
            filters=[zc.TransposeCodec(order=[1, 0])], compressors=[zc.ZstdCodec()])
        add("packed", np.round(rng.uniform(0, 100, (6, 8)), 1), ["lat", "lon"], chunks=(3, 4),
            filters=[znc.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i2")],
            compressors=[znc.Zlib(level=1)])
        add("delta", np.cumsum(rng.integers(0, 9, 4)).astype("<i4"), ["time"], chunks=(2,),
            filters=[znc.Delta(dtype="<i4")], compressors=[znc.Shuffle(elementsize=4), znc.Zlib()])
        add("station", np.array([b"Aberdeen", b"Bergen", b"Cork", b"Dundee", b"Exeter", b"Fife"], "S8"),
            ["lat"], chunks=(3,), compressors=[zc.GzipCodec()])
        add("flag", rng.integers(0, 2, 6).astype(bool), ["lat"], chunks=(6,))
        sub = g.create_group("obs", attributes={"kind": "observations"})
        add("nested", np.arange(8, dtype="<i8") * 3, ["lon"], group=sub, chunks=(4,),
            compressors=[zc.ZstdCodec()])
    return values


@pytest.fixture(scope="module")
def v3set(tmp_path_factory):
    """(the store, its reference set JSON, the values written)."""
    base = tmp_path_factory.mktemp("v3")
    store = base / "store"
    values = build_store(store)
    refs = store_refs(store, ranges=False)
    for key in [k for k in refs if k.startswith("temp/")]:  # some refs as ranges
        if isinstance(refs[key], list):
            refs[key] = [refs[key][0], 0, os.path.getsize(refs[key][0].removeprefix("file://"))]
    # an array with a codec nothing knows: served as stored, left out of the netCDF side
    odd = json.loads(refs["delta/zarr.json"])
    odd["codecs"] = [*odd["codecs"], {"name": "fancy_codec", "configuration": {}}]
    refs["odd/zarr.json"] = json.dumps(odd)
    refs["odd/c/0"] = "base64:AAAA"
    path = base / "v3.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return store, path, values


@pytest.fixture(scope="module")
def v3mount(v3set, tmp_path_factory):
    from support.mounts import Mounter

    mounter = Mounter(tmp_path_factory.mktemp("v3mounts"))
    try:
        yield mounter(v3set[1], "decode")
    finally:
        mounter.cleanup()


def zarr_values(store, name: str) -> np.ndarray:
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(zarr.open_array(zarr.storage.LocalStore(store, read_only=True), path=name,
                                          mode="r")[...])


def test_ncdump_header_shows_v3_arrays_as_netcdf_variables(v3mount):
    cdl = run("ncdump", "-h", url(v3mount))
    for decl in ("float temp(time, lat, lon) ;", "double be(lat, lon) ;", "short sharded(time, lat, lon) ;",
                 "ushort blosc(lat, lon) ;", "double tr(lat, lon) ;", "double packed(lat, lon) ;",
                 "int delta(time) ;", "char station(lat, string8) ;", "double time(time) ;"):
        assert decl in cdl, (decl, cdl)
    assert "temp:_FillValue = NaNf ;" in cdl and "sharded:_FillValue = -999s ;" in cdl
    assert 'temp:units = "K" ;' in cdl and "sharded:valid_range = -500s, 500s ;" in cdl
    assert ':title = "v3 through -o decode" ;' in cdl
    assert "flag" not in cdl and "odd" not in cdl  # booleans; a codec nothing knows
    assert "group: obs" in cdl or "nested" in cdl


def test_ncdump_values_equal_zarrs(v3mount, v3set):
    store, _path, _values = v3set
    for name in ("temp", "be", "sharded", "blosc", "tr", "packed", "delta", "time", "lat"):
        want = zarr_values(store, name)
        fill = {"temp": np.nan, "sharded": -999}.get(name)  # declared (_FillValue); the others none
        tokens = ncdump_values(run("ncdump", "-p", "9,17", "-v", name, url(v3mount)), name)
        assert len(tokens) == want.size, name
        for t, w in zip(tokens, want.ravel().tolist(), strict=True):
            if t == "_":
                assert fill is not None and (w == fill or (np.isnan(w) and np.isnan(fill))), (name, t, w)
            else:
                assert float(t) == pytest.approx(w, rel=1e-6), (name, t, w)
    # the sharded array's last time step is in no shard's written inner chunks: fill
    assert (zarr_values(store, "sharded")[3] == -999).all()
    station = ncdump_values(run("ncdump", "-v", "station", url(v3mount)), "station")
    assert station == ["Aberdeen", "Bergen", "Cork", "Dundee", "Exeter", "Fife"]


CDO_ROW = re.compile(r"\d+ : (\S+) (\S+) +(\S+) +(\d+) +(\d+) :(.*): (\S+)")


def test_cdo_and_ncks_read_the_sharded_and_compressed_arrays(v3mount, v3set):
    store, _path, _values = v3set
    rows = [CDO_ROW.fullmatch(line.strip()) for line in run("cdo", "-s", "infon", url(v3mount)).splitlines()]
    stats: dict[str, list] = {}  # parameter -> per time step: (missing, minimum, maximum)
    for m in filter(None, rows):
        numbers = [float(v) for v in m.group(6).split()]  # all missing: "nan" (the mean) only
        lo, hi = (numbers[0], numbers[2]) if len(numbers) == 3 else (None, None)
        stats.setdefault(m.group(7), []).append((int(m.group(5)), lo, hi))
    temp = zarr_values(store, "temp")
    assert [s[0] for s in stats["temp"]] == [int(np.isnan(t).sum()) for t in temp]
    for (_miss, lo, hi), t in zip(stats["temp"], temp, strict=True):
        assert (lo, hi) == pytest.approx((np.nanmin(t), np.nanmax(t)), rel=1e-4)
    sharded = zarr_values(store, "sharded")
    assert [s[0] for s in stats["sharded"]] == [int((s == -999).sum()) for s in sharded]
    text = run("ncks", "-H", "-C", "-v", "sharded", url(v3mount))
    printed = [-999 if t == "_" else int(t) for t in ncdump_values(text, "sharded")]
    assert printed == sharded.ravel().tolist()


def test_gdal_reads_the_decoded_v3_arrays(v3mount, v3set, tmp_path):
    store, _path, _values = v3set
    info = json.loads(run("gdalmdiminfo", str(v3mount), env=GDAL_ENV))
    assert {"temp", "sharded", "be", "blosc", "tr"} <= set(info["arrays"])
    assert [d.rpartition("/")[2] for d in info["arrays"]["sharded"]["dimensions"]] == ["time", "lat", "lon"]
    for name, dtype in (("sharded", "<i2"), ("be", "<f8"), ("tr", "<f8")):
        array = f"/{name}:1" if name == "sharded" else f"/{name}"
        out = tmp_path / f"{name}.bin"
        run("gdal_translate", "-q", "-of", "ENVI", f'ZARR:"{v3mount}":{array}', str(out), env=GDAL_ENV)
        want = zarr_values(store, name)
        want = want[1] if name == "sharded" else want
        np.testing.assert_array_equal(np.fromfile(out, dtype).reshape(want.shape), want)


def test_xarray_over_the_decoded_mount_equals_xarray_over_the_v3_store(v3mount, v3set):
    store, _path, _values = v3set
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        orig = xr.open_zarr(store, consolidated=False, zarr_format=3)
        dec = xr.open_zarr(v3mount.path, consolidated=False, zarr_format=2, drop_variables=["station"])
        # netCDF's side leaves out booleans and the char array reads as <U1 through the view
        assert set(dec.variables) == set(orig.variables) - {"flag", "station"}
        for v in dec.variables:
            xr.testing.assert_identical(dec[v].load(), orig[v].load())
        nested = xr.open_zarr(v3mount.path, group="obs", consolidated=False, zarr_format=2)
        original = xr.open_zarr(store, group="obs", consolidated=False)
        xr.testing.assert_identical(nested.load(), original.load())


def test_listing_xattrs_and_the_unknown_codec(v3mount):
    names = sorted(os.listdir(v3mount.path / "sharded"))
    assert names[:2] == [".zarray", ".zattrs"] and "zarr.json" not in names and "c" not in names
    # 4 x 2 x 2 inner chunks; the shard of time steps 2-3 holds time step 2 only, but is stored
    assert len(names) == 2 + 16 and (v3mount.path / "sharded" / "3.1.1").stat().st_size == 3 * 4 * 2
    assert sorted(os.listdir(v3mount.path)) [:2] == [".zattrs", ".zgroup"]
    left_out = json.loads(os.getxattr(v3mount.path, "user.refmount.netcdf_left_out"))
    assert "fancy_codec" in left_out["odd"] and "boolean" in left_out["flag"]
    assert sorted(os.listdir(v3mount.path / "odd")) == ["c", "zarr.json"]  # as stored
    log = v3mount.log_text()
    assert "fancy_codec" in log or "fancy_codec" in (v3mount.result.stderr if v3mount.result else "")


def test_serve_decode_gives_xarray_the_v3_set_over_http(v3set, serve):
    store, path, _values = v3set
    s = serve(path, "decode")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = xr.open_zarr(s.url, consolidated=True, zarr_format=2)
        orig = xr.open_zarr(store, consolidated=False, zarr_format=3)
        assert set(d.variables) == set(orig.variables)  # booleans and char too (zarr's side)
        for v in d.variables:
            xr.testing.assert_identical(d[v].load(), orig[v].load())
    assert "temp/.zarray" in json.loads(s.request("GET", "/.zmetadata").body)["metadata"]
    raw = serve(path)  # as stored (zarr.json): no v2 .zmetadata is made up
    assert raw.request("GET", "/.zmetadata").status == 404
    assert raw.request("GET", "/zarr.json").status == 200
    assert b".zmetadata" not in raw.request("GET", "/").body
