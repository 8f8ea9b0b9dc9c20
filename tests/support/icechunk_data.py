"""Icechunk repositories written at test time by icechunk 1.1.21 (format version 1): native,
inline and virtual chunks, several commits, a branch and a tag.

The virtual chunks are ranges of a netCDF-4 file (written by netCDF4, a contiguous variable; its
offset from h5py) that nginx serves: ``build_repository(root, files_dir, base_url)`` writes the
file under ``files_dir`` and the repository at ``root``, its virtual chunks at ``base_url``.
icechunk 1.1.21 drops the port of a virtual chunk's URL (``http://127.0.0.1:8080/x`` is recorded
as ``http://127.0.0.1/x``), so ``base_url`` is port-less (``VIRTUAL_BASE``) and the tests read it
through a target rule that rewrites it to nginx's address (which authorises it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

VIRTUAL_BASE = "http://127.0.0.1/icechunk-files"
ROWS, COLS = 8, 6  # the virtual array: ROWS x COLS float32, one virtual chunk per 2 rows


@dataclass
class Built:
    root: Path
    container: str  # the virtual chunk container's URL prefix (base_url + "/")
    netcdf: Path  # the netCDF file the virtual chunks read
    snapshots: dict[str, str] = field(default_factory=dict)  # "first", "second", "dev", "tagged"
    expected: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # by the same names


def write_netcdf(path: Path, values: np.ndarray) -> tuple[int, int]:
    """A netCDF-4 file with one contiguous float32 variable ``v``; (offset, bytes) of its data."""
    import h5py
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", values.shape[0])
        ds.createDimension("x", values.shape[1])
        var = ds.createVariable("v", "f4", ("y", "x"), contiguous=True)
        var[:] = values
    with h5py.File(path, "r") as f:
        offset = f["v"].id.get_offset()
    return int(offset), values.nbytes


def virtual_refs(store: Any, url: str, offset: int, checksum: Any = None) -> None:
    """The array ``virtual`` (ROWS x COLS float32, chunks of 2 rows) as virtual chunks of ``url``."""
    row = COLS * 4
    for i in range(ROWS // 2):
        store.set_virtual_ref(f"virtual/c/{i}/0", url, offset=offset + 2 * i * row, length=2 * row,
                              checksum=checksum)


def repository_config(container: str) -> Any:
    import icechunk

    config = icechunk.RepositoryConfig.default()
    config.inline_chunk_threshold_bytes = 64  # chunks of the array "small" are inline
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(container, icechunk.http_store()))
    return config


def build_repository(root: Path, files_dir: Path, base_url: str = VIRTUAL_BASE, *,
                     checksum: bool = True) -> Built:
    """The repository (see the module's docstring). Snapshots: "first" (main's first commit),
    "second" (main's head), "tagged" (tag v1 = first), "dev" (branch dev from first, one commit)."""
    import datetime

    import icechunk
    import zarr

    files_dir.mkdir(parents=True, exist_ok=True)
    values = np.arange(ROWS * COLS, dtype="f4").reshape(ROWS, COLS) * 0.5
    netcdf = files_dir / "virtual.nc"
    offset, _ = write_netcdf(netcdf, values)
    url = f"{base_url}/virtual.nc"
    container = f"{base_url}/"
    storage = icechunk.local_filesystem_storage(str(root))
    repo = icechunk.Repository.create(storage, repository_config(container))

    built = Built(root, container, netcdf)
    session = repo.writable_session("main")
    group = zarr.group(store=session.store, attributes={"title": "refmount test"})
    native = group.create_array("native", shape=(40, 10), chunks=(8, 5), dtype="i4",
                                compressors=None, fill_value=-1, dimension_names=["row", "col"])
    native[:] = np.arange(400, dtype="i4").reshape(40, 10)
    small = group.create_array("small", shape=(6,), chunks=(2,), dtype="i2", compressors=None,
                               fill_value=0, dimension_names=["s"])
    small[:] = np.array([1, 2, 3, 4, 5, 6], "i2")
    sub = group.create_group("sub")
    zipped = sub.create_array("zipped", shape=(30,), chunks=(7,), dtype="f8")  # zstd
    zipped[:] = np.linspace(0, 1, 30)
    sub.create_array("scalar", shape=(), dtype="u1", fill_value=7, compressors=None)[()] = 42
    group.create_array("virtual", shape=(ROWS, COLS), chunks=(2, COLS), dtype="f4", compressors=None,
                       fill_value=0, dimension_names=["y", "x"])
    modified = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=5)
    stamp = modified if checksum else None
    virtual_refs(session.store, url, offset, stamp)
    built.snapshots["first"] = session.commit("first")
    built.expected["first"] = {"native": native[:], "small": small[:], "sub/zipped": zipped[:],
                               "sub/scalar": np.array(42, "u1"), "virtual": values}
    repo.create_tag("v1", built.snapshots["first"])
    built.snapshots["tagged"] = built.snapshots["first"]
    built.expected["tagged"] = built.expected["first"]

    repo.create_branch("dev", built.snapshots["first"])
    session = repo.writable_session("dev")
    dev_native = zarr.open_array(session.store, path="native")
    dev_native[:8, :] = 7
    built.snapshots["dev"] = session.commit("dev: first rows 7")
    built.expected["dev"] = {**built.expected["first"], "native": dev_native[:]}

    session = repo.writable_session("main")
    main_native = zarr.open_array(session.store, path="native")
    main_native[32:, :] = -5
    main_small = zarr.open_array(session.store, path="small")
    main_small[4:] = 0  # back to the fill value: chunk 2 of "small" still written (zeros)
    built.snapshots["second"] = session.commit("second")
    built.expected["second"] = {**built.expected["first"], "native": main_native[:], "small": main_small[:]}
    return built


def commit_more(root: Path, container: str, value: int) -> str:
    """One more commit on main (native[:] = value); its snapshot id."""
    import icechunk
    import zarr

    storage = icechunk.local_filesystem_storage(str(root))
    repo = icechunk.Repository.open(storage, repository_config(container))
    session = repo.writable_session("main")
    zarr.open_array(session.store, path="native")[:] = value
    return session.commit(f"native = {value}")


def read_with_icechunk(root: Path, snapshot: str) -> dict[str, np.ndarray]:
    """The arrays of a snapshot with native and inline chunks as icechunk's own store reads them
    (not ``virtual``: icechunk 1.1.21 would read its port-less URL, see the module's docstring)."""
    import icechunk
    import zarr

    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(root)))
    group = zarr.open_group(repo.readonly_session(snapshot_id=snapshot).store, mode="r")
    return {path: group[path][...] for path in ("native", "small", "sub/zipped", "sub/scalar")}


def build_local_virtual(root: Path, files_dir: Path) -> tuple[str, np.ndarray]:
    """A repository whose array ``virtual`` is virtual chunks of a local netCDF file, under the
    container ``file://<files_dir>/``; (that container, the values)."""
    import icechunk
    import zarr

    files_dir.mkdir(parents=True, exist_ok=True)
    values = np.arange(ROWS * COLS, dtype="f4").reshape(ROWS, COLS) + 100
    netcdf = files_dir / "local.nc"
    offset, _ = write_netcdf(netcdf, values)
    container = f"file://{files_dir}/"
    config = icechunk.RepositoryConfig.default()
    store = icechunk.local_filesystem_store(str(files_dir))
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(container, store))
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)), config)
    session = repo.writable_session("main")
    group = zarr.group(store=session.store)
    group.create_array("virtual", shape=(ROWS, COLS), chunks=(2, COLS), dtype="f4", compressors=None,
                       fill_value=0, dimension_names=["y", "x"])
    virtual_refs(session.store, f"file://{netcdf}", offset)
    session.commit("local virtual chunks")
    return container, values


def read_local_virtual_with_icechunk(root: Path, container: str) -> np.ndarray:
    """The array ``virtual`` as icechunk's own store reads it (the container authorised)."""
    import icechunk
    import zarr

    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(root)),
                                    authorize_virtual_chunk_access={container: None})
    return zarr.open_array(repo.readonly_session(branch="main").store, path="virtual", mode="r")[...]


@dataclass
class Decodable:
    root: Path
    netcdf: Path  # the netCDF file the array ``virtual`` reads
    snapshot: str
    dataset: Any  # the xarray Dataset written (time, lat, lon, temp)
    sharded: np.ndarray


def build_decodable(root: Path, files_dir: Path, base_url: str = VIRTUAL_BASE) -> Decodable:
    """A repository as xarray and zarr-python write one: an xarray Dataset (coordinates ``time``,
    ``lat``, ``lon``; ``temp`` zstd-compressed float32 with a ``_FillValue``, one NaN), the
    array ``virtual`` (virtual chunks of a netCDF-4 file under ``files_dir``, at ``base_url``)
    and ``sharded`` (int16, shards of 2 x 6 x 8 holding inner chunks of 1 x 3 x 4, zstd)."""
    import warnings

    import icechunk
    import xarray as xr
    import zarr

    files_dir.mkdir(parents=True, exist_ok=True)
    values = np.arange(ROWS * COLS, dtype="f4").reshape(ROWS, COLS) * 0.5
    netcdf = files_dir / "virtual.nc"
    offset, _ = write_netcdf(netcdf, values)
    storage = icechunk.local_filesystem_storage(str(root))
    repo = icechunk.Repository.create(storage, repository_config(f"{base_url}/"))
    session = repo.writable_session("main")
    rng = np.random.default_rng(44)
    temp = (rng.standard_normal((4, 6, 8)) * 10 + 280).astype("f4")
    temp[1, 2, 3] = np.nan
    ds = xr.Dataset({"temp": (("time", "lat", "lon"), temp, {"units": "K", "long_name": "temperature"})},
                    coords={"time": ("time", np.arange(4.0), {"units": "days since 2000-01-01"}),
                            "lat": ("lat", np.linspace(-50, 50, 6), {"units": "degrees_north"}),
                            "lon": ("lon", np.linspace(0, 350, 8), {"units": "degrees_east"})},
                    attrs={"title": "icechunk through -o decode"})
    ds["temp"].encoding = {"chunks": (2, 3, 4), "_FillValue": np.float32(-9999.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(session.store, zarr_format=3, consolidated=False, mode="w")
    group = zarr.open_group(session.store, mode="r+")
    group.create_array("virtual", shape=(ROWS, COLS), chunks=(2, COLS), dtype="f4", compressors=None,
                       fill_value=0, dimension_names=["y", "x"])
    virtual_refs(session.store, f"{base_url}/virtual.nc", offset)
    sharded = rng.integers(-500, 500, (4, 6, 8)).astype("i2")
    array = group.create_array("sharded", shape=sharded.shape, chunks=(1, 3, 4), shards=(2, 6, 8),
                               dtype="i2", fill_value=-999, dimension_names=["time", "lat", "lon"],
                               attributes={"_FillValue": -999})
    array[...] = sharded
    snapshot = session.commit("xarray dataset, virtual and sharded arrays")
    return Decodable(root, netcdf, snapshot, ds, sharded)
