"""Inode numbers of a mount serving several sets, or several versions of one.

Each set's tree computes its own inode numbers from its index (``refs/tree.py``,
``refs/chunktree.py``), over all 64 bits: two sets, or two versions of one, use the same
numbers for different files. A mount of several sets therefore gives the kernel numbers of
its own: :class:`InodeTable` hands out one per (version id, the tree's number) the kernel
is told of, and frees it when the kernel forgets it (FUSE's lookup count: each ``lookup``
reply and each ``readdirplus`` entry is one reference, ``forget`` gives them back).
:class:`VersionInodes` is one version's view of the table, what ``fs.RefFS`` asks through
its ``inodes`` parameter. Inode 1 is the mount's root: the catalogue's directory, or, for a
single set served with ``reload``, the root of its current version.
"""

from __future__ import annotations

ROOT = 1


class InodeTable:
    """(version id, inner inode) <-> the inode number the kernel knows, with lookup counts."""

    def __init__(self) -> None:
        self._outer: dict[tuple[int, int], int] = {}
        self._inner: dict[int, list[int]] = {}  # outer -> [vid, inner, lookup count]
        self._next = ROOT + 1

    def __len__(self) -> int:
        return len(self._inner)

    def get(self, outer: int) -> tuple[int, int] | None:
        """The (version id, inner inode) of a number the kernel holds, None if unknown."""
        e = self._inner.get(outer)
        return None if e is None else (e[0], e[1])

    def outer(self, vid: int, inner: int) -> int:
        """The number of (vid, inner), made if new (with no reference yet)."""
        key = (vid, inner)
        n = self._outer.get(key)
        if n is None:
            n = self._next
            self._next += 1
            self._outer[key] = n
            self._inner[n] = [vid, inner, 0]
        return n

    def reply(self, vid: int, inner: int) -> int:
        """The number of (vid, inner), told to the kernel once more (a lookup reference)."""
        n = self.outer(vid, inner)
        self._inner[n][2] += 1
        return n

    def forget(self, outer: int, count: int) -> None:
        """The kernel gives back ``count`` references; at none the number is freed."""
        e = self._inner.get(outer)
        if e is None:
            return
        e[2] -= count
        if e[2] <= 0:
            del self._inner[outer]
            del self._outer[(e[0], e[1])]


class VersionInodes:
    """One version's view of the table (``fs.RefFS``'s ``inodes``): ``inner``/``outer``
    translate, ``reply`` counts a reference the kernel is given, ``unreply`` takes back one
    that was not sent (a full ``readdir`` buffer). With ``root_is_mount`` the version's root
    is the mount's root, inode 1."""

    def __init__(self, table: InodeTable, vid: int, *, root_is_mount: bool) -> None:
        self.table = table
        self.vid = vid
        self.root_is_mount = root_is_mount

    def inner(self, outer: int) -> int | None:
        if outer == ROOT:
            return ROOT if self.root_is_mount else None
        e = self.table.get(outer)
        return e[1] if e is not None and e[0] == self.vid else None

    def outer(self, inner: int) -> int:
        if inner == ROOT and self.root_is_mount:
            return ROOT
        return self.table.outer(self.vid, inner)

    def reply(self, inner: int) -> int:
        if inner == ROOT and self.root_is_mount:
            return ROOT
        return self.table.reply(self.vid, inner)

    def unreply(self, outer: int) -> None:
        if outer != ROOT:
            self.table.forget(outer, 1)


class SameInodes:
    """A mount of one set: the tree's numbers are the kernel's."""

    @staticmethod
    def inner(outer: int) -> int | None:
        return outer

    @staticmethod
    def outer(inner: int) -> int:
        return inner

    @staticmethod
    def reply(inner: int) -> int:
        return inner

    @staticmethod
    def unreply(outer: int) -> None:
        pass
