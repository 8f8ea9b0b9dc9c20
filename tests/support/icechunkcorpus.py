"""Icechunk repositories and Zarr v3 stores made the ways people make them, at test time:

- ``xarray_repo``: xarray ``to_zarr`` into icechunk 1.1.21 sessions — a CF dataset with a
  ``crs`` scalar whose chunk is never written (its value is the fill value), char station names,
  packed shorts (``scale_factor``/``add_offset``), ``time`` appended over two commits; a tag
  ``v1`` on the first commit and a branch ``dev`` from it with a commit of its own;
- ``virtualizarr_repo``: VirtualiZarr 2.5.1 ``to_icechunk`` of two CF netCDF4 files (the
  ``time`` halves of the same dataset), the netCDF files' directory a local virtual chunk
  container (read with ``-o allow_local=DIR``);
- ``sharded_store``: a zarr-python 3 store with a sharded array and the same never-written
  ``crs``, referenced as a kerchunk-style v3 set (``v3store.store_refs``).

Each gives the dataset it wrote (``expected``), as xarray decodes it.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr

from .v3store import store_refs

NT, NLAT, NLON, NSTATION = 6, 4, 5, 3


def cf_dataset(t0: int = 0, nt: int = NT) -> xr.Dataset:
    """The CF dataset (time steps ``t0`` .. ``t0 + nt``)."""
    time = np.arange(t0, t0 + nt, dtype="f8")
    lat = np.linspace(-30, 30, NLAT)
    lon = np.linspace(0, 80, NLON)
    rng = np.random.default_rng(53)
    full = 250 + 40 * rng.random((NT, NLAT, NLON))
    temp = np.round(full[t0:t0 + nt], 2).astype("f4")
    temp[0, 0, 0] = np.nan
    names = np.array([list(n.ljust(6)) for n in ("alpha", "bravo", "cx")], dtype="S1")
    ds = xr.Dataset(
        {
            "temp": (("time", "lat", "lon"), temp, {"units": "K", "grid_mapping": "crs"}),
            "station_name": (("station", "strlen"), names, {"long_name": "station name"}),
            "crs": ((), np.int32(0), {"grid_mapping_name": "latitude_longitude"}),
        },
        coords={"time": ("time", time, {"units": "days since 2000-01-01"}),
                "lat": ("lat", lat, {"units": "degrees_north"}),
                "lon": ("lon", lon, {"units": "degrees_east"})},
        attrs={"title": "producers' corpus", "Conventions": "CF-1.8"},
    )
    ds["temp"].encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 270.0,
                           "_FillValue": -32768}
    return ds


def _expected(ds: xr.Dataset) -> xr.Dataset:
    """What a reader decodes: packed values rounded as stored."""
    out = ds.copy(deep=True)
    packed = np.round((out["temp"].values - 270.0) / 0.01)
    out["temp"].values = np.where(np.isnan(packed), np.nan, packed * 0.01 + 270.0).astype("f4")
    return out


@dataclass
class Repo:
    root: Path
    expected: xr.Dataset
    files: Path | None = None  # a virtual chunk container's directory (allow_local)
    snapshots: dict[str, str] = field(default_factory=dict)
    dev_expected: xr.Dataset | None = None


def xarray_repo(root: Path) -> Repo:
    import icechunk

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    first, second = cf_dataset(0, NT // 2), cf_dataset(NT // 2, NT - NT // 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = repo.writable_session("main")
        first.to_zarr(session.store, mode="w", consolidated=False, zarr_format=3)
        snap1 = session.commit("first half")
        session = repo.writable_session("main")
        second.drop_vars(["station_name", "crs", "lat", "lon"]).to_zarr(
            session.store, append_dim="time", consolidated=False, zarr_format=3)
        snap2 = session.commit("second half")
        repo.create_tag("v1", snap1)
        repo.create_branch("dev", snap1)
        session = repo.writable_session("dev")
        import zarr

        zarr.open_array(session.store, path="temp")[0] = 2000  # packed: 290.0 K
        snap3 = session.commit("dev: first step 290 K")
    whole = xr.concat([first, second], dim="time", data_vars="minimal")
    whole["station_name"], whole["crs"] = first["station_name"], first["crs"]
    dev = _expected(first)
    dev["temp"].values[0] = 290.0
    return Repo(root, _expected(whole), snapshots={"first": snap1, "second": snap2, "dev": snap3},
                dev_expected=dev)


def write_netcdf(path: Path, ds: xr.Dataset) -> None:
    ds.to_netcdf(path, format="NETCDF4", unlimited_dims=["time"])


def virtualizarr_repo(root: Path, files: Path) -> Repo:
    import icechunk
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser
    from virtualizarr.registry import ObjectStoreRegistry

    files.mkdir(parents=True, exist_ok=True)
    halves = [cf_dataset(0, NT // 2), cf_dataset(NT // 2, NT - NT // 2)]
    paths = []
    for i, half in enumerate(halves):
        path = files / f"part{i}.nc"
        write_netcdf(path, half)
        paths.append(path)
    from obstore.store import LocalStore

    registry = ObjectStoreRegistry({"file://": LocalStore()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vds = [open_virtual_dataset(f"file://{p}", parser=HDFParser(), registry=registry,
                                    loadable_variables=["time", "lat", "lon", "crs", "station_name"])
               for p in paths]
        combined = xr.concat(vds, dim="time", coords="minimal", compat="override",
                             data_vars="minimal", combine_attrs="override")
        container = f"file://{files}/"
        config = icechunk.RepositoryConfig.default()
        config.inline_chunk_threshold_bytes = 8  # the loaded coordinates: the repository's objects
        config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
            container, icechunk.local_filesystem_store(str(files))))
        repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)), config)
        session = repo.writable_session("main")
        combined.virtualize.to_icechunk(session.store)
        snap = session.commit("virtual netCDF4")
    whole = xr.concat(halves, dim="time", data_vars="minimal")
    whole["station_name"], whole["crs"] = halves[0]["station_name"], halves[0]["crs"]
    return Repo(root, _expected(whole), files=files, snapshots={"main": snap})


def sharded_store(store_dir: Path, refs_path: Path) -> Repo:
    """A zarr-python 3 store (sharded ``temp``, a never-written ``crs``), as a v3 JSON set."""
    import zarr

    ds = cf_dataset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.drop_vars("station_name").to_zarr(
            zarr.storage.LocalStore(store_dir), mode="w", consolidated=False, zarr_format=3,
            encoding={"temp": {**ds["temp"].encoding, "shards": (2, NLAT, NLON),
                               "chunks": (1, 2, NLON)}})
    refs_path.write_text(json.dumps(store_refs(store_dir, ranges=True)))
    return Repo(refs_path, _expected(ds.drop_vars("station_name")))
