"""refmount.core.consolidated: .zmetadata from a set's metadata keys, against zarr and xarray."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from refmount.core.consolidated import ConsolidationRefused, consolidate, consolidation, is_metadata_key


def store_metadata(root: Path) -> dict[str, bytes]:
    """Every file of a directory store, by key, as a reference set would inline them."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def write_v2_store(root: Path) -> None:
    g = zarr.open_group(root, mode="w", zarr_format=2)
    g.attrs.update({"title": "Tést", "history": "made by zarr", "nan": float("nan")})
    a = g.create_array("temp", shape=(4, 5), chunks=(2, 5), dtype="f4", fill_value=np.nan)
    a[:] = np.arange(20, dtype="f4").reshape(4, 5)
    a.attrs["units"] = "K"
    sub = g.create_group("sub")
    sub.attrs["level"] = 1
    b = sub.create_array("x", shape=(3,), chunks=(2,), dtype="i2", fill_value=-1)
    b[:] = [1, 2, 3]
    sub.create_group("deeper").create_array("y", shape=(), dtype="u1")


def without_zarr3_group_member(meta: dict) -> dict:
    """zarr-python 3 adds ``consolidated_metadata`` to each nested ``.zgroup`` it consolidates."""
    out = {}
    for key, value in meta.items():
        if key.endswith("/.zgroup"):
            value = {k: v for k, v in value.items() if k != "consolidated_metadata"}
        out[key] = value
    return out


def test_equals_zarr_consolidate_metadata(tmp_path):
    root = tmp_path / "store.zarr"
    write_v2_store(root)
    keys = store_metadata(root)
    assert ".zmetadata" not in keys
    zarr.consolidate_metadata(str(root))
    theirs = json.loads((root / ".zmetadata").read_bytes())
    keys_now = store_metadata(root)  # with zarr's .zmetadata: consolidate() must ignore it
    ours_bytes = consolidate(keys_now)
    ours = json.loads(ours_bytes)
    assert ours["zarr_consolidated_format"] == theirs["zarr_consolidated_format"] == 1
    assert set(ours) == set(theirs) == {"metadata", "zarr_consolidated_format"}
    # NaN != NaN: compare the JSON text of each key's document.
    assert {k: json.dumps(v, sort_keys=True) for k, v in ours["metadata"].items()} == {
        k: json.dumps(v, sort_keys=True) for k, v in without_zarr3_group_member(theirs["metadata"]).items()
    }
    assert set(ours["metadata"]) == {k for k in keys if is_metadata_key(k)}
    # zarr 2's serialization: indent 4, sorted keys, ASCII.
    assert ours_bytes.startswith(b'{\n    "metadata": {\n        ".zattrs": {')
    assert ours_bytes.isascii()


def test_zarr_and_xarray_open_with_it(tmp_path):
    ds = xr.Dataset(
        {"t": (("y", "x"), np.arange(12.0).reshape(3, 4), {"units": "K"}),
         "flag": (("y",), np.array([1, 0, 1], "u1"))},
        coords={"y": [10, 20, 30], "x": [1.5, 2.5, 3.5, 4.5]},
        attrs={"title": "consolidated"},
    )
    root = tmp_path / "ds.zarr"
    ds.to_zarr(root, zarr_format=2, consolidated=False)
    assert not (root / ".zmetadata").exists()
    (root / ".zmetadata").write_bytes(consolidate(store_metadata(root)))
    opened = xr.open_zarr(root, consolidated=True, zarr_format=2)
    xr.testing.assert_identical(opened.load(), ds)
    group = zarr.open_consolidated(str(root), zarr_format=2)
    assert sorted(group.array_keys()) == ["flag", "t", "x", "y"]
    # The arrays' metadata comes from .zmetadata alone: remove their files (zarr 3 reads
    # the root group's own from the store).
    bare = tmp_path / "bare.zarr"
    shutil.copytree(root, bare)
    for p in [*bare.glob("*/.zattrs"), *bare.glob("*/.zarray")]:
        p.unlink()
    opened = xr.open_zarr(bare, consolidated=True, zarr_format=2)
    xr.testing.assert_identical(opened.load(), ds)


def test_skips_and_says_why():
    metadata: dict[str, bytes | None] = {
        ".zgroup": b'{"zarr_format": 2}',
        ".zattrs": b'{"a": NaN}',
        ".zmetadata": b'{"metadata": {}}',
        "v/.zarray": None,  # a reference, not inline
        "v/.zattrs": b"not json",
        "w/.zattrs": b"[1, 2]",
        "deep/" * 3 + ".zattrs": b"[" * 100_000 + b"]" * 100_000,  # nesting Python cannot parse
        "v/0.0": b"\x00\x01",  # a chunk: not metadata
        "x.zarray": b"{}",  # not a path component named .zarray
        "u/.zarray": b'{"shape": [1]}',
    }
    result = consolidation(metadata)
    doc = json.loads(result.document)
    assert sorted(doc["metadata"]) == [".zattrs", ".zgroup", "u/.zarray"]
    assert np.isnan(doc["metadata"][".zattrs"]["a"])
    assert result.skipped == {
        "v/.zarray": "not inline (a reference to a target)",
        "v/.zattrs": "not valid JSON",
        "w/.zattrs": "not a JSON object",
        "deep/deep/deep/.zattrs": "not valid JSON",
    }
    assert consolidate(metadata) == result.document


def test_bounded_input():
    """Just under each bound: consolidated; just over: refused, naming the bound."""
    doc = b'{"x": 1' + b" " * 200 + b"}"  # 208 bytes, written as 30 or so
    metadata = {f"a{i}/.zattrs": doc for i in range(10)}
    assert len(json.loads(consolidation(metadata, max_bytes=2080).document)["metadata"]) == 10
    with pytest.raises(ConsolidationRefused, match="keys hold more than 2,079 bytes"):
        consolidation(metadata, max_bytes=2079)
    metadata = {f"a{i}/.zattrs": b'{"x": "' + b"y" * 100 + b'"}' for i in range(10)}
    # the document written is bounded too (re-indented, it is longer than its input)
    written = len(consolidation(metadata).document)
    consolidation(metadata, max_bytes=written)
    with pytest.raises(ConsolidationRefused, match="consolidated metadata is over"):
        consolidation(metadata, max_bytes=written - 60)
    # JSON values: one per key, plus one per container and comma
    values = {f"v{i}/.zattrs": b'{"a": [1, 2, 3]}' for i in range(4)}  # 1 + 2 + 2 = 5 each
    assert len(json.loads(consolidation(values, max_values=20).document)["metadata"]) == 4
    with pytest.raises(ConsolidationRefused, match="more than 19 JSON values"):
        consolidation(values, max_values=19)


def test_refused_as_soon_as_a_bound_is_passed():
    """The keys after the one that passes a bound are neither read nor parsed."""
    taken: list[str] = []

    def pairs():
        for i in range(1000):
            taken.append(f"k{i:04d}/.zattrs")
            yield taken[-1], b'{"a": [' + b"0," * 999 + b"0]}"

    with pytest.raises(ConsolidationRefused):
        consolidation(pairs(), max_values=10_000)
    assert len(taken) == 10  # 1,002 values each


def test_the_document_is_what_one_json_dumps_writes():
    """Built key by key, the text is the one zarr 2 writes for the whole document at once."""
    metadata = {".zattrs": b'{"b": [1, {"c": "x\\ny"}], "\\u00e9": NaN, "a": {}}',
                "a/.zarray": b'{"shape": [1, 2], "z": {}, "f": []}', "b/.zgroup": b'{"zarr_format": 2}',
                "b/c/.zattrs": b"{}"}
    whole = {"metadata": {k: json.loads(v) for k, v in metadata.items()}, "zarr_consolidated_format": 1}
    assert consolidate(metadata) == json.dumps(whole, indent=4, sort_keys=True, ensure_ascii=True,
                                               separators=(",", ": ")).encode()


def test_empty_set():
    assert json.loads(consolidate({})) == {"metadata": {}, "zarr_consolidated_format": 1}
