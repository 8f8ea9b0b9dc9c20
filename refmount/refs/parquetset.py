"""A Parquet reference set (fsspec's LazyReferenceMapper layout): its metadata and arrays,
and its record files.

``load_parquet_set`` reads only ``.zmetadata``: its metadata keys and the file itself (the key
``.zmetadata``, as fsspec's ReferenceFileSystem serves it) become a small KeyIndex, and each
array (a ``<path>/.zarray`` key) becomes an :class:`ArraySpec` whose chunk keys are derived
from shape/chunks in C order. Chunk ``i`` lives in ``<path>/refs.<i // record_size>.parq`` at
row ``i % record_size``; a :class:`Record` is one record file decoded to arrays, and
:class:`RecordCache` loads them when a lookup, listing or read needs them (in a worker
thread), kept in a bounded LRU. The tree over them is ``ChunkTree`` (chunktree.py); the
format's entry in the registry is ``ParquetFormat`` (parquet.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.implementations.local import LocalFileSystem

from refmount.base.errors import ReadError
from refmount.base.lru import LRU
from refmount.base.urls import is_chained, is_local
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.limits import DEFAULT_LIMITS, Limits, size_text
from refmount.refs.model import Ref, ReferenceSetError, RefKind
from refmount.refs.recordfile import COLUMNS, RecordRefused, read_record
from refmount.refs.zmetadata import read_zmetadata

if TYPE_CHECKING:
    from refmount.base.singleflight import SingleFlight

log = logging.getLogger(__name__)

RECORD_CACHE_BYTES = 256 << 20  # decoded record files kept in memory (beyond the newest)


def parquet_root(source: str, target_options: dict[str, Any]) -> str | None:
    """The root of a Parquet reference set, if SOURCE is one: a location (any fsspec URL,
    HTTP included, where there is no directory listing) holding ``.zmetadata``, or that
    ``.zmetadata`` file itself."""
    base, query = _split_query(source)
    base = base.rstrip("/")
    if base.endswith("/.zmetadata"):
        return base[: -len("/.zmetadata")] + query
    root = base + query
    try:
        fs, path = fsspec.core.url_to_fs(under_root(root, ".zmetadata"), **target_options)
        return root if fs.isfile(path) else None
    except Exception:
        return None


def _split_query(url: str) -> tuple[str, str]:
    """A remote URL's text before its query, and the query with its ``?`` (else "")."""
    if is_local(url) or is_chained(url) or "?" not in url:
        return url, ""
    base, _, query = url.partition("?")
    return base, "?" + query


def under_root(root: str, rel: str) -> str:
    """``rel`` under a set's ``root``: a remote root's query (a signature, a version) stays
    at the end, on the file named (``refs.json?v=1`` is never probed as
    ``refs.json?v=1/.zmetadata``)."""
    base, query = _split_query(root)
    return f"{base.rstrip('/')}/{rel}{query}"


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
    name = under_root(root, ".zmetadata")
    meta, nonfinite, raw = read_zmetadata(name, target_options, limits)
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
        raise RecordRefused(f"{where}: column '{name}' has values beyond 64-bit integers")
    return column.cast(pa.int64()).to_numpy()


class Cells:
    """A ``path`` or ``raw`` column, plain or dictionary-encoded, as the value of each row: a
    dictionary is never decoded (a value that many rows share is held once)."""

    def __init__(self, column: pa.Array) -> None:
        n = len(column)
        if pa.types.is_dictionary(column.type):
            self.values: pa.Array = column.dictionary
            indices = column.indices
            self.index: np.ndarray | None = indices.fill_null(0).cast(pa.int32()).to_numpy()
            self.valid = indices.is_valid().to_numpy(zero_copy_only=False)
            if len(self.values) == 0:
                self.valid = np.zeros(n, bool)
            elif self.values.null_count:
                self.valid &= self.values.is_valid().to_numpy(zero_copy_only=False)[self.index]
        else:
            self.values = column
            self.index = None
            self.valid = column.is_valid().to_numpy(zero_copy_only=False)

    @property
    def type(self) -> pa.DataType:
        return self.values.type

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.valid.nbytes + (0 if self.index is None else self.index.nbytes)

    def __getitem__(self, row: int) -> pa.Scalar:
        return self.values[int(self.index[row]) if self.index is not None else row]

    def lengths(self) -> np.ndarray:
        """Byte length of each row's value (0 for a null)."""
        if not len(self.values):
            return np.zeros(len(self.valid), np.int64)
        lengths = pc.binary_length(self.values).fill_null(0).cast(pa.int64()).to_numpy()
        return lengths[self.index] if self.index is not None else lengths


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
            raise RecordRefused(f"{where}: has neither a 'path' nor a 'raw' column")
        n = self.n = table.num_rows
        del table
        path = raw = None
        if "path" in cols:
            path = Cells(pa.nulls(n, pa.string()) if pa.types.is_null(cols["path"].type) else cols["path"])
            if not (pa.types.is_string(path.type) or pa.types.is_large_string(path.type)):
                raise RecordRefused(f"{where}: column 'path' must be strings, not {path.type}")
        if "raw" in cols:
            raw = Cells(pa.nulls(n, pa.binary()) if pa.types.is_null(cols["raw"].type) else cols["raw"])
            if not (pa.types.is_binary(raw.type) or pa.types.is_large_binary(raw.type)):
                raise RecordRefused(f"{where}: column 'raw' must be binary, not {raw.type}")
        for c in ("offset", "size"):
            if path is not None and c not in cols:
                raise RecordRefused(f"{where}: has 'path' but no '{c}' column")
            if c in cols and not pa.types.is_integer(cols[c].type):
                raise RecordRefused(f"{where}: column '{c}' must be integers, not {cols[c].type}")
        self.path = path
        self.raw = raw
        self.offset = _int64(cols["offset"], "offset", where) if "offset" in cols else None
        size = _int64(cols["size"], "size", where) if "size" in cols else np.zeros(n, np.int64)
        no_size = (cols["size"].is_null().to_numpy(zero_copy_only=False) if "size" in cols
                   else np.zeros(n, bool))
        del cols
        has_raw = raw.valid if raw is not None else np.zeros(n, bool)
        has_path = path.valid if path is not None else np.zeros(n, bool)
        self.exists = has_raw | has_path
        raw_len = raw.lengths() if raw is not None else np.zeros(n, np.int64)
        if raw is not None and n and int(raw_len.max()) > max_inline:
            row = int(np.argmax(raw_len > max_inline))
            raise RecordRefused(
                f"{where}: row {row}: 'raw' value of {int(raw_len[row]):,} bytes is over the limit "
                f"max_inline={size_text(max_inline)}")
        offset = self.offset if self.offset is not None else np.zeros(n, np.int64)
        ranged = has_path & ~has_raw
        if (size[ranged] < 0).any() or (offset[ranged] < 0).any():
            raise RecordRefused(f"{where}: negative offset or size")
        # Size of each key: raw length; range size; -1 for a whole-file target. As fsspec's
        # reader has it, only offset 0 *and* size 0 mean the whole target: size 0 at another
        # offset is an empty range (serving the whole target would expose bytes outside it).
        # A null size is the target from ``offset`` to its end (as GDAL reads such a row).
        whole = ((offset == 0) & (size == 0)) | no_size
        self.sizes = np.where(has_raw, raw_len, np.where(whole, -1, size)).astype(np.int64)
        self.sizes[~self.exists] = -2
        self.nbytes = (self.sizes.nbytes + self.exists.nbytes + offset.nbytes
                       + sum(c.nbytes for c in (path, raw) if c is not None))

    def ref(self, row: int, view: bool = False) -> Ref | None:
        """Row's reference; ``view``: a 'raw' value as a view into the record (no copy)."""
        if row >= self.n or not self.exists[row]:
            return None
        if self.raw is not None and self.raw.valid[row]:
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


class RecordError(ReadError):
    """A record file that cannot be read or is over a bound: EIO for its keys."""


class RecordCache:
    """Loads record files off the trio loop, one load per record at a time, LRU-bounded.

    Each record file is read within ``max_record`` bytes (recordfile.py); at most
    ``LOADS`` load at once, and decoded records are kept up to RECORD_CACHE_BYTES (the
    newest always). A record file refused for its content is remembered (its keys give EIO
    at once, logged once); one that could not be read (I/O) is tried again next time.
    ``present`` tells which record files of an array exist, where the store can list them.
    """

    LOADS = 4

    def __init__(self, pset: ParquetSet, target_options: dict[str, Any], capacity: int = 64,
                 relative: Callable[[str], bool] | None = None,
                 max_inline: int = Limits.max_inline, max_record: int = Limits.max_record,
                 roots: tuple[str, ...] | None = None) -> None:
        import trio  # here, not at the top: the command reads a set's metadata without trio

        from refmount.base.singleflight import SingleFlight

        self.pset = pset
        self.relative = relative  # which target paths are relative (TargetPolicy.relative)
        self.max_inline = max_inline
        self.max_record = max_record
        self.target_options = target_options
        # a set of a shared catalogue or mount (Limits.source_roots): a local record file is
        # opened beneath these directories, no symlink followed (base/confinedopen.py)
        self.roots = roots
        self.capacity = capacity
        self.max_bytes = RECORD_CACHE_BYTES
        # At most `capacity` records and RECORD_CACHE_BYTES (large 'raw' cells), the newest
        # always kept.
        self._lru: LRU[tuple[int, int], Record | RecordError] = LRU(
            capacity, max_weight=self.max_bytes, weigh=_weight, keep_newest=True)
        self._loading: SingleFlight[tuple[int, int], Record] = SingleFlight()
        self._limiter = trio.CapacityLimiter(self.LOADS)
        self._present: dict[int, np.ndarray | None] = {}
        self._listing: SingleFlight[int, np.ndarray | None] = SingleFlight()
        self.loads = 0

    def url(self, array: ArraySpec, record: int) -> str:
        return under_root(self.pset.root, f"{array.path}/refs.{record}.parq")

    def _load(self, array: ArraySpec, record: int) -> Record:
        url = self.url(array, record)
        try:
            with self._open(url) as f:
                table = read_record(f, url, self.pset.record_size, self.max_record)
        except FileNotFoundError:
            return Record(None, url)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise RecordRefused(f"{url}: unreadable Parquet ({e})") from None
        except OSError as e:
            raise ReferenceSetError(f"{url}: unreadable Parquet ({e})") from None
        return Record(table, url, array.path + "/", self.relative, self.max_inline)

    def _open(self, url: str) -> Any:
        if self.roots is None or not is_local(url):
            return fsspec.open(url, "rb", **self.target_options)
        from refmount.base.confinedopen import NotARegularFile, open_checked
        from refmount.base.urls import local_path

        try:
            fd, _ = open_checked(os.path.abspath(local_path(url)), list(self.roots))
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(url) from None
        except (PermissionError, NotARegularFile) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise RecordRefused(f"{url}: refused: {why} (a record file of a set in a shared mount "
                                "or catalogue must lie beneath its directory or allow_local, not "
                                "through a symlink leaving it)") from None
        return os.fdopen(fd, "rb")

    async def get(self, array_id: int, record: int) -> Record:
        key = (array_id, record)
        rec = self._lru.get(key)
        if isinstance(rec, RecordError):
            raise rec
        if rec is not None:
            return rec
        return await self._loading.run(key, lambda: self._get(key))

    async def _get(self, key: tuple[int, int]) -> Record:
        import trio

        array = self.pset.arrays[key[0]]
        try:
            rec = await trio.to_thread.run_sync(self._load, array, key[1], limiter=self._limiter)
        except ReferenceSetError as e:
            error = RecordError(str(e))
            log.error("record file refused, its keys give EIO: %s", error)
            error.logged = True
            if isinstance(e, RecordRefused):
                self._lru.put(key, error)
            raise error from None
        self.loads += 1
        self._lru.put(key, rec)
        return rec

    # ---- which record files exist ---------------------------------------------------------
    async def present(self, array_id: int) -> np.ndarray | None:
        """The numbers of the record files array ``array_id`` has, sorted, listed once from
        a store that can list a directory (a local one); None where that cannot be told."""
        if array_id in self._present:
            return self._present[array_id]
        return await self._listing.run(array_id, lambda: self._list(array_id))

    async def _list(self, array_id: int) -> np.ndarray | None:
        array = self.pset.arrays[array_id]
        import trio

        records = -(-max(array.count, 1) // self.pset.record_size)
        found = await trio.to_thread.run_sync(
            list_records, under_root(self.pset.root, array.path), self.target_options, records,
            limiter=self._limiter)
        self._present[array_id] = found
        return found


def _weight(rec: Record | RecordError) -> int:
    return rec.nbytes if isinstance(rec, Record) else 0


_RECORD_NAME = re.compile(r"refs\.(0|[1-9][0-9]{0,18})\.parq")


def list_records(directory: str, target_options: dict[str, Any], records: int) -> np.ndarray | None:
    """Numbers below ``records`` of the ``refs.N.parq`` files in ``directory`` of a local
    store, sorted; None for other stores (a listing may be slow or partial there: record
    files are then looked for one by one) or when the directory cannot be listed."""
    try:
        fs, path = fsspec.core.url_to_fs(directory, **target_options)
        if not isinstance(fs, LocalFileSystem):
            return None
        with os.scandir(path) as entries:
            numbers = [int(m.group(1)) for e in entries if (m := _RECORD_NAME.fullmatch(e.name))]
    except FileNotFoundError:
        return np.zeros(0, np.int64)
    except (OSError, ValueError):
        return None
    found = np.unique(np.array(numbers, np.int64))
    return found[found < records]


def references(pset: ParquetSet, target_options: dict[str, Any]) -> Iterator[tuple[str, Ref]]:
    """Every reference of the set: its metadata keys, then each array's chunks, record file by
    record file (read here, in this thread)."""
    for i in range(pset.metadata.n):
        yield pset.metadata.key(i).decode(), pset.metadata.ref(i)
    loader = RecordCache(pset, target_options)
    rs = pset.record_size
    for array in pset.arrays:
        records = math.ceil(array.count / rs)
        present = list_records(under_root(pset.root, array.path), target_options, records)
        for record_no in (range(records) if present is None else present.tolist()):
            record = loader._load(array, record_no)
            for row in np.flatnonzero(record.exists).tolist():
                number = record_no * rs + row
                if number < array.count:
                    ref = record.ref(row)
                    assert ref is not None
                    yield f"{array.path}/{array.chunk_name(number)}", ref
