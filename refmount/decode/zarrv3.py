"""Zarr v3 metadata (``zarr.json``) as the decoded view shows it: Zarr v2 metadata.

The decoded view (``-o decode``) shows every v3 group as ``.zgroup`` (and ``.zattrs``) and
every v3 array as a Zarr v2 array (``v2_array``): ``.zarray`` with the shape, the chunks of its
regular chunk grid (the inner chunks of a sharded array), the dtype of its ``data_type`` (the
byte order of its ``bytes`` codec; served little-endian after decoding), its ``fill_value``
in v2's encoding (v3's hex floats read as their value), order C (a ``transpose`` codec is
undone when decoding), no codecs, ``dimension_separator`` ``.``; ``.zattrs`` with its
attributes and ``_ARRAY_DIMENSIONS`` from ``dimension_names``. The rest of the view (what
netCDF-C is shown, attribute types) treats the result as any v2 array.

An array whose metadata the view cannot show as v2 (an irregular chunk grid, storage
transformers, a variable-length data type, a codec the view does not know) gets a reason
instead (``V3Error``): it is served as referenced (its ``zarr.json`` and chunks as stored,
for zarr v3 clients) and left out of the netCDF side.
"""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ZARR_JSON = "zarr.json"

_NUMERIC = {"bool": "b1", "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4",
            "uint32": "u4", "int64": "i8", "uint64": "u8", "float16": "f2", "float32": "f4",
            "float64": "f8", "complex64": "c8", "complex128": "c16"}
_FLOAT_WORDS = ("NaN", "Infinity", "-Infinity")


class V3Error(ValueError):
    """v3 metadata the decoded view cannot show as v2 (the message says why)."""


@dataclass
class V3Group:
    path: str
    attributes: dict[str, Any]


@dataclass
class V3ArrayMeta:
    """One v3 array's metadata as parsed: enough to serve it as v2 and to decode its chunks."""

    path: str
    shape: list[int]
    chunk_shape: list[int]  # the chunk grid's (a shard's, for a sharded array)
    dtype: np.dtype  # native (little-endian where it has a byte order)
    fill_value: Any  # in v2's JSON encoding
    codecs: list[dict[str, Any]]  # the array's codecs, each {"name": ..., "configuration": ...}
    key_encoding: str  # "default" or "v2"
    key_separator: str
    attributes: dict[str, Any] = field(default_factory=dict)
    dimension_names: list[Any] | None = None

    def stored_key(self, idx: tuple[int, ...]) -> str:
        """The key of the stored chunk (or shard) at grid position ``idx``, relative to the
        array: ``c/0/1`` (default encoding), ``0.1`` (v2 encoding)."""
        if self.key_encoding == "default":
            return self.key_separator.join(["c", *map(str, idx)])
        return self.key_separator.join(map(str, idx)) if idx else "0"


def codec_name(codec: Any) -> str:
    """The name of a v3 codec (a ``{"name": ...}`` object, or a bare name)."""
    if isinstance(codec, str):
        return codec
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        return codec["name"]
    raise V3Error(f"codec {codec!r} is not a name or an object with a name")


def codec_config(codec: Any) -> dict[str, Any]:
    if isinstance(codec, dict):
        conf = codec.get("configuration", {})
        if not isinstance(conf, dict):
            raise V3Error(f"codec {codec_name(codec)!r}: configuration is not an object")
        return conf
    return {}


def parse_dtype(data_type: Any) -> np.dtype:
    """The numpy dtype (native byte order) of a v3 ``data_type``."""
    if isinstance(data_type, str):
        if data_type in _NUMERIC:
            return np.dtype(_NUMERIC[data_type])
        if data_type in ("string", "variable_length_bytes", "vlen-utf8", "vlen-bytes"):
            raise V3Error(f"data_type {data_type!r}: variable-length values")
        if data_type.startswith("r") and data_type[1:].isdigit() and int(data_type[1:]) % 8 == 0:
            return np.dtype(f"V{int(data_type[1:]) // 8}")
        raise V3Error(f"data_type {data_type!r} is not known to the decoded view")
    name = data_type.get("name") if isinstance(data_type, dict) else None
    conf = data_type.get("configuration", {}) if isinstance(data_type, dict) else {}
    if not isinstance(conf, dict):
        conf = {}
    length = conf.get("length_bytes")
    if name in ("null_terminated_bytes", "fixed_length_bytes", "raw_bytes", "fixed_length_utf32"):
        if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
            raise V3Error(f"data_type {name!r}: length_bytes {length!r} is not a positive integer")
        if name == "null_terminated_bytes":
            return np.dtype(f"S{length}")
        if name == "fixed_length_utf32":
            return np.dtype(f"<U{max(length // 4, 1)}")
        return np.dtype(f"V{length}")
    if name in ("numpy.datetime64", "numpy.timedelta64"):
        unit, scale = conf.get("unit"), conf.get("scale_factor", 1)
        try:
            return np.dtype(f"{'M8' if name.endswith('datetime64') else 'm8'}[{scale}{unit}]")
        except TypeError as e:
            raise V3Error(f"data_type {data_type!r}: {e}") from None
    raise V3Error(f"data_type {data_type!r} is not known to the decoded view")


def _float_fill(value: Any, dt: np.dtype) -> Any:
    if isinstance(value, str):
        if value in _FLOAT_WORDS:
            return value
        if value.startswith("0x"):  # the value's bytes, big-endian, in hex
            raw = bytes.fromhex(value[2:])
            fmt = {2: ">e", 4: ">f", 8: ">d"}.get(len(raw))
            if fmt is None or len(raw) != dt.itemsize:
                raise V3Error(f"fill_value {value!r} is not {dt.itemsize} bytes")
            f = struct.unpack(fmt, raw)[0]
            if math.isnan(f):
                return "NaN"
            return "Infinity" if f == math.inf else "-Infinity" if f == -math.inf else f
        raise V3Error(f"fill_value {value!r} is not a number")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    raise V3Error(f"fill_value {value!r} is not a number")


def v2_fill(value: Any, dt: np.dtype) -> Any:
    """A v3 ``fill_value`` in zarr v2's JSON encoding for the dtype ``dt``."""
    if value is None:
        return None
    kind = dt.kind
    if kind == "f":
        return _float_fill(value, dt)
    if kind == "c":
        if isinstance(value, list) and len(value) == 2:
            return [_float_fill(v, np.dtype(f"f{dt.itemsize // 2}")) for v in value]
        raise V3Error(f"fill_value {value!r} is not a pair of numbers")
    if kind == "b":
        if isinstance(value, bool):
            return value
        raise V3Error(f"fill_value {value!r} is not a boolean")
    if kind in "iumM":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind in "mM" and value == "NaT":
            return None
        raise V3Error(f"fill_value {value!r} is not an integer")
    if kind == "S":  # base64 of the bytes (v2 too)
        return value if isinstance(value, str) else None
    if kind == "V":
        if isinstance(value, list) and all(isinstance(b, int) for b in value):
            return base64.b64encode(bytes(value)).decode()
        return value if isinstance(value, str) else None
    if kind == "U":
        return value if isinstance(value, str) else None
    return None


def fill_scalar(fill: Any, dt: np.dtype) -> np.ndarray:
    """One element of the fill value (v2 JSON) as an array of ``dt`` (zeros for none)."""
    out = np.zeros(1, dt)
    if fill is None:
        return out
    try:
        if dt.kind in "SV" and isinstance(fill, str):
            raw = base64.b64decode(fill)
            out.view(np.uint8)[: min(len(raw), dt.itemsize)] = np.frombuffer(raw, np.uint8)[: dt.itemsize]
        elif dt.kind == "c" and isinstance(fill, list):
            out[0] = complex(*(float(v) if not isinstance(v, str) else float(v.replace("inity", ""))
                               for v in fill))
        elif isinstance(fill, str) and fill in _FLOAT_WORDS:
            out[0] = float(fill.replace("inity", ""))
        else:
            out[0] = fill
    except (TypeError, ValueError, OverflowError):
        return np.zeros(1, dt)
    return out


def _ints(value: Any, what: str, positive: bool) -> list[int]:
    least = 1 if positive else 0
    if not isinstance(value, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= least for n in value):
        raise V3Error(f"{what} is not a list of {'positive' if positive else 'non-negative'} integers")
    return value


def parse_node(path: str, doc: Any) -> V3Group | V3ArrayMeta:
    """A parsed ``zarr.json`` (``path``: its directory, "" for the root). V3Error: not shown."""
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
        raise V3Error("zarr.json is not a zarr_format 3 object")
    attrs = doc.get("attributes", {})
    if not isinstance(attrs, dict):
        raise V3Error("attributes is not an object")
    if doc.get("node_type") == "group":
        return V3Group(path, attrs)
    if doc.get("node_type") != "array":
        raise V3Error(f"node_type {doc.get('node_type')!r} is not group or array")
    shape = _ints(doc.get("shape"), "shape", False)
    grid = doc.get("chunk_grid")
    if not isinstance(grid, dict) or grid.get("name") != "regular":
        raise V3Error(f"chunk_grid {grid!r:.80} is not regular")
    chunks = _ints(codec_config(grid).get("chunk_shape"), "chunk_shape", True)
    if len(chunks) != len(shape):
        raise V3Error("chunk_shape and shape differ in length")
    if doc.get("storage_transformers"):
        raise V3Error("storage_transformers")
    enc = doc.get("chunk_key_encoding", {"name": "default"})
    name = enc.get("name") if isinstance(enc, dict) else None
    conf = enc.get("configuration", {}) if isinstance(enc, dict) else {}
    if name not in ("default", "v2") or not isinstance(conf, dict):
        raise V3Error(f"chunk_key_encoding {enc!r:.80} is not default or v2")
    sep = conf.get("separator", "/" if name == "default" else ".")
    if sep not in ("/", "."):
        raise V3Error(f"chunk_key_encoding separator {sep!r}")
    codecs = doc.get("codecs")
    if not isinstance(codecs, list) or not codecs:
        raise V3Error("codecs is not a list of codecs")
    dt = parse_dtype(doc.get("data_type"))
    dims = doc.get("dimension_names")
    if dims is not None and (not isinstance(dims, list) or len(dims) != len(shape)):
        dims = None
    for key, value in doc.items():
        if isinstance(value, dict) and value.get("must_understand") is True and key not in (
                "attributes", "chunk_grid", "chunk_key_encoding", "data_type"):
            raise V3Error(f"extension {key!r} must be understood")
    return V3ArrayMeta(path, shape, chunks, dt, v2_fill(doc.get("fill_value"), dt), codecs, name, sep,
                       attrs, dims)


def declared_fill(meta: V3ArrayMeta) -> Any:
    """The missing-value marker a v3 array declares: its ``_FillValue`` attribute (as xarray
    writes it for v3: a float as base64 of its little-endian double) in v2's JSON encoding, or
    None. A v3 ``fill_value`` alone marks nothing missing (xarray reads v3 so): it is only the
    value of chunks not written."""
    value = meta.attributes.get("_FillValue")
    if value is None or (isinstance(value, bool) and meta.dtype.kind != "b"):
        return None
    kind = meta.dtype.kind
    try:
        if kind == "f" and isinstance(value, str) and value not in _FLOAT_WORDS:
            raw = base64.b64decode(value, validate=True)
            if len(raw) != 8:
                return None
            f = struct.unpack("<d", raw)[0]
            return "NaN" if math.isnan(f) else "Infinity" if f == math.inf else "-Infinity" if (
                f == -math.inf) else f
        return v2_fill(value, meta.dtype)
    except (V3Error, ValueError):
        return None


def v2_array(meta: V3ArrayMeta, chunks: list[int]) -> dict[str, Any]:
    """``.zarray`` of a v3 array as the view shows it (as stored: no codecs; the view serves
    it decoded, little-endian). ``chunks``: the chunks of its v2 grid. Its ``fill_value`` is
    the declared missing value (``declared_fill``), None when there is none: every chunk of
    the grid is served (one not written as the v3 ``fill_value``), so no v2 reader needs it
    for data, and v2 readers take it as the missing-value marker."""
    dt = meta.dtype.newbyteorder("<") if meta.dtype.byteorder not in ("|", "=") else meta.dtype
    if dt.byteorder == "=":
        dt = dt.newbyteorder("<")
    return {"zarr_format": 2, "shape": list(meta.shape), "chunks": list(chunks), "dtype": dt.str,
            "fill_value": declared_fill(meta), "order": "C", "compressor": None, "filters": None,
            "dimension_separator": "."}


def v2_attrs(meta: V3ArrayMeta | V3Group) -> dict[str, Any]:
    """``.zattrs`` of a v3 node: its attributes, and an array's ``dimension_names`` as
    ``_ARRAY_DIMENSIONS`` (when each is a name)."""
    attrs = dict(meta.attributes)
    if isinstance(meta, V3ArrayMeta) and "_FillValue" in attrs:
        fill = declared_fill(meta)
        if fill is None:
            del attrs["_FillValue"]
        else:
            attrs["_FillValue"] = fill
    if isinstance(meta, V3ArrayMeta) and meta.dimension_names is not None and all(
            isinstance(d, str) and d for d in meta.dimension_names):
        attrs["_ARRAY_DIMENSIONS"] = list(meta.dimension_names)
    return attrs
