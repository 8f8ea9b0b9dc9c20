"""xarray datasets of the raw mount as the decoded view names them: netCDF-C puts every
dimension in the root group, so the view names a group's dimension (kerchunk: ``sub/z``) by its
own name (``z``), and a variable named like its dimension becomes the dimension's coordinate."""

from __future__ import annotations

import xarray as xr


def netcdf_dims(ds: xr.Dataset) -> xr.Dataset:
    renames = {d: str(d).rpartition("/")[2] for d in ds.dims if "/" in str(d)}
    if not renames:
        return ds
    variables = {k: xr.Variable([renames.get(d, d) for d in v.dims], v.data, v.attrs, v.encoding)
                 for k, v in ds.variables.items()}
    coords = {k: v for k, v in variables.items() if k in ds.coords or v.dims == (k,)}
    data = {k: v for k, v in variables.items() if k not in coords}
    return xr.Dataset(data, coords=coords, attrs=ds.attrs)
