"""What netCDF-C's zarr reader accepts, rendered; what it cannot, left out with a reason.

The decoded view (``-o decode``) is the netCDF side of a mount: netCDF-C 4.9 (ncdump, CDO,
NCO) reads it in pure zarr mode (``file:///mnt#mode=zarr,file``), finding a variable wherever
a directory holds a ``.zarray``. Every array is shown the way netCDF-C's own zarr writer
(``nccopy f.nc 'file:///z#mode=zarr,file'``) writes the same variable, so that the reader,
which trusts its metadata and crashes or refuses the whole file on what it does not expect,
reads it as the original (``netcdf_array``):

* numeric netCDF types (``i1``-``i8``, ``u1``-``u8``, ``f4``, ``f8``): as they are (little-endian
  after decoding; one-byte types keep ``|``, which zarr needs);
* ``char`` (``|S1``, what kerchunk writes): dtype ``"<U1"`` with ``fill_value`` null, one byte
  per character -- netCDF-C's own representation (it crashes on ``|S1``). Consolidated
  metadata (``.zmetadata``) keeps ``|S1`` for zarr clients, which read ``<U1`` as four bytes;
* fixed-width strings (``|S<n>``, n > 1): ``char`` with one more dimension of length n,
  ``string<n>``, the whole of it in each chunk (the same bytes); a chunk ``i.j`` is listed as
  ``i.j.0`` (and found by both names). With ``dimension_separator`` ``/`` they are left out;
* a chunk larger than the array along an axis (an unlimited dimension: HDF5 gives ``time`` of
  3 steps ``chunks [512]``; netCDF-C refuses it): the chunk is cut to the shape (the decoded
  chunk holds only the array's part of the stored one);
* a scalar (``shape []``): ``shape [1]``, ``chunks [1]``, dimension ``_zdim_1`` (what netCDF-C
  names a length-1 dimension it has no name for; it cannot read a zarr scalar);
* ``_ARRAY_DIMENSIONS``: netCDF-C makes every dimension name one dimension of the root group
  (a group's dimension, which kerchunk names ``group/name``, is named ``name``: netCDF-C 4.9
  makes a second root dimension of a path),
  so a name used with two lengths (kerchunk's combined sets, groups) keeps the name for the
  length most arrays use (an array named like the dimension first) and becomes
  ``<name>_<length>`` for the others (``resolve_dims``); a list that is not one name per axis
  is left to netCDF-C's own naming (``_zdim_<length>``).

Left out of the netCDF side (``.zarray`` and ``.zattrs`` not listed to it; zarr clients read
the array through consolidated metadata or the raw mount): dtypes netCDF-C's zarr reader has
no type for (variable-length strings, unicode strings, booleans,
float16, complex, datetimes, structured), arrays with ``order`` ``F`` (netCDF-C reads them as
C), arrays with a dimension of length 0 (netCDF-C refuses chunks of 0 or larger than the
shape), and arrays the view cannot decode (their codecs would have to be netCDF-C's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from refmount.decode.ncattrs import ARRAY_DIMENSIONS, is_fill_of, netcdf_type

CHAR = "<U1"
SCALAR_DIM = "_zdim_1"


@dataclass
class NcArray:
    """One array as netCDF-C is shown it."""

    zarray: dict[str, Any] | None  # .zarray as served to netCDF-C (None: left out)
    why: str | None = None  # left out: why
    cut: list[int] | None = None  # the served chunk shape, when the stored chunk is cut to it
    scalar: bool = False
    shape: list[int] | None = None  # as served
    strlen: int = 0  # fixed-width strings of this many bytes: the last dimension, added


def nc_dtype(spec: Any) -> tuple[str | None, str | None]:
    """(served dtype, None) for a ``.zarray`` dtype netCDF-C has a type for, else (None, why)."""
    if spec in ("|S1", "S1", ">S1", "<S1"):
        return CHAR, None
    nctype = netcdf_type(spec)
    if nctype is not None:
        return nctype, None
    try:
        dt = np.dtype(spec) if isinstance(spec, str) else None
    except (TypeError, ValueError):
        dt = None
    if dt is None:
        return None, f"dtype {spec!r} has no netCDF type"
    if dt.kind == "O":
        return None, "variable-length values (netCDF-C 4.9's zarr reader has no string type)"
    if dt.kind == "S":
        return CHAR, None  # with a string-length dimension (netcdf_array)
    if dt.kind == "U":
        return None, "unicode strings (netCDF-C 4.9's zarr reader has none)"
    if dt.kind == "b":
        return None, "booleans (netCDF-C 4.9's zarr reader has no boolean type)"
    return None, f"dtype {spec!r} has no netCDF type"


def netcdf_array(meta: Any) -> NcArray:
    """How an array with ``.zarray`` ``meta`` (parsed; codecs as stored) is shown to netCDF-C;
    its ``zarray`` has the stored codecs: the caller serves it without (decoded) or leaves the
    array out (``why``) when it cannot decode it."""
    if not isinstance(meta, dict):
        return NcArray(None, ".zarray is not a JSON object")
    shape, chunks = meta.get("shape"), meta.get("chunks")
    if not (isinstance(shape, list) and isinstance(chunks, list) and len(shape) == len(chunks)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in shape + chunks)):
        return NcArray(None, "shape and chunks are not lists of integers of one length")
    dtype, why = nc_dtype(meta.get("dtype"))
    if dtype is None:
        return NcArray(None, why)
    if any(n <= 0 for n in shape):
        return NcArray(None, "a dimension of length 0 (netCDF-C 4.9's zarr reader refuses it)")
    if meta.get("order", "C") != "C" and sum(n > 1 for n in shape) > 1:
        return NcArray(None, "order F (netCDF-C's zarr reader reads every array in C order)")
    out = dict(meta)
    out["dtype"] = dtype
    out.setdefault("fill_value", None)  # zarr's default when a .zarray names none
    strlen = 0
    if dtype == CHAR and meta.get("dtype") not in ("|S1", "S1", ">S1", "<S1"):
        strlen = np.dtype(meta["dtype"]).itemsize
        if len(shape) and (meta.get("dimension_separator") or ".") != ".":
            return NcArray(None, f"fixed-width strings of {strlen} bytes with dimension_separator '/'")
    if dtype == CHAR or (out.get("fill_value") is not None and not is_fill_of(out["fill_value"], dtype)):
        out["fill_value"] = None  # netCDF-C refuses the whole file on a fill value not of the type
    scalar = not shape and not strlen
    cut = None
    if scalar:
        out["shape"], out["chunks"] = [1], [1]
    elif any(c > s for c, s in zip(chunks, shape, strict=True)):
        cut = [min(c, s) for c, s in zip(chunks, shape, strict=True)]
        out["chunks"] = cut
    if strlen:
        out["shape"], out["chunks"] = [*out["shape"], strlen], [*out["chunks"], strlen]
    return NcArray(out, None, cut, scalar, list(out["shape"]), strlen)


def array_dims(attrs: Any, nc: NcArray) -> list[str] | None:
    """The ``_ARRAY_DIMENSIONS`` of an array as referenced, when it is one name per axis."""
    if nc.scalar:
        return [SCALAR_DIM]
    dims = attrs.get(ARRAY_DIMENSIONS) if isinstance(attrs, Mapping) else None
    assert nc.shape is not None
    extra = [f"string{nc.strlen}"] if nc.strlen else []
    if (isinstance(dims, list) and len(dims) + len(extra) == len(nc.shape)
            and all(isinstance(d, str) and all(d.split("/")) for d in dims)):
        return [d.rpartition("/")[2] for d in dims] + extra
    return None


def resolve_dims(arrays: Mapping[str, tuple[list[str] | None, list[int]]]) -> dict[str, list[str]]:
    """Served ``_ARRAY_DIMENSIONS`` of each array (path -> (names or None, served shape)): one
    length per name across the whole tree (netCDF-C puts every dimension in the root group).
    Arrays with no usable names get ``_zdim_<length>``, as netCDF-C names them."""
    lengths: dict[str, Counter[int]] = {}
    first: dict[str, int] = {}
    for path, (dims, shape) in arrays.items():
        for name, n in zip(dims or [], shape, strict=False):
            lengths.setdefault(name, Counter())[n] += 1
            if path.rpartition("/")[2] == name and len(dims or []) == 1:
                first[name] = n  # a coordinate variable: its length keeps the name
    keep = {name: first.get(name, max(c, key=lambda n: (c[n], n))) for name, c in lengths.items()}
    taken = set(lengths)
    renamed: dict[tuple[str, int], str] = {}
    out: dict[str, list[str]] = {}
    for path, (dims, shape) in arrays.items():
        if dims is None:
            out[path] = [f"_zdim_{n}" for n in shape]
            continue
        names = []
        for name, n in zip(dims, shape, strict=True):
            if keep[name] == n:
                names.append(name)
                continue
            new = renamed.get((name, n))
            if new is None:
                new = f"{name}_{n}"
                while new in taken:
                    new += "_"
                taken.add(new)
                renamed[(name, n)] = new
            names.append(new)
        out[path] = names
    return out
