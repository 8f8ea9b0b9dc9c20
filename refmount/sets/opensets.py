"""Many reference sets served at once: each opened on first use, a bounded number kept open,
a changed one swapped for its new version.

A catalogue mount (``-o catalog``) and a mount with ``reload=SEC`` serve their sets through
:class:`Sets`, one :class:`SetSlot` per set of the catalogue (a single-set mount with
``reload`` is one slot). A slot is opened on first use: SOURCE is identified
(``source_identity``), indexed by the indexer process and the index mapped into a
``core.SetCore`` (``index_and_build``, run in a worker thread, never on the trio loop), at
most ``max_indexing`` at a time and once per slot however many readers ask at once. The
opened core is a :class:`SetVersion`, known by a version id (``vid``) that the front ends
put in front of the core's own inode numbers and paths: a file opened on a version keeps
reading that version's core until it is closed.

At most ``max_open`` slots keep a version open; opening one more closes the version of the
least recently used slot that is idle (no open file, no request in flight). A reload check
(``check``, see ``sets/reload.py``) identifies each opened slot's SOURCE again; a changed one is
indexed in the background and its new version swapped in: new requests see it, files
already open keep the old version, which is closed once the last of them is. A new version
that fails to index keeps the last good one and records the error (``SetSlot.error``,
``refmount stats``, the set directory's xattrs). ``update`` applies a re-read catalogue:
sets appear, disappear, or are re-indexed when their entry changed.

Front ends hear of what changes through :class:`SetEvents` (the mount drops the kernel's
cached names). Nothing here knows FUSE or HTTP. The slots, versions and events are
``sets/setslots.py``; the concrete opener (``set_config``, ``index_and_build``) is
``sets/setopener.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import trio

from refmount.base.redact import redact_url
from refmount.refs.limits import size_text
from refmount.serving.retired import RetiredCounters
from refmount.sets.setslots import Opened, SetEvents, SetSlot, SetUnavailable, SetVersion

log = logging.getLogger(__name__)

# What a set's error says outside the log (refmount stats, xattrs, HTTP bodies): fixed texts,
# never the reason, which may quote the file it could not parse or name local paths.
OPEN_FAILED = "the set cannot be opened (the log says why)"
TOO_MUCH_OPEN = "too many sets are in use at once (max_open_memory): try again later"
IDENTIFY_FAILED = "the set's SOURCE cannot be identified (the log says why)"

__all__ = ["Identify", "OpenSet", "Sets"]


OpenSet = Callable[[str, Any], Opened]  # blocking: (name, entry) -> Opened, or raises
Identify = Callable[[Any], str]  # blocking: entry -> the identity of its SOURCE now


class Sets:
    """The slots of a catalogue (see the module's docstring).

    ``open_set`` and ``identify`` block (run in worker threads). ``attach(nursery, loop)``
    before use: each version's core runs in a nursery of its own in ``nursery``."""

    def __init__(self, entries: Mapping[str, Any], *, open_set: OpenSet, identify: Identify,
                 max_open: int, events: SetEvents | None = None, max_indexing: int = 2,
                 max_identify: int = 8, max_bytes: int = 0) -> None:
        self._open_set = open_set
        self._identify = identify
        self.max_open = max(1, max_open)
        self.max_bytes = max_bytes  # of the versions not yet closed, in use or not (0: no bound)
        self.events = events or SetEvents()
        # counted for refmount stats and the metrics: opens and re-indexings that failed,
        # versions swapped in by a reload, reloads that kept the old version after a failure
        self.index_failures = self.reloads = self.reload_failures = 0
        self.versions_opened = 0  # first opens and new versions, of sets removed since too
        # the final counters of the versions closed, which the metrics add to the open ones'
        # (their counters only go up: serving/retired.py)
        self.retired = RetiredCounters()
        self._vids = itertools.count(1)
        self.slots: dict[str, SetSlot] = {}
        self._by_vid: dict[int, SetSlot] = {}  # a slot's shown vid -> the slot
        self._versions: dict[int, SetVersion] = {}  # vid -> an opened version not yet closed
        self._opening: dict[str, trio.Event] = {}
        self._open: set[SetSlot] = set()  # the slots with a current version
        self._names: list[str] | None = None  # sorted, made again when sets come or go
        self._indexing = trio.CapacityLimiter(max(1, max_indexing))
        self._identifying = trio.CapacityLimiter(max(1, max_identify))
        self._nursery: trio.Nursery | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        for name in sorted(entries):
            self._add(name, entries[name])

    # ---- wiring --------------------------------------------------------------------------
    def attach(self, nursery: trio.Nursery, loop: asyncio.AbstractEventLoop | None) -> None:
        self._nursery = nursery
        self._loop = loop

    def _add(self, name: str, entry: Any) -> SetSlot:
        self._names = None
        slot = SetSlot(name, entry, next(self._vids))
        self.slots[name] = slot
        self._by_vid[slot.vid] = slot
        return slot

    # ---- what front ends ask -------------------------------------------------------------
    def names(self) -> list[str]:
        if self._names is None:
            self._names = sorted(self.slots)
        return self._names

    def slot(self, name: str) -> SetSlot | None:
        return self.slots.get(name)

    def slot_of(self, vid: int) -> SetSlot | None:
        """The slot whose shown version id is ``vid`` (opened or not)."""
        return self._by_vid.get(vid)

    def version(self, vid: int) -> SetVersion | None:
        """The opened version ``vid``, if it is still open (no opening)."""
        v = self._versions.get(vid)
        return v if v is not None and not v.closing.is_set() else None

    def open_versions(self) -> list[SetVersion]:
        """Every version open now (current ones and replaced ones still read)."""
        return [v for v in self._versions.values() if not v.closing.is_set()]

    def counted_versions(self) -> list[SetVersion]:
        """Every version whose counters are not yet in ``retired``: the open ones, and those
        closing (their cores may still count) until they are closed."""
        return list(self._versions.values())

    def versions_of(self, name: str) -> list[SetVersion]:
        return [v for v in self.open_versions() if v.name == name]

    @property
    def opened(self) -> int:
        return len(self._open)

    async def get(self, vid: int) -> SetVersion | None:
        """The version ``vid``, opening its slot when ``vid`` is what the slot shows; None
        when ``vid`` is gone (replaced and closed, or its set removed). SetUnavailable when
        the set cannot be opened."""
        version = self.version(vid)
        if version is not None:
            return version
        slot = self._by_vid.get(vid)
        if slot is None or slot.removed:
            return None
        version = await self.open(slot)
        return version if version.vid == vid else None

    async def open(self, slot: SetSlot) -> SetVersion:
        """The slot's current version, opened now if it is not (single-flight per slot)."""
        while True:
            if slot.current is not None:
                slot.last_used = trio.current_time()
                return slot.current
            if slot.removed:
                raise SetUnavailable(f"set {slot.name!r} was removed from the catalogue")
            busy = self._opening.get(slot.name)
            if busy is None:
                break
            await busy.wait()
            if slot.current is None and slot.error is not None:
                raise SetUnavailable(slot.error)
        self._opening[slot.name] = done = trio.Event()
        try:
            if slot.error is not None and slot.failed_identity is not None:
                # The same SOURCE failed before: say so without indexing it again.
                identity = await self._identity(slot)
                if identity == slot.failed_identity:
                    raise SetUnavailable(slot.error)
            opened = await self._index(slot, slot.entry)
            if not await self._room_for(opened.size, keep=slot):
                await self._discard(opened)
                log.error("set %s: not opened: %s MiB of open sets, in use, and its %s MiB would pass "
                          "max_open_memory=%s MiB (it opens once others close)", slot.name or "/",
                          self.held_bytes >> 20, opened.size >> 20, self.max_bytes >> 20)
                raise SetUnavailable(TOO_MUCH_OPEN)
            version = await self._install(slot, opened)
        finally:
            del self._opening[slot.name]
            done.set()
        await self._bound(keep=slot)
        return version

    @contextlib.asynccontextmanager
    async def using(self, version: SetVersion) -> AsyncIterator[SetVersion]:
        """A request in flight on ``version`` (it is not closed meanwhile)."""
        version.active += 1
        slot = self.slots.get(version.name)
        if slot is not None and slot.current is version:
            slot.last_used = trio.current_time()
        try:
            yield version
        finally:
            version.active -= 1
            self._settle(version)

    def hold(self, version: SetVersion) -> None:
        """A file was opened on ``version``."""
        version.handles += 1

    def drop(self, version: SetVersion) -> None:
        """A file opened on ``version`` was closed."""
        version.handles -= 1
        self._settle(version)

    def _settle(self, version: SetVersion) -> None:
        if not version.idle:
            return
        if version.retired:
            self._close(version)
        elif self.opened > self.max_open and self._nursery is not None:
            self._nursery.start_soon(self._bound)

    # ---- opening and closing versions ------------------------------------------------------
    async def _identity(self, slot: SetSlot) -> str:
        return await trio.to_thread.run_sync(self._identify, slot.entry, limiter=self._identifying,
                                             abandon_on_cancel=True)

    async def _index(self, slot: SetSlot, entry: Any) -> Opened:
        """Identify and index ``entry`` and build its core, in a worker thread; the failure
        is the slot's error (SetUnavailable)."""
        began = time.monotonic()
        try:
            # abandoned when cancelled (unmounting): the indexer dies with this process
            opened = await trio.to_thread.run_sync(self._open_set, slot.name, entry,
                                                   limiter=self._indexing, abandon_on_cancel=True)
        except Exception as e:
            # the reason (a path, a parse excerpt, a refusal naming directories) goes to the
            # log only; what clients see (stats, xattrs, a 503) is a fixed text
            log.error("set %s: cannot be opened: %s", slot.name or "/",
                      redact_url(str(e) or type(e).__name__))
            slot.error = OPEN_FAILED
            self.index_failures += 1
            with contextlib.suppress(Exception):
                slot.failed_identity = await self._identity(slot)
            raise SetUnavailable(OPEN_FAILED) from None
        log.info("set %s: opened in %.2f s", slot.name or "/", time.monotonic() - began)
        return opened

    async def _install(self, slot: SetSlot, opened: Opened) -> SetVersion:
        """Make ``opened`` the slot's current version and start its core."""
        old = slot.current
        if old is None and opened.key == slot.last_key and slot.versions:
            vid = slot.vid  # the same index reopened (closed by the bound): the same version
        elif slot.versions == 0:
            vid = slot.vid  # the first version: the vid shown before it opened
            slot.versions = 1
            self.versions_opened += 1
        else:
            vid = next(self._vids)
            slot.versions += 1
            self.versions_opened += 1
        version = SetVersion(vid, slot.versions, slot.name, opened.core, opened.identity, opened.key,
                             opened.size)
        await self._start(version)
        self._versions[vid] = version
        self.events.made(version)
        slot.current, slot.last_key = version, opened.key
        self._open.add(slot)
        slot.error = slot.failed_identity = None
        slot.last_used = trio.current_time()
        if vid != slot.vid:
            old_vid = slot.vid
            del self._by_vid[old_vid]
            slot.vid = vid
            self._by_vid[vid] = slot
            if slot.versions > 1:
                slot.last_reload = time.time()
            self.events.replaced(slot, old_vid, vid)
        if old is not None:
            self._retire(old)
        return version

    async def _start(self, version: SetVersion) -> None:
        assert self._nursery is not None, "attach() first"
        await self._nursery.start(self._run_version, version)

    async def _run_version(self, version: SetVersion, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """A version's core runs in a nursery of its own until it is closed."""
        core = version.core
        try:
            if self._loop is not None:
                core.bind_loop(self._loop)
            async with trio.open_nursery() as nursery:
                core.start(nursery, None)
                task_status.started()
                with contextlib.suppress(Exception):
                    await core.warm()
                await version.closing.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self._loop is not None:
                    from refmount.targets.filesystems import await_task

                    with contextlib.suppress(Exception):
                        await await_task(self._loop, core.aclose())
                await trio.to_thread.run_sync(core.close)
                if self._versions.get(version.vid) is version:
                    del self._versions[version.vid]
                self.retired.fold(core)  # in the same step: a scrape counts it once, open or retired
                version.closed.set()
                log.info("set %s: version %d closed", version.name or "/", version.number)

    def _retire(self, version: SetVersion) -> None:
        version.retired = True
        if version.idle:
            self._close(version)

    def _close(self, version: SetVersion) -> None:
        version.retired = True
        version.closing.set()

    @property
    def held_bytes(self) -> int:
        """Bytes the versions not yet closed hold (current ones, and replaced ones still read)."""
        return sum(v.size for v in self._versions.values())

    async def _room_for(self, size: int, keep: SetSlot, replacing: SetVersion | None = None) -> bool:
        """Close idle sets, least recently used first, until ``size`` more bytes fit within
        ``max_bytes``; False if they do not (the sets in use hold too much). ``replacing``:
        the version a reload swaps out, which counts only while it is in use (idle, it is
        closed at the swap)."""
        if not self.max_bytes:
            return True
        freed = replacing.size if replacing is not None and replacing.idle else 0
        others = [v for v in self._versions.values() if v is not replacing or not freed]
        in_use = sum(v.size for v in others
                     if not (v.idle and (s := self.slots.get(v.name)) is not None and s.current is v
                             and s is not keep and v.name not in self._opening))
        if in_use and in_use + size > self.max_bytes:
            return False  # closing the idle ones would not make room: none is closed
        while self.held_bytes - freed + size > self.max_bytes:
            version = self._close_least_recent(keep, f"for max_open_memory={self.max_bytes >> 20} MiB")
            if version is None:
                return not in_use  # one set alone (no other in use) is never refused
            with trio.CancelScope(shield=True):
                await version.closed.wait()
        return True

    async def _bound(self, keep: SetSlot | None = None) -> None:
        """Close the least recently used idle slots beyond ``max_open`` (never ``keep``,
        the slot just opened for a request)."""
        while self.opened > self.max_open:
            why = f"of {self.opened} open, max_open_sets={self.max_open}"
            if self._close_least_recent(keep, why) is None:
                return  # every open set is in use: closed once one is idle

    def _close_least_recent(self, keep: SetSlot | None, why: str) -> SetVersion | None:
        """Close the current version of the least recently used idle slot (never ``keep``);
        None when every open set is in use."""
        idle = [s for s in self._open
                if s.current is not None and s.current.idle and s.name not in self._opening
                and s is not keep]
        if not idle:
            return None
        slot = min(idle, key=lambda s: s.last_used)
        version = slot.current
        assert version is not None
        slot.current = None
        self._open.discard(slot)
        log.info("set %s: closed (least recently used %s)", slot.name or "/", why)
        self._close(version)
        return version

    # ---- reloading -------------------------------------------------------------------------
    async def check(self) -> int:
        """Identify every opened slot's SOURCE again and re-index those that changed (at most
        ``max_indexing`` at a time); the number of versions swapped in."""
        swapped = 0

        async def one(slot: SetSlot) -> None:
            nonlocal swapped
            if await self.reload(slot):
                swapped += 1

        async with trio.open_nursery() as nursery:
            for slot in list(self._open):
                if slot.current is not None and not slot.reloading:
                    nursery.start_soon(one, slot)
        return swapped

    async def reload(self, slot: SetSlot, entry: Any = None) -> bool:
        """Re-index ``slot`` if its SOURCE changed (or with a new ``entry``) and swap the new
        version in; False if unchanged, not open, or the new version failed (the error kept)."""
        if slot.reloading or slot.removed:
            return False
        slot.reloading = True
        try:
            changed_entry = entry is not None
            if changed_entry:
                slot.entry = entry
            current = slot.current
            if current is None:
                return False
            try:
                identity = await self._identity(slot)
            except Exception as e:
                slot.error = IDENTIFY_FAILED
                self.reload_failures += 1
                log.error("set %s: cannot identify SOURCE: %s (the opened version keeps serving)",
                          slot.name or "/", redact_url(str(e)))
                return False
            finally:
                slot.last_check = time.time()
            if not changed_entry and identity == current.identity:
                slot.error = slot.failed_identity = None  # back to what serves
                return False
            if not changed_entry and identity == slot.failed_identity:
                return False
            try:
                opened = await self._index(slot, slot.entry)
            except SetUnavailable:  # why: logged by _index
                self.reload_failures += 1
                log.error("set %s: the new version cannot be served, version %d keeps serving",
                          slot.name or "/", current.number)
                return False
            if not await self._room_for(opened.size, keep=slot, replacing=current):
                await self._discard(opened)
                self.reload_failures += 1
                log.error("set %s: the new version is not swapped in: %s bytes of open sets, and its %s "
                          "would pass max_open_memory=%s (version %d keeps serving; tried again at the "
                          "next check)", slot.name or "/", f"{self.held_bytes:,}", f"{opened.size:,}",
                          size_text(self.max_bytes), current.number)
                return False
            if slot.removed or slot.current is not current:  # closed or removed meanwhile
                await self._discard(opened)
                return False
            version = await self._install(slot, opened)
            self.reloads += 1
            log.info("set %s: version %d swapped in", slot.name or "/", version.number)
            return True
        finally:
            slot.reloading = False

    async def _discard(self, opened: Opened) -> None:
        with contextlib.suppress(Exception):
            await trio.to_thread.run_sync(opened.core.close)

    def update(self, entries: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
        """Apply a re-read catalogue: (added, removed, changed) names. A changed entry of an
        opened set is re-indexed in the background; of a closed one, used at its next open."""
        added = [n for n in entries if n not in self.slots]
        removed = [n for n in self.slots if n not in entries]
        changed = [n for n in entries if n in self.slots and entries[n] != self.slots[n].entry]
        for name in removed:
            self._names = None
            slot = self.slots.pop(name)
            slot.removed = True
            self._by_vid.pop(slot.vid, None)
            if slot.current is not None:
                version, slot.current = slot.current, None
                self._open.discard(slot)
                self._retire(version)
            self.events.removed(slot)
        for name in sorted(added):
            self.events.added(self._add(name, entries[name]))
        for name in changed:
            slot = self.slots[name]
            if slot.current is None:
                slot.entry = entries[name]
                slot.error = slot.failed_identity = None
            elif self._nursery is not None:
                self._nursery.start_soon(self.reload, slot, entries[name])
        for what, names in (("added", added), ("removed", removed), ("changed", changed)):
            if names:
                log.info("catalogue: %s %s", what, ", ".join(sorted(names)[:10])
                         + (f" and {len(names) - 10} more" if len(names) > 10 else ""))
        return added, removed, changed

    # ---- state and shutdown ------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """``refmount stats``' view: counts, and each slot that was ever opened or failed."""
        sets = {name: s.describe() for name, s in sorted(self.slots.items())
                if s.versions or s.error is not None}
        return {"sets": len(self.slots), "sets_open": self.opened, "max_open_sets": self.max_open,
                "set_opens": self.versions_opened,
                "set_index_failures": self.index_failures, "set_reloads": self.reloads,
                "set_reload_failures": self.reload_failures, "set_states": sets}

    async def aclose(self) -> None:
        """Close every version and wait until they are."""
        versions = list(self._versions.values())
        for version in versions:
            self._close(version)
        for slot in self.slots.values():
            slot.current = None
        self._open.clear()
        for version in versions:
            await version.closed.wait()
