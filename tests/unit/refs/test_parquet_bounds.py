"""Parquet sets without FUSE: record files and ``.zmetadata`` read within their bounds.

Record files made by pyarrow that decode to far more than they store (a dictionary value
repeated by every row, front-coded values, rows beyond ``record_size``, a footer over the
bound) are refused or held as stored, before they are decoded whole; ``.zmetadata`` over
``max_inline``, with too many JSON values or nested too deep is refused naming the bound.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trio

from refmount.base.errors import ReadError
from refmount.refs import ReferenceSetError
from refmount.refs.limits import DEFAULT_LIMITS, Limits
from refmount.refs.parquet import ParquetFormat
from refmount.refs.parquetset import Record, RecordCache, load_parquet_set
from refmount.refs.zmetadata import MAX_VALUES

MiB = 1 << 20
ZARRAY = {"zarr_format": 2, "shape": [4], "chunks": [1], "dtype": "|u1", "compressor": None,
          "filters": None, "fill_value": 0, "order": "C"}


def make_set(root: Path, shape: int, record_size: int, table: pa.Table, **write: object) -> Path:
    (root / "x").mkdir(parents=True)
    (root / ".zmetadata").write_text(json.dumps({"record_size": record_size, "metadata": {
        ".zgroup": {"zarr_format": 2}, "x/.zarray": {**ZARRAY, "shape": [shape]}}}))
    pq.write_table(table, root / "x" / "refs.0.parq", store_schema=False, **write)  # type: ignore[arg-type]
    return root


def raw_rows(raw: pa.Array) -> pa.Table:
    n = len(raw)
    return pa.table({"path": pa.nulls(n, pa.string()), "offset": pa.array(np.zeros(n, np.int64)),
                     "size": pa.array(np.zeros(n, np.int64)), "raw": raw})


def cache(root: Path, limits: Limits = DEFAULT_LIMITS) -> RecordCache:
    pset = load_parquet_set(str(root), {}, "error", limits)
    return RecordCache(pset, {}, max_inline=limits.max_inline, max_record=limits.max_record)


def load(records: RecordCache, record: int = 0) -> Record:
    async def get() -> Record:
        return await records.get(0, record)
    return trio.run(get)


def test_a_dictionary_value_every_row_repeats_is_held_once(tmp_path: Path) -> None:
    """40 rows of one 8 MiB value, stored once (dictionary page): held once, served exactly."""
    cell = bytes(range(256)) * (32 << 10)
    raw = pa.DictionaryArray.from_arrays(pa.array(np.zeros(40, np.int32)), pa.array([cell], pa.binary()))
    records = cache(make_set(tmp_path / "s", 40, 40, raw_rows(raw), compression="zstd"))
    assert (tmp_path / "s" / "x" / "refs.0.parq").stat().st_size < 64 << 10
    rec = load(records)
    assert rec.nbytes < 2 * len(cell)
    for row in (0, 39):
        ref = rec.ref(row, view=True)
        assert ref is not None and bytes(ref.data) == cell


def test_rows_beyond_record_size_give_eio_logged_once(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    records = cache(make_set(tmp_path / "s", 100, 10, raw_rows(pa.nulls(1000, pa.binary()))))
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            with pytest.raises(ReadError, match=r"1,000 rows, more than record_size=10"):
                load(records)
    assert len([r for r in caplog.records if "refs.0.parq" in r.getMessage()]) == 1
    assert records.loads == 0


def test_declared_column_sizes_over_max_record_are_refused_before_reading(tmp_path: Path) -> None:
    n = 100_000
    table = pa.table({"path": pa.array([f"/data/file-{i:08d}.nc" for i in range(n)]),
                      "offset": pa.array(np.arange(n, dtype=np.int64)),
                      "size": pa.array(np.ones(n, np.int64))})
    root = make_set(tmp_path / "s", n, n, table, use_dictionary=False)
    assert len(load(cache(root)).ref(n - 1).url) > 0  # within the default bound
    with pytest.raises(ReadError, match=r"max_record=1M"):
        load(cache(root, Limits(max_record=1 * MiB)))


def test_front_coded_values_are_refused_after_one_batch_beyond_the_bound(tmp_path: Path) -> None:
    """DELTA_BYTE_ARRAY: 16 values sharing a 1 MiB prefix store ~1 MiB and decode to 16 MiB."""
    prefix = bytes(range(256)) * (4 << 10)
    raw = pa.array([prefix + bytes([i]) for i in range(16)], pa.binary())
    root = make_set(tmp_path / "s", 16, 16, raw_rows(raw), use_dictionary=False,
                    column_encoding={"raw": "DELTA_BYTE_ARRAY"})
    md = pq.ParquetFile(root / "x" / "refs.0.parq").metadata
    assert md.row_group(0).column(3).total_uncompressed_size < 2 * MiB
    with pytest.raises(ReadError, match=r"decode to more than max_record=4M"):
        load(cache(root, Limits(max_record=4 * MiB)))
    rec = load(cache(root))  # within the default bound: served exactly
    assert rec.ref(15).data == prefix + bytes([15])


def test_a_footer_over_the_bound_is_refused_unparsed(tmp_path: Path) -> None:
    root = make_set(tmp_path / "s", 4, 4, raw_rows(pa.array([b"a"] * 4, pa.binary())))
    path = root / "x" / "refs.0.parq"
    blob = bytearray(path.read_bytes())
    blob[-8:-4] = (2 * MiB).to_bytes(4, "little")
    path.write_bytes(bytes(blob))
    with pytest.raises(ReadError, match=r"footer of 2,097,152 bytes, over max_record=1M"):
        load(cache(root, Limits(max_record=1 * MiB)))


# ---- .zmetadata ---------------------------------------------------------------------------------


def zmetadata(root: Path, text: bytes) -> Path:
    root.mkdir()
    (root / ".zmetadata").write_bytes(text)
    return root


def test_zmetadata_over_max_inline_is_refused(tmp_path: Path) -> None:
    text = json.dumps({"record_size": 1, "metadata": {".zattrs": {"s": "x" * (2 * MiB)}}}).encode()
    root = zmetadata(tmp_path / "s", text)
    with pytest.raises(ReferenceSetError, match=r"\.zmetadata: larger than max_inline=1M"):
        load_parquet_set(str(root), {}, "error", Limits(max_inline=1 * MiB))
    assert load_parquet_set(str(root), {}, "error").metadata.n == 2  # the key and .zmetadata itself


def test_zmetadata_with_too_many_json_values_is_refused(tmp_path: Path) -> None:
    values = b"[" + b"0," * MAX_VALUES + b"0]"
    root = zmetadata(tmp_path / "s", b'{"record_size": 1, "metadata": {".zattrs": {"v": ' + values + b"}}}")
    with pytest.raises(ReferenceSetError, match=r"more than 1,048,576 JSON values"):
        load_parquet_set(str(root), {}, "error")
    # Commas and brackets inside strings are not values.
    text = json.dumps({"record_size": 1, "metadata": {".zattrs": {"s": "[{," * MAX_VALUES}}})
    loaded = load_parquet_set(str(zmetadata(tmp_path / "t", text.encode())), {}, "error")
    assert loaded.metadata.n == 2  # the key and .zmetadata itself


def test_zmetadata_nested_too_deep_is_refused_naming_max_nesting(tmp_path: Path) -> None:
    root = zmetadata(tmp_path / "s", b'{"record_size": 1, "metadata": {".zattrs": {"v": '
                     + b"[" * 300 + b"]" * 300 + b"}}}")
    with pytest.raises(ReferenceSetError, match=r"max_nesting=256"):
        load_parquet_set(str(root), {}, "error")
    loaded = load_parquet_set(str(root), {}, "error", Limits(max_nesting=512))
    assert loaded.metadata.n == 2  # the key and .zmetadata itself


def test_zmetadata_with_bare_nan_still_reads(tmp_path: Path) -> None:
    root = zmetadata(tmp_path / "s", b'{"record_size": 2, "metadata": {".zattrs": {"v": NaN}}}')
    pset = load_parquet_set(str(root), {}, "error")
    assert pset.record_size == 2 and pset.quirks == {"numbers were a bare NaN or Infinity": 1}


def test_references_of_a_huge_grid_skip_absent_record_files(tmp_path: Path) -> None:
    """``refmount expand``/``inspect`` of shape [2**39], record_size 1, one record file: the
    record files there are come from the directory listing, not 2**39 attempts."""
    root = make_set(tmp_path / "s", 2**39, 1, raw_rows(pa.array([b"one"], pa.binary())))
    found = list(ParquetFormat().references(str(root), {}))
    assert [(k, r.data) for k, r in found if not k.rpartition("/")[2].startswith(".")] == [("x/0", b"one")]
