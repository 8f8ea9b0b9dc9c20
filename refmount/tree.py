"""The directory tree implied by the sorted keys, with no Python object per key.

Keys are sorted bytewise, so every directory ``a/b/`` is one contiguous run of keys,
found by binary search. Inode numbers are computed, not allocated:

* the root is 1 (FUSE's root inode);
* file = key index ``i``:            ``(i + 1) << 12``
* directory of depth ``d`` (1 ≤ d ≤ 4095) whose first key is ``i``: ``((i + 1) << 12) | d``

so they are stable across remounts of the same set and need no table. (Several
directories can start at the same key — ``a/`` and ``a/b/`` — the depth tells them apart.)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import numpy as np

from .refs import KeyIndex, Ref
from .refs.parquet import ArraySpec, ParquetSet, RecordCache

ROOT_INODE = 1
_DEPTH_BITS = 12
_DEPTH_MASK = (1 << _DEPTH_BITS) - 1


@dataclass(frozen=True, slots=True)
class Node:
    ino: int
    is_dir: bool
    index: int  # key index (file) or first key index (dir); -1 for the root
    depth: int  # components in the path (root 0)


# A directory entry: name, inode, is_dir, resume token, size (-1: whole file, not yet measured)
Entry = tuple[bytes, int, bool, int, int]


class KeyTree:
    def __init__(self, index: KeyIndex) -> None:
        self.index = index
        self.root = Node(ROOT_INODE, True, -1, 0)

    # ---- inode arithmetic -------------------------------------------------------------
    @staticmethod
    def file_ino(i: int) -> int:
        return (i + 1) << _DEPTH_BITS

    @staticmethod
    def dir_ino(first: int, depth: int) -> int:
        return ((first + 1) << _DEPTH_BITS) | depth

    def node(self, ino: int) -> Node | None:
        if ino == ROOT_INODE:
            return self.root
        i = (ino >> _DEPTH_BITS) - 1
        depth = ino & _DEPTH_MASK
        if not 0 <= i < self.index.n:
            return None
        if depth == 0:
            return Node(ino, False, i, self.index.key(i).count(b"/") + 1)
        key = self.index.key(i)
        if key.count(b"/") < depth:  # not a directory prefix of this key
            return None
        return Node(ino, True, i, depth)

    # ---- paths ------------------------------------------------------------------------
    def dir_prefix(self, node: Node) -> bytes:
        """``b""`` for the root, else the directory path followed by ``/``."""
        if node.index < 0:
            return b""
        parts = self.index.key(node.index).split(b"/", node.depth)
        return b"/".join(parts[: node.depth]) + b"/"

    def path(self, node: Node) -> bytes:
        if node.is_dir:
            return self.dir_prefix(node).rstrip(b"/")
        return self.index.key(node.index)

    def parent(self, node: Node) -> Node:
        """The directory holding ``node`` (the root for the root)."""
        if node.depth <= 1:
            return self.root
        prefix = b"/".join(self.index.key(node.index).split(b"/", node.depth)[: node.depth - 1])
        first = self.index.bisect(prefix + b"/")
        return Node(self.dir_ino(first, node.depth - 1), True, first, node.depth - 1)

    def _dir_range(self, node: Node) -> tuple[int, int, bytes]:
        prefix = self.dir_prefix(node)
        if not prefix:
            return 0, self.index.n, prefix
        # All keys starting with "a/b/" sort before "a/b0" ('0' follows '/').
        hi = self.index.bisect(prefix[:-1] + b"0", node.index)
        return node.index, hi, prefix

    # ---- operations -------------------------------------------------------------------
    def find(self, parent: Node, name: bytes) -> Node | None:
        if not parent.is_dir or not name or b"/" in name:
            return None
        lo, hi, prefix = self._dir_range(parent)
        target = prefix + name
        idx = self.index
        j = idx.bisect(target, lo, hi)
        if j < hi and idx.key(j) == target:
            return Node(self.file_ino(j), False, j, parent.depth + 1)
        sub = target + b"/"
        j = idx.bisect(sub, j, hi)
        if j < hi and idx.key(j).startswith(sub):
            return Node(self.dir_ino(j, parent.depth + 1), True, j, parent.depth + 1)
        return None

    def children(self, parent: Node, start: int = 0) -> Iterator[Entry]:
        """Entries of ``parent`` as (name, ino, is_dir, next_token, size), resuming after
        ``start`` (0 = from the beginning; tokens are key positions + 1, so they stay valid
        across calls). Keys are sliced in batches: this loop runs once per entry of ``ls``
        and ``find``, so it avoids per-entry numpy indexing and objects."""
        lo, hi, prefix = self._dir_range(parent)
        idx = self.index
        koff, kbuf, lengths = idx._koff, idx._kbuf, idx._lengths
        plen = len(prefix)
        depth = parent.depth + 1
        j = max(lo, start - 1) if start else lo
        while j < hi:
            end = min(hi, j + 512)
            base = int(koff[j])
            blob = kbuf[base : int(koff[end])].tobytes()
            offs = (koff[j : end + 1] - base).tolist()
            sizes = lengths[j:end].tolist()
            for i in range(end - j):
                name = blob[offs[i] + plen : offs[i + 1]]
                slash = name.find(b"/")
                if slash < 0:
                    pos = j + i
                    yield name, (pos + 1) << _DEPTH_BITS, False, pos + 2, sizes[i]
                    continue
                # A subdirectory: one entry, then skip all keys below it.
                pos = j + i
                name = name[:slash]
                nxt = idx.bisect(prefix + name + b"0", pos + 1, hi)
                yield name, self.dir_ino(pos, depth), True, nxt + 1, 0
                j = nxt
                break
            else:
                j = end

    # ---- the interface the FUSE layer uses (async: other trees load lazily) ------------
    async def lookup(self, parent: Node, name: bytes) -> Node | None:
        return self.find(parent, name)

    async def entries(self, parent: Node, start: int = 0) -> AsyncIterator[Entry]:
        for entry in self.children(parent, start):
            yield entry

    async def ref(self, node: Node) -> Ref:
        return self.index.ref(node.index, view=True)

    async def size(self, node: Node) -> int:
        """File size, or -1 when it is a whole-file target not yet measured."""
        return self.index.size(node.index)

    def __len__(self) -> int:
        return self.index.n


# ---- Parquet: metadata keys from a KeyTree, chunk keys computed from array grids ----------
#
# Chunk inodes live in their own range (bit 62): array id (16 bits) | level (6 bits) | p (40 bits).
# level 0: a chunk file, p = chunk number. level L >= 1: a chunk directory for
# dimension_separator "/", p = the flattened index of its first L chunk coordinates.
_CHUNK = 1 << 62
_P_BITS, _LEVEL_BITS, _AID_BITS = 40, 6, 16
_P_MASK = (1 << _P_BITS) - 1
_CHUNK_TOKEN = 1 << 41  # readdir tokens above this enumerate chunks
_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,18}")


def _chunk_ino(aid: int, level: int, p: int) -> int:
    return _CHUNK | (aid << (_P_BITS + _LEVEL_BITS)) | (level << _P_BITS) | p


def _decimal(name: bytes, bound: int) -> int | None:
    if not _DECIMAL.fullmatch(name):
        return None
    v = int(name)
    return v if v < bound else None


class ChunkTree:
    """The tree of a Parquet reference set; record files are loaded on demand."""

    def __init__(self, pset: ParquetSet, records: RecordCache) -> None:
        self.meta = KeyTree(pset.metadata)
        self.root = self.meta.root
        self.arrays = pset.arrays
        self.record_size = pset.record_size
        self.records = records
        if len(self.arrays) >= 1 << _AID_BITS:
            raise ValueError("too many arrays")
        self._array_of_dir: dict[int, int] = {}
        self._array_dir: list[Node] = []
        for aid, array in enumerate(self.arrays):
            if max(array.count, 1) > _P_MASK or array.ndim >= 1 << _LEVEL_BITS:
                raise ValueError(f"array {array.path} has too many chunks")
            node = self.root
            for part in array.path.encode().split(b"/"):
                found = self.meta.find(node, part)
                assert found is not None and found.is_dir
                node = found
            self._array_of_dir[node.ino] = aid
            self._array_dir.append(node)

    def __len__(self) -> int:
        return len(self.meta) + sum(a.count for a in self.arrays)

    # ---- nodes --------------------------------------------------------------------------
    def _decode(self, ino: int) -> tuple[ArraySpec, int, int, int]:
        aid = (ino >> (_P_BITS + _LEVEL_BITS)) & ((1 << _AID_BITS) - 1)
        return self.arrays[aid], aid, (ino >> _P_BITS) & ((1 << _LEVEL_BITS) - 1), ino & _P_MASK

    def _nested(self, array: ArraySpec) -> bool:
        return array.separator == "/" and array.ndim > 1

    def node(self, ino: int) -> Node | None:
        if not ino & _CHUNK:
            return self.meta.node(ino)
        aid = (ino >> (_P_BITS + _LEVEL_BITS)) & ((1 << _AID_BITS) - 1)
        if aid >= len(self.arrays):
            return None
        array, aid, level, p = self._decode(ino)
        base = self._array_dir[aid].depth
        if level == 0:
            if p >= array.count:
                return None
            return Node(ino, False, p, base + (array.ndim if self._nested(array) else 1))
        if not self._nested(array) or level >= array.ndim or p >= int(np.prod(array.dims[:level])):
            return None
        return Node(ino, True, p, base + level)

    def _chunk_node(self, aid: int, number: int) -> Node:
        array = self.arrays[aid]
        depth = self._array_dir[aid].depth + (array.ndim if self._nested(array) else 1)
        return Node(_chunk_ino(aid, 0, number), False, number, depth)

    async def _chunk_size(self, aid: int, number: int) -> int:
        record = await self.records.get(aid, number // self.record_size)
        return record.size(number % self.record_size)

    # ---- lookup -------------------------------------------------------------------------
    async def lookup(self, parent: Node, name: bytes) -> Node | None:
        if not parent.is_dir:
            return None
        if parent.ino & _CHUNK:
            array, aid, level, p = self._decode(parent.ino)
            i = _decimal(name, array.dims[level])
            if i is None:
                return None
            q = p * array.dims[level] + i
            if level + 1 < array.ndim:
                return Node(_chunk_ino(aid, level + 1, q), True, q, parent.depth + 1)
            return await self._existing(aid, q)
        node = self.meta.find(parent, name)
        aid = self._array_of_dir.get(parent.ino)
        if node is not None or aid is None:
            return node
        array = self.arrays[aid]
        if self._nested(array):
            i = _decimal(name, array.dims[0])
            return None if i is None else Node(_chunk_ino(aid, 1, i), True, i, parent.depth + 1)
        parts = name.split(b".") if array.separator == "." else [name]
        if len(parts) != array.ndim:
            return None
        idx = [_decimal(part, n) for part, n in zip(parts, array.dims, strict=True)]
        if any(i is None for i in idx):
            return None
        return await self._existing(aid, int(np.ravel_multi_index(idx, array.dims)))

    async def _existing(self, aid: int, number: int) -> Node | None:
        if await self._chunk_size(aid, number) == -2:
            return None  # both path and raw null: the key does not exist
        return self._chunk_node(aid, number)

    # ---- listing ------------------------------------------------------------------------
    async def entries(self, parent: Node, start: int = 0) -> AsyncIterator[Entry]:
        if parent.ino & _CHUNK:
            _array, aid, level, p = self._decode(parent.ino)
            async for entry in self._chunk_entries(aid, level, p, start, parent.depth + 1):
                yield entry
            return
        if start < _CHUNK_TOKEN:
            async for entry in self.meta.entries(parent, start):
                yield entry
            start = _CHUNK_TOKEN
        aid = self._array_of_dir.get(parent.ino)
        if aid is not None:
            async for entry in self._chunk_entries(aid, 0, 0, start, parent.depth + 1):
                yield entry

    async def _chunk_entries(
        self, aid: int, level: int, p: int, start: int, depth: int
    ) -> AsyncIterator[Entry]:
        """Children of an array directory (level 0) or a nested chunk directory."""
        array = self.arrays[aid]
        first = max(start - _CHUNK_TOKEN, 0)
        if self._nested(array) and level + 1 < array.ndim:
            for i in range(first, array.dims[level]):
                q = p * array.dims[level] + i
                yield str(i).encode(), _chunk_ino(aid, level + 1, q), True, _CHUNK_TOKEN + i + 1, 0
            return
        nested = self._nested(array)
        if nested or (array.ndim == 1 and array.separator == "/"):
            span = array.dims[level] if nested else array.dims[0]
            lo, hi = p * span, p * span + span
        else:
            lo, hi = 0, array.count
        number = lo + first
        rs = self.record_size
        while number < hi:
            record = await self.records.get(aid, number // rs)
            row0 = number % rs
            stop = min(hi, number - row0 + rs)
            sizes = np.full(stop - number, -2, np.int64)
            avail = max(min(record.n, row0 + len(sizes)) - row0, 0)
            sizes[:avail] = record.sizes[row0 : row0 + avail]
            present = np.flatnonzero(sizes != -2)
            qs = number + present
            if nested:  # names are the last coordinate only
                names = (qs % array.dims[-1]).tolist()
                labels = [str(v) for v in names]
            else:
                coords = [c.tolist() for c in np.unravel_index(qs, array.dims)]
                labels = [array.separator.join(map(str, t)) for t in zip(*coords, strict=True)]
            for q, label, size in zip(qs.tolist(), labels, sizes[present].tolist(), strict=True):
                yield label.encode(), _chunk_ino(aid, 0, q), False, _CHUNK_TOKEN + (q - lo) + 1, size
            number = stop

    # ---- references ---------------------------------------------------------------------
    async def ref(self, node: Node) -> Ref:
        if not node.ino & _CHUNK:
            return await self.meta.ref(node)
        _, aid, _, number = self._decode(node.ino)
        record = await self.records.get(aid, number // self.record_size)
        ref = record.ref(number % self.record_size, view=True)
        if ref is None:
            raise FileNotFoundError(node.ino)
        return ref

    async def size(self, node: Node) -> int:
        if not node.ino & _CHUNK:
            return await self.meta.size(node)
        _, aid, _, number = self._decode(node.ino)
        return await self._chunk_size(aid, number)

    def parent(self, node: Node) -> Node:
        if not node.ino & _CHUNK:
            return self.meta.parent(node)
        array, aid, level, p = self._decode(node.ino)
        if level == 0 and self._nested(array):  # a file in the deepest chunk directory
            level, p = array.ndim, p
        if level <= 1 or not self._nested(array):
            return self._array_dir[aid]
        q = p // array.dims[level - 1]
        return Node(_chunk_ino(aid, level - 1, q), True, q, node.depth - 1)

    def path(self, node: Node) -> bytes:
        if not node.ino & _CHUNK:
            return self.meta.path(node)
        array, _aid, level, p = self._decode(node.ino)
        if level == 0:
            return f"{array.path}/{array.chunk_name(p)}".encode()
        idx = np.unravel_index(p, array.dims[:level])
        return (array.path + "/" + "/".join(str(int(i)) for i in idx)).encode()
