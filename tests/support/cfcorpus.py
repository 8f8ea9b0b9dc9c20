"""Ordinary CF files of the kind model and observation archives hold, written by netCDF4-python,
and kerchunk reference sets of them (for the ``-o decode`` tests with netCDF-C's tools).

``build(root)`` writes under ``root``:

    cf4.nc      netCDF4: unlimited ``time`` (3 steps; HDF5 chunks it ``[512]``...), char station
                names, a float with ``_FillValue`` holding it, a packed ``short``
                (``scale_factor``/``add_offset`` float32) with ``_FillValue``, a CF ``crs``
                scalar (no data written) with a long WKT and ``grid_mapping``, a float scalar
                with a value, ``int64`` and ``uint8`` (``valid_range``) variables, global
                attributes of several types, variable-length strings, a group ``obs`` with its
                own dimension.
    cf3.nc      netCDF3 classic (big-endian): unlimited ``time``, char station names, a float
                with ``missing_value`` only, a short with ``_FillValue``, a ``crs`` scalar.
    part0..2.nc three netCDF4 files consecutive along an unlimited ``time`` (char names, a
                float with ``_FillValue``, a packed short, ``crs``), ``cat.nc`` = their
                ``ncrcat``.
    cf4.json, cf3.json, combined.json   kerchunk reference sets (Version 1), next to the files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

WKT = ('GEOGCRS["WGS 84",DATUM["World Geodetic System 1984",ELLIPSOID["WGS 84",6378137,'
       '298.257223563,LENGTHUNIT["metre",1]]],PRIMEM["Greenwich",0,ANGLEUNIT["degree",'
       '0.0174532925199433]],CS[ellipsoidal,2],AXIS["geodetic latitude (Lat)",north,ORDER[1],'
       'ANGLEUNIT["degree",0.0174532925199433]],AXIS["geodetic longitude (Lon)",east,ORDER[2],'
       'ANGLEUNIT["degree",0.0174532925199433]],USAGE[SCOPE["Horizontal component of 3D '
       'system."],AREA["World."],BBOX[-90,-180,90,180]],ID["EPSG",4326]]')
STATIONS = ["Aberdeen", "Bergen", "Cork"]


def _stations(ds, netCDF4) -> None:
    ds.createDimension("station", len(STATIONS))
    ds.createDimension("name_strlen", 8)
    names = ds.createVariable("station_name", "S1", ("station", "name_strlen"))
    names.cf_role = "timeseries_id"
    names[:] = netCDF4.stringtochar(np.array(STATIONS, "S8"))


def _crs(ds, with_value: bool = False) -> None:
    crs = ds.createVariable("crs", "i4")
    crs.grid_mapping_name = "latitude_longitude"
    crs.crs_wkt = WKT
    crs.semi_major_axis = 6378137.0
    crs.inverse_flattening = 298.257223563
    if with_value:
        crs.assignValue(0)


def make_cf4(path: Path) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.Conventions = "CF-1.8"
        ds.title = "stations"
        ds.version = np.int32(3)
        ds.levels = np.array([1.5, 2.5], "f4")
        ds.createDimension("time", None)
        _stations(ds, netCDF4)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01 00:00:00"
        t.standard_name = "time"
        t.calendar = "standard"
        t[:] = [0.5, 1.5, 2.5]
        temp = ds.createVariable("temp", "f4", ("time", "station"), fill_value=np.float32(-9999.0))
        temp.units = "K"
        temp.grid_mapping = "crs"
        temp.coordinates = "station_name"
        temp.comment = "2 m above ground, read in °C, stored in K"
        temp[:] = np.ma.masked_array([[280.5, 281.25, 0], [282, 283, 284], [285, 286, 287.5]],
                                     mask=[[0, 0, 1], [0, 0, 0], [0, 1, 0]])
        packed = ds.createVariable("pres", "i2", ("time", "station"), fill_value=np.int16(-32767))
        packed.scale_factor = np.float32(0.01)
        packed.add_offset = np.float32(1000.0)
        packed.units = "hPa"
        packed.set_auto_maskandscale(False)
        packed[:] = np.array([[100, -200, 300], [-32767, 5, 6], [7, 8, 9]], "i2")
        _crs(ds)
        height = ds.createVariable("height", "f4")
        height.units = "m"
        height.assignValue(2.0)
        counts = ds.createVariable("counts", "i8", ("time",))
        counts[:] = [2**40, -5, 7]
        flags = ds.createVariable("flags", "u1", ("time", "station"))
        flags.valid_range = np.array([0, 200], "u1")
        flags.flag_values = np.array([1, 2, 4], "u1")
        flags.flag_meanings = "low mid high"
        flags[:] = np.array([[1, 2, 4], [4, 2, 1], [250, 1, 2]], "u1")
        names = ds.createVariable("remark", str, ("station",))
        for i, s in enumerate(["calm", "windy day", "x"]):
            names[i] = s
        obs = ds.createGroup("obs")
        obs.createDimension("level", 2)
        lev = obs.createVariable("depth", "f8", ("level",))
        lev.units = "m"
        lev[:] = [0.5, 10.0]
        sal = obs.createVariable("salinity", "f4", ("level",), fill_value=np.float32(-1.0))
        sal[:] = np.ma.masked_array([35.25, 0], mask=[0, 1])


def make_cf3(path: Path) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as ds:
        ds.Conventions = "CF-1.6"
        ds.createDimension("time", None)
        _stations(ds, netCDF4)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "hours since 2010-06-01"
        t[:] = [0, 6, 12]
        wind = ds.createVariable("wind", "f4", ("time", "station"))
        wind.missing_value = np.float32(-99.0)
        wind.units = "m s-1"
        wind.set_auto_maskandscale(False)
        wind[:] = np.array([[1.5, -99, 3], [4, 5, -99], [7, 8, 9]], "f4")
        elev = ds.createVariable("elev", "i2", ("station",), fill_value=np.int16(-999))
        elev.valid_min = np.int16(-500)
        elev[:] = np.ma.masked_array([10, 0, 30], mask=[0, 1, 0])
        _crs(ds, with_value=True)


def make_part(path: Path, part: int) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", None)
        _stations(ds, netCDF4)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(3) + 3 * part
        temp = ds.createVariable("temp", "f4", ("time", "station"), fill_value=np.float32(-9999.0))
        temp.grid_mapping = "crs"
        values = np.arange(9, dtype="f4").reshape(3, 3) + 10 * part
        temp[:] = np.ma.masked_array(values, mask=np.eye(3)[part % 3][None, :].repeat(3, 0) * (part == 1))
        packed = ds.createVariable("pres", "i2", ("time", "station"), fill_value=np.int16(-1))
        packed.scale_factor = 0.5
        packed.add_offset = 10.0
        packed.set_auto_maskandscale(False)
        packed[:] = (np.arange(9).reshape(3, 3) * (part + 1)).astype("i2")
        _crs(ds)


def kerchunk_refs(path: Path) -> dict:
    from kerchunk.hdf import SingleHdf5ToZarr
    from kerchunk.netCDF3 import NetCDF3ToZarr

    with open(path, "rb") as f:
        netcdf3 = f.read(3) == b"CDF"
    if netcdf3:
        return NetCDF3ToZarr(str(path), inline_threshold=100).translate()
    return SingleHdf5ToZarr(str(path), inline_threshold=100).translate()


def build(root: Path) -> dict[str, tuple[Path, Path]]:
    """{set name: (reference set, the file netCDF-C reads as its original)}."""
    from kerchunk.combine import MultiZarrToZarr

    root.mkdir(parents=True, exist_ok=True)
    make_cf4(root / "cf4.nc")
    make_cf3(root / "cf3.nc")
    parts = [root / f"part{i}.nc" for i in range(3)]
    for i, p in enumerate(parts):
        make_part(p, i)
    ncrcat = shutil.which("ncrcat")
    assert ncrcat, "ncrcat is not installed (Debian package nco)"
    subprocess.run([ncrcat, "-O", *map(str, parts), str(root / "cat.nc")], check=True, timeout=120,
                   capture_output=True)
    out = {}
    for name in ("cf4", "cf3"):
        ref = root / f"{name}.json"
        ref.write_text(json.dumps(kerchunk_refs(root / f"{name}.nc")))
        out[name] = (ref, root / f"{name}.nc")
    combined = MultiZarrToZarr([kerchunk_refs(p) for p in parts], concat_dims=["time"],
                               identical_dims=["station", "name_strlen", "station_name", "crs"]).translate()
    (root / "combined.json").write_text(json.dumps(combined))
    out["combined"] = (root / "combined.json", root / "cat.nc")
    return out
