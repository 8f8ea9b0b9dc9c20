"""Pins: the version of each target a mount may serve bytes of (``-o pins=FILE``).

A target's *version* is what its store reports about it: its size, and where the store
reports them its ETag, its modification time (HTTP ``Last-Modified``, an object store's
``LastModified``, a local file's ``st_mtime_ns``) and an object version id. ``refmount verify
SOURCE --pin FILE`` records each target's version in a pin file; a mount (or ``refmount
serve``) given that file compares the version of the response that carries the bytes with
the pin and refuses a target whose version differs (``PinMismatch``: EIO for a read, 502 over
HTTP, one log line per target). Nothing fetched from a changed target is returned, so none
of it is cached.

The pin file (JSON, written atomically, mode 0600)::

    {"format": "refmount-pins-1",
     "targets": {"<target URL as written in the set>":
                     {"size": 1234, "etag": "\\"5f-3a\\"", "last_modified": "...",
                      "mtime_ns": 1700000000000000000, "version_id": "..."}, ...}}

Only ``size`` is required; the other fields are present when the store reported them.

This module is pure (no I/O but reading and writing the pin file): the fetcher asks
``Pins.pin``, observes a ``Version`` and calls ``Pins.refuse`` with the reason
``Pin.mismatch`` gives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from refmount.base.errors import ConfigError, FetchError
from refmount.base.lru import LRU
from refmount.base.optionfile import read_option_bytes
from refmount.base.redact import redact_url

log = logging.getLogger(__name__)

PIN_FORMAT = "refmount-pins-1"
MAX_PIN_FILE = 1 << 30  # a pin file larger than this is refused (bounded memory)
_FIELDS = ("size", "etag", "last_modified", "mtime_ns", "version_id")


class VersionChanged(Exception):
    """A response (or a file descriptor) shows a version other than the pinned one; the
    message says what differs. Raised where the bytes are read, turned into ``PinMismatch``
    by the fetcher."""


class PinMismatch(FetchError):
    """A read refused because its target is not the pinned version (or not pinned at all).
    Logged once per target by ``Pins.refuse``, so never again per read (``logged``)."""


@dataclass(frozen=True)
class Version:
    """A target's version as its store reports it; None where it reports nothing."""

    size: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    mtime_ns: int | None = None
    version_id: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], size: int | None) -> Version:
        """From an HTTP response's headers; ``size``: the object's size the response tells
        (a ``Content-Range`` total, or the ``Content-Length`` of a whole answer)."""
        return cls(size=size, etag=headers.get("ETag") or None,
                   last_modified=headers.get("Last-Modified") or None)

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Version:
        """From an fsspec ``info`` dict (http, s3, gcs, ... spell the fields differently)."""
        size = info.get("size")
        etag = info.get("ETag") or info.get("etag")
        modified = (info.get("Last-Modified") or info.get("LastModified") or info.get("mtime")
                    or info.get("updated"))
        mtime_ns = info.get("mtime_ns")
        version = info.get("VersionId") or info.get("version_id") or info.get("generation")
        return cls(size=int(size) if size is not None else None,
                   etag=str(etag) if etag else None,
                   last_modified=str(modified) if modified and mtime_ns is None else None,
                   mtime_ns=int(mtime_ns) if mtime_ns is not None else None,
                   version_id=str(version) if version and version != "null" else None)

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS if getattr(self, name) is not None}

    def token(self) -> str:
        """A stable text naming this version (part of the disk cache's key of a pinned target)."""
        return json.dumps(self.as_json(), sort_keys=True)

    @property
    def strong_etag(self) -> str | None:
        """The ETag if it is a strong one (``If-Match`` compares strong ETags only)."""
        return self.etag if self.etag and not self.etag.startswith("W/") else None

    def mismatch(self, seen: Version) -> str | None:
        """Why ``seen`` (what a response or descriptor showed) is not this pinned version, or
        None if it is. Every field of the pin that ``seen`` reports must be equal; the ETag,
        the modification time and the version id must be reported when pinned; the size may
        go unreported (a ``Content-Range`` total of ``*``) only when an ETag or version id
        matched."""
        if seen.size is not None and self.size is not None and seen.size != self.size:
            return f"size {seen.size:,} bytes, pinned {self.size:,}"
        for name, label in (("etag", "ETag"), ("version_id", "version id"),
                            ("mtime_ns", "modification time (ns)"),
                            ("last_modified", "modification time")):
            pinned, now = getattr(self, name), getattr(seen, name)
            if pinned is None:
                continue
            if now is None:
                return f"the store reports no {label}, pinned {pinned}"
            if now != pinned:
                return f"{label} {now}, pinned {pinned}"
        if seen.size is None and self.size is not None and self.etag is None and self.version_id is None:
            return "the store reports neither the size nor an ETag"
        return None


def parse_pins(text: str | bytes, where: str) -> dict[str, Version]:
    """The pins of a pin file's text; ConfigError naming ``where`` and the problem."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        why = f"{e.msg} at char {e.pos}" if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise ConfigError(f"pins: {where} is not valid JSON ({why}); write it with "
                          "'refmount verify SOURCE --pin FILE'") from None
    if not isinstance(doc, dict) or doc.get("format") != PIN_FORMAT:
        raise ConfigError(f"pins: {where} is not a refmount pin file (no \"format\": "
                          f"\"{PIN_FORMAT}\"); write it with 'refmount verify SOURCE --pin FILE'")
    targets = doc.get("targets")
    if not isinstance(targets, dict):
        raise ConfigError(f"pins: {where}: \"targets\" must be an object of target URL -> pin")
    pins: dict[str, Version] = {}
    for url, entry in targets.items():
        what = f"pins: {where}: the pin of {redact_url(url)!r}"
        if not isinstance(entry, dict) or set(entry) - set(_FIELDS):
            raise ConfigError(f"{what} must be an object with the fields {', '.join(_FIELDS)}")
        size, mtime_ns = entry.get("size"), entry.get("mtime_ns")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ConfigError(f"{what} needs \"size\", a non-negative integer")
        if mtime_ns is not None and (not isinstance(mtime_ns, int) or isinstance(mtime_ns, bool)):
            raise ConfigError(f"{what}: \"mtime_ns\" must be an integer")
        for name in ("etag", "last_modified", "version_id"):
            if entry.get(name) is not None and not isinstance(entry[name], str):
                raise ConfigError(f"{what}: \"{name}\" must be a string")
        pins[url] = Version(size=size, etag=entry.get("etag"),
                            last_modified=entry.get("last_modified"), mtime_ns=mtime_ns,
                            version_id=entry.get("version_id"))
    return pins


def read_pins(path: str) -> dict[str, Version]:
    """The pins in the file ``path``; ConfigError (one line) if it cannot be read or parsed."""
    return parse_pins(read_option_bytes(path, "pins", MAX_PIN_FILE), path)


def write_pins(path: str, versions: Iterable[tuple[str, Version]], source: str) -> int:
    """Write a pin file atomically (a temporary file beside it, renamed into place; mode
    0600: it names the set's targets as the set does, credentials in URLs included).
    Returns the number of targets pinned."""
    targets = {url: v.as_json() for url, v in versions}
    doc = {"format": PIN_FORMAT, "source": redact_url(source), "targets": targets}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".pins-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(targets)


class _Counts:
    pin_refusals = 0
    pinned_targets_changed = 0


class Pins:
    """The pins a mount serves by, and the targets found changed (refused from then on
    without asking their store again, until the mount is made again)."""

    MAX_CHANGED = 100_000  # changed targets remembered at once

    def __init__(self, pins: dict[str, Version], where: str = "", stats: Any = None) -> None:
        self._pins = pins
        self.where = where
        self._changed: LRU[str, str] = LRU(self.MAX_CHANGED)
        # counted in ``stats`` (the mount's Stats): pin_refusals, pinned_targets_changed
        self.stats = stats if stats is not None else _Counts()

    @classmethod
    def load(cls, path: str, stats: Any = None) -> Pins:
        return cls(read_pins(path), path, stats)

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, url: str) -> bool:
        return url in self._pins

    def pin(self, url: str) -> Version | None:
        return self._pins.get(url)

    def token(self, url: str) -> str:
        """What names the pinned version of ``url`` in a disk-cache key ("unpinned" if none)."""
        pin = self._pins.get(url)
        return pin.token() if pin is not None else "unpinned"

    def refused(self, url: str) -> PinMismatch | None:
        """The refusal of a target already found changed (or unpinned), if it was."""
        reason = self._changed.get(url)
        if reason is None:
            return None
        self.stats.pin_refusals += 1
        return self._error(url, reason)

    def check(self, url: str) -> Version:
        """The pin of ``url``; a PinMismatch if it has none or was found changed."""
        if (known := self.refused(url)) is not None:
            raise known
        pin = self._pins.get(url)
        if pin is None:
            raise self.refuse(url, f"not pinned in {self.where or 'the pin file'}")
        return pin

    def refuse(self, url: str, reason: str) -> PinMismatch:
        """Record ``url`` as changed (logged once per target) and return the read's error."""
        self.stats.pin_refusals += 1
        if self._changed.peek(url) is None:
            self.stats.pinned_targets_changed += 1
            self._changed.put(url, reason)
            log.error("target %s is not its pinned version (%s): its reads fail with EIO until "
                      "it is pinned again (refmount verify SOURCE --pin FILE, then remount)",
                      redact_url(url), reason)
        return self._error(url, reason)

    @staticmethod
    def _error(url: str, reason: str) -> PinMismatch:
        e = PinMismatch(url, f"not the pinned version: {reason}")
        e.logged = True  # once per target, above
        return e
