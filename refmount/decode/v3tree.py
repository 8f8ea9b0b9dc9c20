"""The directories of Zarr v3 nodes as the decoded view serves them (``DecodedTree`` asks).

* a v3 group's directory (an implicit one too): ``.zgroup`` and ``.zattrs`` first, then its
  children, without ``zarr.json``;
* a decoded v3 array's directory: ``.zarray``, ``.zattrs`` (unless the array is left out of
  the netCDF side) and every chunk of its grid named as v2 names them (``i.j``, ``0`` for a
  0-d array; a sharded array's inner chunks), and nothing else (``zarr.json`` and ``c/`` are
  not shown). A chunk (or shard) not stored is served as the v3 ``fill_value``
  (``MISSING_CHUNK``): in v2 the ``fill_value`` of missing chunks is also the missing-value
  marker, which v3's is not;
* every other directory (an array served as referenced included) as stored.

These files have inode numbers of their own (bit 63: ``kind`` (2 bits) | directory id (21
bits) | chunk number (40 bits)), the directory ids numbered in the set's sorted path order,
so they are stable across remounts of one set. A chunk's reference is the stored chunk's or
shard's; its directory's stored node is kept from the lookup or listing that led to it.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from refmount.decode.v3view import V3Array
from refmount.refs import Ref, RefKind

_SYNTH = 1 << 63
_KIND_SHIFT, _ID_SHIFT = 61, 40
_ID_MASK = (1 << 21) - 1
_P_MASK = (1 << 40) - 1
CHUNK, ZARRAY, ZATTRS, ZGROUP = 0, 1, 2, 3
_NAMES = {ZARRAY: ".zarray", ZATTRS: ".zattrs", ZGROUP: ".zgroup"}
_META = {".zarray": ZARRAY, ".zattrs": ZATTRS, ".zgroup": ZGROUP}
# the reference of a chunk (or shard) the set does not store: decoded as the fill value
MISSING_CHUNK = Ref(RefKind.INLINE, None, 0, 0, b"")


def is_synthesized(ino: int) -> bool:
    return bool(ino & _SYNTH)


class V3Tree:
    """The v3 directories of one decoded view over ``inner`` (the set's own tree)."""

    def __init__(self, inner: Any, view: Any) -> None:
        from refmount.refs.tree import Node

        self._node_type = Node
        self.inner = inner
        self.view = view
        layout = view.v3
        self.arrays: dict[str, V3Array] = {p: a for p, a in layout.plans.items() if p in view.arrays}
        self.groups = set(layout.groups)
        self.paths = sorted(set(self.arrays) | self.groups)[: _ID_MASK + 1]  # (V3Layout: MAX_NODES)
        self._ids = {p: i for i, p in enumerate(self.paths)}
        self._dirs: dict[int, Any] = {}  # id -> the stored directory node (seen)

    def handles(self, path: str) -> bool:
        return path in self._ids

    def is_array(self, path: str) -> bool:
        return path in self.arrays

    # ---- nodes ------------------------------------------------------------------------------
    def _ino(self, kind: int, dir_id: int, p: int = 0) -> int:
        return _SYNTH | (kind << _KIND_SHIFT) | (dir_id << _ID_SHIFT) | p

    @staticmethod
    def _parts(ino: int) -> tuple[int, int, int]:
        return (ino >> _KIND_SHIFT) & 3, (ino >> _ID_SHIFT) & _ID_MASK, ino & _P_MASK

    def node(self, ino: int) -> Any:
        _kind, dir_id, p = self._parts(ino)
        if dir_id >= len(self.paths):
            return None
        path = self.paths[dir_id]
        depth = (path.count("/") + 1 if path else 0) + 1
        return self._node_type(ino, False, p, depth)

    def path(self, node: Any) -> bytes:
        kind, dir_id, p = self._parts(node.ino)
        head = self.paths[dir_id]
        name = _NAMES[kind] if kind != CHUNK else self._chunk_name(self.arrays[head], p)
        return ((head + "/" if head else "") + name).encode("utf-8", "surrogateescape")

    def parent(self, node: Any) -> Any:
        _kind, dir_id, _p = self._parts(node.ino)
        return self._dirs.get(dir_id, self.inner.root)

    def _chunk_name(self, array: V3Array, n: int, listed: bool = False) -> str:
        """A chunk's name (its key's last part); ``listed``: as listed (a fixed-width string
        array shown as char lists its chunks with ``.0`` added, as the v2 view does)."""
        name = array.chunk_name(n, array.grid) if array.ndim else "0"
        if listed and self.view.suffixed(array.path) is not None:
            name += ".0"
        return name

    def _metadata_names(self, path: str) -> list[tuple[int, str]]:
        prefix = f"{path}/" if path else ""
        kinds = (ZARRAY, ZATTRS) if path in self.arrays else (ZGROUP, ZATTRS)
        view = self.view
        return [(k, _NAMES[k]) for k in kinds
                if view.metadata(prefix + _NAMES[k]) is not None and not view.is_hidden(prefix + _NAMES[k])]

    # ---- lookups and listings -----------------------------------------------------------------
    async def lookup(self, parent: Any, path: str, name: bytes) -> tuple[bool, Any]:
        """(answered, node): answered False when the stored tree answers instead."""
        dir_id = self._ids[path]
        self._dirs[dir_id] = parent
        text = name.decode("utf-8", "surrogateescape")
        if text in _META:
            for kind, known in self._metadata_names(path):
                if known == text:
                    return True, self.node(self._ino(kind, dir_id))
            return True, None
        array = self.arrays.get(path)
        if array is None:
            return (True, None) if text == "zarr.json" else (False, None)
        idx = array.index_of(text)
        if idx is None and text.endswith(".0") and self.view.suffixed(path) is not None:
            idx = array.index_of(text[:-2])  # listed with its string-length dimension's chunk
        if idx is None:
            return True, None
        n = int(np.ravel_multi_index(idx, array.grid)) if idx else 0
        return True, self.node(self._ino(CHUNK, dir_id, n))

    async def _stored(self, dir_node: Any, array: V3Array, idx: tuple[int, ...]) -> Any:
        """The stored node of the chunk (or shard) holding grid position ``idx``, None if absent."""
        key, _number = array.stored_location(idx)
        node = dir_node
        for part in key.encode().split(b"/"):
            node = await self.inner.lookup(node, part)
            if node is None:
                return None
        return None if node.is_dir else node

    async def entries(self, parent: Any, path: str, start: int) -> AsyncIterator[tuple]:
        """Entries of a v3 directory: positions 0-1 the metadata, then chunks (arrays) or the
        stored entries (groups); each entry's resume token is its position + 1."""
        dir_id = self._ids[path]
        self._dirs[dir_id] = parent
        prefix = f"{path}/" if path else ""
        for kind, name in self._metadata_names(path):
            pos = 0 if kind in (ZARRAY, ZGROUP) else 1
            if pos >= start:
                meta = self.view.metadata(prefix + name)
                yield name.encode(), self._ino(kind, dir_id), False, pos + 1, len(meta)
        array = self.arrays.get(path)
        if array is None:
            async for name, ino, is_dir, nxt, size in self.inner.entries(parent, max(start - 2, 0)):
                if name != b"zarr.json":
                    yield name, ino, is_dir, nxt + 2, size
            return
        count = math.prod(array.grid) if array.ndim else 1
        for n in range(max(start - 2, 0), count):
            yield (self._chunk_name(array, n, listed=True).encode(), self._ino(CHUNK, dir_id, n), False,
                   n + 3, array.nbytes)

    # ---- files --------------------------------------------------------------------------------
    async def ref(self, node: Any) -> Ref:
        kind, dir_id, n = self._parts(node.ino)
        path = self.paths[dir_id]
        if kind != CHUNK:
            data = self.view.metadata((f"{path}/" if path else "") + _NAMES[kind])
            if data is None:
                raise FileNotFoundError(path)
            return Ref(RefKind.INLINE, None, 0, len(data), data)
        array = self.arrays[path]
        idx = tuple(int(i) for i in np.unravel_index(n, array.grid)) if array.ndim else ()
        dir_node = self._dirs.get(dir_id)
        if dir_node is None:
            raise FileNotFoundError(path)
        stored = await self._stored(dir_node, array, idx)
        return MISSING_CHUNK if stored is None else await self.inner.ref(stored)

    def size(self, node: Any) -> int:
        kind, dir_id, _n = self._parts(node.ino)
        path = self.paths[dir_id]
        if kind == CHUNK:
            return self.arrays[path].nbytes
        data = self.view.metadata((f"{path}/" if path else "") + _NAMES[kind])
        return len(data) if data is not None else 0

    def array(self, node: Any) -> V3Array | None:
        kind, dir_id, _n = self._parts(node.ino)
        return self.arrays[self.paths[dir_id]] if kind == CHUNK else None
