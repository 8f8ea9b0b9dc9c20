"""FUSE operations: translate kernel requests into tree lookups and reader calls.

No parsing or fetching happens here. Every handler goes through ``_guard`` so that any
exception becomes an errno reply and a log line: pyfuse3 ends the whole mount when a
non-FUSEError exception escapes a handler.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, TypeVar

import pyfuse3
import trio

from refmount.base.errors import ReadError
from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.fuse.inodes import SameInodes, VersionInodes
from refmount.refs import Ref, RefKind
from refmount.refs.tree import Node, Tree

if TYPE_CHECKING:  # the read path is imported by whoever builds one (core/setcore.py), not here
    from refmount.base.stats import Stats
    from refmount.core.reader import ReadState, RefReader
    from refmount.decode.codecplan import DecodedArray
    from refmount.decode.decoder import ChunkDecoder
    from refmount.fuse.pagepush import PagePusher

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

XATTR_PREFIX = b"user.refmount."


def _guard(fn: F) -> F:
    @functools.wraps(fn)
    async def wrapper(self: RefFS, *args: Any) -> Any:
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except ReadError as e:
            self.stats.failed(f"({fn.__name__})", e)
            if not e.logged:
                log.error("%s failed: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.reply_errno) from None
        except Exception as e:
            self.stats.failed(f"({fn.__name__})", e)
            log.exception("%s%r raised", fn.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper  # type: ignore[return-value]


def _erofs(name: str) -> Callable[..., Awaitable[Any]]:
    async def handler(self: RefFS, *args: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    handler.__name__ = name
    return handler


class _Handle:
    __slots__ = ("array", "key", "node", "ref", "state")

    def __init__(self, node: Node, ref: Ref, state: ReadState, array: DecodedArray | None = None,
                 key: str = "") -> None:
        self.node = node
        self.ref = ref
        self.state = state
        self.array = array  # a chunk served decoded (-o decode): read through the decoder
        self.key = key


class RefFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        tree: Tree,
        reader: RefReader,
        stats: Stats,
        *,
        uid: int,
        gid: int,
        umask: int,
        attr_timeout: float,
        mtime_ns: int,
        info: dict[str, str],
        pusher: PagePusher | None = None,
        decoder: ChunkDecoder | None = None,
        inodes: VersionInodes | None = None,
        no_open: bool = False,
    ) -> None:
        super().__init__()
        from refmount.core.reader import ReadState
        from refmount.decode.decodedtree import DecodedTree

        self._read_state = ReadState
        # a decoded view's chunks are opened as arrays (-o decode), other trees have none
        self._arrays = tree if isinstance(tree, DecodedTree) else None
        # the kernel's inode numbers <-> the tree's (different when a mount serves several
        # sets or versions: fuse/inodes.py)
        self.inodes: VersionInodes | SameInodes = inodes or SameInodes()
        self.tree = tree
        self.reader = reader
        self.stats = stats
        self.uid, self.gid = uid, gid
        self.file_mode = stat.S_IFREG | (0o666 & ~umask)
        self.dir_mode = stat.S_IFDIR | (0o777 & ~umask)
        self.timeout = attr_timeout
        self.mtime_ns = mtime_ns
        self.info = info  # shown as xattrs on the root
        self.pusher = pusher
        self.decoder = decoder  # with -o decode; the tree is then a DecodedTree
        self._handles: dict[int, _Handle] = {}
        self._opened: dict[int, int] = {}  # inode -> open handles
        # inode -> st_size of a range found to run past the end of its target (see _clip)
        self._clipped: dict[int, int] = {}
        self._settling: dict[int, trio.Event] = {}  # inode -> the kernel is being told its size
        self._background: trio.Nursery | None = None
        self._next_fh = 1
        # no_open (fuse/noopen.py): OPEN is answered ENOSYS, READs come with the inode as
        # their handle; the per-file state lives here, keyed by the kernel's inode number
        self.no_open = no_open
        self._by_inode: LRU[int, _Handle] = LRU(self.INODE_STATES)
        if no_open and pusher is not None:
            pusher.enabled = False  # pushes happen at open, which no longer comes

    INODE_STATES = 1 << 14  # files whose read state is kept with no_open (least recently read dropped)

    def attach(self, nursery: trio.Nursery) -> None:
        """Where kernel notifications that may wait for the kernel run: the daemon's nursery."""
        self._background = nursery

    # ---- attributes ---------------------------------------------------------------------
    def _attr(self, ino: int, is_dir: bool, size: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = self.inodes.outer(ino) if ino else 0
        a.generation = 0
        a.entry_timeout = self.timeout
        a.attr_timeout = self.timeout
        if is_dir:
            a.st_mode = self.dir_mode
            a.st_nlink = 1  # unknown number of subdirectories (find then uses d_type)
            a.st_size = 0
        else:
            a.st_mode = self.file_mode
            a.st_nlink = 1
            if size < 0:  # whole-file target not measured yet: let the kernel ask again
                size = 0
                a.entry_timeout = a.attr_timeout = 0
            a.st_size = size
            a.st_blocks = (size + 511) // 512
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_blksize = 1 << 17
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.mtime_ns
        return a

    async def _node_attr(self, node: Node) -> pyfuse3.EntryAttributes:
        size = 0
        if not node.is_dir:
            size = await self.tree.size(node)
            if size < 0:
                try:
                    size = await self.reader.size(await self.tree.ref(node))
                except ReadError as e:
                    # A listed file always stats: size unknown (0, attributes the kernel may
                    # not cache, as readdir lists it); opening it fails with EIO (``open``).
                    log.error("size of key %s: %s", self.tree.path(node).decode(errors="replace"), e)
                    size = -1
            size = self._clipped.get(node.ino, size)
        return self._attr(node.ino, node.is_dir, size)

    def _node(self, ino: int) -> Node:
        inner = self.inodes.inner(ino)
        node = None if inner is None else self.tree.node(inner)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return node

    # ---- lookups ------------------------------------------------------------------------
    @_guard
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        self.stats.lookups += 1
        debug = log.isEnabledFor(logging.DEBUG)
        began = trio.current_time() if debug else 0.0
        parent = self._node(parent_inode)
        node = await self.tree.lookup(parent, name)
        if node is None:
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = 0  # a negative entry the kernel may cache: the set never changes
            miss.entry_timeout = self.timeout
            return miss
        if self.no_open and not node.is_dir:
            await self._settle_at_lookup(node)
        attr = await self._node_attr(node)
        attr.st_ino = self.inodes.reply(node.ino)  # the kernel holds one more reference
        if debug:  # bench/diagnostics/inflight.py
            log.debug("lookup ino %d: began %.6f, took %.6f s", node.ino, began, trio.current_time() - began)
        return attr

    @_guard
    async def getattr(self, inode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return await self._node_attr(self._node(inode))

    async def forget(self, inode_list: Any) -> None:
        pass  # inode numbers are computed from the index: nothing to free

    # ---- directories --------------------------------------------------------------------
    @_guard
    async def opendir(self, inode: int, ctx: Any) -> int:
        if not self._node(inode).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    @_guard
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        node = self._node(fh)
        # Offsets: 1 and 2 follow "." and ".."; the tree's resume tokens are shifted by 2.
        if start_id < 1 and not pyfuse3.readdir_reply(token, b".", self._attr(node.ino, True, 0), 1):
            return
        if start_id < 2:
            parent = self.tree.parent(node)
            if not pyfuse3.readdir_reply(token, b"..", self._attr(parent.ino, True, 0), 2):
                return
        # readdir_reply copies the attributes into the reply, so one object per kind is
        # reused and only the per-entry fields change: this loop runs for every entry.
        file_attr, dir_attr = self._attr(0, False, 0), self._attr(0, True, 0)
        if self.no_open:  # a file is looked up before it is read: settled there (_settle_at_lookup)
            file_attr.entry_timeout = file_attr.attr_timeout = 0
        clipped = self._clipped
        async with aclosing(self.tree.entries(node, max(start_id - 2, 0))) as entries:
            async for name, ino, is_dir, next_id, size in entries:
                if is_dir:
                    attr = dir_attr
                elif size >= 0:
                    if clipped and ino in clipped:
                        size = clipped[ino]
                    attr = file_attr
                    attr.st_size = size
                    attr.st_blocks = (size + 511) // 512
                else:
                    attr = self._attr(ino, False, size)  # size unknown: uncached attributes
                attr.st_ino = self.inodes.reply(ino)
                if not pyfuse3.readdir_reply(token, name, attr, next_id + 2):
                    self.inodes.unreply(attr.st_ino)  # not sent: the kernel holds no reference
                    break

    async def releasedir(self, fh: int) -> None:
        pass

    # ---- files --------------------------------------------------------------------------
    @_guard
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        if self.no_open:  # the kernel sends no OPEN or RELEASE after this answer
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise pyfuse3.FUSEError(errno.EROFS)
        node = self._node(inode)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        fh = self._next_fh
        self._next_fh += 1
        began = trio.current_time()
        ref = await self.tree.ref(node)
        array = self._arrays.array(node) if self._arrays is not None else None
        key = self.tree.path(node).decode("utf-8", "surrogateescape") if array is not None else ""
        if array is None and ref.kind is RefKind.WHOLE:
            await self.reader.size(ref)  # a target whose size cannot be found is not opened
        others = self._opened.get(inode, 0)
        # Bytes read ahead already go to the page cache now: the read then needs no READ.
        # Only with no other handle open: none of its READs can hold a page (fuse/pagepush.py).
        data = None
        if self.pusher is not None and not others and self.pusher.wanted(inode):
            if array is not None:  # decoded ahead (ChunkDecoder), up to the same size
                data = self.decoder.ready(key) if self.decoder is not None else None
                if data is not None and len(data) > self.reader.PUSH_LIMIT:
                    data = None
            else:
                data = self.reader.ready_whole(ref)
                if data is not None and len(data) != ref.length:
                    data = None
        # A decoded chunk's size comes from its array; a range's is settled before any READ
        # (bytes read ahead in full already settle it).
        if array is None and ref.kind is RefKind.RANGE and data is None:
            await self._settle(node, ref, inode)
        self._handles[fh] = _Handle(node, ref, self._read_state(), array, key)
        self.stats.opens += 1
        self.stats.open_files += 1
        self._opened[inode] = others + 1
        if data is not None and self.pusher is not None:
            self.pusher.push(inode, data)
        if log.isEnabledFor(logging.DEBUG):  # bench/diagnostics/inflight.py draws the timeline from these
            log.debug("open ino %d: pushed %d bytes, began %.6f, took %.6f s", inode,
                      0 if data is None else len(data), began, trio.current_time() - began)
        # The bytes never change: let the kernel keep its page cache across opens.
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @_guard
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        h = self._by_inode.get(fh) if self.no_open else self._handles.get(fh)
        if h is None:
            if not self.no_open:
                raise pyfuse3.FUSEError(errno.EBADF)
            h = await self._inode_handle(fh)
        self.stats.reads += 1
        debug = log.isEnabledFor(logging.DEBUG)
        began = trio.current_time()  # the request latency histogram's start
        try:
            if h.array is not None:
                assert self.decoder is not None
                data = await self.decoder.read(h.key, h.array, h.ref, off, size)
            else:
                data = await self.reader.read(h.ref, off, size, h.state)
        except ReadError as e:  # a decode error is logged with the key and codec by the decoder
            raise self._failed(h.node, e) from None
        if h.array is None and h.ref.kind is RefKind.RANGE and h.node.ino not in self._clipped:
            self._clip(h.node, h.ref)
        self.stats.bytes_read += len(data)
        self.stats.request_latency.observe(trio.current_time() - began)
        if self.pusher is not None and self.pusher.enabled:
            self.pusher.given(self.inodes.outer(h.node.ino))
        if debug:
            log.debug("read ino %d bytes %d-%d: began %.6f, took %.6f s", h.node.ino, off, off + size,
                      began, trio.current_time() - began)
        return data

    async def _inode_handle(self, inode: int) -> _Handle:
        """With no_open: the state of the file ``inode`` (the READ's handle is its inode),
        made at its first READ as ``open`` makes a handle's. A range running past the end of
        its target is found by that READ (``_clip``), a target that cannot be sized fails it."""
        node = self._node(inode)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        ref = await self.tree.ref(node)
        array = self._arrays.array(node) if self._arrays is not None else None
        key = self.tree.path(node).decode("utf-8", "surrogateescape") if array is not None else ""
        h = _Handle(node, ref, self._read_state(), array, key)
        self._by_inode.put(inode, h)
        return h

    async def _settle_at_lookup(self, node: Node) -> None:
        """With no_open, where ``open`` settles a range (``_settle``): before the kernel knows
        the file, so that no READ of it can be sent while it holds the stated length. Listed
        files are given to the kernel with no timeouts, so that their next use looks them up
        here. A range that cannot be read now still looks up; its READs fail (EIO)."""
        if node.ino in self._clipped or (self._arrays is not None and self._arrays.array(node) is not None):
            return
        ref = await self.tree.ref(node)
        if ref.kind is not RefKind.RANGE:
            return
        try:
            await self.reader.settle(ref)
        except ReadError:  # counted and logged when its READ fails
            return
        self._record_clip(node, ref)

    async def _settle(self, node: Node, ref: Ref, inode: int) -> None:
        """Whether a range runs past the end of its target, found out at open, before the
        kernel sends a READ: its ``st_size`` is then the bytes that exist before any page of
        it is cached.

        Found out by a READ instead, it would come too late. The kernel takes a short READ
        as the end of the file and zero-fills the rest of the pages it asked for, but it
        shrinks its size of the file only if the file's attributes did not change while the
        READ was out. Concurrent READs of one file (a reader and the kernel's readahead, or
        several readers) change them for each other, and a READ past the true end shrinks
        the file to where it began, not to the end: readers were then served zero-filled
        pages as data. Settling first, the kernel's cached size is dropped (attributes
        only: no page of the file exists yet) and asked for again at the first read. A
        target that cannot be read (or sized) now is not opened: EIO, as for a whole
        target whose size cannot be found."""
        settling = self._settling.get(node.ino)
        if settling is not None:  # another open is telling the kernel: wait until it has
            await settling.wait()
        if node.ino in self._clipped:
            return
        try:
            await self.reader.settle(ref)
        except ReadError as e:  # as for a whole target whose size cannot be found: not opened
            raise self._failed(node, e) from None
        settling = self._settling.get(node.ino)
        if settling is not None:
            await settling.wait()
        elif self._record_clip(node, ref):
            self._settling[node.ino] = done = trio.Event()
            try:
                with contextlib.suppress(OSError):  # ENOENT: the kernel holds no attributes
                    await trio.to_thread.run_sync(pyfuse3.invalidate_inode, inode, True)
            finally:
                done.set()
                del self._settling[node.ino]

    def _failed(self, node: Node, e: ReadError) -> pyfuse3.FUSEError:
        """Count and log a failed read of ``node`` (unless already logged with more context);
        the errno reply to raise."""
        key = self.tree.path(node).decode(errors="replace")
        self.stats.failed(key, e)
        if not e.logged:
            log.error("read failed: key=%s %s", key, e)
        return pyfuse3.FUSEError(e.reply_errno)

    def _record_clip(self, node: Node, ref: Ref) -> bool:
        """From now on, a range found to run past the end of its target has the ``st_size``
        of the bytes that exist (its reads give those). True if newly found."""
        length = self.reader.clipped(ref)
        if length is None or node.ino in self._clipped:
            return False
        if len(self._clipped) < 1 << 20:  # beyond that, short reads still end the file
            self._clipped[node.ino] = length
        log.warning("key %s: bytes %d-%d of %s run past its end: serving the %d bytes that exist",
                    self.tree.path(node).decode(errors="replace"), ref.offset,
                    ref.offset + ref.length, redact_url(ref.url or ""), length)
        return True

    def _clip(self, node: Node, ref: Ref) -> None:
        """A range found to run past the end of its target by a read, not at open (the
        target shrank since, or another key's reads told its size after this one's open).
        The kernel learns the size from the short READ itself, except in the races
        ``_settle`` describes: ``INVALIDATE_DELAY`` later, from a worker thread (it waits for
        pages that READs still hold), the file's cached attributes and pages are dropped, so
        that a size the kernel kept does not last."""
        if self._record_clip(node, ref) and self._background is not None:
            self._background.start_soon(self._invalidate, self.inodes.outer(node.ino))

    INVALIDATE_DELAY = 1.0

    async def _invalidate(self, ino: int) -> None:
        await trio.sleep(self.INVALIDATE_DELAY)
        # ENOENT: the kernel has forgotten the inode, and will ask when it looks it up again.
        with contextlib.suppress(OSError):
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino, False)

    async def release(self, fh: int) -> None:
        if log.isEnabledFor(logging.DEBUG):  # bench/diagnostics/inflight.py
            log.debug("release fh %d: began %.6f, took 0 s", fh, trio.current_time())
        h = self._handles.pop(fh, None)
        if h is not None:
            self.stats.open_files -= 1
            ino = self.inodes.outer(h.node.ino)
            left = self._opened.pop(ino, 1) - 1
            if left:
                self._opened[ino] = left

    @_guard
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = int(self.info.get("referenced_bytes", "0")) // 4096
        s.f_bfree = s.f_bavail = 0
        s.f_files = len(self.tree)
        s.f_ffree = s.f_favail = 0
        s.f_namemax = 255
        return s

    # ---- extended attributes ------------------------------------------------------------
    async def _xattrs(self, node: Node) -> dict[bytes, bytes]:
        if node.ino == pyfuse3.ROOT_INODE:
            out = {XATTR_PREFIX + k.encode(): v.encode() for k, v in self.info.items()}
            out[XATTR_PREFIX + b"stats"] = json.dumps(self.stats.as_dict()).encode()
            return out
        if node.is_dir:
            return {}
        try:
            ref = await self.tree.ref(node)
        except ReadError:  # a key that may not be read (an unauthorised virtual chunk): listed,
            return {}  # stat-able, no attributes; opening it fails
        if ref.kind is RefKind.INLINE:
            return {XATTR_PREFIX + b"inline": str(ref.length).encode()}
        assert ref.url is not None
        out = {XATTR_PREFIX + b"url": redact_url(ref.url).encode()}
        # With target rules: where it is read (mirrors one per line) and which rule applied.
        for name, value in self.reader.fetcher.describe(ref.url).items():
            out[XATTR_PREFIX + name.encode()] = value.encode()
        if ref.kind is RefKind.RANGE:
            out[XATTR_PREFIX + b"offset"] = str(ref.offset).encode()
            out[XATTR_PREFIX + b"length"] = str(ref.length).encode()
        return out

    @_guard
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        if not name.startswith(XATTR_PREFIX):  # ls -l asks for ACLs and SELinux labels: none
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = (await self._xattrs(self._node(inode))).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @_guard
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return list(await self._xattrs(self._node(inode)))

    # ---- everything that would change the tree: read-only ------------------------------
    setattr = _erofs("setattr")
    mknod = _erofs("mknod")
    mkdir = _erofs("mkdir")
    unlink = _erofs("unlink")
    rmdir = _erofs("rmdir")
    symlink = _erofs("symlink")
    rename = _erofs("rename")
    link = _erofs("link")
    create = _erofs("create")
    write = _erofs("write")
    setxattr = _erofs("setxattr")
    removexattr = _erofs("removexattr")
