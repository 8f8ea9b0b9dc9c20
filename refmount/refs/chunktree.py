"""The tree of a Parquet reference set: metadata keys from a ``KeyTree``, chunk keys
computed from each array's grid, record files loaded on demand (``RecordCache``).

Chunk inodes live in their own range (bit 62): array id (16 bits) | level (6 bits) | p (40 bits).
level 0: a chunk file, p = chunk number. level L >= 1: a chunk directory for
dimension_separator "/", p = the flattened index of its first L chunk coordinates.
Metadata keys keep ``KeyTree``'s numbers (below bit 62), so both are stable across remounts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import numpy as np
import trio

from refmount.base.errors import ReadError
from refmount.refs.chunkinodes import AID_BITS as _AID_BITS
from refmount.refs.chunkinodes import CHUNK as _CHUNK
from refmount.refs.chunkinodes import CHUNK_TOKEN as _CHUNK_TOKEN
from refmount.refs.chunkinodes import LEVEL_BITS as _LEVEL_BITS
from refmount.refs.chunkinodes import P_MASK as _P_MASK
from refmount.refs.chunkinodes import chunk_ino as _chunk_ino
from refmount.refs.chunkinodes import split_ino
from refmount.refs.model import Ref
from refmount.refs.parquetset import ArraySpec, ParquetSet, RecordCache
from refmount.refs.tree import Entry, KeyTree, Node

_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,18}")
ENTRY_BATCH = 256  # chunk names made at a time while listing
MAX_EMPTY_RECORDS = 64  # record files in a row without a key one listing request looks through

log = logging.getLogger(__name__)


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
        self._cut_short: set[int] = set()  # arrays whose listing ended early (warned once)
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

    def array_dir(self, aid: int) -> Node:
        """The directory node of array ``aid`` (its index in ``arrays``)."""
        return self._array_dir[aid]

    # ---- nodes --------------------------------------------------------------------------
    def _decode(self, ino: int) -> tuple[ArraySpec, int, int, int]:
        aid, level, p = split_ino(ino)
        return self.arrays[aid], aid, level, p

    def _nested(self, array: ArraySpec) -> bool:
        return array.separator == "/" and array.ndim > 1

    def node(self, ino: int) -> Node | None:
        if not ino & _CHUNK:
            return self.meta.node(ino)
        aid = split_ino(ino)[0]
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
        """Children of an array directory (level 0) or a nested chunk directory, from the
        resume token ``start``. Bounded work per call, whatever the grid: names are made
        ENTRY_BATCH at a time as the caller takes them, record files that do not exist are
        skipped by their listing (``RecordCache.present``) where the store has one, and at
        most MAX_EMPTY_RECORDS record files in a row without a key are looked through: with
        entries found, the call ends there (the caller asks again from the last one);
        without, the listing ends, with one warning."""
        array = self.arrays[aid]
        first = max(start - _CHUNK_TOKEN, 0)
        if self._nested(array) and level + 1 < array.ndim:
            for i in range(first, array.dims[level]):
                if i % ENTRY_BATCH == 0:
                    await trio.lowlevel.checkpoint()
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
        present = await self.records.present(aid) if number < hi else None
        empty = 0  # record files in a row without a key
        found = False  # entries given by this call
        while number < hi:
            await trio.lowlevel.checkpoint()
            record_no = number // rs
            if present is not None:  # skip record files that do not exist
                i = int(np.searchsorted(present, record_no))
                if i == len(present):
                    return
                if int(present[i]) != record_no:
                    number = int(present[i]) * rs
                    continue
            try:
                record = await self.records.get(aid, record_no)
            except ReadError:
                if found:
                    return  # these entries first; the next call meets the error
                raise
            base = record_no * rs
            stop = min(hi, base + rs)
            rows = np.flatnonzero(record.sizes[number - base : max(min(record.n, stop - base), 0)] != -2)
            rows += number - base
            for b in range(0, len(rows), ENTRY_BATCH):
                if b:
                    await trio.lowlevel.checkpoint()
                qs = base + rows[b : b + ENTRY_BATCH]
                if nested:  # names are the last coordinate only
                    labels = [str(v) for v in (qs % array.dims[-1]).tolist()]
                else:
                    coords = [c.tolist() for c in np.unravel_index(qs, array.dims)]
                    labels = [array.separator.join(map(str, t)) for t in zip(*coords, strict=True)]
                sizes = record.sizes[qs - base].tolist()
                for q, label, size in zip(qs.tolist(), labels, sizes, strict=True):
                    yield label.encode(), _chunk_ino(aid, 0, q), False, _CHUNK_TOKEN + (q - lo) + 1, size
            number = stop
            if len(rows):
                found, empty = True, 0
                continue
            empty += 1
            if empty >= MAX_EMPTY_RECORDS:
                if not found and aid not in self._cut_short:
                    self._cut_short.add(aid)
                    log.warning("listing of %s ends before chunk %d of %d: %d record files in a row "
                                "hold no key (keys after them open by name)", array.path, number,
                                array.count, empty)
                return

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
