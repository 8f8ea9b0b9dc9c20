"""One zarr (v2) array's plan under ``-o decode``: its codecs, its chunk grid, and its
``.zarray`` as served.

A chunk is decoded as zarr decodes it: the compressor, then the filters in reverse order
(numcodecs, and any codec registered with numcodecs, such as kerchunk's own), the result
viewed as the array's dtype and flattened in the array's ``order``; then made little-endian
(``DecodedArray.decode``, through ``ChunkCodecs``). Its served size is ``prod(chunks) *
itemsize``, known from ``.zarray`` without fetching; a chunk that decodes to any other length
is an error (``DecodeError``, EIO), never short or padded bytes.

``plan_array`` says how an array is served: decoded (a ``DecodedArray``), as referenced
because nothing needs decoding (no codecs, byte order already native or irrelevant), or as
referenced with the reason it cannot be decoded (object and variable-length dtypes, a codec
that is not installed, a chunk over ``max_chunk_bytes``). ``rewrite_zarray``: ``.zarray``
served with ``"compressor": null``, ``"filters": null`` and a little-endian ``dtype``. With
``cut`` (an array whose chunk is larger than its shape, ``ncview``), each decoded chunk is cut
to the shape: its served size is ``prod(cut) * itemsize``.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refmount.base.errors import ReadError
from refmount.config import DECODE_MAX_CHUNK_BYTES
from refmount.decode.chunkcodecs import ChunkCodecs


class DecodeError(ReadError):
    """A chunk that does not decode to its array's chunk size (corrupt or mis-described), or
    whose decoding would go past its bounds, or whose codec worker died."""


def _parse_dtype(spec: Any) -> np.dtype:
    """A zarr v2 dtype (a string, or a list of [name, dtype(, shape)] for structured ones)."""
    if isinstance(spec, str):
        return np.dtype(spec)
    if isinstance(spec, list):
        fields = []
        for f in spec:
            if not isinstance(f, list | tuple) or len(f) not in (2, 3):
                raise ValueError(f"bad structured dtype field {f!r}")
            sub = _parse_dtype(f[1])
            fields.append((f[0], sub, tuple(f[2])) if len(f) == 3 else (f[0], sub))
        return np.dtype(fields)
    raise ValueError(f"bad dtype {spec!r}")


def _encode_dtype(dt: np.dtype) -> Any:
    """As zarr v2 writes a dtype: its ``str``, or its ``descr`` for structured dtypes."""
    if dt.fields is None:
        return dt.str
    return [list(f) for f in dt.descr]


def _little(dt: np.dtype) -> np.dtype:
    return dt.newbyteorder("<")


def codec_ids(meta: Mapping[str, Any]) -> list[str]:
    """Codec ids in the order they are applied when decoding: compressor, then filters reversed."""
    out = []
    comp = meta.get("compressor")
    if isinstance(comp, dict):
        out.append(str(comp.get("id")))
    for f in reversed(meta.get("filters") or []):
        if isinstance(f, dict):
            out.append(str(f.get("id")))
    return out


@dataclass
class DecodedArray:
    path: str  # "" for an array at the root
    ndim: int
    separator: str  # "." or "/"
    dtype: np.dtype  # as stored
    out_dtype: np.dtype  # as served (little-endian)
    nbytes: int  # decoded chunk size
    codecs: list[str]  # ids, in decoding order
    compressor: Any = None
    filters: list[Any] = field(default_factory=list)  # in metadata order (decoded reversed)
    grid: tuple[int, ...] = ()  # chunks along each axis
    chain: ChunkCodecs | None = None  # the decoding of a chunk, bounded (decode/chunkcodecs.py)
    stored_chunks: tuple[int, ...] | None = None  # with ``cut``: the stored chunk's shape
    cut: tuple[int, ...] | None = None  # the served chunk's shape, when smaller than stored
    _name: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        if self.ndim == 0:
            self._name = re.compile(r"0")
        else:
            sep = re.escape(self.separator)
            self._name = re.compile(r"[0-9]+" + (sep + r"[0-9]+") * (self.ndim - 1))

    @property
    def label(self) -> str:
        return self.path or "/"

    def is_chunk_name(self, rel: str) -> bool:
        assert self._name is not None
        return self._name.fullmatch(rel) is not None

    def decode(self, stored: bytes | memoryview) -> memoryview:
        """The decoded bytes of one chunk, in this process (``ChunkCodecs.decode``: every step
        bounded by the chunk's declared size). Raises DecodeError naming the codec on
        failure."""
        assert self.chain is not None
        try:
            return self.cut_chunk(self.chain.decode(stored))
        except ValueError as e:
            raise DecodeError(str(e)) from None

    def cut_chunk(self, full: bytes | memoryview) -> memoryview:
        """A whole decoded chunk cut to the served chunk shape (``cut``), C order."""
        if self.cut is None or self.stored_chunks is None:
            return memoryview(full)
        arr = np.frombuffer(full, self.out_dtype).reshape(self.stored_chunks)
        part = arr[tuple(slice(0, c) for c in self.cut)]
        return memoryview(np.ascontiguousarray(part).view(np.uint8).reshape(-1))

    @property
    def isolated(self) -> bool:
        """A codec outside the allow-list takes part: decoded in a codec worker process."""
        return self.chain is not None and self.chain.isolated

    # ---- the chunk grid ---------------------------------------------------------------------
    def chunk_rel(self, key: str) -> str:
        """The chunk's name inside the array: ``key`` without the array's path."""
        return key[len(self.path) + 1 :] if self.path else key

    def coords(self, key: str) -> tuple[int, tuple[int, ...]] | None:
        """(chunk number in C order, grid) of a chunk key inside the array's grid."""
        if self.ndim == 0:
            return 0, (1,)
        idx = [int(p) for p in self.chunk_rel(key).split(self.separator)]
        if any(i >= g for i, g in zip(idx, self.grid, strict=True)):
            return None
        return int(np.ravel_multi_index(idx, self.grid)), self.grid

    def chunk_name(self, n: int, grid: tuple[int, ...]) -> str:
        """The name of chunk number ``n`` (C order) of ``grid`` inside the array."""
        if self.ndim == 0:
            return "0"
        return self.separator.join(str(int(i)) for i in np.unravel_index(n, grid))


def plan_array(path: str, meta: Any, max_chunk_bytes: int = DECODE_MAX_CHUNK_BYTES,
               cut: list[int] | None = None) -> tuple[DecodedArray | None, str | None]:
    """How the array at ``path`` with metadata ``meta`` (parsed ``.zarray``) is served:
    ``(array, None)`` decoded; ``(None, None)`` as referenced because nothing needs decoding;
    ``(None, reason)`` as referenced because it cannot be decoded, or because a decoded chunk
    (or a step of its decoding) would be larger than ``max_chunk_bytes``. ``cut``: a chunk
    shape smaller than the stored one, each decoded chunk cut to it (``ncview``: an array
    whose one chunk is larger than its shape)."""
    if not isinstance(meta, dict):
        return None, ".zarray is not a JSON object"
    if meta.get("zarr_format", 2) != 2:
        return None, f"zarr_format {meta.get('zarr_format')!r} is not 2"
    chunks = meta.get("chunks")
    if not isinstance(chunks, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in chunks
    ):
        return None, "chunks is not a list of positive integers"
    shape = meta.get("shape")
    if not isinstance(shape, list) or len(shape) != len(chunks) or not all(
        isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in shape
    ):
        return None, "shape is not a list of integers as long as chunks"
    try:
        dtype = _parse_dtype(meta.get("dtype"))
    except (TypeError, ValueError) as e:
        return None, f"dtype {meta.get('dtype')!r} not understood ({e})"
    if dtype.hasobject:
        return None, f"object dtype {meta.get('dtype')!r} (variable-length values)"
    if dtype.itemsize == 0:
        return None, f"dtype {meta.get('dtype')!r} has no fixed size"
    order = meta.get("order", "C")
    if order not in ("C", "F"):
        return None, f"order {order!r} is not C or F"
    sep = meta.get("dimension_separator") or "."
    if sep not in (".", "/"):
        return None, f"dimension_separator {sep!r}"
    comp_cfg = meta.get("compressor")
    filt_cfg = meta.get("filters") or []
    if comp_cfg is not None and not isinstance(comp_cfg, dict):
        return None, "compressor is not an object"
    if not isinstance(filt_cfg, list) or not all(isinstance(f, dict) for f in filt_cfg):
        return None, "filters is not a list of objects"
    out_dtype = _little(dtype)
    if cut is not None and (len(cut) != len(chunks) or any(
            not 0 < c <= n for c, n in zip(cut, chunks, strict=True))):
        cut = None
    if comp_cfg is None and not filt_cfg and out_dtype == dtype and cut is None:
        return None, None  # served as referenced: that is already what zarr hands numpy
    import numcodecs

    codecs = []
    for cfg in ([comp_cfg] if comp_cfg is not None else []) + filt_cfg:
        try:
            codecs.append(numcodecs.get_codec(cfg))
        except Exception as e:  # not installed (ValueError), or a bad configuration
            return None, f"codec {cfg.get('id')!r} not available ({type(e).__name__}: {e})"
    for codec in codecs:
        if getattr(codec, "codec_id", None) in ("vlen-utf8", "vlen-bytes", "vlen-array", "json2",
                                                 "json", "msgpack2", "pickle", "categorize"):
            return None, f"codec {codec.codec_id!r} makes variable-length values"
    compressor = codecs[0] if comp_cfg is not None else None
    filters = codecs[1:] if comp_cfg is not None else codecs
    nbytes = math.prod(chunks) * dtype.itemsize
    if nbytes > max_chunk_bytes:
        return None, (f"a decoded chunk is {nbytes:,} bytes, more than max_chunk_bytes="
                      f"{max_chunk_bytes:,}")
    chain = ChunkCodecs(compressor, filters, dtype, nbytes, [c.get_config() for c in codecs],
                        ceiling=2 * max_chunk_bytes)
    if chain.peak > 2 * max_chunk_bytes:
        return None, (f"a step of decoding a chunk may produce {chain.peak:,} bytes, more than "
                      f"twice max_chunk_bytes={max_chunk_bytes:,}")
    grid = tuple(-(-s // c) for s, c in zip(shape, chunks, strict=True))
    if cut is not None:
        if order != "C":
            return None, "order F with a chunk larger than the shape"
        return DecodedArray(path, len(chunks), sep, dtype, out_dtype, math.prod(cut) * dtype.itemsize,
                            codec_ids(meta), compressor, filters, grid, chain, tuple(chunks),
                            tuple(cut)), None
    return DecodedArray(path, len(chunks), sep, dtype, out_dtype, nbytes, codec_ids(meta),
                        compressor, filters, grid, chain), None


def rewrite_zarray(meta: dict[str, Any]) -> dict[str, Any]:
    """``.zarray`` as served: no codecs, a little-endian dtype, everything else as it was. A
    fill_value stays the same value (a structured one, base64 of its bytes, is re-encoded)."""
    out = dict(meta)
    dtype = _parse_dtype(meta["dtype"])
    little = _little(dtype)
    out["compressor"] = None
    out["filters"] = None
    out["dtype"] = _encode_dtype(little)
    fill = meta.get("fill_value")
    if dtype.fields is not None and isinstance(fill, str) and little != dtype:
        try:
            value = np.frombuffer(base64.b64decode(fill), dtype, 1)
            out["fill_value"] = base64.b64encode(value.astype(little).tobytes()).decode()
        except ValueError:
            pass  # not a fill value zarr could read either: leave it
    return out
