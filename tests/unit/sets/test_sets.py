"""Sets of a catalogue without FUSE: opened lazily and once, bounded by max_open, a changed
set swapped in while open files keep the old version, a failed new version keeping the last
good one, catalogue updates; the reload checks; the inode table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from refmount.fuse.inodes import ROOT, InodeTable, VersionInodes
from refmount.sets.opensets import OPEN_FAILED, Sets
from refmount.sets.reload import CATALOG_UNREADABLE, Reloader
from refmount.sets.setslots import Opened, SetEvents, SetSlot, SetUnavailable


@dataclass(frozen=True)
class Entry:
    name: str
    source: str
    options: dict[str, str] = field(default_factory=dict)


class FakeCore:
    def __init__(self, name: str, identity: str) -> None:
        self.name, self.identity = name, identity
        self.started = self.closed = False

    def bind_loop(self, loop: Any) -> None:
        pass

    def start(self, nursery: trio.Nursery, trim: Any = None) -> None:
        self.started = True

    async def warm(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def close(self, timeout: float = 5.0) -> None:
        self.closed = True


class World:
    """The sources' identities now, what failed to parse, and every opening."""

    def __init__(self, names: list[str]) -> None:
        self.identity = {n: "v1" for n in names}
        self.broken: set[tuple[str, str]] = set()
        self.opened: list[tuple[str, str]] = []
        self.cores: list[FakeCore] = []
        self.size: dict[str, int] = {}  # bytes a set holds open (Opened.size)

    def identify(self, entry: Entry) -> str:
        return self.identity[entry.name]

    def open_set(self, name: str, entry: Entry) -> Opened:
        identity = self.identity[name]
        self.opened.append((name, identity))
        if (name, identity) in self.broken:
            raise ValueError(f"{entry.source}: not a reference set (bad JSON at char 3)")
        core = FakeCore(name, identity)
        self.cores.append(core)
        return Opened(core, identity, f"{name}:{identity}", self.size.get(name, 0))


class Events(SetEvents):
    def __init__(self) -> None:
        self.replaced_: list[tuple[str, int, int]] = []
        self.added_: list[str] = []
        self.removed_: list[str] = []

    def replaced(self, slot: SetSlot, old_vid: int, new_vid: int) -> None:
        self.replaced_.append((slot.name, old_vid, new_vid))

    def added(self, slot: SetSlot) -> None:
        self.added_.append(slot.name)

    def removed(self, slot: SetSlot) -> None:
        self.removed_.append(slot.name)


def entries(*names: str) -> dict[str, Entry]:
    return {n: Entry(n, f"/data/{n}.json") for n in names}


def run(world: World, names: list[str], body: Callable[[Sets, Events], Awaitable[None]],
        max_open: int = 8, max_bytes: int = 0) -> None:
    async def main() -> None:
        events = Events()
        sets = Sets(entries(*names), open_set=world.open_set, identify=world.identify,
                    max_open=max_open, events=events, max_bytes=max_bytes)
        async with trio.open_nursery() as nursery:
            sets.attach(nursery, None)
            await body(sets, events)
            await sets.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


def slot(sets: Sets, name: str) -> SetSlot:
    s = sets.slot(name)
    assert s is not None
    return s


def test_nothing_is_opened_until_used_and_a_set_opens_once_for_concurrent_readers() -> None:
    world = World(["a", "b", "c"])

    async def body(sets: Sets, events: Events) -> None:
        assert sets.names() == ["a", "b", "c"] and sets.opened == 0 and world.opened == []
        got = []

        async def reader() -> None:
            got.append(await sets.get(slot(sets, "b").vid))

        async with trio.open_nursery() as n:
            for _ in range(5):
                n.start_soon(reader)
        assert world.opened == [("b", "v1")]
        assert len({id(v) for v in got}) == 1 and got[0].core.started
        assert sets.opened == 1 and sets.describe()["set_states"] == {
            "b": {"state": "open", "version": 1, "open_files": 0}}

    run(world, ["a", "b", "c"], body)


def test_max_open_closes_the_least_recently_used_idle_set() -> None:
    world = World(["a", "b", "c"])

    async def body(sets: Sets, events: Events) -> None:
        a = await sets.open(slot(sets, "a"))
        sets.hold(a)  # a file open on a: a is not idle
        b = await sets.open(slot(sets, "b"))
        assert sets.opened == 2  # over the bound, but a is in use and b just opened
        c = await sets.open(slot(sets, "c"))
        with trio.fail_after(5):
            await b.closed.wait()
        assert slot(sets, "b").current is None and b.core.closed  # b: idle and least recent
        assert sets.opened == 2 and not a.core.closed
        sets.drop(a)
        with trio.fail_after(5):
            await a.closed.wait()
        assert a.core.closed and sets.opened == 1 and slot(sets, "c").current is c
        again = await sets.get(slot(sets, "a").vid)  # reopened on use, same index: same vid
        assert again is not None and again is not a and again.vid == a.vid

    run(world, ["a", "b", "c"], body, max_open=1)


def test_a_changed_set_is_swapped_in_and_open_files_keep_the_old_version() -> None:
    world = World(["a"])

    async def body(sets: Sets, events: Events) -> None:
        old = await sets.open(slot(sets, "a"))
        sets.hold(old)
        assert await sets.check() == 0  # unchanged: nothing indexed
        world.identity["a"] = "v2"
        assert await sets.check() == 1
        new = slot(sets, "a").current
        assert new is not None and new is not old and new.number == 2 and new.vid != old.vid
        assert events.replaced_ == [("a", old.vid, new.vid)] and slot(sets, "a").vid == new.vid
        assert sets.version(old.vid) is old and not old.core.closed  # still read
        assert await sets.get(old.vid) is old
        sets.drop(old)
        with trio.fail_after(5):
            await old.closed.wait()
        assert old.core.closed and await sets.get(old.vid) is None
        assert "last_reload" in slot(sets, "a").describe()

    run(world, ["a"], body)


def test_a_new_version_that_fails_keeps_the_last_good_one_with_the_error(caplog) -> None:
    world = World(["a"])

    async def body(sets: Sets, events: Events) -> None:
        good = await sets.open(slot(sets, "a"))
        world.identity["a"] = "v2"
        world.broken.add(("a", "v2"))
        assert await sets.check() == 0
        s = slot(sets, "a")
        assert s.current is good and s.error == OPEN_FAILED  # a fixed text: why is in the log
        assert sets.describe()["set_states"]["a"]["error"] == OPEN_FAILED
        assert "set a: cannot be opened: /data/a.json: not a reference set (bad JSON" in caplog.text
        tries = len(world.opened)
        assert await sets.check() == 0 and len(world.opened) == tries  # not indexed again
        world.identity["a"] = "v3"
        assert await sets.check() == 1 and s.error is None and s.current is not good

    run(world, ["a"], body)


def test_a_set_that_cannot_be_opened_says_why_without_indexing_again(caplog) -> None:
    world = World(["a"])
    world.broken.add(("a", "v1"))

    async def body(sets: Sets, events: Events) -> None:
        for _ in range(3):
            with pytest.raises(SetUnavailable) as refused:
                await sets.get(slot(sets, "a").vid)
            assert str(refused.value) == OPEN_FAILED
        assert world.opened == [("a", "v1")]
        assert caplog.text.count("bad JSON") == 1  # logged once
        world.identity["a"] = "v2"  # fixed
        assert await sets.get(slot(sets, "a").vid) is not None

    run(world, ["a"], body)


def test_catalogue_updates_add_remove_and_reindex_changed_entries() -> None:
    world = World(["a", "b", "c"])

    async def body(sets: Sets, events: Events) -> None:
        a = await sets.open(slot(sets, "a"))
        b = await sets.open(slot(sets, "b"))
        sets.hold(b)
        new = entries("a", "c")
        new["a"] = Entry("a", "/elsewhere/a.json")  # changed entry of an open set
        world.identity["c"] = "v1"
        added, removed, changed = sets.update(new)
        assert (added, removed, changed) == ([], ["b"], ["a"])
        await trio.testing.wait_all_tasks_blocked()
        assert events.removed_ == ["b"] and sets.names() == ["a", "c"]
        assert not b.core.closed and sets.version(b.vid) is b  # its open file still reads it
        sets.drop(b)
        with trio.fail_after(5):
            await b.closed.wait()
            while slot(sets, "a").current is a:  # re-indexed in the background
                await trio.sleep(0.01)
            await a.closed.wait()
        assert b.core.closed and a.core.closed
        sets.update({**new, "d": Entry("d", "/data/d.json")})
        assert events.added_ == ["d"]

    run(world, ["a", "b", "c"], body)


def test_reloader_checks_when_poked_and_keeps_the_sets_when_the_catalogue_fails(caplog) -> None:
    world = World(["a"])
    catalogue: dict[str, Any] = {"entries": entries("a"), "fail": False}

    def read() -> dict[str, Entry]:
        if catalogue["fail"]:
            raise ValueError("catalogue.json: not JSON")
        return catalogue["entries"]

    async def body(sets: Sets, events: Events) -> None:
        reloader = Reloader(sets, interval=None, read_catalog=read)
        async with trio.open_nursery() as n:
            n.start_soon(reloader.run)
            await sets.open(slot(sets, "a"))
            world.identity["a"] = "v2"
            done = reloader.done
            reloader.poke()
            await done.wait()
            assert slot(sets, "a").versions == 2 and reloader.checks == 1
            catalogue["fail"] = True
            done = reloader.done
            reloader.poke()
            await done.wait()
            assert sets.names() == ["a"] and reloader.describe()["catalog_error"] == CATALOG_UNREADABLE
            assert caplog.text.count("catalogue.json: not JSON") == 1
            catalogue["fail"] = False
            world.identity["b"] = "v1"
            catalogue["entries"] = entries("a", "b")
            done = reloader.done
            reloader.poke()
            await done.wait()
            assert sets.names() == ["a", "b"] and "catalog_error" not in reloader.describe()
            n.cancel_scope.cancel()

    run(world, ["a"], body)


def test_inode_table_counts_references_and_frees_forgotten_numbers() -> None:
    table = InodeTable()
    x = table.reply(1, 4096)
    assert table.reply(1, 4096) == x and table.get(x) == (1, 4096)
    y = table.reply(2, 4096)  # the same inner number in another version: another inode
    assert y != x and x != ROOT and y != ROOT
    table.forget(x, 1)
    assert table.get(x) == (1, 4096)
    table.forget(x, 1)
    assert table.get(x) is None and len(table) == 1
    single = VersionInodes(table, 3, root_is_mount=True)
    assert single.reply(ROOT) == ROOT and single.inner(ROOT) == ROOT
    catalogue = VersionInodes(table, 3, root_is_mount=False)
    assert catalogue.inner(ROOT) is None and catalogue.outer(ROOT) != ROOT
    assert VersionInodes(table, 2, root_is_mount=False).inner(y) == 4096
    assert VersionInodes(table, 3, root_is_mount=False).inner(y) is None


def test_a_sets_configuration_is_the_mounts_with_its_entrys_options_over_it(tmp_path) -> None:
    from refmount.base.errors import ConfigError
    from refmount.config import MountConfig, apply_options
    from refmount.sets.catalog import CatalogEntry
    from refmount.sets.setopener import set_config

    cfg = MountConfig(source=str(tmp_path), mountpoint="/mnt", serving=True)
    apply_options(cfg, ["catalog", "reload=5", "max_open_sets=4", "memory_cache=64M", "timeout=9"])
    entry = CatalogEntry("a", str(tmp_path / "a.json"), {"decode": "", "timeout": "30"})
    one = set_config(cfg, entry)
    assert one.source == str(tmp_path / "a.json") and not one.catalog and one.reload == 0
    assert one.decode and one.timeout == 30 and cfg.timeout == 9 and not cfg.decode
    assert one.memory_cache_size == 16 * 2**20  # a quarter: four sets may be open
    assert one.local_roots() == [str(tmp_path)]  # a server reads beneath the catalogue
    with pytest.raises(ConfigError, match="allow_local"):
        set_config(cfg, CatalogEntry("b", "/x.json", {"allow_local": "/"}))


def test_indexer_processes_stay_for_the_next_set_and_say_why_one_failed(tmp_path) -> None:
    import psutil

    from refmount.config import MountConfig
    from refmount.serving.indexer import IndexerError, IndexerProcesses

    def indexers() -> list[psutil.Process]:
        return [p for p in psutil.Process().children()
                if "refmount.serving.indexer" in " ".join(p.cmdline())]

    sources = []
    for name, text in (("a", '{"k": "base64:AQ=="}'), ("b", '{"k": "x"}'), ("bad", '{"k": [')):
        (tmp_path / f"{name}.json").write_text(text)
        sources.append(MountConfig(source=str(tmp_path / f"{name}.json"), mountpoint="",
                                   cache_dir=str(tmp_path / "cache")))
    processes = IndexerProcesses()
    try:
        first = processes.index(sources[0])
        [proc] = indexers()
        second = processes.index(sources[1])
        assert indexers() == [proc]  # the same process indexed both
        assert first.kind == second.kind == "json" and first.path != second.path
        with pytest.raises(IndexerError, match=r"bad\.json"):
            processes.index(sources[2])
        proc.kill()
        proc.wait(10)
        assert processes.index(sources[0]).reused  # a new process, the persisted index
    finally:
        processes.close()
    assert indexers() == []


def test_sets_in_use_count_against_the_memory_bound() -> None:
    """max_open_memory counts every open set, those in use included: just under it a set
    opens (idle ones closed first, least recently used); a set that would pass it while the
    others are in use is refused (a fixed text) and opens once one of them is idle."""
    from refmount.sets.opensets import TOO_MUCH_OPEN

    world = World(["a", "b", "c", "d"])
    world.size = {"a": 40, "b": 40, "c": 20, "d": 30}

    async def body(sets: Sets, events: Events) -> None:
        a = await sets.open(slot(sets, "a"))
        sets.hold(a)
        b = await sets.open(slot(sets, "b"))
        sets.hold(b)
        c = await sets.open(slot(sets, "c"))  # 100 of 100: just fits
        assert sets.held_bytes == 100 and c.core.started
        with pytest.raises(SetUnavailable) as refused:  # d: 80 in use + 30 > 100 (c left open)
            await sets.open(slot(sets, "d"))
        assert str(refused.value) == TOO_MUCH_OPEN and slot(sets, "c").current is c
        assert sets.held_bytes == 100 and slot(sets, "d").current is None
        sets.drop(a)  # idle now: closed for d
        d = await sets.open(slot(sets, "d"))  # a (least recently used) closed; c still fits
        assert d.core.started and slot(sets, "a").current is None and sets.held_bytes == 90

    run(world, ["a", "b", "c", "d"], body, max_bytes=100)


def test_a_set_over_the_memory_bound_opens_alone_once_the_others_are_idle() -> None:
    """One set alone is never refused: a set bigger than max_open_memory closes the idle sets
    and opens; while another is in use it is refused."""
    from refmount.sets.opensets import TOO_MUCH_OPEN

    world = World(["a", "big"])
    world.size = {"a": 10, "big": 150}

    async def body(sets: Sets, events: Events) -> None:
        a = await sets.open(slot(sets, "a"))
        sets.hold(a)
        with pytest.raises(SetUnavailable) as refused:  # a in use: 10 + 150 > 100
            await sets.open(slot(sets, "big"))
        assert str(refused.value) == TOO_MUCH_OPEN
        sets.drop(a)  # idle: closed for big, which then opens alone
        big = await sets.open(slot(sets, "big"))
        assert big.core.started and slot(sets, "a").current is None and sets.held_bytes == 150

    run(world, ["a", "big"], body, max_bytes=100)


def test_a_reload_that_would_pass_the_memory_bound_keeps_the_old_version(caplog) -> None:
    """A reload counts against max_open_memory: the new version with the sets in use, the old
    one too while files are open on it. Just under the bound it is swapped in; just over,
    the old version keeps serving, one log line says why, and the next check tries again."""
    import logging

    world = World(["a", "b"])
    world.size = {"a": 40, "b": 40}

    async def body(sets: Sets, events: Events) -> None:
        a = await sets.open(slot(sets, "a"))
        sets.hold(a)
        b = await sets.open(slot(sets, "b"))
        sets.hold(b)
        world.identity["a"], world.size["a"] = "v2", 21  # 40 + 40 in use + 21 > 100
        with caplog.at_level(logging.ERROR):
            assert not await sets.reload(slot(sets, "a"))
        lines = [r.getMessage() for r in caplog.records if "not swapped in" in r.getMessage()]
        assert len(lines) == 1
        assert "80 bytes of open sets, and its 21 would pass max_open_memory=100" in lines[0]
        assert slot(sets, "a").current is a and sets.held_bytes == 80
        assert world.cores[-1].closed and not a.core.closed  # the new one discarded
        world.identity["a"], world.size["a"] = "v3", 20  # 40 + 40 + 20 = 100: just fits
        assert await sets.reload(slot(sets, "a"))
        new = slot(sets, "a").current
        assert new is not a and new.size == 20 and sets.held_bytes == 100
        sets.drop(a)  # the old version closes once its file is closed
        await a.closed.wait()
        assert sets.held_bytes == 60
        sets.hold(new)
        world.identity["a"], world.size["a"] = "v4", 60  # b 40 + 60 = 100, a's version 3 in use
        assert not await sets.reload(slot(sets, "a"))
        sets.drop(new)  # idle: closed at the swap, so it does not count
        assert await sets.reload(slot(sets, "a"))
        assert slot(sets, "a").current.size == 60

    run(world, ["a", "b"], body, max_bytes=100)


def test_a_parquet_sets_record_cache_counts_as_memory_it_holds(tmp_path) -> None:
    """What a catalogue's Parquet set is charged against max_open_memory includes the bound of
    its decoded-record cache, not only its memory cache."""
    from refmount.refs.parquetset import RECORD_CACHE_BYTES
    from refmount.sets.setopener import memory_held

    class Core:
        def __init__(self, records: Any) -> None:
            self.records_bound = records

    assert memory_held(0, 8 << 20, Core(0)) == 8 << 20
    assert memory_held(0, 8 << 20, Core(RECORD_CACHE_BYTES)) == (8 << 20) + RECORD_CACHE_BYTES
    assert memory_held(1000, 8 << 20, Core(0)) == (8 << 20) + 1000
