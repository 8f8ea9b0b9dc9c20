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

from collections.abc import Iterator
from dataclasses import dataclass

from .refs import KeyIndex, Ref, RefKind

ROOT_INODE = 1
_DEPTH_BITS = 12
_DEPTH_MASK = (1 << _DEPTH_BITS) - 1


@dataclass(frozen=True, slots=True)
class Node:
    ino: int
    is_dir: bool
    index: int  # key index (file) or first key index (dir); -1 for the root
    depth: int  # components in the path (root 0)


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
    def lookup(self, parent: Node, name: bytes) -> Node | None:
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

    def children(self, parent: Node, start: int = 0) -> Iterator[tuple[bytes, Node, int]]:
        """Entries of ``parent`` as (name, node, next_token), resuming after ``start``
        (0 = from the beginning; tokens are key positions + 1, so they stay valid)."""
        lo, hi, prefix = self._dir_range(parent)
        idx = self.index
        plen = len(prefix)
        depth = parent.depth + 1
        j = max(lo, start - 1) if start else lo
        while j < hi:
            rest = idx.key(j)[plen:]
            slash = rest.find(b"/")
            if slash < 0:
                yield rest, Node(self.file_ino(j), False, j, depth), j + 2
                j += 1
            else:
                name = rest[:slash]
                nxt = idx.bisect(prefix + name + b"0", j + 1, hi)
                yield name, Node(self.dir_ino(j, depth), True, j, depth), nxt + 1
                j = nxt

    def ref(self, node: Node) -> Ref:
        return self.index.ref(node.index)

    def known_size(self, node: Node) -> int:
        """File size, or -1 when it is a whole-file target not yet measured."""
        return self.index.size(node.index)

    def kind(self, node: Node) -> RefKind:
        return self.index.kind(node.index)

    def __len__(self) -> int:
        return self.index.n
