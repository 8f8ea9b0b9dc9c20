"""The decoded view's synthesized metadata is bounded as a whole (decode/metadatabound.py): bytes
read, bytes written and JSON values parsed, each just under its bound built, just over refused
before the parse or the write that would pass it, in bounded time; a refused view fails its
metadata keys (``EIO``: a ``ReadError``) and logs one line."""

from __future__ import annotations

import json
import logging
import time
import tracemalloc

import pytest
import trio
from support.zarrchunks import zarray

from refmount.decode.decodedtree import DecodedTree
from refmount.decode.metadatabound import MAX_BYTES, MAX_VALUES, DecodedMetadataRefused, MetadataBudget
from refmount.decode.view import MAX_ZARRAY_BYTES, DecodedView

ZARRAY = json.dumps(zarray("<f4", shape=(4,), chunks=(4,), compressor={"id": "zlib"})).encode()


def _attrs_set(n: int, attrs: bytes) -> dict[str, bytes]:
    """``n`` decoded arrays, each with the same ``.zattrs`` (one bytes object: the test holds
    it once)."""
    keys: dict[str, bytes] = {}
    for i in range(n):
        keys[f"a{i}/.zarray"] = ZARRAY
        keys[f"a{i}/.zattrs"] = attrs
    return keys


def _build(keys: dict[str, bytes], traced: bool = False) -> tuple[DecodedView, float, int]:
    """The view, its CPU seconds and (``traced``: tracemalloc, which slows parsing several
    times) its peak of Python allocations."""
    if traced:
        tracemalloc.start()
    start = time.process_time()
    view = DecodedView(keys)
    cpu = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    return view, cpu, peak


def test_the_bounds_are_those_of_consolidated_metadata() -> None:
    from refmount.core.consolidated import MAX_BYTES as CONSOLIDATED_BYTES
    from refmount.core.consolidated import MAX_VALUES as CONSOLIDATED_VALUES

    assert (MAX_BYTES, MAX_VALUES) == (CONSOLIDATED_BYTES, CONSOLIDATED_VALUES) == (64 << 20, 1 << 20)


def test_bytes_read_just_under_are_built_and_just_over_refused() -> None:
    """``.zattrs`` of long strings (few values, many bytes): 64 MiB read is the bound."""
    piece = 1000 * 1000
    attrs = json.dumps({"note": "x" * (piece - 20)}).encode()
    assert len(attrs) <= MAX_ZARRAY_BYTES
    per_array = len(attrs) + len(ZARRAY) + len("a00/.zattrs") + len("a00/.zarray")
    under = MAX_BYTES // per_array
    view, _, _ = _build(_attrs_set(under - 1, attrs))
    assert view.refused is None and len(view.arrays) == under - 1
    view, cpu, peak = _build(_attrs_set(under + 2, attrs), traced=True)
    assert view.refused is not None and "bytes" in str(view.refused)
    assert not view.arrays and not view._meta  # nothing decoded, nothing rewritten kept
    assert cpu < 20 and peak < 3 * MAX_BYTES


def test_json_values_just_under_are_built_and_just_over_refused() -> None:
    """``.zattrs`` of lists of zeros (many values in few bytes): 2^20 values is the bound."""
    n_values = 400_000
    attrs = json.dumps({"v": [[0] * n_values]}, separators=(",", ":")).encode()
    per_array = attrs.count(b",") + attrs.count(b"[") + attrs.count(b"{") + 1 + ZARRAY.count(b",") + \
        ZARRAY.count(b"{") + ZARRAY.count(b"[") + 1
    assert 2 * per_array < MAX_VALUES < 3 * per_array
    view, _, _ = _build(_attrs_set(2, attrs))
    assert view.refused is None and len(view.arrays) == 2
    view, cpu, _ = _build(_attrs_set(3, attrs))
    assert view.refused is not None and "JSON values" in str(view.refused)
    assert cpu < 20


def _nested_zmetadata_set(n: int) -> dict[str, bytes]:
    """``n`` groups, each a decoded array and a ``.zmetadata`` whose ``.zgroup`` holds 50,000
    values 100 lists deep: 0.15 MB, rewritten (its ``.zarray`` decoded, ``indent=4``) as about
    20 MB."""
    nested = json.loads("[" * 100 + ",".join("0" * 50_000) + "]" * 100)
    doc = json.dumps({"zarr_consolidated_format": 1, "metadata": {
        ".zgroup": {"zarr_format": 2, "v": nested}, "a/.zarray": json.loads(ZARRAY)}}).encode()
    keys: dict[str, bytes] = {}
    for k in range(n):
        keys[f"g{k}/a/.zarray"] = ZARRAY
        keys[f"g{k}/.zmetadata"] = doc
    return keys


def test_bytes_written_past_the_bound_are_refused_before_kept() -> None:
    budget = MetadataBudget()
    view = DecodedView(_nested_zmetadata_set(3), budget=budget)
    assert view.refused is None and budget.written > 58 << 20 and budget.read < 1 << 20
    view, cpu, _ = _build(_nested_zmetadata_set(4))
    assert view.refused is not None and "rewritten metadata is over" in str(view.refused)
    assert cpu < 20


def test_a_refused_view_fails_its_metadata_keys_and_logs_one_line(caplog) -> None:
    view = DecodedView(_attrs_set(3, json.dumps({"v": 1}).encode()), budget=MetadataBudget(max_values=20))
    assert view.refused is not None
    assert view.describe()["decoded_arrays"] == "0" and "refused" in view.describe()["decoded_metadata"]
    with caplog.at_level(logging.WARNING):
        view.warn()
    assert len(caplog.records) == 1 and "no decoded metadata" in caplog.records[0].getMessage()
    for key in ("a0/.zarray", "a1/.zattrs", ".zmetadata"):
        with pytest.raises(DecodedMetadataRefused) as e:
            view.check(key)
        assert e.value.logged and e.value.reply_errno == 5  # EIO, and not logged again per read
    view.check("a0/0")  # chunks are served as referenced
    view.check(".zgroup")
    assert view.array_of("a0/0") is None

    class Inner:  # a tree of one metadata key
        root = object()

        def path(self, node: object) -> bytes:
            return b"a0/.zarray"

        async def ref(self, node: object) -> object:
            return object()

    async def read() -> None:
        await DecodedTree(Inner(), view).ref(object())

    with pytest.raises(DecodedMetadataRefused):
        trio.run(read)


def test_too_many_metadata_keys_in_an_index_are_refused_before_they_are_read(tmp_path) -> None:
    """A KeyIndex with more metadata keys than there may be JSON values: refused from the
    count, before any key's name or bytes is read."""
    from refmount.decode.view import IndexMetadata

    class Index:
        def key(self, i: int) -> bytes:
            raise AssertionError("no key read")

    with pytest.raises(DecodedMetadataRefused, match="metadata keys"):
        IndexMetadata(Index(), list(range(MAX_VALUES + 1)), MetadataBudget())


V3_ARRAY = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}


def _v3_set(n: int, **extra: object) -> dict[str, bytes]:
    """A v3 group of ``n`` arrays, each ``zarr.json`` with ``extra`` (the same bytes for each)."""
    doc = json.dumps({**V3_ARRAY, **extra}).encode()
    keys = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group"}).encode()}
    keys.update((f"a{i}/zarr.json", doc) for i in range(n))
    return keys


def test_zarr_json_documents_count_against_the_bounds() -> None:
    """Zarr v3's ``zarr.json`` is parsed within the view's bounds, and the v2 documents shown
    for its nodes count as written: values (an array the view serves as stored, whose
    ``zarr.json`` makes no v2 document), bytes read and bytes written, each just under built,
    just over refused."""
    stored = _v3_set(3, storage_transformers=[{"name": "x"}], attributes={"v": [0] * 20_000})
    per_doc = 1 + sum(stored["a0/zarr.json"].count(c) for c in (b"{", b"[", b","))
    under = 3 * per_doc + 1 + 3  # the documents, the group's and a value per key
    view = DecodedView(stored, budget=MetadataBudget(max_values=under + 8))
    assert view.refused is None and set(view.skipped) == {"a0", "a1", "a2"}
    view = DecodedView(stored, budget=MetadataBudget(max_values=3 * per_doc - 1))
    assert view.refused is not None and "JSON values" in str(view.refused)

    long = _v3_set(3, attributes={"note": "x" * 100_000})
    budget = MetadataBudget(max_bytes=1 << 20)
    view = DecodedView(long, budget=budget)
    assert view.refused is None and sorted(view.arrays) == ["a0", "a1", "a2"]
    read_v3 = sum(len(v) for v in long.values())
    assert budget.read > read_v3 and budget.written > 300_000  # the zarr.json and their v2 .zattrs
    view = DecodedView(long, budget=MetadataBudget(max_bytes=read_v3 - 1))
    assert view.refused is not None and "more than" in str(view.refused) and not view.v3.docs
    view = DecodedView(long, budget=MetadataBudget(max_bytes=budget.written - 1))
    assert view.refused is not None and not view.arrays
