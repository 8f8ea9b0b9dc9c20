"""Zarr v3 stores written by zarr-python 3 as reference sets, and a set's decoded view
written out through ``DecodedTree`` (no FUSE): what netCDF-C reads through a mount."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from refmount.decode.decodedtree import DecodedTree
from refmount.decode.sharding import ShardIndexes
from refmount.decode.v3tree import MISSING_CHUNK
from refmount.decode.view import DecodedView
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
        if ref is MISSING_CHUNK:
            return bytes(array.fill_chunk())
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


# ---- arrays written by zarr-python 3, and what ncdump prints of them ---------------------------

def codec_sets(ndim: int) -> dict[str, dict[str, Any]]:
    """Named ``zarr.create_array`` codec arguments covering the v3 codecs the view decodes."""
    import zarr.codecs as zc
    import zarr.codecs.numcodecs as znc

    order = list(reversed(range(ndim)))
    return {
        "plain": {"compressors": None},
        "gzip": {"compressors": [zc.GzipCodec(level=5)]},
        "zstd": {"compressors": [zc.ZstdCodec(level=3)]},
        "zstd_crc32c": {"compressors": [zc.ZstdCodec(), zc.Crc32cCodec()]},
        "blosc": {"compressors": [zc.BloscCodec(cname="lz4", shuffle="shuffle")]},
        "big_gzip": {"serializer": zc.BytesCodec(endian="big"), "compressors": [zc.GzipCodec()]},
        "transpose": {"filters": [zc.TransposeCodec(order=order)], "compressors": [zc.ZstdCodec()]},
        "nc_zlib_shuffle": {"compressors": [znc.Shuffle(), znc.Zlib(level=1)]},
        "nc_delta": {"filters": [znc.Delta(dtype="<i4")], "compressors": [znc.Zstd(level=1)]},
        "nc_fixedscaleoffset": {"filters": [znc.FixedScaleOffset(offset=0, scale=10, dtype="<f8",
                                                                 astype="<i4")],
                                "compressors": [znc.LZ4()]},
    }


def sample(shape: tuple[int, ...], dtype: Any) -> Any:
    import numpy as np

    dt = np.dtype(dtype)
    n = int(np.prod(shape)) if shape else 1
    if dt.kind == "S":
        words = [b"ab", b"c", b"defg", b"", b"hi"]
        return np.array([words[i % 5][: dt.itemsize] for i in range(n)], dt).reshape(shape)
    if dt.kind == "U":
        return np.array([str(i % 7) for i in range(n)], dt).reshape(shape)
    if dt.kind == "b":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dt.kind == "M":
        return np.arange(n).astype(dt).reshape(shape)
    values = np.arange(1, n + 1) % (100 if dt.itemsize == 1 else 10**6)
    if dt.kind == "f":
        values = values * 0.5
    return values.astype(dt).reshape(shape)


def ncdump_values(cdl: str, var: str) -> list[str]:
    """The tokens ncdump prints for ``var`` in its data section (strings for char arrays)."""
    import re

    data = cdl.split("data:", 1)[1]
    m = re.search(r"^\s*" + re.escape(var) + r" =\s*(.*?);\s*$", data, re.S | re.M)
    assert m, f"{var} not in the data section"
    body = m.group(1)
    if body.lstrip().startswith('"'):
        return re.findall(r'"((?:[^"\\]|\\.)*)"', body)
    return [t.strip() for t in body.replace("\n", " ").split(",") if t.strip()]
