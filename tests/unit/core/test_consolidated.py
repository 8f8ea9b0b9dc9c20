"""refmount.core.consolidated: .zmetadata from a set's metadata keys, against zarr and xarray."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import xarray as xr
import zarr

from refmount.core.consolidated import consolidate, consolidation, is_metadata_key


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
    metadata = {f"a{i}/.zattrs": b'{"x": "' + b"y" * 100 + b'"}' for i in range(10)}
    result = consolidation(metadata, max_bytes=350)
    assert len(json.loads(result.document)["metadata"]) == 3
    assert len(result.skipped) == 7
    assert all("bound" in why for why in result.skipped.values())


def test_empty_set():
    assert json.loads(consolidate({})) == {"metadata": {}, "zarr_consolidated_format": 1}
