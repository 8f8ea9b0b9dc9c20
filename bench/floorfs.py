"""``python -m bench.floorfs DATA CHUNKS CHUNK MNT [--no-open] [--debug]``: the floor a FUSE
daemon in Python can reach, for ``bench.chunkcost``: a minimal pyfuse3 filesystem on plain
trio with the bytes in memory, ``x/0`` … ``x/N-1`` being the ``CHUNK``-byte pieces of ``DATA``.

It has refmount's FUSE settings (``ro``, ``default_permissions``, one-day entry and attribute
timeouts, negative entries cached, ``keep_cache`` at open, 128 KiB ``st_blksize``) and does no
more work than a request needs: no tree, no reader, no counters. ``--no-open`` answers ``OPEN``
with ``ENOSYS`` (the kernel then sends none after), which needs refmount's pyfuse3 patch
(``patches/pyfuse3-noopen.patch``) to tell which file a ``READ`` is for. ``--debug``: libfuse
logs every request on stderr. Unmounting (``fusermount3 -u``) ends it.
"""

from __future__ import annotations

import errno
import stat
import sys

import pyfuse3
import trio

DAY = 86400.0
DIR_INO = 2
FIRST = 3  # the inode of x/0


class FloorFS(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, data: bytes, chunks: int, chunk: int, no_open: bool) -> None:
        super().__init__()
        self.view = memoryview(data)
        self.chunks, self.chunk, self.no_open = chunks, chunk, no_open
        self.names = {str(i).encode(): FIRST + i for i in range(chunks)}

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = DAY
        if ino < FIRST:
            a.st_mode = stat.S_IFDIR | 0o755
        else:
            a.st_mode = stat.S_IFREG | 0o644
            a.st_size = self.chunk
            a.st_blocks = (self.chunk + 511) // 512
        a.st_nlink = 1
        a.st_blksize = 1 << 17
        return a

    async def lookup(self, parent_inode: int, name: bytes, ctx: object) -> pyfuse3.EntryAttributes:
        ino = None
        if parent_inode == pyfuse3.ROOT_INODE and name == b"x":
            ino = DIR_INO
        elif parent_inode == DIR_INO:
            ino = self.names.get(name)
        if ino is None:
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = 0
            miss.entry_timeout = DAY
            return miss
        return self._attr(ino)

    async def getattr(self, inode: int, ctx: object) -> pyfuse3.EntryAttributes:
        return self._attr(inode)

    async def opendir(self, inode: int, ctx: object) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: object) -> None:
        if fh == pyfuse3.ROOT_INODE:
            if start_id < 1:
                pyfuse3.readdir_reply(token, b"x", self._attr(DIR_INO), 1)
            return
        for i in range(start_id, self.chunks):
            if not pyfuse3.readdir_reply(token, str(i).encode(), self._attr(FIRST + i), i + 1):
                return

    async def open(self, inode: int, flags: int, ctx: object) -> pyfuse3.FileInfo:
        if self.no_open:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> memoryview:
        start = (fh - FIRST) * self.chunk
        off = min(off, self.chunk)
        return self.view[start + off: start + min(off + size, self.chunk)]


def main(argv: list[str]) -> int:
    data, chunks, chunk, mnt = argv[0], int(argv[1]), int(argv[2]), argv[3]
    no_open, debug = "--no-open" in argv, "--debug" in argv
    if no_open and not getattr(pyfuse3, "REFMOUNT_READ_INODE", False):
        print("floorfs: --no-open needs pyfuse3 with patches/pyfuse3-noopen.patch", file=sys.stderr)
        return 2
    with open(data, "rb") as f:
        blob = f.read(chunks * chunk)
    fs = FloorFS(blob, chunks, chunk, no_open)
    opts = {"ro", "nodev", "nosuid", "default_permissions", "fsname=floorfs", "subtype=floorfs"}
    if debug:
        opts.add("debug")
    pyfuse3.init(fs, mnt, opts)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
