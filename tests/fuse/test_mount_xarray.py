"""xarray over the mount (zarr reading the kerchunk references as a plain directory) equals
xarray over the original netCDF files: every variable, the nested groups, local and http refs."""

from __future__ import annotations

import pytest
import xarray as xr

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]


def normalise_group(ds: xr.Dataset, group: str | None) -> xr.Dataset:
    """kerchunk names a nested group's own dimension by its HDF5 path (``sub/z``) and so the
    dimension's coordinate variable becomes a data variable; undo that to compare with netCDF4,
    which calls it ``z``. Nothing else is changed."""
    if not group:
        return ds
    renames = {d: str(d).rsplit("/", 1)[-1] for d in ds.dims if "/" in str(d)}
    variables = {
        name: xr.Variable(tuple(renames.get(d, d) for d in var.dims), var.data, var.attrs,
                          var.encoding)
        for name, var in ds.variables.items()
    }
    coords = set(ds.coords) | {n for n, v in variables.items() if v.dims == (n,)}
    return xr.Dataset(
        {n: v for n, v in variables.items() if n not in coords},
        coords={n: variables[n] for n in coords},
        attrs=ds.attrs,
    )


def assert_same(original: xr.Dataset, mounted: xr.Dataset) -> None:
    original, mounted = original.load(), mounted.load()
    assert sorted(original.variables) == sorted(mounted.variables)
    xr.testing.assert_identical(original, mounted)
    for name, var in original.variables.items():
        assert var.dtype == mounted[name].dtype, name
        # the on-disk dtype (before decoding), byte order aside: netCDF3 is big-endian
        a, b = var.encoding.get("dtype"), mounted[name].encoding.get("dtype")
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.kind == b.kind and a.itemsize == b.itemsize, (name, a, b)


@pytest.mark.parametrize("name", ["nc4_local", "nc4_http"])
@pytest.mark.parametrize("group", [None, "sub", "sub/deeper"])
def test_nc4_open_zarr_equals_open_dataset(shared_mounts, name, group):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    with xr.open_dataset(ds.nc4, group=group) as original, \
            xr.open_zarr(str(m), consolidated=False, group=group) as mounted:
        assert_same(original, normalise_group(mounted, group))


@pytest.mark.parametrize("name", ["nc4_local", "nc4_http"])
def test_nc4_decoding_details(shared_mounts, name):
    """The features the data set was built for really come through the mount."""
    m = shared_mounts.get(name)
    with xr.open_zarr(str(m), consolidated=False) as mounted:
        assert str(mounted.time.dtype).startswith("datetime64")  # CF time decoded
        assert str(mounted.time.values[1]).startswith("2000-01-02T12")
        assert int(mounted.temp.isnull().sum()) == 10  # _FillValue masked
        assert mounted.packed.dtype == "float64"  # scale_factor/add_offset applied
        assert mounted.packed.encoding["scale_factor"] == 0.01
        assert int(mounted.packed.isnull().sum()) == 1
        assert mounted.flags.dtype == "uint8"
        assert mounted.le_int.dtype == "int32"
        assert int(mounted.le_int.values[0, 0]) == -2000
    # raw (undecoded) values of the packed variable
    with xr.open_zarr(str(m), consolidated=False, mask_and_scale=False) as raw, \
            xr.open_dataset(shared_mounts.datasets.nc4, mask_and_scale=False) as orig:
        assert raw.packed.dtype == "int16"
        xr.testing.assert_identical(raw.packed.load(), orig.packed.load())


@pytest.mark.parametrize("name", ["nc3_local", "nc3_http"])
def test_nc3_open_zarr_equals_open_dataset(shared_mounts, name):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    with xr.open_dataset(ds.nc3) as original, \
            xr.open_zarr(str(m), consolidated=False) as mounted:
        assert_same(original, mounted)
        assert int(mounted.tas.isnull().sum()) == 1
        assert str(mounted.time.dtype).startswith("datetime64")
