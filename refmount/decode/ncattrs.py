"""Attributes as netCDF-C's zarr reader needs them: ``.zattrs`` as the decoded view
(``-o decode``) serves it, for an array (its ``.zarray`` as served) or a group.

netCDF-C 4.9 in pure zarr mode (``#mode=zarr``, and the tools built on it: ncdump, CDO, NCO)
types an attribute by its JSON value unless ``.zattrs``'s hidden attribute ``_NCZARR_ATTR``
(what netCDF-C 4.9.0 to 4.9.2 read; xarray hides attributes starting with ``_nc``) gives its
type in ``"types"``: a JSON number with a fraction is a ``double``, a JSON integer the smallest
integer type that holds it, a list takes the type of its *first* element -- so ``[0, 200]``
is a ``byte`` and 200 fails the whole file (``NetCDF: Numeric conversion not representable``),
and ``null``, ``[]`` or a list of strings fail it too. kerchunk does not record attribute
types. The rule, for every attribute:

* ``_FillValue``: a numeric array's fill value, from ``.zarray``'s ``fill_value`` when the
  attribute is not there (kerchunk moves it there and drops the attribute; netCDF clients find
  missing values only in the attribute), first; typed as the array's own type. Also when it is
  netCDF's default fill value: kerchunk records it whether or not the original declared it,
  and CDO treats it as missing only when declared. One that is not a value of the array's
  type is left out (netCDF-C refuses it). A ``char`` array keeps a one-character text
  ``_FillValue``.
* ``missing_value``, ``valid_min``, ``valid_max``, ``valid_range``, ``flag_values``,
  ``flag_masks`` (CF: the variable's own type): the array's type when every value is one.
* other numbers (and lists of numbers): integers ``int`` (``int64``, ``uint64`` when larger),
  numbers with a fraction ``float`` when each is a float32 value written shorter as one
  (kerchunk writes a float32 ``0.1f`` as ``0.10000000149011612``), else ``double``;
* text and JSON objects stay (netCDF-C shows an object as its JSON text), written in UTF-8
  (``dumps_zattrs``: netCDF-C does not read JSON unicode escapes); a list of texts
  becomes one text, joined by ``", "``; other lists (mixed, nested) their JSON text;
  ``null`` and ``[]`` are left out (no netCDF value);
* every type is given in ``_NCZARR_ATTR``; a type already given there (by an NCZarr writer) is
  kept when it is a netCDF type.

The order of the attributes is the referenced one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

FILL_VALUE = "_FillValue"
NCZARR_ATTR = "_NCZARR_ATTR"  # netCDF-C 4.9.0's name (4.9.2 reads it too, besides _nczarr_attr)
ARRAY_DIMENSIONS = "_ARRAY_DIMENSIONS"
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# CF: attributes of the variable's own type
SAME_TYPE = ("missing_value", "valid_min", "valid_max", "valid_range", "flag_values", "flag_masks")
_ATTR_TYPES = {"|i1", "|u1", "<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8",
               ">i2", ">u2", ">i4", ">u4", ">i8", ">u8", ">f4", ">f8"}


def netcdf_type(dtype: Any) -> str | None:
    """The zarr dtype of a netCDF atomic numeric type as the view serves it (``"<f4"``,
    ``"|i1"``), or None if ``dtype`` (a ``.zarray`` dtype) is not one."""
    if not isinstance(dtype, str):
        return None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    if (dt.kind in "iu" and dt.itemsize in (1, 2, 4, 8)) or (dt.kind == "f" and dt.itemsize in (4, 8)):
        return f"{'|' if dt.itemsize == 1 else '<'}{dt.kind}{dt.itemsize}"
    return None


def is_fill_of(value: Any, nctype: str) -> bool:
    """Whether ``value`` (JSON) is a value of the type ``nctype`` (from ``netcdf_type``)."""
    if isinstance(value, bool):
        return False
    dt = np.dtype(nctype)
    if dt.kind == "f":
        if isinstance(value, str):
            return value in _FLOAT_WORDS
        if isinstance(value, int | float) and dt.itemsize == 4 and math.isfinite(value):
            return abs(value) <= float(np.finfo(np.float32).max)
        return isinstance(value, int | float)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        return False
    info = np.iinfo(dt)
    return info.min <= value <= info.max


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _shorter_as_float32(v: float) -> bool:
    if not math.isfinite(v) or v != v or abs(v) > float(np.finfo(np.float32).max):
        return False
    f = np.float32(v)
    return float(f) == v and len(str(f)) < len(repr(v))


def _number_type(values: list[Any]) -> str:
    """The type given to a number or list of numbers that has no type of its own."""
    if all(isinstance(v, int) for v in values):
        if all(-(2**31) <= v < 2**31 for v in values):
            return "<i4"
        if all(-(2**63) <= v < 2**63 for v in values):
            return "<i8"
        if all(0 <= v < 2**64 for v in values):
            return "<u8"
        return "<f8"
    if all(isinstance(v, int) or _shorter_as_float32(float(v)) for v in values) and any(
            isinstance(v, float) for v in values):
        return "<f4"
    return "<f8"


def render_value(name: str, value: Any, nctype: str | None) -> tuple[Any, str | None] | None:
    """(value as served, its type or None for text) of one attribute; None: left out."""
    if isinstance(value, bool) or value is None:
        return (int(value), "|u1") if isinstance(value, bool) else None
    if isinstance(value, str | Mapping):
        return value, None
    if _is_number(value):
        values = [value]
    elif isinstance(value, list):
        if not value:
            return None
        if all(isinstance(v, str) for v in value):
            return ", ".join(value), None
        if not all(_is_number(v) for v in value):
            return json.dumps(value), None
        values = value
    else:
        return None
    if nctype is not None and name in SAME_TYPE and all(is_fill_of(v, nctype) for v in values):
        return value, nctype
    return value, _number_type(values)


def _fill_attr(zarray: Mapping[str, Any], zattrs: Mapping[str, Any], nctype: str | None,
               char: bool) -> tuple[Any, str | None] | None:
    """The served ``_FillValue`` (value, type) of an array, or None for none."""
    if char:
        fill = zattrs.get(FILL_VALUE)
        return (fill, None) if isinstance(fill, str) and len(fill.encode()) == 1 else None
    if nctype is None:
        return None
    if FILL_VALUE in zattrs:
        fill = zattrs[FILL_VALUE]
        return (fill, nctype) if is_fill_of(fill, nctype) else None
    fill = zarray.get("fill_value")
    if fill is None or not is_fill_of(fill, nctype):
        return None
    return fill, nctype


def netcdf_zattrs(zarray: Any, zattrs: Any, dims: list[str] | None = None) -> dict[str, Any] | None:
    """``.zattrs`` as served to a netCDF client, from the array's served ``.zarray`` (None for a
    group) and the parsed referenced ``.zattrs``; ``dims``: the ``_ARRAY_DIMENSIONS`` served
    (None: as referenced). None when ``zattrs`` is not a JSON object."""
    if not isinstance(zattrs, Mapping):
        return None
    hidden = zattrs.get(NCZARR_ATTR)
    given = hidden.get("types") if isinstance(hidden, Mapping) else None
    given = {k: v for k, v in given.items() if v in _ATTR_TYPES} if isinstance(given, Mapping) else {}
    types: dict[str, str] = {}
    out: dict[str, Any] = {}
    is_array = isinstance(zarray, Mapping)
    nctype = netcdf_type(zarray.get("dtype")) if is_array else None
    if is_array:
        fill = _fill_attr(zarray, zattrs, nctype, zarray.get("dtype") == "<U1")
        if fill is not None:
            out[FILL_VALUE] = fill[0]
            if fill[1] is not None:
                types[FILL_VALUE] = fill[1]
    for name, value in zattrs.items():
        if name in (FILL_VALUE, NCZARR_ATTR) and is_array:
            continue
        if name == NCZARR_ATTR:
            continue
        if name == ARRAY_DIMENSIONS and is_array:
            out[name] = dims if dims is not None else value
            continue
        rendered = render_value(name, value, nctype)
        if rendered is None:
            continue
        out[name] = rendered[0]
        if rendered[1] is not None:
            types[name] = given.get(name, rendered[1])
    if dims is not None and ARRAY_DIMENSIONS not in out:
        out[ARRAY_DIMENSIONS] = dims
    if types:
        extra = {k: v for k, v in hidden.items() if k != "types"} if isinstance(hidden, Mapping) else {}
        out[NCZARR_ATTR] = {**extra, "types": types}
    return out


def dumps_zattrs(attrs: Mapping[str, Any]) -> bytes:
    """JSON text of served ``.zattrs``: the attributes in their order (NCZarr lists them so),
    in UTF-8 -- netCDF-C 4.9's JSON parser reads ``\\u00b0`` as ``u00b0`` (kerchunk writes
    ``"\\u00b0C"``; netCDF-C shows ``"°C"`` only from the UTF-8 bytes). Text that is not valid
    Unicode (a lone surrogate) stays escaped."""
    try:
        return json.dumps(attrs, indent=4, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(attrs, indent=4, ensure_ascii=True).encode()
