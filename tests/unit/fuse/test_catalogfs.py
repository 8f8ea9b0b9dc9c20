"""CatalogFS's handlers without a kernel, over real cores of small sets: the root lists the
sets and answers stat without opening any, a lookup inside a set opens it once, inode numbers
of different sets and versions differ, a handle opened before a swap reads the old version
while new lookups find the new one, the kernel's names are dropped on a swap, forgotten
inode numbers are freed, and a root listing goes on over the names it began with."""

from __future__ import annotations

import base64
import errno
import json
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyfuse3
import pytest
import trio

from refmount.config import MountConfig
from refmount.core.setcore import build_core
from refmount.fuse.catalogops import CatalogFS
from refmount.serving.preparation import index_source
from refmount.sets.opensets import Sets
from refmount.sets.setslots import Opened

ROOT = pyfuse3.ROOT_INODE


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    options: dict[str, str] = field(default_factory=dict)


def write_set(path: Path, version: int) -> None:
    path.write_text(json.dumps({
        ".zgroup": '{"zarr_format": 2}',
        "k": "base64:" + base64.b64encode(bytes([version]) * 1000).decode(),
        f"v{version}": "x"}))


class Token:
    def __init__(self) -> None:
        self.entries: list[tuple[bytes, int, bool]] = []

    def reply(self, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int) -> bool:
        self.entries.append((name, attr.st_ino, stat.S_ISDIR(attr.st_mode)))
        return True


@pytest.fixture
def readdir_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyfuse3, "readdir_reply", lambda token, name, attr, next_id:
                        token.reply(name, attr, next_id))


@dataclass
class World:
    root: Path
    opened: list[str] = field(default_factory=list)
    invalidated: list[tuple[int, bytes]] = field(default_factory=list)

    def cfg(self, source: str) -> MountConfig:
        return MountConfig(source=source, mountpoint="/mnt", cache_dir=str(self.root / "cache"))

    def open_set(self, name: str, entry: Entry) -> Opened:
        self.opened.append(name)
        cfg = self.cfg(entry.source)
        identity = self.identify(entry)
        index_file = index_source(cfg)
        return Opened(build_core(cfg, index_file), identity, index_file.path)

    @staticmethod
    def identify(entry: Entry) -> str:
        st = os.stat(entry.source)
        return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"


def run(tmp_path: Path, body: Callable[[CatalogFS, World], Awaitable[None]]) -> None:
    world = World(tmp_path)
    entries = {}
    for name in ("a", "b"):
        write_set(tmp_path / f"{name}.json", 1)
        entries[name] = Entry(name, str(tmp_path / f"{name}.json"))
    sets = Sets(entries, open_set=world.open_set, identify=world.identify, max_open=8)
    fs = CatalogFS(sets, single=False, uid=0, gid=0, umask=0o222, attr_timeout=60.0,
                   page_push=False, mtime_ns=0, info={"source": str(tmp_path)},
                   invalidate=lambda parent, name: world.invalidated.append((parent, name)))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            sets.attach(nursery, None)
            fs.attach(nursery)
            await body(fs, world)
            await sets.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


async def listing(fs: CatalogFS, ino: int) -> list[tuple[bytes, int, bool]]:
    fh = await fs.opendir(ino, None)
    token = Token()
    await fs.readdir(fh, 0, token)
    return token.entries


async def read_all(fs: CatalogFS, ino: int) -> tuple[int, bytes]:
    fh = (await fs.open(ino, os.O_RDONLY, None)).fh
    return fh, bytes(await fs.read(fh, 0, 1 << 20))


def test_root_lists_sets_without_opening_them(tmp_path: Path, readdir_shim: None) -> None:
    async def body(fs: CatalogFS, world: World) -> None:
        entries = await listing(fs, ROOT)
        assert [e[0] for e in entries] == [b".", b"..", b"a", b"b"] and all(e[2] for e in entries)
        a = await fs.lookup(ROOT, b"a", None)
        assert a.st_ino == entries[2][1] and stat.S_ISDIR(a.st_mode)
        assert (await fs.getattr(a.st_ino, None)).st_ino == a.st_ino
        assert (await fs.getxattr(a.st_ino, b"user.refmount.set.state", None)) == b"closed"
        assert (await fs.lookup(ROOT, b"nope", None)).st_ino == 0
        assert world.opened == []
        inside = [e[0] for e in await listing(fs, a.st_ino)]
        assert sorted(inside[2:]) == [b".zgroup", b"k", b"v1"] and world.opened == ["a"]
        ka = await fs.lookup(a.st_ino, b"k", None)
        b = await fs.lookup(ROOT, b"b", None)
        kb = await fs.lookup(b.st_ino, b"k", None)
        assert len({ROOT, a.st_ino, b.st_ino, ka.st_ino, kb.st_ino}) == 5  # never shared
        assert world.opened == ["a", "b"]
        with pytest.raises(pyfuse3.FUSEError) as e:
            await fs.open(ROOT, os.O_RDONLY, None)
        assert e.value.errno == errno.EISDIR

    run(tmp_path, body)


def test_a_handle_keeps_its_version_across_a_swap(tmp_path: Path) -> None:
    async def body(fs: CatalogFS, world: World) -> None:
        a = await fs.lookup(ROOT, b"a", None)
        k = await fs.lookup(a.st_ino, b"k", None)
        fh = (await fs.open(k.st_ino, os.O_RDONLY, None)).fh
        assert bytes(await fs.read(fh, 0, 10)) == b"\x01" * 10
        write_set(tmp_path / "a.json", 2)
        slot = fs.sets.slot("a")
        assert slot is not None and await fs.sets.reload(slot)
        assert (ROOT, b"a") in world.invalidated  # the kernel looks "a" up again
        assert bytes(await fs.read(fh, 10, 2000)) == b"\x01" * 990  # the old version
        assert (await fs.getattr(k.st_ino, None)).st_size == 1000  # fstat of the open file
        where = fs.inodes.get(k.st_ino)
        assert where is not None and fs.sets.version(where[0]) is not None  # still open
        a2 = await fs.lookup(ROOT, b"a", None)
        assert a2.st_ino != a.st_ino
        k2 = await fs.lookup(a2.st_ino, b"k", None)
        fh2, data = await read_all(fs, k2.st_ino)
        assert data == b"\x02" * 1000
        assert (await fs.lookup(a2.st_ino, b"v1", None)).st_ino == 0
        await fs.release(fh)
        await fs.release(fh2)
        await trio.sleep(0.2)  # the old version closes now that no file is open on it
        with pytest.raises(pyfuse3.FUSEError) as e:
            await fs.getattr(k.st_ino, None)
        assert e.value.errno == errno.ENOENT
        before = len(fs.inodes)
        await fs.forget([(k.st_ino, 1), (a.st_ino, 1)])
        assert len(fs.inodes) == before - 2

    run(tmp_path, body)


class LimitedToken(Token):
    """Takes ``room`` entries, then refuses (the kernel's buffer is full), remembering the
    offset to go on from."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.next_id = 0

    def reply(self, name: bytes, attr: pyfuse3.EntryAttributes, next_id: int) -> bool:
        if len(self.entries) >= self.room:
            return False
        self.next_id = next_id
        return super().reply(name, attr, next_id)


def test_a_root_listing_goes_on_over_the_names_it_began_with(tmp_path: Path,
                                                              readdir_shim: None) -> None:
    """Sets removed and added while ``ls`` reads the root (a catalogue reloaded between two of
    its readdir calls): the listing neither repeats a name nor skips one that stayed; a listing
    begun after the change shows it."""
    async def body(fs: CatalogFS, world: World) -> None:
        for name in ("c", "d"):
            write_set(tmp_path / f"{name}.json", 1)
        entries = {n: Entry(n, str(tmp_path / f"{n}.json")) for n in ("a", "b", "c", "d")}
        fs.sets.update(entries)
        fh = await fs.opendir(ROOT, None)
        first = LimitedToken(4)  # ".", "..", "a", "b"
        await fs.readdir(fh, 0, first)
        assert [e[0] for e in first.entries] == [b".", b"..", b"a", b"b"]
        # "a" goes and "aa" comes: in a fresh sorted list "c" would move back one place
        write_set(tmp_path / "aa.json", 1)
        fs.sets.update({n: e for n, e in entries.items() if n != "a"}
                       | {"aa": Entry("aa", str(tmp_path / "aa.json"))})
        fs.sets.update({n: e for n, e in entries.items() if n not in ("a", "b")}
                       | {"aa": Entry("aa", str(tmp_path / "aa.json"))})
        rest = Token()
        await fs.readdir(fh, first.next_id, rest)
        assert [e[0] for e in rest.entries] == [b"c", b"d"]
        await fs.releasedir(fh)
        assert [e[0] for e in await listing(fs, ROOT)] == [b".", b"..", b"aa", b"c", b"d"]

    run(tmp_path, body)
