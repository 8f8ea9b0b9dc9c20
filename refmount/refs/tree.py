"""The directory tree implied by the sorted keys, with no Python object per key.

Keys are sorted bytewise, so every directory ``a/b/`` is one contiguous run of keys,
found by binary search. Inode numbers are computed, not allocated:

* the root is 1 (FUSE's root inode);
* file = key index ``i``:            ``(i + 1) << 12``
* directory of depth ``d`` (1 ≤ d ≤ 4095) whose first key is ``i``: ``((i + 1) << 12) | d``

so they are stable across remounts of the same set and need no table. (Several
directories can start at the same key — ``a/`` and ``a/b/`` — the depth tells them apart.)

:class:`Tree` is what the FUSE layer asks of any tree. A format read lazily brings its own
(the Parquet ``ChunkTree`` in ``refs/chunktree.py``, built on a ``KeyTree`` of its metadata
keys); each format's ``open_tree`` says which (``refs/format.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # types only: the formats in refs/ build their trees on this module
    from refmount.refs.index import KeyIndex
    from refmount.refs.model import Ref

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


class Tree(Protocol):
    """The directory tree of a reference set, as the FUSE layer (``RefFS``) uses it.
    Inode numbers are computed from the set (stable across remounts); the async methods
    may load parts of the set on demand."""

    root: Node

    def node(self, ino: int) -> Node | None:
        """The node of an inode number, None if the set has none."""

    def path(self, node: Node) -> bytes:
        """The key of a file, or the path of a directory (``b""`` for the root)."""

    def parent(self, node: Node) -> Node:
        """The directory holding ``node`` (the root for the root)."""

    def __len__(self) -> int:
        """The number of keys."""

    async def lookup(self, parent: Node, name: bytes) -> Node | None:
        """The child ``name`` of ``parent``, None if there is none."""

    def entries(self, parent: Node, start: int = 0) -> AsyncIterator[Entry]:
        """The children of ``parent``, resuming after the token ``start`` (0: from the first)."""

    async def ref(self, node: Node) -> Ref:
        """The reference of a file (FileNotFoundError if it has gone)."""

    async def size(self, node: Node) -> int:
        """A file's size, or -1 when it is a whole-file target not yet measured."""


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
        # No upper bound of the directory's run is needed: every key from its first on that
        # is not in it sorts after all that are ("a/b0" > "a/b/..."), so ``target`` and
        # ``target/`` are found from the run's start alone (one binary search fewer).
        target = self.dir_prefix(parent) + name
        idx = self.index
        n = idx.n
        j = idx.bisect(target, max(parent.index, 0))
        if j < n and idx.key(j) == target:
            return Node(self.file_ino(j), False, j, parent.depth + 1)
        sub = target + b"/"
        j = idx.bisect(sub, j)
        if j < n and idx.key(j).startswith(sub):
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
        return self.ref_now(node)

    async def size(self, node: Node) -> int:
        return self.size_now(node)

    # ---- the same, synchronous: every answer is in the mapped index ---------------------
    def ref_now(self, node: Node) -> Ref:
        return self.index.ref(node.index, view=True)

    def size_now(self, node: Node) -> int:
        """File size, or -1 when it is a whole-file target not yet measured."""
        return self.index.size(node.index)

    def __len__(self) -> int:
        return self.index.n
