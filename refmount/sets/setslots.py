"""What ``Sets`` (``sets/opensets.py``) holds: a slot per set (``SetSlot``), the versions opened
for it (``SetVersion``, from an ``Opened`` core), and the events front ends hear (``SetEvents``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio


class Entry(Protocol):
    """One set of a catalogue (``catalog.CatalogEntry``)."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def options(self) -> Mapping[str, str]: ...


class SetUnavailable(Exception):
    """A set that cannot be served now (its first indexing failed): the reason."""


@dataclass
class Opened:
    """What opening a set gives: its core (``core.SetCore`` or anything with its lifecycle),
    what identified SOURCE before it was indexed, and the index it maps (the same ``key``
    means the same inode numbers)."""

    core: Any
    identity: str
    key: str
    size: int = 0  # bytes it holds while open (its index, its memory cache)


@dataclass(eq=False)
class SetVersion:
    """One opened core of a slot. ``front`` is the front end's own object over it."""

    vid: int
    number: int  # 1 for a slot's first version, then one more per reload
    name: str
    core: Any
    identity: str
    key: str
    size: int = 0  # bytes it holds while open (Opened.size)
    opened: float = field(default_factory=time.time)
    front: Any = None
    handles: int = 0  # open files
    active: int = 0  # requests in flight
    retired: bool = False  # replaced, closed by the LRU bound, or its set removed
    closing: trio.Event = field(default_factory=trio.Event)
    closed: trio.Event = field(default_factory=trio.Event)

    @property
    def idle(self) -> bool:
        return self.handles == 0 and self.active == 0


@dataclass(eq=False)
class SetSlot:
    """One set of the catalogue, opened or not."""

    name: str
    entry: Any
    vid: int  # the version id the front ends show now (reserved before the first open)
    current: SetVersion | None = None
    versions: int = 0  # versions seen so far (the number of the newest)
    last_used: float = 0.0  # trio.current_time() of the last request
    last_check: float | None = None  # wall time of the last reload check
    last_reload: float | None = None  # wall time a new version was swapped in
    error: str | None = None  # OPEN_FAILED or IDENTIFY_FAILED (the last good version serves)
    failed_identity: str | None = None  # the SOURCE identity that failed: not tried again
    last_key: str = ""  # the index of the last version (a reopen of the same keeps the vid)
    removed: bool = False
    reloading: bool = False

    def describe(self) -> dict[str, Any]:
        """The slot as ``refmount stats`` shows it."""
        cur = self.current
        out: dict[str, Any] = {"state": "open" if cur is not None else "closed"}
        if self.versions:
            out["version"] = self.versions
        if cur is not None:
            out["open_files"] = cur.handles
            served = (getattr(cur.core, "info", None) or {}).get("snapshot")
            if served:  # the revision a version serves (an Icechunk snapshot)
                out["snapshot"] = served
        if self.last_reload is not None:
            out["last_reload"] = _stamp(self.last_reload)
        if self.last_check is not None:
            out["last_check"] = _stamp(self.last_check)
        if self.error is not None:
            out["error"] = self.error
        return out


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class SetEvents:
    """What a front end hears of (all called on the trio loop; default: nothing)."""

    def made(self, version: SetVersion) -> None:
        """A version was opened: ``version.front`` may be set here."""

    def replaced(self, slot: SetSlot, old_vid: int, new_vid: int) -> None:
        """The version id shown for ``slot`` changed (a reload, a reopened changed set)."""

    def added(self, slot: SetSlot) -> None:
        """A set appeared in the catalogue."""

    def removed(self, slot: SetSlot) -> None:
        """A set disappeared from the catalogue."""
