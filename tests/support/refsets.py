"""Tiny reference sets of each format, written from scratch (json, pyarrow), with the
references each must yield: for tests of the Format interface and the trees without FUSE."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from refmount.refs import Ref, RefKind


@dataclass
class RefSet:
    source: Path  # what to mount
    refs: dict[str, Ref]  # every key and the reference it must yield
    targets: set[str] = field(default_factory=set)  # distinct target URLs
    absent: set[str] = field(default_factory=set)  # chunk keys of rows that hold nothing


def inline(data: bytes) -> Ref:
    return Ref(RefKind.INLINE, None, 0, len(data), data)


def tiny_json(directory: Path, name: str = "refs.json") -> RefSet:
    """Version 0: inline text, base64, a JSON object value, ranges and a whole target."""
    directory.mkdir(parents=True, exist_ok=True)
    blob = directory / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 4)
    whole = directory / "whole.bin"
    whole.write_bytes(b"whole target\n")
    zarray = {"shape": [4], "chunks": [2], "dtype": "<u1", "compressor": None,
              "fill_value": 0, "filters": None, "order": "C", "zarr_format": 2}
    doc = {
        ".zgroup": '{"zarr_format": 2}',
        "a/.zarray": zarray,  # an object value is served as JSON text
        "a/0": "base64:AAEC",
        "a/1": [str(blob), 10, 2],
        "deep/er/c": [str(blob), 1000, 24],
        "w": [str(whole)],
    }
    source = directory / name
    source.write_text(json.dumps(doc))
    refs = {
        ".zgroup": inline(b'{"zarr_format": 2}'),
        "a/.zarray": inline(json.dumps(zarray).encode()),
        "a/0": inline(b"\x00\x01\x02"),
        "a/1": Ref(RefKind.RANGE, str(blob), 10, 2),
        "deep/er/c": Ref(RefKind.RANGE, str(blob), 1000, 24),
        "w": Ref(RefKind.WHOLE, str(whole), 0, -1),
    }
    return RefSet(source, refs, {str(blob), str(whole)})


def write_record(path: Path, rows: list[tuple[str | None, int, int, bytes | None]]) -> None:
    """One record file of LazyReferenceMapper's layout: path, offset, size, raw."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "path": pa.array([r[0] for r in rows], pa.string()),
        "offset": pa.array([r[1] for r in rows], pa.int64()),
        "size": pa.array([r[2] for r in rows], pa.int64()),
        "raw": pa.array([r[3] for r in rows], pa.binary()),
    })
    pq.write_table(table, path)


def tiny_parquet(root: Path, data_dir: Path, record_size: int = 2) -> RefSet:
    """``.zmetadata`` + ``refs.N.parq``: a 1-D array ``x`` (5 chunks: raw, range, whole,
    absent, raw over two records and a half) and a 2-D array ``g/y`` with
    dimension_separator "/" (2x2 chunks, one absent)."""
    root.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    blob = data_dir / "blob.bin"
    blob.write_bytes(bytes(range(200)))
    whole = data_dir / "whole.bin"
    whole.write_bytes(b"a whole chunk")

    def zarray(shape: list[int], chunks: list[int], sep: str = ".") -> dict:
        return {"shape": shape, "chunks": chunks, "dtype": "|u1", "compressor": None,
                "fill_value": 0, "filters": None, "order": "C", "zarr_format": 2,
                "dimension_separator": sep}

    metadata = {
        ".zgroup": {"zarr_format": 2},
        "x/.zarray": zarray([5], [1]),
        "x/.zattrs": {"_ARRAY_DIMENSIONS": ["i"]},
        "g/.zgroup": {"zarr_format": 2},
        "g/y/.zarray": zarray([4, 3], [2, 2], "/"),
    }
    refs = {k: inline(json.dumps(v).encode()) for k, v in metadata.items()}
    x_rows: list[tuple[str | None, int, int, bytes | None]] = [
        (None, 0, 0, b"raw0"),
        (str(blob), 7, 5, None),
        (str(whole), 0, 0, None),  # offset 0 and size 0: the whole target
        (None, 0, 0, None),  # neither path nor raw: the key does not exist
        (None, 0, 0, b"raw4"),
    ]
    refs["x/0"] = inline(b"raw0")
    refs["x/1"] = Ref(RefKind.RANGE, str(blob), 7, 5)
    refs["x/2"] = Ref(RefKind.WHOLE, str(whole), 0, -1)
    refs["x/4"] = inline(b"raw4")
    y_rows: list[tuple[str | None, int, int, bytes | None]] = [
        (None, 0, 0, b"y00"), (str(blob), 100, 3, None), (None, 0, 0, None), (None, 0, 0, b"y11"),
    ]
    refs["g/y/0/0"] = inline(b"y00")
    refs["g/y/0/1"] = Ref(RefKind.RANGE, str(blob), 100, 3)
    refs["g/y/1/1"] = inline(b"y11")
    for name, rows in (("x", x_rows), ("g/y", y_rows)):
        for r in range(0, len(rows), record_size):
            write_record(root / name / f"refs.{r // record_size}.parq", rows[r : r + record_size])
    zmetadata = json.dumps({"metadata": metadata, "record_size": record_size}).encode()
    (root / ".zmetadata").write_bytes(zmetadata)
    refs[".zmetadata"] = inline(zmetadata)  # the file itself is a key, as fsspec serves it
    return RefSet(root, refs, {str(blob), str(whole)}, absent={"x/3", "g/y/1/0"})
