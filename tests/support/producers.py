"""A producers' corpus: reference sets written by the real tools at test time (no committed
blobs), each next to the files it points at.

``build_corpus(root, datasets)`` writes under ``root`` and returns ``{name: Case}``:

- kerchunk ``SingleHdf5ToZarr`` over the suite's netCDF4 file, inline thresholds 0 and 10**6;
- kerchunk ``NetCDF3ToZarr`` over the suite's netCDF3 file;
- GRIB2 written with eccodes from its own ``GRIB2`` sample (three messages: two levels of
  ``t``, one of ``u``), referenced by kerchunk ``scan_grib`` (one message) and ``grib_tree``;
- TIFF written by tifffile (tiled, raw and zlib), referenced by kerchunk ``tiff_to_zarr``;
- FITS written by astropy (an image, a binary table, an ASCII table), referenced by kerchunk
  ``fits.process_file``;
- two netCDF4 files combined along ``time`` by kerchunk ``MultiZarrToZarr``;
- kerchunk ``refs_to_dataframe`` Parquet of a netCDF4 file of 12,000 chunks (record_size 10,000
  and 100,000, categorical paths) and of the combined set (paths not categorical);
- VirtualiZarr's ``to_kerchunk`` JSON (a Version 1 file) and Parquet writers.

JSON files are written as these tools write them (``ujson``: compact, ``\\/`` escapes; bytes
values as text or ``base64:``).
"""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CHUNKY_N = 12_000  # chunks of the Parquet source array: two records at record_size 10,000


@dataclass
class Case:
    name: str
    source: Path  # a JSON file or a Parquet directory
    groups: list[str | None] = field(default_factory=lambda: [None])  # compared with xarray
    xarray: bool = True  # False: no xarray (a root array, compared with zarr; structured tables)


def _text(value):
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    return value


def write_refs(path: Path, refs: dict) -> Path:
    """As kerchunk's writers do: ujson, bytes values as text (or base64 when not UTF-8)."""
    import ujson

    if "refs" in refs and "version" in refs:
        refs = {**refs, "refs": {k: _text(v) for k, v in refs["refs"].items()}}
    else:
        refs = {k: _text(v) for k, v in refs.items()}
    path.write_text(ujson.dumps(refs))
    return path


def make_grib(path: Path) -> None:
    import eccodes

    with open(path, "wb") as out:
        for i, (name, level) in enumerate([("t", 850), ("t", 500), ("u", 850)]):
            h = eccodes.codes_grib_new_from_samples("GRIB2")
            try:
                eccodes.codes_set(h, "typeOfLevel", "isobaricInhPa")
                eccodes.codes_set(h, "level", level)
                eccodes.codes_set(h, "shortName", name)
                n = eccodes.codes_get(h, "Ni") * eccodes.codes_get(h, "Nj")
                eccodes.codes_set_values(h, np.linspace(200, 300, n) + 10 * i)
                eccodes.codes_write(h, out)
            finally:
                eccodes.codes_release(h)


def make_tiff(path: Path, compression: str | None) -> None:
    import tifffile

    data = (np.arange(64 * 96, dtype="uint16").reshape(64, 96) * 7) % 65521
    # metadata=None: kerchunk's tiff_to_zarr fails on tifffile's "shaped" description metadata
    tifffile.imwrite(path, data, tile=(32, 32), compression=compression, metadata=None)


def make_fits(path: Path) -> None:
    from astropy.io import fits

    image = fits.PrimaryHDU(np.arange(120, dtype=">f4").reshape(10, 12))
    table = fits.BinTableHDU.from_columns(
        [fits.Column(name="a", format="J", array=np.arange(5)),
         fits.Column(name="b", format="E", array=np.linspace(0, 1, 5))], name="TAB")
    ascii_table = fits.TableHDU.from_columns(
        [fits.Column(name="s", format="A8", array=np.array(["ab", "cd", "ef"])),
         fits.Column(name="n", format="I6", array=np.arange(3))], name="ASC")
    fits.HDUList([image, table, ascii_table]).writeto(path, overwrite=True)


def make_parts(data: Path) -> list[Path]:
    import netCDF4

    paths = []
    for i in range(2):
        p = data / f"part{i}.nc"
        with netCDF4.Dataset(p, "w") as ds:
            ds.createDimension("time", 3)
            ds.createDimension("x", 5)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = np.arange(3) + 3 * i
            v = ds.createVariable("v", "f4", ("time", "x"), zlib=True, chunksizes=(1, 5),
                                  fill_value=np.float32(np.nan))
            v[:] = np.arange(15, dtype="f4").reshape(3, 5) + 100 * i
            v[1, 1] = np.nan
            x = ds.createVariable("x", "i4", ("x",))
            x[:] = np.arange(5)
        paths.append(p)
    return paths


def make_chunky(path: Path) -> None:
    """One variable of CHUNKY_N one-element chunks (and its coordinate)."""
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("n", CHUNKY_N)
        v = ds.createVariable("v", "i4", ("n",), chunksizes=(1,))
        v[:] = np.arange(CHUNKY_N, dtype="i4") * 3 - 7


def build_corpus(root: Path, nc4: Path, nc3: Path) -> dict[str, Case]:
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.df import refs_to_dataframe
    from kerchunk.fits import process_file
    from kerchunk.grib2 import grib_tree, scan_grib
    from kerchunk.hdf import SingleHdf5ToZarr
    from kerchunk.netCDF3 import NetCDF3ToZarr
    from kerchunk.tiff import tiff_to_zarr

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    cases: dict[str, Case] = {}
    nc4, nc3 = Path(shutil.copy(nc4, data)), Path(shutil.copy(nc3, data))

    def add(name: str, source: Path, **kw) -> None:
        cases[name] = Case(name, source, **kw)

    groups = [None, "sub", "sub/deeper"]
    for label, threshold in (("inline0", 0), ("inline1M", 10**6)):
        refs = SingleHdf5ToZarr(str(nc4), inline_threshold=threshold).translate()
        add(f"hdf5-{label}", write_refs(root / f"hdf5-{label}.json", refs), groups=groups)

    add("netcdf3", write_refs(root / "netcdf3.json", NetCDF3ToZarr(str(nc3)).translate()))

    grib = data / "t.grib2"
    make_grib(grib)
    messages = scan_grib(str(grib))
    add("grib2-scan_grib", write_refs(root / "grib-message.json", messages[0]))
    add("grib2-grib_tree", write_refs(root / "grib-tree.json", grib_tree(messages)),
        groups=["t/instant/isobaricInhPa", "u/instant/isobaricInhPa"])

    for label, compression in (("raw", None), ("zlib", "zlib")):
        tif = data / f"img-{label}.tif"
        make_tiff(tif, compression)
        add(f"tiff-{label}", write_refs(root / f"tiff-{label}.json", tiff_to_zarr(str(tif))),
            xarray=False)  # a root array: compared with zarr

    fits_path = data / "x.fits"
    make_fits(fits_path)
    add("fits-image", write_refs(root / "fits-image.json", process_file(str(fits_path))),
        groups=[None])
    add("fits-tables", write_refs(root / "fits-tables.json",
                                  process_file(str(fits_path), extension=["TAB", "ASC"])),
        xarray=False)

    parts = make_parts(data)
    singles = [SingleHdf5ToZarr(str(p), inline_threshold=0).translate() for p in parts]
    mzz = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["x"]).translate()
    add("multizarr", write_refs(root / "multizarr.json", mzz))
    refs_to_dataframe(mzz, str(root / "multizarr.parq"), record_size=10_000,
                      categorical_threshold=10**9)
    add("multizarr-parquet", root / "multizarr.parq")

    chunky = data / "chunky.nc"
    make_chunky(chunky)
    chunky_refs = SingleHdf5ToZarr(str(chunky), inline_threshold=0).translate()
    for record_size in (10_000, 100_000):
        out = root / f"chunky-{record_size}.parq"
        refs_to_dataframe(chunky_refs, str(out), record_size=record_size)
        # xarray over 12,000 chunks takes ~10 s a side: once, where records split the array
        add(f"parquet-{record_size // 1000}k", out, xarray=record_size == 10_000)

    from obstore.store import LocalStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser
    from virtualizarr.registry import ObjectStoreRegistry

    registry = ObjectStoreRegistry({"file://": LocalStore()})
    vds = open_virtual_dataset(f"file://{parts[1]}", parser=HDFParser(), registry=registry)
    vds.vz.to_kerchunk(str(root / "virtualizarr.json"), format="json")
    add("virtualizarr-json", root / "virtualizarr.json")
    vds.vz.to_kerchunk(str(root / "virtualizarr.parq"), format="parquet", record_size=2)
    add("virtualizarr-parquet", root / "virtualizarr.parq")
    assert all(os.path.exists(c.source) for c in cases.values())
    return cases
