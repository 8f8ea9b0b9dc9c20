"""Parquet reference sets (fsspec's LazyReferenceMapper layout).

Mounting reads only ``.zmetadata``: its metadata keys and the file itself (the key
``.zmetadata``, as fsspec's ReferenceFileSystem serves it) become a small KeyIndex, and each
array (a ``<path>/.zarray`` key) becomes an :class:`ArraySpec` whose chunk keys are
derived from shape/chunks in C order. Chunk ``i`` lives in ``<path>/refs.<i // record_size>.parq``
at row ``i % record_size``; record files are read when a lookup, listing or read needs
them (in a worker thread), and kept in a bounded LRU. The tree served is a ``ChunkTree``
(chunktree.py); :class:`ParquetFormat` is this format's entry in the registry.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import trio

from ..lru import LRU
from ..singleflight import SingleFlight
from .format import Format, IndexFile, OpenedTree, Options
from .index import IndexBuilder, KeyIndex
from .limits import DEFAULT_LIMITS, Limits, size_text
from .model import Ref, ReferenceSetError, RefKind
from .source import open_source

log = logging.getLogger(__name__)

COLUMNS = ("path", "offset", "size", "raw")
RECORD_CACHE_BYTES = 256 << 20  # decoded record files kept in memory (beyond the newest)


def parquet_root(source: str, target_options: dict[str, Any]) -> str | None:
    """The root of a Parquet reference set, if SOURCE is one: a location (any fsspec URL,
    HTTP included, where there is no directory listing) holding ``.zmetadata``, or that
    ``.zmetadata`` file itself."""
    root = source.rstrip("/")
    if root.endswith("/.zmetadata"):
        return root[: -len("/.zmetadata")]
    try:
        fs, path = fsspec.core.url_to_fs(root + "/.zmetadata", **target_options)
        return root if fs.isfile(path) else None
    except Exception:
        return None


@dataclass(frozen=True)
class ArraySpec:
    path: str  # "deep/name"
    grid: tuple[int, ...]  # chunks along each axis (() for a 0-d array)
    separator: str  # "." or "/"

    @property
    def count(self) -> int:
        return math.prod(self.grid) if self.grid else 1

    @property
    def ndim(self) -> int:
        return max(len(self.grid), 1)

    @property
    def dims(self) -> tuple[int, ...]:
        """Chunk grid as used for naming: a 0-d array has one chunk named ``0``."""
        return self.grid or (1,)

    def chunk_name(self, number: int) -> str:
        idx = np.unravel_index(number, self.dims)
        return self.separator.join(str(int(i)) for i in idx)


@dataclass
class ParquetSet:
    root: str
    record_size: int
    metadata: KeyIndex
    arrays: list[ArraySpec]
    skipped: list[str] = field(default_factory=list)  # metadata keys left out (bad_keys=skip)
    quirks: dict[str, int] = field(default_factory=dict)  # producer quirks accepted (IndexBuilder)


def _array_spec(name: str, key: str, zarray: Any) -> ArraySpec:
    path = key[: -len("/.zarray")] if key.endswith("/.zarray") else ""
    if path.startswith("/") and not path.startswith("//"):  # a leading '/' means the root
        path = path[1:]
    if isinstance(zarray, str):
        try:
            zarray = json.loads(zarray)
        except json.JSONDecodeError:
            raise ReferenceSetError(f"{name}: {key} is not valid JSON") from None
    if not isinstance(zarray, dict):
        raise ReferenceSetError(f"{name}: {key} must be a JSON object")
    shape, chunks = zarray.get("shape"), zarray.get("chunks")
    ok = (
        isinstance(shape, list)
        and isinstance(chunks, list)
        and len(shape) == len(chunks)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in shape)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in chunks)
    )
    if not ok:
        raise ReferenceSetError(f"{name}: {key} needs integer 'shape' and positive 'chunks' of one length")
    sep = zarray.get("dimension_separator") or "."
    if sep not in (".", "/"):
        raise ReferenceSetError(f"{name}: {key}: dimension_separator must be '.' or '/'")
    if not path:
        raise ReferenceSetError(f"{name}: an array at the root ('.zarray') is not supported")
    grid = tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
    return ArraySpec(path, grid, sep)


def load_parquet_set(source: str, target_options: dict[str, Any], bad_keys: str,
                     limits: Limits = DEFAULT_LIMITS) -> ParquetSet:
    root = parquet_root(source, target_options) or source.rstrip("/")
    name = root + "/.zmetadata"
    nonfinite_seen: list[str] = []
    with open_source(name, target_options, limits.max_ratio) as f:
        raw = f.read()
    nonfinite = 0
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        try:  # bare NaN/Infinity, as Python's json (LazyReferenceMapper) writes them
            meta = json.loads(raw, parse_constant=lambda c: nonfinite_seen.append(c) or float(c))
        except (ValueError, RecursionError):
            raise ReferenceSetError(f"{name}: malformed JSON: {e}") from None
        nonfinite = len(nonfinite_seen)
    if not isinstance(meta, dict):
        raise ReferenceSetError(f"{name}: must be a JSON object")
    record_size = meta.get("record_size")
    if not isinstance(record_size, int) or isinstance(record_size, bool) or record_size <= 0:
        raise ReferenceSetError(f"{name}: 'record_size' must be a positive integer, got {record_size!r}")
    metadata = meta.get("metadata")
    if not isinstance(metadata, dict):
        raise ReferenceSetError(f"{name}: 'metadata' must be an object of zarr metadata keys")
    arrays = []
    texts: list[tuple[str, bytes]] = []
    for key, value in metadata.items():
        # As LazyReferenceMapper serves them: every metadata value is JSON text.
        text = value if isinstance(value, str) else json.dumps(value)
        texts.append((key, text.encode()))
        if key == ".zarray" or key.endswith("/.zarray"):
            arrays.append(_array_spec(name, key, value))
    # fsspec's ReferenceFileSystem serves the set's own .zmetadata file as the key .zmetadata
    # (before any metadata key of that name) and lists it at the root: so does the mount,
    # holding the metadata keys the tree serves (a first pass tells which bad_keys=skip drops).
    probe = IndexBuilder(bad_keys, limits)
    for key, data in texts:
        probe.add_inline(key, data)
    probe.finish()
    served = _served_zmetadata(raw, meta, set(probe.skipped))
    builder = IndexBuilder(bad_keys, limits)
    for key, data in texts:
        builder.add_inline(key, data)
    builder.quirks["numbers were a bare NaN or Infinity"] += nonfinite
    if len(served) <= limits.max_inline:
        builder.add_inline(".zmetadata", served)
    else:
        log.warning("%s: not served as the key .zmetadata: %s is over max_inline=%s", name,
                    size_text(len(served)), size_text(limits.max_inline))
    index = KeyIndex(builder.finish())
    # With bad_keys=skip, an array whose '.zarray' key cannot be a path is skipped whole.
    skipped = set(builder.skipped)
    arrays = [a for a in arrays if f"{a.path}/.zarray" not in skipped]
    return ParquetSet(root, record_size, index, sorted(arrays, key=lambda a: a.path), builder.skipped,
                      +builder.quirks)


def _served_zmetadata(raw: bytes, meta: dict[str, Any], skipped: set[str]) -> bytes:
    """The bytes of the key ``.zmetadata``: the file as it is when every metadata value is a
    JSON object and every key is served (LazyReferenceMapper's form: what fsspec serves, byte
    for byte, and what zarr reads as consolidated metadata). Otherwise it holds the metadata
    the tree serves: without the keys ``bad_keys=skip`` left out, and values written as JSON
    text (the spec's ``dict[str, str]``) parsed, so that zarr can read them; a value that is
    not a JSON object is left out."""
    metadata = meta["metadata"]
    if not skipped and all(isinstance(v, dict) for v in metadata.values()):
        return raw
    parsed: dict[str, Any] = {}
    for key, value in metadata.items():
        if key in skipped:
            continue
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                continue
        if isinstance(value, dict):
            parsed[key] = value
    return json.dumps({**meta, "metadata": parsed}).encode()


def _int64(column: pa.Array, name: str, where: str) -> np.ndarray:
    """An integer column as int64 (nulls as 0): unsigned columns too, when they fit."""
    column = column.fill_null(0)
    if pa.types.is_unsigned_integer(column.type) and len(column) and (
        pc.max(column).as_py() > np.iinfo(np.int64).max
    ):
        raise ReferenceSetError(f"{where}: column '{name}' has values beyond 64-bit integers")
    return column.cast(pa.int64()).to_numpy()


class Record:
    """The references of one record file, decoded to arrays (no object per row)."""

    def __init__(self, table: pa.Table | None, where: str, prefix: str = "",
                 relative: Callable[[str], bool] | None = None,
                 max_inline: int = Limits.max_inline) -> None:
        # A relative target path is relative to the directory of the record file naming it
        # (``prefix``, from the set's root, which is where such paths are resolved from).
        self.prefix = prefix
        self.relative = relative
        if table is None:  # no such record file: all its keys are absent
            self.n = self.nbytes = 0
            self.exists = np.zeros(0, bool)
            self.sizes = np.zeros(0, np.int64)
            return
        cols = {c: table[c].combine_chunks() for c in COLUMNS if c in table.column_names}
        if "raw" not in cols and "path" not in cols:
            raise ReferenceSetError(f"{where}: has neither a 'path' nor a 'raw' column")
        n = self.n = table.num_rows
        self.nbytes = table.nbytes
        path = cols.get("path")
        if path is not None:
            if pa.types.is_dictionary(path.type):
                path = path.dictionary_decode()
            if not (pa.types.is_string(path.type) or pa.types.is_large_string(path.type)):
                if pa.types.is_null(path.type):
                    path = pa.nulls(n, pa.string())
                else:
                    raise ReferenceSetError(f"{where}: column 'path' must be strings, not {path.type}")
        raw = cols.get("raw")
        if raw is not None:
            if pa.types.is_null(raw.type):
                raw = pa.nulls(n, pa.binary())
            elif not (pa.types.is_binary(raw.type) or pa.types.is_large_binary(raw.type)):
                raise ReferenceSetError(f"{where}: column 'raw' must be binary, not {raw.type}")
        for c in ("offset", "size"):
            if path is not None and c not in cols:
                raise ReferenceSetError(f"{where}: has 'path' but no '{c}' column")
            if c in cols and not pa.types.is_integer(cols[c].type):
                raise ReferenceSetError(f"{where}: column '{c}' must be integers, not {cols[c].type}")
        self.path = path
        self.raw = raw
        self.offset = _int64(cols["offset"], "offset", where) if "offset" in cols else None
        size = _int64(cols["size"], "size", where) if "size" in cols else np.zeros(n, np.int64)
        no_size = (cols["size"].is_null().to_numpy(zero_copy_only=False) if "size" in cols
                   else np.zeros(n, bool))
        has_raw = raw.is_valid().to_numpy(zero_copy_only=False) if raw is not None else np.zeros(n, bool)
        has_path = path.is_valid().to_numpy(zero_copy_only=False) if path is not None else np.zeros(n, bool)
        self.exists = has_raw | has_path
        raw_len = pc.binary_length(raw).fill_null(0).to_numpy() if raw is not None else 0
        if raw is not None and n and int(raw_len.max()) > max_inline:
            row = int(np.argmax(raw_len > max_inline))
            raise ReferenceSetError(
                f"{where}: row {row}: 'raw' value of {int(raw_len[row]):,} bytes is over the limit "
                f"max_inline={size_text(max_inline)}")
        offset = self.offset if self.offset is not None else np.zeros(n, np.int64)
        ranged = has_path & ~has_raw
        if (size[ranged] < 0).any() or (offset[ranged] < 0).any():
            raise ReferenceSetError(f"{where}: negative offset or size")
        # Size of each key: raw length; range size; -1 for a whole-file target. As fsspec's
        # reader has it, only offset 0 *and* size 0 mean the whole target: size 0 at another
        # offset is an empty range (serving the whole target would expose bytes outside it).
        # A null size is the target from ``offset`` to its end (as GDAL reads such a row).
        whole = ((offset == 0) & (size == 0)) | no_size
        self.sizes = np.where(has_raw, raw_len, np.where(whole, -1, size)).astype(np.int64)
        self.sizes[~self.exists] = -2

    def ref(self, row: int, view: bool = False) -> Ref | None:
        """Row's reference; ``view``: a 'raw' value as a view into the record (no copy)."""
        if row >= self.n or not self.exists[row]:
            return None
        if self.raw is not None and self.raw[row].is_valid:
            cell = self.raw[row]
            data = memoryview(cell.as_buffer()) if view else cell.as_py()
            return Ref(RefKind.INLINE, None, 0, len(data), data)
        assert self.path is not None
        url = self.path[row].as_py()
        if self.relative is not None and self.relative(url):
            protocol, sep, path = url.rpartition("://")
            url = protocol + sep + posixpath.join(self.prefix, path)
        size = int(self.sizes[row])
        offset = int(self.offset[row]) if self.offset is not None else 0
        if size < 0:
            return Ref(RefKind.WHOLE, url, offset, -1)
        return Ref(RefKind.RANGE, url, offset, size)

    def size(self, row: int) -> int:
        """-2: absent; -1: whole target (size unknown); else the byte size."""
        return int(self.sizes[row]) if row < self.n else -2


class RecordCache:
    """Loads record files off the trio loop, one load per record at a time, LRU-bounded."""

    def __init__(self, pset: ParquetSet, target_options: dict[str, Any], capacity: int = 64,
                 relative: Callable[[str], bool] | None = None,
                 max_inline: int = Limits.max_inline) -> None:
        self.pset = pset
        self.relative = relative  # which target paths are relative (TargetPolicy.relative)
        self.max_inline = max_inline
        self.target_options = target_options
        self.capacity = capacity
        self.max_bytes = RECORD_CACHE_BYTES
        # At most `capacity` records and RECORD_CACHE_BYTES (large 'raw' cells), the newest
        # always kept.
        self._lru: LRU[tuple[int, int], Record] = LRU(
            capacity, max_weight=self.max_bytes, weigh=lambda r: r.nbytes, keep_newest=True)
        self._loading: SingleFlight[tuple[int, int], Record] = SingleFlight()
        self._limiter = trio.CapacityLimiter(4)
        self.loads = 0

    def url(self, array: ArraySpec, record: int) -> str:
        return f"{self.pset.root}/{array.path}/refs.{record}.parq"

    def _load(self, array: ArraySpec, record: int) -> Record:
        url = self.url(array, record)
        try:
            with fsspec.open(url, "rb", **self.target_options) as f:
                table = pq.read_table(f)
        except FileNotFoundError:
            return Record(None, url)
        except (pa.ArrowInvalid, OSError) as e:
            raise ReferenceSetError(f"{url}: unreadable Parquet ({e})") from None
        return Record(table, url, array.path + "/", self.relative, self.max_inline)

    async def get(self, array_id: int, record: int) -> Record:
        key = (array_id, record)
        rec = self._lru.get(key)
        if rec is not None:
            return rec
        return await self._loading.run(key, lambda: self._get(key))

    async def _get(self, key: tuple[int, int]) -> Record:
        array = self.pset.arrays[key[0]]
        rec = await trio.to_thread.run_sync(self._load, array, key[1], limiter=self._limiter)
        self.loads += 1
        self._lru.put(key, rec)
        return rec


# ---- the Format ------------------------------------------------------------------------------


class ParquetFormat(Format):
    """fsspec's LazyReferenceMapper layout: ``.zmetadata`` is validated at mount, record files
    are read when a lookup, listing or read needs them (``ChunkTree`` in chunktree.py)."""

    name = "parquet"

    def detect(self, source: str, target_options: Options) -> bool:
        return parquet_root(source, dict(target_options)) is not None

    def prepare(self, source: str, target_options: Options, *, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS, cache_dir: str | None = None) -> IndexFile:
        pset = load_parquet_set(source, dict(target_options), bad_keys, limits)  # validate .zmetadata now
        if pset.skipped:
            log.warning("skipped %d metadata keys that cannot be paths (bad_keys=skip), e.g. %r",
                        len(pset.skipped), pset.skipped[0])
        return IndexFile("", temporary=False, reused=False, kind=self.name)

    def targets(self, index: IndexFile) -> Iterator[tuple[str, Callable[[], str]]]:
        return iter(())  # record files are read lazily: their targets are checked at read time

    def metadata(self, index: IndexFile, source: str, target_options: Options, *,
                 bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS) -> KeyIndex:
        return load_parquet_set(source, dict(target_options), bad_keys, limits).metadata

    def open_tree(self, index: IndexFile, source: str, target_options: Options, *,
                  bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS,
                  relative: Callable[[str], bool] | None = None) -> OpenedTree:
        from .chunktree import ChunkTree  # it builds on the tree layer (tree.KeyTree)

        options = dict(target_options)
        pset = load_parquet_set(source, options, bad_keys, limits)
        tree = ChunkTree(pset, RecordCache(pset, options, max_inline=limits.max_inline,
                                           relative=relative))
        info = {"record_size": str(pset.record_size), "arrays": str(len(pset.arrays))}
        return OpenedTree(tree, pset.metadata, time.time_ns(), info)

    def references(self, source: str, target_options: Options,
                   quirks: dict[str, int] | None = None) -> Iterator[tuple[str, Ref]]:
        options = dict(target_options)
        pset = load_parquet_set(source, options, "error")
        if quirks is not None:
            quirks.update((what, n) for what, n in pset.quirks.items() if n)
        return _references(pset, options)


def _references(pset: ParquetSet, target_options: dict[str, Any]) -> Iterator[tuple[str, Ref]]:
    for i in range(pset.metadata.n):
        yield pset.metadata.key(i).decode(), pset.metadata.ref(i)
    loader = RecordCache(pset, target_options)
    rs = pset.record_size
    for array in pset.arrays:
        for record_no in range(math.ceil(array.count / rs)):
            record = loader._load(array, record_no)
            for row in np.flatnonzero(record.exists).tolist():
                number = record_no * rs + row
                if number < array.count:
                    ref = record.ref(row)
                    assert ref is not None
                    yield f"{array.path}/{array.chunk_name(number)}", ref
