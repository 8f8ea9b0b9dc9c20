"""Parquet reference sets (fsspec's LazyReferenceMapper layout) for the Parquet mount tests.

Three kinds, each written independently of refmount:

- ``kerchunk_parquet``: a netCDF4 file made here (1-D, 2-D and 3-D zlib-chunked variables, chunks
  small enough to be inlined, chunks never written by HDF5, a 0-d variable, a nested group),
  kerchunk's ``SingleHdf5ToZarr`` references of it, and kerchunk's ``refs_to_dataframe`` writing
  them as Parquet with a small ``record_size``.
- ``lazy_zarr_parquet``: ``LazyReferenceMapper.create`` + zarr writing arrays into it (the spec's
  example: ``name`` at the root and ``deep/name``), then ``flush()``.
- ``hand_parquet``: ``.zmetadata`` and ``refs.N.parq`` written directly with pyarrow: every row
  form of the spec (raw, whole file, range, absent), record_size 3, ``dimension_separator`` "/",
  nested groups, a 0-d array.

``Inotify`` (ctypes, Linux) records which files of a directory tree are opened, for laziness
checks: a process that reads a record file has to open it first.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import json
import os
import select
import struct
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np

SEED = 20240917

# --- the netCDF4 file and kerchunk's references to it -------------------------------------------

# Chunks whose zlib stream is below this many bytes are inlined by kerchunk (constant chunks
# compress to ~20 bytes; random ones stay far above).
INLINE_THRESHOLD = 40

NC_DIMS = {"t": 9, "y": 12, "x": 14, "n": 45}


def make_nc(path: Path) -> None:
    """A netCDF4 file whose chunks exercise the Parquet layout.

    - ``series`` (n)       float64, chunks 4:      12 chunks, some constant (inlined)
    - ``field2d`` (y, x)   float32, chunks 3x4:    16 chunks, every other row of chunks constant
    - ``cube`` (t, y, x)   int32, chunks 2x5x4:    60 chunks, some constant
    - ``sparse`` (t, y, x) float32 with _FillValue, chunks 1x4x7: 54 chunks of which only some
      are ever written, so HDF5 never allocates the others; whole records of them are missing
    - ``scalar`` ()        0-d float64
    - ``t`` (t)            coordinate
    - ``grp/inner`` (m, x) in a nested group with its own dimension ``m``
    """
    import netCDF4

    rng = np.random.default_rng(SEED)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = "refmount parquet test data"
        for name, size in NC_DIMS.items():
            ds.createDimension(name, size)

        t = ds.createVariable("t", "f8", ("t",))
        t.units = "days since 2001-01-01"
        t[:] = np.arange(NC_DIMS["t"]) * 0.5

        series = ds.createVariable("series", "f8", ("n",), zlib=True, chunksizes=(4,))
        series.long_name = "a 1-D series"
        values = rng.standard_normal(NC_DIMS["n"])
        values[8:16] = 1.0  # chunks 2 and 3 constant -> inlined
        series[:] = values

        field2d = ds.createVariable("field2d", "f4", ("y", "x"), zlib=True, chunksizes=(3, 4))
        values = rng.standard_normal((12, 14)).astype("f4")
        values[3:6, :] = 2.5  # the second row of chunks is constant -> inlined
        values[9:12, 0:8] = -1.0
        field2d[:] = values

        cube = ds.createVariable("cube", "i4", ("t", "y", "x"), zlib=True, chunksizes=(2, 5, 4),
                                 fill_value=np.int32(-77))
        values = rng.integers(-1_000_000, 1_000_000, (9, 12, 14), dtype="i4")
        values[2:4] = 7  # t-chunk 1 constant -> 12 inlined chunks in the middle of the array
        values[8, 10:12, :] = 0
        cube[:] = values

        sparse = ds.createVariable("sparse", "f4", ("t", "y", "x"), zlib=True,
                                   chunksizes=(1, 4, 7), fill_value=np.float32(-999.0))
        sparse.units = "mm"
        # chunk number = t * 6 + (y // 4) * 2 + x // 7; written: t = 0 (chunks 0-5), one point in
        # chunk 15 and t = 5..8 (chunks 30-53). Chunks 6-14 and 16-29 are never allocated: with
        # record_size 7 the record files refs.1.parq and refs.3.parq do not exist at all.
        sparse[0] = rng.standard_normal((12, 14)).astype("f4")
        sparse[2, 5, 9] = 42.0
        sparse[5:9] = rng.standard_normal((4, 12, 14)).astype("f4")

        scalar = ds.createVariable("scalar", "f8", ())
        scalar.note = "0-d"
        scalar.assignValue(3.25)

        grp = ds.createGroup("grp")
        grp.description = "nested"
        grp.createDimension("m", 10)
        inner = grp.createVariable("inner", "i2", ("m", "x"), zlib=True, chunksizes=(3, 5))
        inner[:] = rng.integers(-3000, 3000, (10, 14), dtype="i2")


def kerchunk_refs(nc: Path) -> dict:
    """Version 0 references of ``nc`` (SingleHdf5ToZarr, chunks under INLINE_THRESHOLD inlined)."""
    from kerchunk.hdf import SingleHdf5ToZarr

    out = SingleHdf5ToZarr(str(nc), inline_threshold=INLINE_THRESHOLD).translate()
    refs = out.get("refs", out) if "version" in out else out
    return dict(refs)


@contextlib.contextmanager
def lazy_mapper_engine(engine: str):
    """Make ``LazyReferenceMapper`` write with ``engine`` (its default is fastparquet, which
    kerchunk's ``refs_to_dataframe`` gives no way to change)."""
    from fsspec.implementations.reference import LazyReferenceMapper

    original = LazyReferenceMapper.__init__
    LazyReferenceMapper.__init__ = functools.partialmethod(original, engine=engine)
    try:
        yield
    finally:
        LazyReferenceMapper.__init__ = original


def kerchunk_to_parquet(refs: dict, out: Path, record_size: int, engine: str = "pyarrow",
                        categorical_threshold: int = 10) -> Path:
    """kerchunk's own ``refs_to_dataframe`` (which drives LazyReferenceMapper)."""
    import fsspec
    from kerchunk.df import refs_to_dataframe

    with lazy_mapper_engine(engine):
        refs_to_dataframe(dict(refs), str(out), record_size=record_size,
                          categorical_threshold=categorical_threshold,
                          storage_options={})
    assert fsspec.filesystem("file").exists(str(out / ".zmetadata"))
    return out


# --- what a reference (JSON Version 0 value or Parquet row) reads as ----------------------------


def local_path(url: str) -> Path:
    if url.startswith("file://"):
        return Path(unquote(urlparse(url).path))
    if "://" in url:
        raise ValueError(f"not a local URL: {url!r}")
    return Path(url)


def expected_bytes(value) -> bytes:
    """The bytes a Version 0 reference value stands for."""
    if isinstance(value, str):
        if value.startswith("base64:"):
            return base64.b64decode(value[len("base64:"):])
        return value.encode()
    if isinstance(value, dict):
        return json.dumps(value).encode()
    if isinstance(value, list) and len(value) in (1, 3):
        data = local_path(value[0]).read_bytes()
        if len(value) == 1:
            return data
        return data[value[1]: value[1] + value[2]]
    raise TypeError(f"not a reference value: {value!r}")


def is_meta_key(key: str) -> bool:
    return key.rsplit("/", 1)[-1].startswith(".z")


def chunk_number(index: tuple[int, ...], grid: tuple[int, ...]) -> int:
    """C-order number of a chunk (0 for a 0-d array)."""
    return int(np.ravel_multi_index(index, grid)) if grid else 0


def chunk_grid(zarray: dict) -> tuple[int, ...]:
    return tuple(-(-s // c) for s, c in zip(zarray["shape"], zarray["chunks"], strict=True))


# --- LazyReferenceMapper + zarr -----------------------------------------------------------------


@dataclass
class LazyZarrSet:
    root: Path
    record_size: int
    arrays: dict[str, np.ndarray]  # array path -> values written
    fill_values: dict[str, float]
    written_chunks: dict[str, set[str]] = field(default_factory=dict)  # chunk keys with a row


def lazy_zarr_parquet(root: Path, record_size: int = 4, engine: str = "pyarrow") -> LazyZarrSet:
    """The spec's example, with real data: ``LazyReferenceMapper.create`` and zarr writing
    arrays ``name`` (1-D) at the root, ``deep/name`` (2-D) and ``deep/deeper/cube`` (3-D).

    zarr 3 cannot write to a plain MutableMapping, but its ``MemoryStore`` keeps its items in
    any MutableMapping it is given: the LazyReferenceMapper. zarr does not write chunks that are
    all fill value (``write_empty_chunks`` is False), so those keys stay absent."""
    import fsspec
    import zarr
    from fsspec.implementations.reference import LazyReferenceMapper

    rng = np.random.default_rng(SEED + 1)
    lz = LazyReferenceMapper.create(str(root), fs=fsspec.filesystem("file"),
                                    record_size=record_size, engine=engine)
    store = zarr.storage.MemoryStore(store_dict=lz)
    group = zarr.open_group(store, mode="w", zarr_format=2)
    group.attrs["title"] = "lazy reference mapper"

    arrays: dict[str, np.ndarray] = {}
    fills: dict[str, float] = {}

    name = np.arange(1, 24, dtype="i4") * 3
    name[8:12] = 0  # chunks 4 and 5 all fill value: never written
    a = group.create_array("name", shape=name.shape, chunks=(2,), dtype="i4", fill_value=0)
    a.attrs["_ARRAY_DIMENSIONS"] = ["i"]
    a[:] = name
    arrays["name"], fills["name"] = name, 0

    deep = group.create_group("deep")
    deep.attrs["level"] = 1
    d2 = rng.standard_normal((7, 9))
    d2[3:6, 4:8] = np.nan  # chunk (1, 1) all fill value
    b = deep.create_array("name", shape=d2.shape, chunks=(3, 4), dtype="f8", fill_value=np.nan)
    b.attrs["_ARRAY_DIMENSIONS"] = ["r", "c"]
    b[:] = d2
    arrays["deep/name"], fills["deep/name"] = d2, np.nan

    deeper = deep.create_group("deeper")
    d3 = rng.integers(1, 200, (5, 6, 7), dtype="u1")
    d3[2:4] = 255
    c = deeper.create_array("cube", shape=d3.shape, chunks=(2, 3, 3), dtype="u1",
                            fill_value=255)
    c.attrs["_ARRAY_DIMENSIONS"] = ["p", "q", "s"]
    c[:] = d3
    arrays["deep/deeper/cube"], fills["deep/deeper/cube"] = d3, 255
    lz.flush()

    # Which chunk keys have data: zarr skips chunks equal to the fill value.
    written: dict[str, set[str]] = {}
    for path, values in arrays.items():
        zarray = json.loads((root / ".zmetadata").read_text())["metadata"][f"{path}/.zarray"]
        chunks = zarray["chunks"]
        keys = set()
        for idx in np.ndindex(*chunk_grid(zarray)):
            sl = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks, strict=True))
            block = values[sl]
            fill = fills[path]
            empty = np.all(np.isnan(block)) if np.isnan(fill) else np.all(block == fill)
            if not empty:
                keys.add(f"{path}/" + ".".join(map(str, idx)))
        written[path] = keys
    return LazyZarrSet(root, record_size, arrays, fills, written)


# --- hand-made Parquet set with pyarrow ---------------------------------------------------------


@dataclass
class HandSet:
    root: Path
    record_size: int
    files: dict[str, bytes]  # every key the mount must show -> its bytes
    metadata: dict[str, dict]  # the .zmetadata "metadata" (parsed)
    absent: list[str]  # chunk keys whose row is null/null
    arrays: dict[str, np.ndarray]  # array path -> values zarr must read


HAND_RECORD_SIZE = 3


def _write_record(path: Path, rows: list[tuple], dictionary_path: bool = False) -> None:
    """One record file; a column with no value at all gets Arrow's ``null`` type, as pandas
    gives it for an all-NaN object column (what LazyReferenceMapper writes with pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(zip(*rows, strict=True))

    def column(values, typ):
        if all(v is None for v in values):
            return pa.nulls(len(values))
        return pa.array(values, typ)

    paths = column(cols[0], pa.string())
    if dictionary_path:
        paths = paths.dictionary_encode()
    table = pa.table({
        "path": paths,
        "offset": pa.array(cols[1], pa.int64()),
        "size": pa.array(cols[2], pa.int64()),
        "raw": column(cols[3], pa.binary()),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")


def hand_parquet(root: Path, data_dir: Path) -> HandSet:
    """``.zmetadata`` + ``refs.N.parq`` written with pyarrow, record_size 3.

    - ``a`` (5, 7) int32, chunks (2, 3), dimension_separator "/": 9 chunks ``a/i/j`` in three
      record files; rows are raw, range, whole file, raw+path (raw wins) and null/null (absent).
    - ``g1/g2/b`` (10,) float64, chunks (4,), uncompressed, in nested groups; one record file,
      dictionary-encoded ``path`` column, ``file://`` URL.
    - ``scalar`` () float64: 0-d, only chunk key ``scalar/0`` (raw).
    - ``blobs/x`` (7,) uint8 chunks (1,), no compressor, holding arbitrary bytes: a raw b""
      (empty file), a whole-file reference to an odd-sized file, a range at the end of a file,
      a range larger than a page; chunks 4-6 absent (refs.2 has no value at all).
    - ``empty`` (0, 3): no chunk keys and no record file.
    - Columns without any value have Arrow type ``null`` (``scalar``: path, ``blobs/x`` refs.1:
      raw, ``blobs/x`` refs.2: both).
    - ``g1/.zattrs`` and ``scalar/.zarray`` stored as JSON text, the others as JSON objects.
    """
    rng = np.random.default_rng(SEED + 2)
    data_dir.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    rs = HAND_RECORD_SIZE

    files: dict[str, bytes] = {}
    absent: list[str] = []
    meta: dict[str, dict] = {
        ".zgroup": {"zarr_format": 2},
        ".zattrs": {"title": "hand-made parquet references"},
        "g1/.zgroup": {"zarr_format": 2},
        "g1/.zattrs": {"level": 1},
        "g1/g2/.zgroup": {"zarr_format": 2},
    }

    # --- a: 2-D int32, "/" separator ------------------------------------------------------
    shape, chunks = (5, 7), (2, 3)
    grid = chunk_grid({"shape": shape, "chunks": chunks})  # (3, 3)
    a = rng.integers(-10_000, 10_000, shape, dtype="<i4")
    fill = -1
    meta["a/.zarray"] = {
        "zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": "<i4",
        "compressor": None, "filters": None, "fill_value": fill, "order": "C",
        "dimension_separator": "/",
    }
    meta["a/.zattrs"] = {"_ARRAY_DIMENSIONS": ["row", "col"], "units": "counts"}
    blob = bytearray(rng.bytes(101))  # a junk prefix, so that offsets are never 0
    whole_files: dict[int, Path] = {}
    kinds = {  # chunk number -> how it is referenced
        0: "raw", 1: "range", 2: "whole", 3: "absent", 4: "range", 5: "raw+path",
        6: "whole", 7: "range", 8: "absent",
    }
    expected_a = a.copy()
    rows: dict[int, tuple] = {}
    for idx in np.ndindex(*grid):
        n = chunk_number(idx, grid)
        full = np.full(chunks, fill, dtype="<i4")  # zarr v2 edge chunks are full-size
        sl = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks, strict=True))
        part = a[sl]
        full[: part.shape[0], : part.shape[1]] = part
        data = full.tobytes()
        key = "a/" + "/".join(map(str, idx))
        kind = kinds[n]
        if kind == "raw":
            rows[n] = (None, 0, 0, data)
        elif kind == "range":
            rows[n] = (str(data_dir / "a_blob.bin"), len(blob), len(data), None)
            blob += data + rng.bytes(int(rng.integers(1, 50)))
        elif kind == "whole":
            p = data_dir / f"a_chunk{n}.bin"
            p.write_bytes(data)
            whole_files[n] = p
            rows[n] = (str(p), 0, 0, None)
        elif kind == "raw+path":  # raw is populated: it is the data, the path is ignored
            rows[n] = (str(data_dir / "does-not-exist.bin"), 5, 9, data)
        elif kind == "absent":
            rows[n] = (None, 0, 0, None)
            absent.append(key)
            expected_a[sl] = fill
            continue
        files[key] = data
    (data_dir / "a_blob.bin").write_bytes(bytes(blob))
    for record in range(-(-len(kinds) // rs)):
        _write_record(root / "a" / f"refs.{record}.parq",
                      [rows[n] for n in range(record * rs, min((record + 1) * rs, len(kinds)))])

    # --- g1/g2/b: 1-D float64 in nested groups; padded record, dictionary path --------------
    b = rng.standard_normal(10)
    meta["g1/g2/b/.zarray"] = {
        "zarr_format": 2, "shape": [10], "chunks": [4], "dtype": "<f8", "compressor": None,
        "filters": None, "fill_value": None, "order": "C",
    }
    meta["g1/g2/b/.zattrs"] = {"_ARRAY_DIMENSIONS": ["k"]}
    bfile = data_dir / "b.bin"
    padded = np.zeros(12)
    padded[:10] = b
    bfile.write_bytes(b"HEADER" + padded.tobytes())
    b_rows = []
    for i in range(3):
        data = padded[i * 4: (i + 1) * 4].tobytes()
        b_rows.append(("file://" + str(bfile), 6 + i * 32, 32, None))
        files[f"g1/g2/b/{i}"] = data
    _write_record(root / "g1" / "g2" / "b" / "refs.0.parq", b_rows, dictionary_path=True)

    # --- scalar: 0-d -----------------------------------------------------------------------
    meta["scalar/.zarray"] = {
        "zarr_format": 2, "shape": [], "chunks": [], "dtype": "<f8", "compressor": None,
        "filters": None, "fill_value": None, "order": "C",
    }
    meta["scalar/.zattrs"] = {"_ARRAY_DIMENSIONS": []}
    sdata = np.array(6.5, "<f8").tobytes()
    _write_record(root / "scalar" / "refs.0.parq", [(None, 0, 0, sdata), *[(None, 0, 0, None)] * 2])
    files["scalar/0"] = sdata

    # --- blobs/x: arbitrary bytes ------------------------------------------------------------
    meta["blobs/.zgroup"] = {"zarr_format": 2}
    meta["blobs/x/.zarray"] = {
        "zarr_format": 2, "shape": [7], "chunks": [1], "dtype": "|u1", "compressor": None,
        "filters": None, "fill_value": 0, "order": "C",
    }
    odd = data_dir / "odd.bin"
    odd.write_bytes(rng.bytes(200_003))  # larger than one FUSE read, odd size
    tail = data_dir / "tail.bin"
    tail.write_bytes(rng.bytes(5000))
    x_rows = [
        (None, 0, 0, b""),  # raw, empty: an empty file
        (str(odd), 0, 0, None),  # whole file
        (str(tail), 4990, 10, None),  # the last 10 bytes
        (str(tail), 1, 4000, None),  # a range larger than one FUSE page
    ]
    files["blobs/x/0"] = b""
    files["blobs/x/1"] = odd.read_bytes()
    files["blobs/x/2"] = tail.read_bytes()[4990:]
    files["blobs/x/3"] = tail.read_bytes()[1:4001]
    _write_record(root / "blobs" / "x" / "refs.0.parq", x_rows[:3])
    null_row = (None, 0, 0, None)
    _write_record(root / "blobs" / "x" / "refs.1.parq", [*x_rows[3:], null_row, null_row])
    _write_record(root / "blobs" / "x" / "refs.2.parq", [null_row] * 3)  # chunk 6 + padding
    absent += ["blobs/x/4", "blobs/x/5", "blobs/x/6"]

    # --- empty: a dimension of length 0, no chunks, no record file ---------------------------
    meta["empty/.zarray"] = {
        "zarr_format": 2, "shape": [0, 3], "chunks": [5, 3], "dtype": "<i2", "compressor": None,
        "filters": None, "fill_value": 0, "order": "C",
    }

    # The spec calls "metadata" dict[str, str]; LazyReferenceMapper writes JSON objects. Both
    # forms: two values as JSON text (one of them a .zarray the chunk keys derive from).
    stored: dict[str, dict | str] = dict(meta)
    stored["g1/.zattrs"] = json.dumps(meta["g1/.zattrs"])
    stored["scalar/.zarray"] = json.dumps(meta["scalar/.zarray"])
    (root / ".zmetadata").write_text(json.dumps({"metadata": stored, "record_size": rs}))
    for key, value in meta.items():
        files[key] = json.dumps(value).encode()  # only compared as parsed JSON
    # served with the JSON-text values parsed (only compared as parsed JSON)
    files[".zmetadata"] = json.dumps({"metadata": meta, "record_size": rs}).encode()
    return HandSet(root, rs, files, meta, absent,
                   {"a": expected_a, "g1/g2/b": b, "scalar": np.array(6.5),
                    "empty": np.zeros((0, 3), "<i2")})


# --- a large array ---------------------------------------------------------------------------


def chunk_bytes(n: int) -> bytes:
    """A 2x2 uint32 chunk filled with ``n``."""
    return np.full(4, n, "<u4").tobytes()


@dataclass
class LargeSet:
    root: Path
    record_size: int
    grid: tuple[int, int]
    present: dict[str, bytes]  # chunk key -> bytes (the rest of the rows are null)


def large_parquet(root: Path, grid: tuple[int, int] = (150, 401),
                  record_size: int = 10_000) -> LargeSet:
    """One 2-D array of ``grid`` chunks in ``record_size`` rows per file (fsspec's default
    10000), written the way LazyReferenceMapper pads: every file full, absent rows null/null.
    Every 7th chunk is present, raw, holding its chunk number (``chunk_bytes``); the last
    record file is all null except the last chunk of the grid."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = grid[0] * grid[1]
    nrec = -(-total // record_size)
    meta = {
        ".zgroup": {"zarr_format": 2},
        "big/.zarray": {
            "zarr_format": 2, "shape": [grid[0] * 2, grid[1] * 2], "chunks": [2, 2],
            "dtype": "<u4", "compressor": None, "filters": None, "fill_value": 0, "order": "C",
        },
    }
    (root / "big").mkdir(parents=True)
    present: dict[str, bytes] = {}
    for rec in range(nrec):
        numbers = np.arange(rec * record_size, (rec + 1) * record_size)
        keep = (numbers % 7 == 0) & (numbers < total)
        if rec == nrec - 1:
            keep = numbers == total - 1
        raws = [chunk_bytes(n) if k else None
                for n, k in zip(numbers.tolist(), keep.tolist(), strict=True)]
        for n in numbers[keep].tolist():
            i, j = divmod(n, grid[1])
            present[f"big/{i}.{j}"] = chunk_bytes(n)
        table = pa.table({
            "path": pa.nulls(record_size, pa.string()),
            "offset": pa.array(np.zeros(record_size, "i8")),
            "size": pa.array(np.zeros(record_size, "i8")),
            "raw": pa.array(raws, pa.binary()),
        })
        pq.write_table(table, root / "big" / f"refs.{rec}.parq", compression="zstd")
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": record_size}))
    return LargeSet(root, record_size, grid, present)


# --- inotify: which files get opened ------------------------------------------------------------

IN_OPEN = 0x00000020
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")


class Inotify:
    """Watches directories for IN_OPEN and reports the opened paths."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._libc = libc
        self.fd = libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), "inotify_init1")
        self.watches: dict[int, Path] = {}

    def watch(self, directory: Path) -> None:
        wd = self._libc.inotify_add_watch(self.fd, str(directory).encode(), IN_OPEN)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), str(directory))
        self.watches[wd] = Path(directory)

    def watch_tree(self, root: Path) -> None:
        for dirpath, _dirs, _files in os.walk(root):
            self.watch(Path(dirpath))

    def opened(self, timeout: float = 0.2) -> list[Path]:
        """Paths opened since the last call (files only; the watched directories themselves are
        left out)."""
        out: list[Path] = []
        while True:
            r, _, _ = select.select([self.fd], [], [], timeout)
            if not r:
                return out
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    return out
                raise
            pos = 0
            while pos < len(buf):
                wd, _mask, _cookie, length = _EVENT.unpack_from(buf, pos)
                name = buf[pos + _EVENT.size: pos + _EVENT.size + length].rstrip(b"\0").decode()
                pos += _EVENT.size + length
                if name:
                    out.append(self.watches[wd] / name)
            timeout = 0.05

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
