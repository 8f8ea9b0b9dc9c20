"""The tree of one Icechunk snapshot: each node's ``zarr.json`` from a ``KeyTree``, the chunk
keys of each array computed from its grid and chunk key encoding (``keys.py``), chunks looked
up in the snapshot's manifests when a lookup, listing or read needs them.

Chunk inodes live in their own range (bit 62), as in the Parquet set's ``ChunkTree``:
array id (16 bits) | level (6 bits) | p (40 bits). Level 0: a chunk file, p = chunk number
(C order over the grid). Level L >= 1: a chunk directory (``/``-separated keys), p = the
flattened index of the coordinates it fixes. The manifests are read in worker threads (the
reader's API is synchronous); an array's written chunks are listed once into two arrays
(numbers and sizes, 16 bytes a chunk) kept in a bounded LRU.
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from refmount.base.errors import FetchError, ReadError
from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.refs.chunkinodes import AID_BITS as _AID_BITS
from refmount.refs.chunkinodes import CHUNK as _CHUNK
from refmount.refs.chunkinodes import CHUNK_TOKEN as _CHUNK_TOKEN
from refmount.refs.chunkinodes import chunk_ino as _chunk_ino
from refmount.refs.chunkinodes import split_ino
from refmount.refs.icechunk.keys import ChunkKeys
from refmount.refs.icechunk.repository import ChunkRef
from refmount.refs.index import KeyIndex
from refmount.refs.model import Ref, ReferenceSetError
from refmount.refs.tree import Entry, KeyTree, Node

ENTRY_BATCH = 256  # entries made between checkpoints while listing
LISTING_BYTES = 256 << 20  # arrays' chunk listings kept (16 bytes a chunk)
LOOKUPS = 65536  # chunk references kept from lookups
LOOKUP_BYTES = 256 << 20  # and the manifest buffers their inline chunks (views) keep alive
THREADS = 4  # manifest reads at once

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkSource:
    """What the tree reads chunks through: the snapshot's ``chunk`` and ``chunks`` (the
    reader's API), and ``to_ref``, a ChunkRef made a reference (raising ReadError when it may
    not be read: ``format.py``)."""

    chunk: Callable[[str, tuple[int, ...]], ChunkRef | None]
    # path -> (coordinates (n, ndim), sizes (n)) arrays, manifest by manifest (chunk_listing)
    listing: Callable[[str], Iterator[tuple[np.ndarray, np.ndarray]]]
    to_ref: Callable[[ChunkRef], Ref]


@dataclass(frozen=True)
class ArrayKeys:
    """An array of the tree: its path (``""`` for an array at the root) and chunk keys."""

    path: str
    keys: ChunkKeys


def _held(found: tuple[ChunkRef | None]) -> int:
    """What a kept lookup holds: an inline chunk that is a view of its manifest holds the
    manifest's buffer (counted for each view of it: an upper bound)."""
    data = found[0].data if found[0] is not None else None
    if isinstance(data, memoryview):
        return memoryview(data.obj).nbytes  # type: ignore[arg-type]
    return 128 + (len(data) if data is not None else 0)


def chunk_size(ref: ChunkRef) -> int:
    return len(ref.data or b"") if ref.kind == "inline" else ref.length


class IcechunkTree:
    """The tree of one snapshot (see the module's docstring)."""

    def __init__(self, metadata: KeyIndex, arrays: list[ArrayKeys], source: ChunkSource) -> None:
        self.meta = KeyTree(metadata)
        self.root = self.meta.root
        self.arrays = arrays
        self.source = source
        if len(arrays) >= 1 << _AID_BITS:
            raise ReferenceSetError(f"more than {(1 << _AID_BITS) - 1} arrays")
        self._array_of_dir: dict[int, int] = {}
        self._array_dir: list[Node] = []
        for aid, array in enumerate(arrays):
            node: Node | None = self.root
            for part in array.path.encode().split(b"/") if array.path else []:
                assert node is not None
                node = self.meta.find(node, part)
            assert node is not None and node.is_dir, array.path
            self._array_of_dir[node.ino] = aid
            self._array_dir.append(node)
        self._limiter = trio.CapacityLimiter(THREADS)
        self._lookups: LRU[tuple[int, int], tuple[ChunkRef | None]] = LRU(
            LOOKUPS, max_weight=LOOKUP_BYTES, weigh=_held, keep_newest=True)
        self._listings: LRU[int, tuple[np.ndarray, np.ndarray]] = LRU(
            max_weight=LISTING_BYTES, weigh=lambda v: v[0].nbytes + v[1].nbytes, keep_newest=True)
        self._listing_locks: dict[int, trio.Lock] = {}
        # Told of each native chunk a reader opens (aid, number): readahead across the
        # array's chunk objects (core/objectreadahead.py), set by the set's core.
        self.on_open: Callable[[int, int], None] | None = None

    def __len__(self) -> int:
        return len(self.meta) + sum(a.keys.count for a in self.arrays)

    # ---- the manifests, off the trio loop ------------------------------------------------
    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        except ReferenceSetError as e:  # a manifest that cannot be read or is malformed
            raise ReadError(str(e)) from None
        except (OSError, TimeoutError) as e:  # storage errors the reader did not name
            text = f"manifest read failed: {type(e).__name__}: {e}".splitlines()[0]
            raise ReadError(redact_url(text)) from None

    async def chunk(self, aid: int, number: int) -> ChunkRef | None:
        """The chunk ``number`` of array ``aid``, None where none was written."""
        known = self._lookups.get((aid, number))
        if known is not None:
            return known[0]
        array = self.arrays[aid]
        found = await self._in_thread(self.source.chunk, array.path, array.keys.coords(number))
        self._lookups.put((aid, number), (found,))
        return found

    async def listing(self, aid: int) -> tuple[np.ndarray, np.ndarray]:
        """The numbers (sorted) and sizes of the written chunks of array ``aid``."""
        known = self._listings.get(aid)
        if known is not None:
            return known
        lock = self._listing_locks.setdefault(aid, trio.Lock())
        async with lock:
            known = self._listings.get(aid)
            if known is None:
                known = await self._in_thread(self._list, aid)
                self._listings.put(aid, known)
        return known

    def listing_now(self, aid: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The listing of array ``aid`` if it is known now (no I/O)."""
        return self._listings.get(aid)

    async def object_refs(self, aid: int, numbers: list[int]) -> list[Ref | None]:
        """The references of the chunks ``numbers`` of array ``aid``, looked up in one worker
        thread and kept like any lookup; None for a chunk that is not a native one (inline,
        virtual: readahead across objects leaves those alone) or was not written."""
        array = self.arrays[aid]
        todo = [n for n in numbers if self._lookups.get((aid, n)) is None]
        if todo:
            found = await self._in_thread(
                lambda: [self.source.chunk(array.path, array.keys.coords(n)) for n in todo])
            for n, chunk in zip(todo, found, strict=True):
                self._lookups.put((aid, n), (chunk,))
        out: list[Ref | None] = []
        for n in numbers:
            known = self._lookups.get((aid, n))
            chunk = known[0] if known is not None else None
            out.append(self.source.to_ref(chunk) if chunk is not None and chunk.kind == "native" else None)
        return out

    def _list(self, aid: int) -> tuple[np.ndarray, np.ndarray]:
        array = self.arrays[aid]
        keys = array.keys
        dims = np.asarray(keys.dims, np.int64)
        numbers: list[np.ndarray] = []
        sizes: list[np.ndarray] = []
        for coords, size in self.source.listing(array.path):
            coords = np.asarray(coords, np.int64).reshape(len(size), keys.ndim)
            inside = np.all(coords < dims, axis=1)  # a chunk outside the grid (an array shrunk
            coords, size = coords[inside], np.asarray(size, np.int64)[inside]  # after): no key
            if keys.ndim:
                numbers.append(np.ravel_multi_index(tuple(coords.T), keys.dims).astype(np.int64))
            else:
                numbers.append(np.zeros(len(size), np.int64))
            sizes.append(size)
        n = np.concatenate(numbers) if numbers else np.zeros(0, np.int64)
        s = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        if len(n) > 1 and not bool(np.all(n[1:] > n[:-1])):
            order = np.argsort(n, kind="stable")
            n, s = n[order], s[order]
            keep = np.concatenate(([True], n[1:] != n[:-1]))
            n, s = n[keep], s[keep]
        return n, s

    # ---- nodes ----------------------------------------------------------------------------
    def _decode(self, ino: int) -> tuple[int, int, int]:
        return split_ino(ino)

    def _file_depth(self, aid: int) -> int:
        return self._array_dir[aid].depth + self.arrays[aid].keys.levels + 1

    def node(self, ino: int) -> Node | None:
        if not ino & _CHUNK:
            return self.meta.node(ino)
        aid, level, p = self._decode(ino)
        if aid >= len(self.arrays):
            return None
        keys = self.arrays[aid].keys
        if level == 0:
            return Node(ino, False, p, self._file_depth(aid)) if p < keys.count else None
        if level > keys.levels or p >= max(int(np.prod(keys.dims[: keys.fixed(level)])), 1):
            return None
        return Node(ino, True, p, self._array_dir[aid].depth + level)

    # ---- lookup ---------------------------------------------------------------------------
    async def lookup(self, parent: Node, name: bytes) -> Node | None:
        if not parent.is_dir:
            return None
        if parent.ino & _CHUNK:
            aid, level, p = self._decode(parent.ino)
        else:
            node = self.meta.find(parent, name)
            aid_or_none = self._array_of_dir.get(parent.ino)
            if node is not None or aid_or_none is None:
                return node
            aid, level, p = aid_or_none, 0, 0
        keys = self.arrays[aid].keys
        try:
            text = name.decode("ascii")
        except UnicodeDecodeError:
            return None
        if keys.nested:
            child = keys.child(level, p, text)
            if child is None:
                return None
            level, q = child
            if level:
                return Node(_chunk_ino(aid, level, q), True, q, parent.depth + 1)
            number = q
        else:
            number_or_none = keys.parse(text)
            if number_or_none is None:
                return None
            number = number_or_none
        if await self.chunk(aid, number) is None:
            return None
        return Node(_chunk_ino(aid, 0, number), False, number, self._file_depth(aid))

    # ---- listing --------------------------------------------------------------------------
    async def entries(self, parent: Node, start: int = 0) -> AsyncIterator[Entry]:
        if parent.ino & _CHUNK:
            aid, level, p = self._decode(parent.ino)
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

    async def _chunk_entries(self, aid: int, level: int, p: int, start: int,
                             depth: int) -> AsyncIterator[Entry]:
        """Children of the array's directory (level 0) or of a chunk directory, resuming
        after the token ``start``: a directory's token is its coordinate + 1, a file's its
        position among the array's written chunks + 1 (above _CHUNK_TOKEN)."""
        keys = self.arrays[aid].keys
        first = max(start - _CHUNK_TOKEN, 0)
        numbers, sizes = await self.listing(aid)
        if keys.nested and level == 0 and keys.prefix:
            if first == 0 and len(numbers):
                yield keys.prefix.encode(), _chunk_ino(aid, 1, 0), True, _CHUNK_TOKEN + 1, 0
            return
        span = keys.span(level)
        lo = int(np.searchsorted(numbers, p * span))
        hi = int(np.searchsorted(numbers, (p + 1) * span))
        k = keys.fixed(level) if level else 0
        if keys.nested and k + 1 < keys.ndim:  # the children are directories
            below = math.prod(keys.dims[k + 1 :])  # chunks below one child
            children = np.unique((numbers[lo:hi] - p * span) // below)
            children = children[children >= first]
            for j, i in enumerate(children.tolist()):
                if j % ENTRY_BATCH == 0:
                    await trio.lowlevel.checkpoint()
                q = p * keys.dims[k] + i
                yield str(i).encode(), _chunk_ino(aid, level + 1, q), True, _CHUNK_TOKEN + i + 1, 0
            return
        for j in range(max(lo, first), hi):
            if (j - lo) % ENTRY_BATCH == 0:
                await trio.lowlevel.checkpoint()
            number = int(numbers[j])
            yield (keys.leaf(number).encode(), _chunk_ino(aid, 0, number), False, _CHUNK_TOKEN + j + 1,
                   int(sizes[j]))

    # ---- references -----------------------------------------------------------------------
    async def _chunk_of(self, node: Node) -> ChunkRef:
        aid, _, number = self._decode(node.ino)
        found = await self.chunk(aid, number)
        if found is None:
            raise FileNotFoundError(node.ino)
        return found

    async def ref(self, node: Node) -> Ref:
        if not node.ino & _CHUNK:
            return await self.meta.ref(node)
        chunk = await self._chunk_of(node)
        if chunk.kind == "native" and self.on_open is not None:
            aid, _, number = self._decode(node.ino)
            self.on_open(aid, number)
        return self.source.to_ref(chunk)

    async def size(self, node: Node) -> int:
        if not node.ino & _CHUNK:
            return await self.meta.size(node)
        return chunk_size(await self._chunk_of(node))

    def parent(self, node: Node) -> Node:
        if not node.ino & _CHUNK:
            return self.meta.parent(node)
        aid, level, p = self._decode(node.ino)
        keys = self.arrays[aid].keys
        if level == 0:
            if not keys.nested:
                return self._array_dir[aid]
            level, p = keys.levels, p // keys.dims[-1] if keys.ndim else 0
            return Node(_chunk_ino(aid, level, p), True, p, node.depth - 1)
        if level == 1:
            return self._array_dir[aid]
        k = keys.fixed(level)
        q = p // keys.dims[k - 1] if k > 0 else 0
        return Node(_chunk_ino(aid, level - 1, q), True, q, node.depth - 1)

    def path(self, node: Node) -> bytes:
        if not node.ino & _CHUNK:
            return self.meta.path(node)
        aid, level, p = self._decode(node.ino)
        array = self.arrays[aid]
        rest = array.keys.key(p) if level == 0 else array.keys.dir_path(level, p)
        return (f"{array.path}/{rest}" if array.path else rest).encode()


def virtual_refusal(url: str, reason: str) -> ReadError:
    """The read error of a virtual chunk that may not be read (EACCES for logs, EIO for readers)."""
    return FetchError(url, reason, errno.EACCES)
