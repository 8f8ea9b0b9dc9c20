"""The decoded view (``-o decode``): every chunk of a zarr (v2) array served as zarr hands it
to numpy, and the array's metadata rewritten to say it has no codecs.

A chunk is decoded as zarr decodes it: the compressor, then the filters in reverse order
(numcodecs, and any codec registered with numcodecs, such as kerchunk's own), the result
viewed as the array's dtype and flattened in the array's ``order``; then made little-endian.
Its served size is ``prod(chunks) * itemsize``, known from ``.zarray`` without fetching; a
chunk that decodes to any other length is an error (EIO), never short or padded bytes.

``.zarray`` is served with ``"compressor": null``, ``"filters": null`` and a little-endian
``dtype``; ``.zattrs`` with the attributes a netCDF client needs (``ncattrs``: ``_FillValue``
from ``fill_value``); the same inside ``.zmetadata``. Everything else is untouched.

Arrays that cannot be decoded (object and variable-length dtypes, a codec that is not
installed, metadata that is not inline) are served as referenced; ``DecodedView.skipped``
says which and why. Arrays that need no decoding (no codecs, byte order already native or
irrelevant) are served as referenced too, at no cost.

Parts:

* ``plan_array`` / ``DecodedArray``: one array's codecs and the pure ``decode`` of a chunk;
* ``DecodedView``: built from a set's metadata keys; which key is a decoded chunk, the
  rewritten metadata and the served sizes;
* ``DecodedTree``: a tree (``KeyTree``/``ChunkTree``) as served through the view;
* ``ChunkDecoder``: the read path of decoded chunks — stored bytes from the ``RefReader``,
  decoding in bounded worker threads (bounded by decoded bytes in flight), results in the
  memory cache, decoding ahead of a reader going through an array's chunks in order.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from .cache import Block, MemoryLRU
from .chunkcodecs import ChunkCodecs
from .codecworker import CodecWorkers, WorkerDied, WorkerError
from .config import DECODE_MAX_CHUNK_BYTES
from .errors import ReadError
from .lru import LRU
from .ncattrs import dumps_zattrs, netcdf_zattrs
from .refs import Ref, RefKind
from .singleflight import SingleFlight
from .workers import WorkerPool

log = logging.getLogger(__name__)

# The most bytes of one metadata document the view parses: a .zarray holds no attributes
# (those are in .zattrs), so a real one is well under a kilobyte; consolidated metadata
# holds every array's and group's metadata and attributes.
MAX_ZARRAY_BYTES = 1 << 20
MAX_ZMETADATA_BYTES = 16 << 20
Buffer = bytes | memoryview


class DecodeError(ReadError):
    """A chunk that does not decode to its array's chunk size (corrupt or mis-described), or
    whose decoding would go past its bounds, or whose codec worker died."""


# ---- one array ------------------------------------------------------------------------------


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


def _codec_ids(meta: Mapping[str, Any]) -> list[str]:
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
    chain: ChunkCodecs | None = None  # the decoding of a chunk, bounded (chunkcodecs.py)
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
            return self.chain.decode(stored)
        except ValueError as e:
            raise DecodeError(str(e)) from None

    @property
    def isolated(self) -> bool:
        """A codec outside the allow-list takes part: decoded in a codec worker process."""
        return self.chain is not None and self.chain.isolated


def plan_array(path: str, meta: Any, max_chunk_bytes: int = DECODE_MAX_CHUNK_BYTES
               ) -> tuple[DecodedArray | None, str | None]:
    """How the array at ``path`` with metadata ``meta`` (parsed ``.zarray``) is served:
    ``(array, None)`` decoded; ``(None, None)`` as referenced because nothing needs decoding;
    ``(None, reason)`` as referenced because it cannot be decoded, or because a decoded chunk
    (or a step of its decoding) would be larger than ``max_chunk_bytes``."""
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
    if comp_cfg is None and not filt_cfg and out_dtype == dtype:
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
    return DecodedArray(path, len(chunks), sep, dtype, out_dtype, nbytes, _codec_ids(meta),
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


def _dumps(obj: Any) -> bytes:
    # allow_nan: zarr writes NaN fill values as the string "NaN", but other writers may not.
    return json.dumps(obj, indent=4, sort_keys=True, ensure_ascii=True).encode()


# ---- the view of one reference set ---------------------------------------------------------


def _netcdf_attrs(zarray: Any, data: bytes) -> dict[str, Any] | None:
    """A ``.zattrs`` key's attributes as served (``ncattrs``), None if served as referenced."""
    if not isinstance(zarray, dict):
        return None
    try:
        return netcdf_zattrs(zarray, json.loads(data))
    except ValueError:
        return None


def _split(key: str) -> tuple[str, str]:
    head, _, tail = key.rpartition("/")
    return head, tail


class IndexMetadata(Mapping[str, "Buffer | None"]):
    """Metadata keys of a ``KeyIndex`` (its rows ``rows``) as a mapping read from the index on
    each pass: a value is a view into the mapped index (None: not inline), so a document is
    copied only by whoever parses it, after checking its size."""

    def __init__(self, index: Any, rows: list[int]) -> None:
        self._index = index
        self._rows = {index.key(i).decode("utf-8", "surrogateescape"): i for i in rows}

    def __getitem__(self, key: str) -> Buffer | None:
        ref = self._index.ref(self._rows[key], view=True)
        return ref.data if ref.kind is RefKind.INLINE else None

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


class DecodedView:
    """Built from a set's ``.zarray``, ``.zattrs`` and ``.zmetadata`` keys (``metadata``: key
    -> bytes, or None for a key that is not inline). A ``.zarray`` or ``.zattrs`` larger than
    MAX_ZARRAY_BYTES is not parsed (its array is served as referenced; its attributes as
    they are); a ``.zmetadata`` larger than MAX_ZMETADATA_BYTES is not parsed either, and the
    arrays under its directory are served as referenced, as it describes them. Only what
    serving needs is kept: the plans and the rewritten metadata."""

    def __init__(self, metadata: Mapping[str, Buffer | None],
                 max_chunk_bytes: int = DECODE_MAX_CHUNK_BYTES) -> None:
        self.arrays: dict[str, DecodedArray] = {}
        self.skipped: dict[str, str] = {}  # array path -> why it is served as referenced
        self.plain: set[str] = set()  # arrays that need no decoding
        self.codecs: dict[str, list[str]] = {}  # array path -> codec ids (every array)
        self._meta: dict[str, bytes] = {}  # rewritten metadata keys
        fills: dict[str, dict[str, Any]] = {}  # .zarray key -> its dtype and fill_value
        for key, data in metadata.items():
            if not (key == ".zarray" or key.endswith("/.zarray")):
                continue
            path = key[: -len(".zarray")].rstrip("/")
            if data is None:
                self.skipped[path or "/"] = ".zarray is not inline in the reference set"
                continue
            if len(data) > MAX_ZARRAY_BYTES:
                self.skipped[path or "/"] = (f".zarray is {len(data):,} bytes, more than the "
                                             f"{MAX_ZARRAY_BYTES:,} a .zarray is parsed up to")
                continue
            try:
                meta = json.loads(bytes(data))
            except ValueError:
                self.skipped[path or "/"] = ".zarray is not valid JSON"
                continue
            if isinstance(meta, dict):
                self.codecs[path] = _codec_ids(meta)
                fills[key] = {"dtype": meta.get("dtype"), "fill_value": meta.get("fill_value")}
            array, reason = plan_array(path, meta, max_chunk_bytes)
            if array is not None:
                self.arrays[path] = array
                self._meta[key] = _dumps(rewrite_zarray(meta))
            elif reason is not None:
                self.skipped[path or "/"] = reason
            else:
                self.plain.add(path)
        too_big = {key for key, data in metadata.items()
                   if (key == ".zmetadata" or key.endswith("/.zmetadata"))
                   and data is not None and len(data) > MAX_ZMETADATA_BYTES}
        for key in too_big:  # first: other .zmetadata keys may describe the same arrays
            self._unparsed_zmetadata(key[: -len(".zmetadata")], len(metadata[key] or b""))
        for key, data in metadata.items():
            if ((key == ".zattrs" or key.endswith("/.zattrs")) and data is not None
                    and len(data) <= MAX_ZARRAY_BYTES):
                attrs = _netcdf_attrs(fills.get(key[: -len(".zattrs")] + ".zarray"), bytes(data))
                if attrs is not None:
                    self._meta[key] = dumps_zattrs(attrs)
        for key, data in metadata.items():
            if (key == ".zmetadata" or key.endswith("/.zmetadata")) and key not in too_big:
                rewritten = self._zmetadata(key, None if data is None else bytes(data))
                if rewritten is not None:
                    self._meta[key] = rewritten
        self._max_depth = max((p.count("/") + 1 for p in self.arrays), default=0)

    def _unparsed_zmetadata(self, base: str, size: int) -> None:
        """The arrays under a ``.zmetadata`` too large to parse: served as it describes them
        (as referenced)."""
        for path in [p for p in self.arrays if (p + "/").startswith(base)]:
            del self.arrays[path]
            del self._meta[f"{path}/.zarray" if path else ".zarray"]
            self.skipped[path or "/"] = (
                f"{base}.zmetadata is {size:,} bytes, more than the "
                f"{MAX_ZMETADATA_BYTES:,} consolidated metadata is parsed up to")

    def _zmetadata(self, key: str, data: bytes | None) -> bytes | None:
        if data is None:
            return None
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        inner = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(inner, dict):
            return None
        base = key[: -len(".zmetadata")]
        changed = False
        new = dict(inner)
        for name, meta in inner.items():
            if name == ".zarray" or name.endswith("/.zarray"):
                path = (base + name[: -len(".zarray")]).rstrip("/")
                if path in self.arrays and isinstance(meta, dict):
                    new[name] = rewrite_zarray(meta)
                    changed = True
            elif name == ".zattrs" or name.endswith("/.zattrs"):
                attrs = netcdf_zattrs(inner.get(name[: -len(".zattrs")] + ".zarray"), meta)
                if attrs is not None:
                    new[name] = attrs
                    changed = True
        if not changed:
            return None
        return _dumps({**obj, "metadata": new})

    @classmethod
    def from_index(cls, index: Any, max_chunk_bytes: int = DECODE_MAX_CHUNK_BYTES) -> DecodedView:
        """From a ``KeyIndex``: its ``.zarray``, ``.zattrs`` and ``.zmetadata`` keys, found with
        one vectorised pass over the key column (``IndexMetadata``: nothing copied up front)."""
        import pyarrow.compute as pc

        keys = index.table["key"]
        hits = pc.or_(pc.or_(pc.ends_with(keys, pattern=".zarray"), pc.ends_with(keys, pattern=".zattrs")),
                      pc.ends_with(keys, pattern=".zmetadata"))
        rows = np.flatnonzero(hits.to_numpy(zero_copy_only=False)).tolist()
        return cls(IndexMetadata(index, rows), max_chunk_bytes)

    # ---- what a key is --------------------------------------------------------------------
    def array_of(self, key: str) -> DecodedArray | None:
        """The decoded array whose chunk ``key`` is, if any."""
        if not key or key.rpartition("/")[2][:1] == ".":
            return None
        head = key
        for _ in range(self._max_depth + 1):
            head, _, _tail = head.rpartition("/")
            array = self.arrays.get(head)
            if array is not None:
                rel = key[len(head) + 1 :] if head else key
                return array if array.is_chunk_name(rel) else None
            if not head:
                break
        return self.arrays.get("") if "" in self.arrays and self.arrays[""].is_chunk_name(key) else None

    def metadata(self, key: str) -> bytes | None:
        """The rewritten bytes of a metadata key (``.zarray``, ``.zattrs``, ``.zmetadata``), if
        rewritten."""
        return self._meta.get(key)

    def size(self, key: str, stored: int) -> int:
        """The served size of ``key`` whose referenced size is ``stored``."""
        meta = self._meta.get(key)
        if meta is not None:
            return len(meta)
        array = self.array_of(key)
        return array.nbytes if array is not None else stored

    def entry_sizer(self, dir_path: str) -> Callable[[str, int], int]:
        """``size(name, stored)`` for the entries of one directory (one look-up per directory,
        a regular-expression match per entry)."""
        prefix = dir_path + "/" if dir_path else ""
        candidates: list[tuple[DecodedArray, str]] = []
        head = dir_path
        while True:
            array = self.arrays.get(head)
            if array is not None:
                rel = dir_path[len(head) + 1 :] if head else dir_path
                candidates.append((array, rel + "/" if rel else ""))
                break
            if not head:
                break
            head = head.rpartition("/")[0]
        meta = self._meta

        def size(name: str, stored: int) -> int:
            if name[:1] == ".":
                m = meta.get(prefix + name)
                return len(m) if m is not None else stored
            for array, rel in candidates:
                if array.is_chunk_name(rel + name):
                    return array.nbytes
            return stored

        return size

    def describe(self) -> dict[str, str]:
        """For the root's xattrs."""
        return {
            "decoded_arrays": str(len(self.arrays)),
            "not_decoded": json.dumps(dict(sorted(self.skipped.items())), sort_keys=True),
        }

    def warn(self) -> None:
        """One warning per array served as referenced although decoding was asked for."""
        for path, why in sorted(self.skipped.items()):
            log.warning("decode: array %s is served as referenced (not decoded): %s", path, why)


# ---- the tree as served through the view ---------------------------------------------------


class DecodedTree:
    """A ``KeyTree`` or ``ChunkTree`` whose sizes and metadata are those of the view."""

    def __init__(self, inner: Any, view: DecodedView) -> None:
        self.inner = inner
        self.view = view
        self.root = inner.root

    def node(self, ino: int) -> Any:
        return self.inner.node(ino)

    def path(self, node: Any) -> bytes:
        return self.inner.path(node)

    def parent(self, node: Any) -> Any:
        return self.inner.parent(node)

    def __len__(self) -> int:
        return len(self.inner)

    async def lookup(self, parent: Any, name: bytes) -> Any:
        return await self.inner.lookup(parent, name)

    @staticmethod
    def _str(path: bytes) -> str:
        return path.decode("utf-8", "surrogateescape")

    async def entries(self, parent: Any, start: int = 0) -> AsyncIterator[tuple]:
        sizer = self.view.entry_sizer(self._str(self.inner.path(parent)))
        async for name, ino, is_dir, nxt, size in self.inner.entries(parent, start):
            if not is_dir:
                size = sizer(self._str(name), size)
            yield name, ino, is_dir, nxt, size

    async def ref(self, node: Any) -> Ref:
        ref = await self.inner.ref(node)
        meta = self.view.metadata(self._str(self.inner.path(node)))
        if meta is not None:
            return Ref(RefKind.INLINE, None, 0, len(meta), meta)
        return ref

    async def size(self, node: Any) -> int:
        key = self._str(self.inner.path(node))
        meta = self.view.metadata(key)
        if meta is not None:
            return len(meta)
        array = self.view.array_of(key)
        if array is not None:
            return array.nbytes
        return await self.inner.size(node)

    def array(self, node: Any) -> DecodedArray | None:
        """The decoded array whose chunk ``node`` is (None: served as referenced)."""
        if node.is_dir:
            return None
        return self.view.array_of(self._str(self.inner.path(node)))

    async def resolve(self, key: str) -> tuple[Any, Ref] | None:
        """Node and stored reference of ``key`` (for decoding ahead), None if absent."""
        node = self.root
        for part in key.encode("utf-8", "surrogateescape").split(b"/"):
            node = await self.inner.lookup(node, part)
            if node is None:
                return None
        if node.is_dir:
            return None
        try:
            return node, await self.inner.ref(node)
        except FileNotFoundError:
            return None


# ---- the read path of decoded chunks -------------------------------------------------------


class _ByteBudget:
    """Decoded bytes in flight, bounded: a chunk waits until its bytes fit (one chunk larger
    than the whole budget goes alone)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = trio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._changed:
            while self.used and self.used + n > self.limit:
                await self._changed.wait()
            self.used += n

    async def release(self, n: int) -> None:
        async with self._changed:
            self.used -= n
            self._changed.notify_all()


@dataclass(frozen=True, slots=True)
class DecodedKey:
    """A decoded chunk in the memory cache (distinct from the reader's stored-byte keys)."""

    key: str


class ChunkDecoder:
    """Decoded chunks for the FUSE read path.

    ``read_stored(ref)`` gives a chunk's stored bytes (the ``RefReader``: memory, disk,
    fetch, readahead across keys). Decoding runs in ``threads`` worker threads of its own
    (``WorkerPool``: each takes the next chunk as soon as it is done with one), with at most
    ``max_bytes`` decoded bytes in flight; results go to ``memory`` (the
    mount's memory cache) and are shared by concurrent readers of the same chunk. While a
    reader goes through an array's chunks in order, the next chunks are decoded ahead.
    """

    def __init__(
        self,
        view: DecodedView,
        memory: MemoryLRU,
        read_stored: Callable[[Ref], Any],
        *,
        resolve: Callable[[str], Any] | None = None,
        threads: int | None = None,
        max_bytes: int = 128 * 2**20,
        ahead: int = 8,
        on_error: Callable[[], None] | None = None,
        stats: Any = None,
        workers: CodecWorkers | None = None,
    ) -> None:
        self.view = view
        self.memory = memory
        self.read_stored = read_stored
        self.resolve = resolve
        self.pool = WorkerPool(threads or max(1, os.cpu_count() or 1), "refmount-decode")
        self.budget = _ByteBudget(max_bytes)
        self.ahead = ahead
        self.on_error = on_error
        self.stats = stats  # a Stats: its decoded / decoded_ahead counters
        self.workers = workers  # codec worker processes, for arrays with codecs off the allow-list
        self.decoded = 0  # chunks decoded
        self.decoded_ahead = 0  # of those, decoded ahead of a reader
        self._flights: SingleFlight[str, Block] = SingleFlight()
        self._last: LRU[str, int] = LRU(10_000)  # array path -> chunk number last read for the first time
        self._background: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._background = nursery

    def close(self) -> None:
        """Stop the worker threads (chunks not being decoded are dropped) and the codec
        worker processes."""
        self.pool.close()
        if self.workers is not None:
            self.workers.close()

    def ready(self, key: str) -> Block | None:
        """The decoded chunk if memory has it right now (for the page-cache push at open)."""
        return self.memory.get(DecodedKey(key))

    async def read(self, key: str, array: DecodedArray, ref: Ref, off: int, size: int) -> Block:
        data = self.memory.get(DecodedKey(key))
        if data is None:
            data = await self.chunk(key, array, ref)
        if off == 0:  # a reader starting on a chunk (decoded ahead or not)
            self._maybe_ahead(key, array)
        return memoryview(data)[off : off + size]

    async def chunk(self, key: str, array: DecodedArray, ref: Ref, *, ahead: bool = False) -> Block:
        """The decoded bytes of chunk ``key`` (memory, else a decode shared by all asking;
        ``ahead``: for no reader yet)."""
        mkey = DecodedKey(key)
        data = self.memory.get(mkey)
        if data is not None:
            return data
        return await self._flights.run(key, lambda: self._decode(key, array, ref, ahead))

    async def _decode(self, key: str, array: DecodedArray, ref: Ref, ahead: bool) -> Block:
        began = trio.current_time()
        ran: list[float] = []  # when a worker thread took the chunk, and how long it took

        def decode() -> memoryview:
            start = time.perf_counter()
            try:
                return array.decode(stored) if not array.isolated else isolated()
            finally:
                ran[:] = [start, time.perf_counter() - start]

        def isolated() -> memoryview:  # codecs off the allow-list: in a codec worker process
            assert array.chain is not None
            if self.workers is None:
                raise DecodeError(f"{'+'.join(array.codecs)}: codecs outside the allow-list "
                                  "need a codec worker, and this decoder has none")
            try:
                out = self.workers.decode(array.chain.spec(), stored, array.nbytes)
            except (WorkerDied, WorkerError) as e:
                raise DecodeError(str(e)) from None
            if len(out) != array.nbytes:
                raise DecodeError(f"the codec worker gave {len(out)} bytes, expected {array.nbytes}")
            return memoryview(out)

        try:
            t0 = time.perf_counter()
            stored = await self.read_stored(ref)
            got = time.perf_counter()
            await self.budget.acquire(array.nbytes)
            try:
                data = await self.pool.run(decode)
            finally:
                await self.budget.release(array.nbytes)
        except DecodeError as e:
            if self.on_error is not None:
                self.on_error()
            log.error("decode failed: key=%s codecs=%s: %s", key, "+".join(array.codecs) or "none", e)
            e.logged = True
            raise
        if log.isEnabledFor(logging.DEBUG) and ran:
            log.debug("decode %s: began %.6f, stored bytes in %.6f s, waited %.6f s for a thread, "
                      "decoded in %.6f s%s", key, began, got - t0, ran[0] - got, ran[1],
                      " (ahead)" if ahead else "")
        self.decoded += 1
        self.decoded_ahead += ahead
        if self.stats is not None:
            self.stats.decoded += 1
            self.stats.decoded_ahead += ahead
        self.memory.put(DecodedKey(key), data)
        return data

    # ---- decoding ahead ---------------------------------------------------------------------
    def _maybe_ahead(self, key: str, array: DecodedArray) -> None:
        """A reader starts on a chunk: if it is near the furthest one started in its array (a
        reader going through the array in C order, possibly several chunks at once, as zarr
        does), decode the ``ahead`` chunks after the furthest in the background."""
        if self._background is None or self.resolve is None or self.ahead <= 0:
            return
        coords = _coords(key, array)
        if coords is None:
            return
        number, grid = coords
        last = self._last.get(array.path)
        in_order = last is not None and -2 * self.ahead <= number - last <= 2 * self.ahead
        front = max(number, last) if in_order and last is not None else number
        self._last.put(array.path, front)
        if not in_order or number == last:
            return
        base = key[: len(key) - len(_chunk_rel(key, array))]
        for n in range(front + 1, front + 1 + self.ahead):
            if n >= math.prod(grid):
                break
            nxt = base + _chunk_name(n, grid, array)
            if nxt in self._flights or self.memory.get(DecodedKey(nxt)) is not None:
                continue
            self._background.start_soon(self._ahead, nxt, array)

    async def _ahead(self, key: str, array: DecodedArray) -> None:
        try:
            assert self.resolve is not None
            found = await self.resolve(key)
            if found is None:
                return
            await self.chunk(key, array, found[1], ahead=True)
        except Exception as e:  # the reader will see (and log) the error if it gets there
            log.debug("decoding ahead %s failed: %s", key, e)


def _chunk_rel(key: str, array: DecodedArray) -> str:
    return key[len(array.path) + 1 :] if array.path else key


def _coords(key: str, array: DecodedArray) -> tuple[int, tuple[int, ...]] | None:
    """(chunk number in C order, grid) of a chunk key inside the array's grid."""
    if array.ndim == 0:
        return 0, (1,)
    idx = [int(p) for p in _chunk_rel(key, array).split(array.separator)]
    if any(i >= g for i, g in zip(idx, array.grid, strict=True)):
        return None
    return int(np.ravel_multi_index(idx, array.grid)), array.grid


def _chunk_name(n: int, grid: tuple[int, ...], array: DecodedArray) -> str:
    if array.ndim == 0:
        return "0"
    return array.separator.join(str(int(i)) for i in np.unravel_index(n, grid))
