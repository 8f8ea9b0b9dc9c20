"""Zarr v3 stores written by zarr-python 3 as reference sets, and a set's decoded view
written out through ``DecodedTree`` (no FUSE): what netCDF-C reads through a mount."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from refmount.decode.sharding import ShardIndexes
from refmount.decode.view import DecodedTree, DecodedView
from refmount.refs import Ref, RefKind
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.tree import KeyTree


def store_refs(store: Path, ranges: bool = False) -> dict[str, Any]:
    """A reference set of every file of a local store: ``zarr.json`` inline, chunks and shards
    as ``[path]`` (``ranges``: ``[path, 0, size]``)."""
    refs: dict[str, Any] = {}
    for root, _dirs, files in os.walk(store):
        for name in files:
            path = Path(root) / name
            key = str(path.relative_to(store))
            if name == "zarr.json":
                refs[key] = path.read_text()
            else:
                refs[key] = [f"file://{path}", 0, path.stat().st_size] if ranges else [f"file://{path}"]
    return refs


def decoded_tree(refs: dict[str, Any]) -> DecodedTree:
    b = IndexBuilder()
    b.add_items(sorted(refs.items()))
    index = KeyIndex(b.finish())
    return DecodedTree(KeyTree(index), DecodedView.from_index(index))


def _read(ref: Ref, off: int = 0, size: int | None = None) -> bytes:
    if ref.kind is RefKind.INLINE:
        data = bytes(ref.data or b"")
    else:
        assert ref.url is not None
        with open(ref.url.removeprefix("file://"), "rb") as f:
            f.seek(ref.offset)
            data = f.read(ref.length if ref.length >= 0 else -1)
    return data[off:] if size is None else data[off : off + size]


async def _range(ref: Ref, off: int, n: int) -> bytes:
    return _read(ref, off, n)


async def _size(ref: Ref) -> int:
    return len(_read(ref))


def render_tree(tree: DecodedTree, out: Path) -> dict[str, bytes]:
    """Every file of ``tree`` written under ``out`` (decoded chunks decoded); key -> bytes."""
    shards = ShardIndexes(_range, _size)
    written: dict[str, bytes] = {}

    async def chunk_bytes(key: str, array: Any, ref: Ref) -> bytes:
        if getattr(array, "shard", None) is not None:
            idx = array.index_of(array.chunk_rel(key))
            _k, number = array.stored_location(idx)
            stored = await shards.inner(ref, array.shard, number, array.stored_bound)
            if stored is None:
                return bytes(array.fill_chunk())
        else:
            stored = _read(ref)
        return bytes(array.decode(stored))

    async def walk(node: Any, prefix: str) -> None:
        async for name, ino, is_dir, _nxt, size in tree.entries(node):
            child = tree.node(ino)
            assert child is not None and child.is_dir == is_dir
            found = await tree.lookup(node, name)
            assert found is not None and found.ino == ino, (prefix, name)
            key = prefix + name.decode()
            if is_dir:
                await walk(child, key + "/")
                continue
            ref = await tree.ref(child)
            array = tree.array(child)
            data = await chunk_bytes(tree.path(child).decode(), array, ref) if array else _read(ref)
            assert len(data) == size == await tree.size(child), (key, len(data), size)
            written[key] = data
            (out / key).parent.mkdir(parents=True, exist_ok=True)
            (out / key).write_bytes(data)

    out.mkdir(parents=True, exist_ok=True)
    trio.run(walk, tree.root, "")
    return written


def zarr_json(refs: dict[str, Any], path: str) -> dict[str, Any]:
    return json.loads(refs[f"{path}/zarr.json" if path else "zarr.json"])
