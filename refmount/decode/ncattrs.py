"""The attributes a netCDF client needs to read a zarr (v2) array as netCDF describes it:
``.zattrs`` as the decoded view (``-o decode``) serves it.

netCDF clients (netCDF-C's NCZarr in pure zarr mode, ``#mode=zarr``, and the tools built on it:
ncdump, CDO, NCO) find a variable's missing values in its ``_FillValue`` attribute only, never
in ``.zarray``'s ``fill_value``. kerchunk moves a netCDF variable's ``_FillValue`` (for netCDF3
also a ``missing_value``) into ``fill_value`` and drops the attribute; zarr and xarray read it
from there, netCDF-C does not. The rule:

* a numeric array (netCDF types: ``i1``-``i8``, ``u1``-``u8``, ``f4``, ``f8``) whose ``.zattrs``
  has no ``_FillValue`` and whose ``fill_value`` is a value of its dtype (a number, or
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` for floats) gets ``_FillValue`` equal to
  ``fill_value``, as the first attribute;
* ``_FillValue`` is typed as the array's own dtype: NCZarr types attributes by their JSON value
  (a JSON number with a fraction as ``double``, a JSON integer as the smallest integer type
  that holds it) unless ``.zattrs``'s hidden attribute ``_NCZARR_ATTR`` (what netCDF-C 4.9.0
  to 4.9.2 read; xarray hides attributes starting with ``_nc``) says otherwise in its
  ``"types"``: ``{"_FillValue": "<f4"}``. A type already given there is kept;
* nothing else changes: every other attribute, and its order, is the referenced one.

Other numeric attributes (``scale_factor``, ``add_offset``, ``valid_range``, ``missing_value``)
keep the type NCZarr infers from their JSON value: kerchunk does not record their types.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

FILL_VALUE = "_FillValue"
NCZARR_ATTR = "_NCZARR_ATTR"  # netCDF-C 4.9.0's name (4.9.2 reads it too, besides _nczarr_attr)
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def netcdf_type(dtype: Any) -> str | None:
    """The zarr dtype of a netCDF atomic numeric type as netCDF-C names attribute types
    (``"<f4"``, ``"<i1"``), or None if ``dtype`` (a ``.zarray`` dtype) is not one."""
    if not isinstance(dtype, str):
        return None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    if (dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8)) or (dt.kind == "f" and dt.itemsize in (4, 8)):
        return f"<{dt.kind}{dt.itemsize}"
    return None


def is_fill_of(value: Any, nctype: str) -> bool:
    """Whether ``value`` (JSON) is a fill value of the type ``nctype`` (from ``netcdf_type``)."""
    if isinstance(value, bool):
        return False
    dt = np.dtype(nctype)
    if dt.kind == "f":
        if isinstance(value, str):
            return value in _FLOAT_WORDS
        return isinstance(value, int | float)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        return False
    info = np.iinfo(dt)
    return info.min <= value <= info.max


def netcdf_zattrs(zarray: Any, zattrs: Any) -> dict[str, Any] | None:
    """``.zattrs`` as served for a netCDF client, from the array's parsed ``.zarray`` and
    ``.zattrs``; None when it is served as referenced (nothing to add, or not an array this
    rule applies to)."""
    if not isinstance(zarray, Mapping) or not isinstance(zattrs, Mapping):
        return None
    nctype = netcdf_type(zarray.get("dtype"))
    if nctype is None:
        return None
    out = dict(zattrs)
    if FILL_VALUE not in zattrs:
        fill = zarray.get("fill_value")
        if fill is None or not is_fill_of(fill, nctype):
            return None
        out = {FILL_VALUE: fill, **zattrs}
    elif not is_fill_of(zattrs[FILL_VALUE], nctype):
        return None  # not a value NCZarr could give the variable's type: leave it as it is
    hidden = zattrs.get(NCZARR_ATTR, {})
    if not isinstance(hidden, Mapping):
        return None  # NCZarr refuses a malformed one; adding _FillValue would not help
    types = hidden.get("types", {})
    if not isinstance(types, Mapping):
        return None
    if FILL_VALUE in types:
        return out if FILL_VALUE not in zattrs else None
    out[NCZARR_ATTR] = {**hidden, "types": {**types, FILL_VALUE: nctype}}
    return out


def dumps_zattrs(attrs: Mapping[str, Any]) -> bytes:
    """JSON text of served ``.zattrs``: the attributes in their order (NCZarr lists them so)."""
    return json.dumps(attrs, indent=4, ensure_ascii=True).encode()
