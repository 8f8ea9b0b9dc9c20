"""FUSE operations of a mount serving sets through ``sets.Sets``: route each request to the
version it concerns and let that version's ``fs.RefFS`` answer it.

With ``-o catalog`` the root lists the catalogue's sets, one directory each, without opening
any; the first request inside one opens it. A single set served with ``reload`` is one slot
whose current version is the mount's root. Inode numbers are the table's (``fuse/inodes.py``); an
open file holds its version (``Sets.hold``), so it reads that version's bytes until it is
closed, whatever was swapped in meanwhile. When the version shown for a set changes (a
reload) or a set appears or disappears, the kernel's cached names are dropped
(``invalidate_entry``): the next path lookup finds the new version.
"""

from __future__ import annotations

import errno
import json
import logging
import stat
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import pyfuse3
import trio

from refmount.base.stats import Stats
from refmount.fuse.inodes import ROOT, InodeTable, VersionInodes
from refmount.fuse.operations import XATTR_PREFIX, RefFS, _guard
from refmount.fuse.pagepush import PagePusher
from refmount.sets.opensets import Sets
from refmount.sets.setslots import SetEvents, SetSlot, SetUnavailable, SetVersion

log = logging.getLogger(__name__)

__all__ = ["CatalogFS"]

# Names at the root dropped from the kernel's cache when a single set's version changes;
# beyond that many, the names of the old version stay cached until attr_timeout.
MAX_INVALIDATED = 100_000

Invalidate = Callable[[int, bytes], None]


def _invalidate_entry(parent: int, name: bytes) -> None:
    pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)


ROOT_LISTINGS = 1 << 63  # handles of root listings: above every inode number (fuse/inodes.py)


class CatalogFS(pyfuse3.Operations, SetEvents):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, sets: Sets, *, single: bool, uid: int, gid: int, umask: int,
                 attr_timeout: float, page_push: bool, mtime_ns: int, info: dict[str, str],
                 describe: Callable[[], dict[str, Any]] | None = None,
                 invalidate: Invalidate = _invalidate_entry) -> None:
        super().__init__()
        self.sets = sets
        self.single = single
        self.uid, self.gid, self.umask = uid, gid, umask
        self.timeout = attr_timeout
        self.page_push = page_push
        self.mtime_ns = mtime_ns
        self.info = info  # the mount's (the catalogue's), xattrs of the root
        self.describe = describe or sets.describe
        self.stats = Stats()  # requests that fail before they reach a set
        self.inodes = InodeTable()
        self._invalidate = invalidate
        self._files: dict[int, tuple[SetVersion, int]] = {}
        self._next_fh = 1
        # open listings of the root: handle -> the sorted names when it was opened (a list
        # Sets replaces, never changes), so that a listing's offsets stay positions in one list
        # while sets come and go: no name twice, none skipped that stayed
        self._listings: dict[int, list[str]] = {}
        self._next_listing = ROOT_LISTINGS
        self._nursery: trio.Nursery | None = None
        self.dir_mode = stat.S_IFDIR | (0o777 & ~umask)
        sets.events = self

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    # ---- SetEvents: versions made and replaced, sets added and removed ----------------------
    def made(self, version: SetVersion) -> None:
        core = version.core
        version.front = RefFS(
            core.tree, core.reader, core.stats,
            pusher=PagePusher(pyfuse3.notify_store, core.stats) if self.page_push else None,
            uid=self.uid, gid=self.gid, umask=self.umask, attr_timeout=self.timeout,
            mtime_ns=core.mtime_ns, info=core.info, decoder=core.decoder,
            inodes=VersionInodes(self.inodes, version.vid, root_is_mount=self.single))
        if self._nursery is not None:
            version.front.attach(self._nursery)

    def replaced(self, slot: SetSlot, old_vid: int, new_vid: int) -> None:
        if not self.single:
            self._invalidate(ROOT, slot.name.encode("utf-8", "surrogateescape"))
        elif self._nursery is not None:
            self._nursery.start_soon(self._invalidate_root_names, slot)

    def added(self, slot: SetSlot) -> None:
        self._invalidate(ROOT, slot.name.encode("utf-8", "surrogateescape"))  # a negative entry

    def removed(self, slot: SetSlot) -> None:
        self._invalidate(ROOT, slot.name.encode("utf-8", "surrogateescape"))

    async def _invalidate_root_names(self, slot: SetSlot) -> None:
        """A single set's new version: the names at the mount's root, old and new, are looked
        up again (old versions' names from their trees, while they are open)."""
        names: set[bytes] = set()
        for version in list(self.sets.versions_of(slot.name)):
            tree = version.core.tree
            async with aclosing(tree.entries(tree.root)) as entries:
                async for name, *_ in entries:
                    names.add(name)
                    if len(names) >= MAX_INVALIDATED:
                        break
        for name in names:
            self._invalidate(ROOT, name)

    # ---- routing ----------------------------------------------------------------------------
    async def _version(self, ino: int) -> SetVersion:
        """The version an inode number belongs to (opening its set if needed)."""
        try:
            if ino == ROOT:
                if not self.single:
                    raise pyfuse3.FUSEError(errno.EISDIR)
                slot = self.sets.slot("")
                version = None if slot is None else await self.sets.open(slot)
            else:
                where = self.inodes.get(ino)
                version = None if where is None else await self.sets.get(where[0])
        except SetUnavailable as e:
            log.error("%s", e)
            raise pyfuse3.FUSEError(errno.EIO) from None
        if version is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return version

    def _catalogue_root(self, ino: int) -> bool:
        return ino == ROOT and not self.single

    def _unopened_set_dir(self, ino: int) -> SetSlot | None:
        """The slot whose directory ``ino`` is, when that set is not open: answered without
        opening it."""
        if self.single:
            return None
        where = self.inodes.get(ino)
        if where is None or where[1] != ROOT or self.sets.version(where[0]) is not None:
            return None
        return self.sets.slot_of(where[0])

    def _dir_attr(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = self.timeout
        a.st_mode = self.dir_mode
        a.st_nlink = 1
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_blksize = 1 << 17
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.mtime_ns
        return a

    # ---- lookups and attributes -------------------------------------------------------------
    @_guard
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        if self._catalogue_root(parent_inode):
            slot = self.sets.slot(name.decode("utf-8", "surrogateescape"))
            if slot is None:
                miss = pyfuse3.EntryAttributes()
                miss.st_ino = 0
                miss.entry_timeout = 0  # sets come and go: no negative entry is kept
                return miss
            return self._dir_attr(self.inodes.reply(slot.vid, ROOT))
        version = await self._version(parent_inode)
        async with self.sets.using(version):
            return await version.front.lookup(parent_inode, name, ctx)

    @_guard
    async def getattr(self, inode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        if self._catalogue_root(inode) or self._unopened_set_dir(inode) is not None:
            return self._dir_attr(inode)
        version = await self._version(inode)
        async with self.sets.using(version):
            return await version.front.getattr(inode, ctx)

    async def forget(self, inode_list: Any) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)

    # ---- directories -----------------------------------------------------------------------
    @_guard
    async def opendir(self, inode: int, ctx: Any) -> int:
        if self._catalogue_root(inode):
            fh = self._next_listing
            self._next_listing += 1
            self._listings[fh] = self.sets.names()
            return fh
        version = await self._version(inode)
        async with self.sets.using(version):
            return await version.front.opendir(inode, ctx)

    @_guard
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        names = self._listings.get(fh)
        if names is None:
            version = await self._version(fh)
            async with self.sets.using(version):
                await version.front.readdir(fh, start_id, token)
            return
        root = self._dir_attr(ROOT)
        if start_id < 1 and not pyfuse3.readdir_reply(token, b".", root, 1):
            return
        if start_id < 2 and not pyfuse3.readdir_reply(token, b"..", root, 2):
            return
        for i in range(max(start_id - 2, 0), len(names)):
            slot = self.sets.slot(names[i])
            if slot is None:  # removed since the listing began
                continue
            attr = self._dir_attr(self.inodes.reply(slot.vid, ROOT))
            if not pyfuse3.readdir_reply(token, names[i].encode("utf-8", "surrogateescape"), attr, i + 3):
                self.inodes.forget(attr.st_ino, 1)
                break

    async def releasedir(self, fh: int) -> None:
        self._listings.pop(fh, None)

    # ---- files -------------------------------------------------------------------------------
    @_guard
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if self._catalogue_root(inode):
            raise pyfuse3.FUSEError(errno.EISDIR)
        version = await self._version(inode)
        async with self.sets.using(version):
            info = await version.front.open(inode, flags, ctx)
            self.sets.hold(version)  # before the request ends: never closed under the file
        fh = self._next_fh
        self._next_fh += 1
        self._files[fh] = (version, info.fh)
        info.fh = fh
        return info

    @_guard
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        found = self._files.get(fh)
        if found is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        version, inner = found
        async with self.sets.using(version):
            return await version.front.read(inner, off, size)

    async def release(self, fh: int) -> None:
        found = self._files.pop(fh, None)
        if found is not None:
            version, inner = found
            await version.front.release(inner)
            self.sets.drop(version)

    @_guard
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_files = len(self.sets.slots)
        s.f_namemax = 255
        return s

    # ---- extended attributes ----------------------------------------------------------------
    def _root_xattrs(self) -> dict[bytes, bytes]:
        out = {XATTR_PREFIX + k.encode(): v.encode() for k, v in self.info.items()}
        counters = self.stats.as_dict()
        for version in self.sets.open_versions():
            for k, v in version.core.stats.as_dict().items():
                if isinstance(v, int) and k != "started" and isinstance(counters.get(k), int):
                    counters[k] += v
        counters.update(self.describe())
        out[XATTR_PREFIX + b"stats"] = json.dumps(counters).encode()
        return out

    async def _xattrs(self, inode: int) -> dict[bytes, bytes]:
        if inode == ROOT and not self.single:
            return self._root_xattrs()
        slot = self._unopened_set_dir(inode)
        if slot is not None:
            return _slot_xattrs(slot)
        version = await self._version(inode)
        async with self.sets.using(version):
            names = await version.front.listxattr(inode, None)
            out = {n: await version.front.getxattr(inode, n, None) for n in names}
        if version.front.inodes.inner(inode) == ROOT:
            slot = self.sets.slot(version.name)
            if slot is not None:
                out.update(_slot_xattrs(slot, version))
            if self.single:
                out[XATTR_PREFIX + b"stats"] = json.dumps(
                    {**json.loads(out.get(XATTR_PREFIX + b"stats", b"{}")), **self.describe()}).encode()
        return out

    @_guard
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        value = (await self._xattrs(inode)).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @_guard
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return list(await self._xattrs(inode))

    setattr = RefFS.setattr
    mknod = RefFS.mknod
    mkdir = RefFS.mkdir
    unlink = RefFS.unlink
    rmdir = RefFS.rmdir
    symlink = RefFS.symlink
    rename = RefFS.rename
    link = RefFS.link
    create = RefFS.create
    write = RefFS.write
    setxattr = RefFS.setxattr
    removexattr = RefFS.removexattr


def _slot_xattrs(slot: SetSlot, version: SetVersion | None = None) -> dict[bytes, bytes]:
    """A set directory's own xattrs: its state, version, last reload and last error."""
    out = {XATTR_PREFIX + b"set." + k.encode(): str(v).encode() for k, v in slot.describe().items()}
    out[XATTR_PREFIX + b"set.source"] = _redacted(slot.entry.source)
    if version is not None and version is not slot.current:  # a replaced version still read
        out[XATTR_PREFIX + b"set.version"] = str(version.number).encode()
    return out


def _redacted(url: str) -> bytes:
    from refmount.base.redact import redact_url

    return redact_url(url).encode()
