"""Dask over refmount: a dask.distributed LocalCluster of four worker processes computes the
mean over time of a 3-D variable through a mount, through ``refmount serve`` (``xr.open_zarr``
of its URL in the workers) and, for reference, with fsspec's ``reference://`` in each worker;
the three equal the original netCDF file's values. Each worker reads its own slab of time
steps, i.e. its own part of the one target file, at the same time as the others: the
interleaved readers that readahead keeps a stream each for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest
import xarray as xr
from support.datasets import kerchunk_hdf5, write_json
from support.probes import stats

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

STEPS, NY, NX = 64, 64, 128  # float32: one 32 KiB chunk per time step, 2 MiB in all
WORKERS = 4


def make_cube(path: Path) -> np.ndarray:
    """A netCDF-4 file with ``temp(time, y, x)``, one chunk per time step, laid out in time
    order (written at once, not compressed)."""
    data = np.random.default_rng(45).normal(280, 10, (STEPS, NY, NX)).astype("f4")
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", STEPS)
        nc.createDimension("y", NY)
        nc.createDimension("x", NX)
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(STEPS)
        v = nc.createVariable("temp", "f4", ("time", "y", "x"), chunksizes=(1, NY, NX))
        v[:] = data
    return data


@pytest.fixture(scope="module")
def cube(nginx, tmp_path_factory) -> tuple[Path, np.ndarray]:
    """The file under nginx and its reference set (HTTP targets); the expected mean."""
    where = nginx.root / "dask"
    where.mkdir(exist_ok=True)
    data = make_cube(where / "cube.nc")
    refs = kerchunk_hdf5(where / "cube.nc")
    url = f"{nginx.url}/dask/cube.nc"
    refs = {k: ([url, *v[1:]] if isinstance(v, list) else v) for k, v in refs.items()}
    assert sum(1 for k in refs if k.startswith("temp/") and not k.endswith((".zarray", ".zattrs"))) == STEPS
    src = write_json(tmp_path_factory.mktemp("dask") / "cube.json", refs)
    with xr.open_dataset(where / "cube.nc") as original:
        expected = original.temp.mean("time").values
    assert np.allclose(expected, data.mean(axis=0), atol=1e-3)
    return src, expected


@pytest.fixture(scope="module")
def client() -> Any:
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=WORKERS, processes=True, threads_per_worker=1, dashboard_address=None,
                      host="127.0.0.1", death_timeout=120) as cluster, Client(cluster, timeout=120) as c:
        c.wait_for_workers(WORKERS, timeout=120)
        yield c


def open_slab(how: str, where: str, first: int, stop: int) -> tuple[np.ndarray, int]:
    """In a worker: open the set ``how`` (a mount's directory, serve's URL or a reference
    file for fsspec) and sum ``temp`` over its time steps [first, stop)."""
    if how == "reference":
        import fsspec

        mapper = fsspec.get_mapper("reference://", fo=where, remote_protocol="http",
                                   remote_options={"asynchronous": True}, asynchronous=True,
                                   skip_instance_cache=True)
        ds = xr.open_zarr(mapper, consolidated=False, chunks=None)
    else:
        ds = xr.open_zarr(where, consolidated=how == "serve", chunks=None)
    with ds:
        slab = ds.temp.isel(time=slice(first, stop)).values
    return slab.astype("f8").sum(axis=0), stop - first


def mean_in_workers(client: Any, how: str, where: str) -> np.ndarray:
    """Each of the workers sums its own quarter of the time steps, all at once; the mean."""
    per = STEPS // WORKERS
    workers = sorted(client.scheduler_info()["workers"])
    futures = [client.submit(open_slab, how, where, w * per, (w + 1) * per, workers=[addr], pure=False)
               for w, addr in enumerate(workers)]
    parts = client.gather(futures, errors="raise")
    total = sum(p for p, _ in parts)
    return (total / sum(n for _, n in parts)).astype("f4")


def test_dask_workers_through_a_mount(client, cube, mount) -> None:
    src, expected = cube
    m = mount(src)
    got = mean_in_workers(client, "mount", str(m.path))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # and the usual way: a dask array over the mount, reduced by the cluster
    with xr.open_zarr(str(m.path), consolidated=False, chunks={"time": STEPS // WORKERS}) as ds:
        reduced = client.compute(ds.temp.mean("time")).result(timeout=120).values
    np.testing.assert_allclose(reduced, expected, rtol=1e-5)
    s = stats(m)
    assert s["errors"] == 0, s


def test_dask_workers_through_serve(client, cube, serve) -> None:
    src, expected = cube
    s = serve(src)
    got = mean_in_workers(client, "serve", s.url)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    with xr.open_zarr(s.url, consolidated=True, chunks={"time": STEPS // WORKERS}) as ds:
        reduced = client.compute(ds.temp.mean("time")).result(timeout=120).values
    np.testing.assert_allclose(reduced, expected, rtol=1e-5)
    assert s.stats()["errors"] == 0


def test_dask_workers_with_fsspec_references(client, cube) -> None:
    src, expected = cube
    assert json.loads(Path(src).read_text())  # the same set, read by fsspec in each worker
    got = mean_in_workers(client, "reference", str(src))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
