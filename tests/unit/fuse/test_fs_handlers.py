"""RefFS's handlers called directly, without FUSE: the file system fuse/daemon.py builds over a small
local reference set, each request awaited as pyfuse3 would await it.

pyfuse3's structures (EntryAttributes, FileInfo, RequestContext) need no mount. Two calls do:

* ``readdir_reply`` writes into the kernel's reply buffer; a ``ReaddirToken`` made without a
  session has none (every entry answers "full"), so ``readdir`` is run against a shim that
  collects the entries and can stop after N of them, as a full buffer does.
* ``invalidate_inode`` without a session raises ``OSError(EINVAL)``, which ``_settle`` already
  takes as "the kernel holds nothing to drop": the settle-at-open path runs unchanged.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyfuse3
import pytest
import trio

from refmount.config import MountConfig, apply_options
from refmount.fuse.daemon import build_filesystem
from refmount.fuse.operations import XATTR_PREFIX, RefFS
from refmount.serving.preparation import index_source

ROOT = pyfuse3.ROOT_INODE
DATA = bytes(range(256)) * 40  # data.bin: 10,240 bytes, every byte tells its offset mod 256
CTX = pyfuse3.RequestContext()

REFS = {
    "version": 1,
    "refs": {
        ".zgroup": '{"zarr_format":2}',
        "a/inline": "hello",
        "a/b/range": ["data.bin", 100, 50],
        "whole": ["data.bin"],
        "past_end": ["data.bin", 10_000, 1_000],  # 240 of its 1,000 bytes exist
        "broken/range": ["missing.bin", 0, 10],
        "broken/whole": ["missing.bin"],
    },
}


def _fs(tmp_path: Path, *options: str) -> RefFS:
    (tmp_path / "data.bin").write_bytes(DATA)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(REFS))
    cfg = MountConfig(source=str(source), mountpoint=str(tmp_path / "mnt"))
    apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", *options])
    return build_filesystem(cfg, index_source(cfg)).fs


@pytest.fixture
def ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RefFS:
    """The file system without no_open: files are opened (fuse/noopen.py)."""
    fs = _fs(tmp_path)
    assert not fs.no_open
    return fs


@pytest.fixture
def noopen_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RefFS:
    """The file system with no_open: OPEN answered ENOSYS, READs given the inode."""
    monkeypatch.setattr(pyfuse3, "REFMOUNT_READ_INODE", True, raising=False)
    monkeypatch.delenv("REFMOUNT_PYFUSE3_STOCK", raising=False)
    fs = _fs(tmp_path, "no_open")
    assert fs.no_open
    return fs


def run(ops: RefFS, body: Callable[[RefFS], Awaitable[Any]]) -> Any:
    """``body(ops)`` under trio, with the background nursery the daemon gives the file system."""

    async def main() -> Any:
        async with trio.open_nursery() as nursery:
            ops.attach(nursery)
            ops.reader.attach(nursery)
            ops.reader.fetcher.attach(nursery)
            result = await body(ops)
            nursery.cancel_scope.cancel()
            return result

    return trio.run(main)


async def errno_of(call: Awaitable[Any]) -> int:
    with pytest.raises(pyfuse3.FUSEError) as e:
        await call
    return e.value.errno


async def resolve(ops: RefFS, path: str) -> pyfuse3.EntryAttributes:
    attr = None
    ino = ROOT
    for name in path.split("/"):
        attr = await ops.lookup(ino, name.encode(), CTX)
        assert attr.st_ino, f"{path}: no {name!r}"
        ino = attr.st_ino
    assert attr is not None
    return attr


async def cat(ops: RefFS, path: str, chunk: int = 4096) -> bytes:
    """open, read in ``chunk``-sized pieces until a short one, release: like ``cat``."""
    ino = (await resolve(ops, path)).st_ino
    fi = await ops.open(ino, os.O_RDONLY, CTX)
    try:
        out = b""
        while piece := bytes(await ops.read(fi.fh, len(out), chunk)):
            out += piece
            if len(piece) < chunk:
                break
        return out
    finally:
        await ops.release(fi.fh)


# ---- lookup / getattr ------------------------------------------------------------------------


def test_lookup_and_getattr_give_the_tree(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        a = await resolve(ops, "a")
        assert stat.S_ISDIR(a.st_mode) and a.st_size == 0
        r = await resolve(ops, "a/b/range")
        assert stat.S_ISREG(r.st_mode) and r.st_size == 50
        assert (await ops.getattr(r.st_ino, CTX)).st_size == 50
        assert (await resolve(ops, "a/inline")).st_size == 5
        assert (await resolve(ops, "whole")).st_size == len(DATA)  # measured on lookup
        assert (await ops.getattr(ROOT, CTX)).st_ino == ROOT

    run(ops, body)


def test_missing_names_are_negative_entries_and_unknown_inodes_enoent(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        miss = await ops.lookup(ROOT, b"nope", CTX)
        assert miss.st_ino == 0 and miss.entry_timeout > 0  # cached ENOENT: the set never changes
        a = (await resolve(ops, "a")).st_ino
        assert (await ops.lookup(a, b"inline.x", CTX)).st_ino == 0
        assert (await ops.lookup(a, b"..", CTX)).st_ino == 0  # no dot entries by lookup
        file_ino = (await resolve(ops, "a/inline")).st_ino
        assert (await ops.lookup(file_ino, b"x", CTX)).st_ino == 0  # below a file: nothing
        unknown = 1 << 60
        assert await errno_of(ops.getattr(unknown, CTX)) == errno.ENOENT
        assert await errno_of(ops.lookup(unknown, b"a", CTX)) == errno.ENOENT
        assert await errno_of(ops.open(unknown, os.O_RDONLY, CTX)) == errno.ENOENT

    run(ops, body)


# ---- readdir -----------------------------------------------------------------------------------


@dataclass
class Token:
    """Stands in for pyfuse3's ReaddirToken: room for ``room`` entries."""

    room: int = 1 << 30
    entries: list[tuple[bytes, int, bool, int]] | None = None

    def reply(self, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int) -> bool:
        if self.entries is None:
            self.entries = []
        if len(self.entries) >= self.room:
            return False
        self.entries.append((name, attr.st_ino, stat.S_ISDIR(attr.st_mode), next_id))
        return True


@pytest.fixture
def readdir_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyfuse3, "readdir_reply", lambda token, name, attr, next_id:
                        token.reply(name, attr, next_id))


async def listing(ops: RefFS, ino: int, start: int = 0, room: int = 1 << 30) -> list:
    fh = await ops.opendir(ino, CTX)
    token = Token(room)
    await ops.readdir(fh, start, token)
    await ops.releasedir(fh)
    return token.entries or []


def test_readdir_lists_dot_entries_then_children_and_resumes(ops: RefFS, readdir_shim: None) -> None:
    async def body(ops: RefFS) -> None:
        entries = await listing(ops, ROOT)
        names = [e[0] for e in entries]
        assert names[:2] == [b".", b".."]
        assert sorted(names[2:]) == sorted([b".zgroup", b"a", b"whole", b"past_end", b"broken"])
        kinds = {e[0]: e[2] for e in entries}
        assert kinds[b"a"] and kinds[b"broken"] and not kinds[b".zgroup"] and not kinds[b"whole"]
        for name, ino, is_dir, _next in entries[2:]:  # readdir and lookup agree
            attr = await ops.lookup(ROOT, name, CTX)
            assert attr.st_ino == ino and stat.S_ISDIR(attr.st_mode) == is_dir
        # A full buffer after 3 entries; the kernel then asks again from the last offset.
        first = await listing(ops, ROOT, room=3)
        assert first == entries[:3]
        rest = await listing(ops, ROOT, start=first[-1][3])
        assert first + rest == entries
        for i in range(len(entries)):  # resuming after any entry gives exactly the rest
            assert await listing(ops, ROOT, start=entries[i][3]) == entries[i + 1:]
        b = (await resolve(ops, "a/b")).st_ino
        assert [e[0] for e in await listing(ops, b)] == [b".", b"..", b"range"]
        assert (await listing(ops, b))[1][1] == (await resolve(ops, "a")).st_ino  # ".." is a

    run(ops, body)


def test_opendir_of_a_file_is_enotdir(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        ino = (await resolve(ops, "whole")).st_ino
        assert await errno_of(ops.opendir(ino, CTX)) == errno.ENOTDIR

    run(ops, body)


# ---- open / read / release -----------------------------------------------------------------


def test_reads_of_inline_range_and_whole_keys(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        assert await cat(ops, ".zgroup") == b'{"zarr_format":2}'
        assert await cat(ops, "a/inline") == b"hello"
        assert await cat(ops, "a/b/range") == DATA[100:150]
        assert await cat(ops, "a/b/range", chunk=7) == DATA[100:150]
        assert await cat(ops, "whole") == DATA
        assert await cat(ops, "whole", chunk=1000) == DATA
        # reads at any offset, past the end included
        ino = (await resolve(ops, "a/b/range")).st_ino
        fi = await ops.open(ino, os.O_RDONLY, CTX)
        assert fi.keep_cache  # the bytes never change
        assert bytes(await ops.read(fi.fh, 10, 5)) == DATA[110:115]
        assert bytes(await ops.read(fi.fh, 45, 100)) == DATA[145:150]
        assert bytes(await ops.read(fi.fh, 50, 10)) == b""
        assert bytes(await ops.read(fi.fh, 1 << 40, 10)) == b""
        await ops.release(fi.fh)
        assert await errno_of(ops.read(fi.fh, 0, 10)) == errno.EBADF  # released
        assert ops.stats.open_files == 0

    run(ops, body)


def test_write_opens_are_erofs_and_directories_eisdir(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        ino = (await resolve(ops, "whole")).st_ino
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
            assert await errno_of(ops.open(ino, flags, CTX)) == errno.EROFS, flags
        a = (await resolve(ops, "a")).st_ino
        assert await errno_of(ops.open(a, os.O_RDONLY, CTX)) == errno.EISDIR
        assert await errno_of(ops.open(ROOT, os.O_RDONLY, CTX)) == errno.EISDIR
        # every call that would change the tree
        assert await errno_of(ops.mkdir(ROOT, b"d", 0o755, CTX)) == errno.EROFS
        assert await errno_of(ops.unlink(ROOT, b"whole", CTX)) == errno.EROFS
        assert await errno_of(ops.create(ROOT, b"f", 0o644, os.O_WRONLY, CTX)) == errno.EROFS
        assert await errno_of(ops.setxattr(ino, b"user.x", b"1", CTX)) == errno.EROFS
        assert ops.stats.open_files == 0  # nothing was opened

    run(ops, body)


def test_a_failing_target_gives_eio_to_its_reads_only(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        # A range: EIO, at open (when its settling read fails) or else at every read.
        ino = (await resolve(ops, "broken/range")).st_ino
        try:
            fi = await ops.open(ino, os.O_RDONLY, CTX)
        except pyfuse3.FUSEError as e:
            assert e.errno == errno.EIO
        else:
            assert await errno_of(ops.read(fi.fh, 0, 10)) == errno.EIO
            assert await errno_of(ops.read(fi.fh, 0, 10)) == errno.EIO
            await ops.release(fi.fh)
        # A whole-file key whose size cannot be found stats (size 0, not cached), opens EIO.
        whole = await resolve(ops, "broken/whole")
        assert whole.st_size == 0 and whole.attr_timeout == 0
        assert await errno_of(ops.open(whole.st_ino, os.O_RDONLY, CTX)) == errno.EIO
        assert ops.stats.errors >= 2
        # The rest of the file system keeps answering.
        assert await cat(ops, "a/b/range") == DATA[100:150]
        assert ops.stats.open_files == 0

    run(ops, body)


def test_a_range_past_the_end_of_its_target_is_settled_at_open(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        attr = await resolve(ops, "past_end")
        assert attr.st_size == 1_000  # as the reference says, until the target is read
        fi = await ops.open(attr.st_ino, os.O_RDONLY, CTX)
        # Before any READ: the size is the bytes that exist, for getattr and readdir alike.
        assert (await ops.getattr(attr.st_ino, CTX)).st_size == len(DATA) - 10_000
        assert (await ops.lookup(ROOT, b"past_end", CTX)).st_size == 240
        assert bytes(await ops.read(fi.fh, 0, 4096)) == DATA[10_000:]
        assert bytes(await ops.read(fi.fh, 240, 4096)) == b""
        await ops.release(fi.fh)
        assert await cat(ops, "past_end") == DATA[10_000:]  # a second open: already settled

    run(ops, body)


def test_settled_size_shows_in_readdir(ops: RefFS, readdir_shim: None) -> None:
    async def body(ops: RefFS) -> None:
        assert await cat(ops, "past_end") == DATA[10_000:]
        fh = await ops.opendir(ROOT, CTX)
        token = Token()
        seen: dict[bytes, tuple[int, float]] = {}

        def reply(name: bytes, attr: pyfuse3.EntryAttributes, next_id: int) -> bool:
            seen[name] = (attr.st_size, attr.attr_timeout)
            return True

        token.reply = reply  # type: ignore[method-assign]
        await ops.readdir(fh, 0, token)
        assert seen[b"past_end"] == (240, ops.timeout)
        assert seen[b"a"] == (0, ops.timeout)
        # A whole-file key is not measured by a listing: size 0, attributes not to be cached.
        assert seen[b"whole"] == (0, 0)

    run(ops, body)


# ---- xattrs / statfs -------------------------------------------------------------------------


def test_getxattr_listxattr_and_statfs(ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        assert await ops.getxattr(ROOT, XATTR_PREFIX + b"keys", CTX) == b"7"
        assert await ops.getxattr(ROOT, XATTR_PREFIX + b"format", CTX) == b"json"
        stats = json.loads(await ops.getxattr(ROOT, XATTR_PREFIX + b"stats", CTX))
        assert stats["lookups"] >= 0
        r = (await resolve(ops, "a/b/range")).st_ino
        assert (await ops.getxattr(r, XATTR_PREFIX + b"url", CTX)).endswith(b"data.bin")
        assert await ops.getxattr(r, XATTR_PREFIX + b"offset", CTX) == b"100"
        assert await ops.getxattr(r, XATTR_PREFIX + b"length", CTX) == b"50"
        assert set(await ops.listxattr(r, CTX)) == {XATTR_PREFIX + n for n in (b"url", b"offset", b"length")}
        i = (await resolve(ops, "a/inline")).st_ino
        assert await ops.getxattr(i, XATTR_PREFIX + b"inline", CTX) == b"5"
        a = (await resolve(ops, "a")).st_ino
        assert await ops.listxattr(a, CTX) == []
        assert await errno_of(ops.getxattr(a, XATTR_PREFIX + b"url", CTX)) == pyfuse3.ENOATTR
        assert await errno_of(ops.getxattr(r, b"user.other", CTX)) == pyfuse3.ENOATTR
        s = await ops.statfs(CTX)
        assert s.f_files == 7 and s.f_bfree == 0 and s.f_namemax == 255

    run(ops, body)


def test_concurrent_opens_settle_once_and_all_see_the_settled_size(
        ops: RefFS, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, bool]] = []
    told = threading.Event()

    def invalidate(ino: int, attr_only: bool) -> None:  # runs in a worker thread
        calls.append((ino, attr_only))
        time.sleep(0.2)  # the kernel takes its time
        told.set()
        raise OSError(errno.EINVAL, "no session")  # as pyfuse3 says without a mount

    monkeypatch.setattr(pyfuse3, "invalidate_inode", invalidate)

    async def body(ops: RefFS) -> None:
        ino = (await resolve(ops, "past_end")).st_ino
        sizes: list[int] = []

        async def open_and_stat() -> None:
            fi = await ops.open(ino, os.O_RDONLY, CTX)
            assert told.is_set(), "an open returned before the kernel was told the size"
            sizes.append((await ops.getattr(ino, CTX)).st_size)
            assert bytes(await ops.read(fi.fh, 0, 4096)) == DATA[10_000:]
            await ops.release(fi.fh)

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(open_and_stat)
        assert sizes == [240] * 5
        assert calls == [(ino, True)]  # the kernel is told once, attributes only
        assert ops.stats.open_files == 0

    run(ops, body)


# ---- no_open: no OPEN, READs by inode ----------------------------------------------------------


async def cat_by_inode(ops: RefFS, path: str, chunk: int = 4096) -> bytes:
    """As the kernel reads with no_open: no OPEN, each READ's handle the file's inode."""
    ino = (await resolve(ops, path)).st_ino
    out = b""
    while piece := bytes(await ops.read(ino, len(out), chunk)):
        out += piece
        if len(piece) < chunk:
            break
    return out


def test_no_open_answers_open_enosys_and_reads_by_inode(noopen_ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        ino = (await resolve(ops, "a/b/range")).st_ino
        assert await errno_of(ops.open(ino, os.O_RDONLY, CTX)) == errno.ENOSYS
        assert await cat_by_inode(ops, ".zgroup") == b'{"zarr_format":2}'
        assert await cat_by_inode(ops, "a/inline") == b"hello"
        assert await cat_by_inode(ops, "a/b/range") == DATA[100:150]
        assert await cat_by_inode(ops, "a/b/range", chunk=7) == DATA[100:150]
        assert await cat_by_inode(ops, "whole", chunk=1000) == DATA
        assert bytes(await ops.read(ino, 45, 100)) == DATA[145:150]
        assert bytes(await ops.read(ino, 1 << 40, 10)) == b""
        assert ops.stats.opens == 0 and ops.stats.open_files == 0
        # a directory's or an unknown inode's READ fails as its OPEN would have
        a = (await resolve(ops, "a")).st_ino
        assert await errno_of(ops.read(a, 0, 10)) == errno.EISDIR
        assert await errno_of(ops.read(1 << 50, 0, 10)) == errno.ENOENT

    run(noopen_ops, body)


def test_no_open_failing_targets_fail_their_reads_only(noopen_ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        for path in ("broken/range", "broken/whole"):
            ino = (await resolve(ops, path)).st_ino
            assert await errno_of(ops.read(ino, 0, 10)) == errno.EIO, path
            assert await errno_of(ops.read(ino, 0, 10)) == errno.EIO, path
        assert await cat_by_inode(ops, "a/b/range") == DATA[100:150]

    run(noopen_ops, body)


def test_no_open_range_past_the_end_is_settled_at_lookup(noopen_ops: RefFS) -> None:
    async def body(ops: RefFS) -> None:
        # looked up: settled before the kernel knows the file, so no READ sees the stated length
        attr = await resolve(ops, "past_end")
        assert attr.st_size == 240 and attr.entry_timeout > 0
        assert (await ops.getattr(attr.st_ino, CTX)).st_size == 240
        assert await cat_by_inode(ops, "past_end") == DATA[10_000:]

    run(noopen_ops, body)
