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
import io
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from refmount.base.errors import ConfigError, FetchError
from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.targets.pintable import PinTable, PinTableBuilder
from refmount.targets.versions import _FIELDS, Version
from refmount.targets.versions import (
    VersionChanged as VersionChanged,  # re-exported: where pins are, for the fetcher
)

log = logging.getLogger(__name__)

PIN_FORMAT = "refmount-pins-1"
# A pin file larger than this is refused (max_inline's default: some 600,000 targets of
# 100-byte URLs), before it is read; it is parsed as it streams into a PinTable, so memory
# is the pins, held compactly (at most about the file's size).
MAX_PIN_FILE = 64 << 20
_DEPTH = 3  # {"targets": {URL: {field: value}}}
_FIELD_SET = frozenset(_FIELDS)


class PinMismatch(FetchError):
    """A read refused because its target is not the pinned version (or not pinned at all).
    Logged once per target by ``Pins.refuse``, so never again per read (``logged``)."""


def _pin_error(where: str, what: str) -> ConfigError:
    return ConfigError(f"pins: {where} is not a valid pin file ({what}); write it with "
                       "'refmount verify SOURCE --pin FILE'")


def _not_pin_file(where: str) -> ConfigError:
    return ConfigError(f"pins: {where} is not a refmount pin file (no \"format\": "
                       f"\"{PIN_FORMAT}\"); write it with 'refmount verify SOURCE --pin FILE'")


def _version(url: str, entry: dict[str, Any], where: str) -> Version:
    size, mtime_ns = entry.get("size"), entry.get("mtime_ns")
    problem = None
    if not _FIELD_SET.issuperset(entry):
        problem = f" must be an object with the fields {', '.join(_FIELDS)}"
    elif type(size) is not int or size < 0:
        problem = " needs \"size\", a non-negative integer"
    elif mtime_ns is not None and type(mtime_ns) is not int:
        problem = ": \"mtime_ns\" must be an integer"
    else:
        for name in ("etag", "last_modified", "version_id"):
            if entry.get(name) is not None and not isinstance(entry[name], str):
                problem = f": \"{name}\" must be a string"
    if problem is not None:  # the URL redacted only then: it costs more than the rest
        raise ConfigError(f"pins: {where}: the pin of {redact_url(url)!r}{problem}")
    return Version(size=size, etag=entry.get("etag"), last_modified=entry.get("last_modified"),
                   mtime_ns=mtime_ns, version_id=entry.get("version_id"))


class _Bounded(io.RawIOBase):
    """A stream that refuses to yield more than ``limit`` bytes in all (a file that grows)."""

    def __init__(self, f: IO[bytes], limit: int, where: str) -> None:
        self._f, self._left, self._limit, self._where = f, limit, limit, where

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(self._left + 1 if n < 0 else min(n, self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise ConfigError(f"pins: {self._where} is larger than {self._limit >> 20} MiB")
        return data


def _parse_stream(open_stream: Callable[[], IO[bytes]], where: str) -> PinTable:
    """The pins of a pin file read as a stream, twice (``open_stream`` opens it): its top
    level up to the start of "targets" (ijson events; "format" comes first in what
    ``write_pins`` writes), then each target's pin built by ijson alone (``kvitems``); the
    nesting is checked before the parser sees a byte (``JsonReader``). Memory is the pins,
    held compactly (``PinTable``: at most about the file's size), never the text or a parse
    of it whole."""
    import ijson

    from refmount.refs.limits import JsonReader, Limits
    from refmount.refs.model import ReferenceSetError

    limits = Limits(max_nesting=_DEPTH)
    fmt: Any = None
    targets: str | None = None  # the event that starts "targets"
    try:
        with open_stream() as f:
            key = None
            for prefix, event, value in ijson.parse(JsonReader(f, where, limits), use_float=True):
                if prefix == "" and event == "map_key":
                    key = value
                elif prefix == "" and event == "end_map":
                    break
                elif prefix == "" and event != "start_map":
                    raise _not_pin_file(where)  # a scalar or an array
                elif prefix == "format" and key == "format":
                    fmt = value
                elif prefix == "targets" and key == "targets" and targets is None:
                    targets = event
                if fmt is not None and targets is not None:
                    break
        if fmt != PIN_FORMAT:
            raise _not_pin_file(where)
        if targets != "start_map":
            raise ConfigError(f"pins: {where}: \"targets\" must be an object of target URL -> pin")
        pins = PinTableBuilder()
        with open_stream() as f:
            add = pins.add_fields
            for url, entry in ijson.kvitems(JsonReader(f, where, limits), "targets", use_float=True):
                if type(entry) is dict and entry.keys() <= _FIELD_SET:  # the usual pin, at once
                    size, mtime_ns = entry.get("size"), entry.get("mtime_ns")
                    etag, modified, version_id = (entry.get("etag"), entry.get("last_modified"),
                                                  entry.get("version_id"))
                    if (type(size) is int and size >= 0 and (mtime_ns is None or type(mtime_ns) is int)
                            and (etag is None or type(etag) is str)
                            and (modified is None or type(modified) is str)
                            and (version_id is None or type(version_id) is str)):
                        try:
                            add(url, size, etag, modified, version_id, mtime_ns)
                        except ValueError as e:
                            raise ConfigError(f"pins: {where}: the pin of {redact_url(url)!r}: {e}") from None
                        continue
                if not isinstance(entry, dict):
                    raise ConfigError(f"pins: {where}: the pin of {redact_url(url)!r} must be an "
                                      f"object with the fields {', '.join(_FIELDS)}")
                try:
                    pins.add(url, _version(url, entry, where))
                except ValueError as e:
                    raise ConfigError(f"pins: {where}: the pin of {redact_url(url)!r}: {e}") from None
        return pins.build()
    except ConfigError:
        raise
    except ijson.JSONError as e:
        first = str(e).strip().splitlines()[0][:80] if str(e).strip() else ""  # yajl's excerpt after it
        raise _pin_error(where, "not valid JSON" + (f": {first}" if first else "")) from None
    except ReferenceSetError as e:
        raise _pin_error(where, str(e).removeprefix(f"{where}: ").split(" (limit ")[0]) from None
    except UnicodeDecodeError:
        raise _pin_error(where, "not UTF-8") from None
    except (ValueError, RecursionError) as e:  # what a parser may still say of odd numbers
        raise _pin_error(where, type(e).__name__) from None


def parse_pins(text: str | bytes, where: str) -> PinTable:
    """The pins of a pin file's text; ConfigError naming ``where`` and the problem."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return _parse_stream(lambda: io.BytesIO(data), where)


def read_pins(path: str) -> PinTable:
    """The pins in the file ``path``, parsed as it is read; ConfigError (one line) if it is
    not a regular file, is larger than MAX_PIN_FILE or cannot be read or parsed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block
    except OSError as e:
        raise ConfigError(f"pins: cannot read {path}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"pins: {path} is not a regular file")
        if st.st_size > MAX_PIN_FILE:
            raise ConfigError(f"pins: {path} is larger than {MAX_PIN_FILE >> 20} MiB "
                              f"({st.st_size:,} bytes): pin fewer targets per file")

        def again() -> IO[bytes]:  # the same open file from its start, never more than the bound
            f.seek(0)
            return _Bounded(f, MAX_PIN_FILE, path)  # type: ignore[return-value]

        try:
            return _parse_stream(again, path)
        except OSError as e:
            raise ConfigError(f"pins: cannot read {path}: {e.strerror or e}") from None


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

    MAX_ADDED = 1_000_000  # pins added while serving (``add``), at most

    def __init__(self, pins: Mapping[str, Version], where: str = "", stats: Any = None,
                 required: bool = True) -> None:
        self._pins = pins  # a pin file's (a PinTable: read-only)
        self._added: dict[str, Version] = {}  # pins added while serving (``add``)
        self.where = where
        # required: a target without a pin is refused (a pin file); else it is read unchecked
        # (pins added while serving: an Icechunk repository's virtual chunks, ``add``)
        self.required = required
        self._changed: LRU[str, str] = LRU(self.MAX_CHANGED)
        # counted in ``stats`` (the mount's Stats): pin_refusals, pinned_targets_changed
        self.stats = stats if stats is not None else _Counts()

    @classmethod
    def load(cls, path: str, stats: Any = None) -> Pins:
        return cls(read_pins(path), path, stats)

    def __len__(self) -> int:
        return len(self._pins) + len(self._added)

    def __contains__(self, url: str) -> bool:
        return url in self._pins or url in self._added

    def pin(self, url: str) -> Version | None:
        pin = self._pins.get(url)
        return pin if pin is not None else self._added.get(url)

    def token(self, url: str) -> str:
        """What names the pinned version of ``url`` in a disk-cache key ("unpinned" if none)."""
        pin = self.pin(url)
        return pin.token() if pin is not None else "unpinned"

    def refused(self, url: str) -> PinMismatch | None:
        """The refusal of a target already found changed (or unpinned), if it was."""
        reason = self._changed.get(url)
        if reason is None:
            return None
        self.stats.pin_refusals += 1
        return self._error(url, reason)

    def check(self, url: str) -> Version | None:
        """The pin of ``url``; a PinMismatch if it was found changed, or if it has none and
        pins are required (None: it has none and may be read unchecked)."""
        if (known := self.refused(url)) is not None:
            raise known
        pin = self.pin(url)
        if pin is None and self.required:
            raise self.refuse(url, f"not pinned in {self.where or 'the pin file'}")
        return pin

    def add(self, url: str, version: Version) -> None:
        """Pin ``url`` to ``version`` unless it is pinned already (the first pin stays)."""
        if url not in self and len(self._added) < self.MAX_ADDED:
            self._added[url] = version

    def keyed(self, url: str) -> bool:
        """Whether ``url``'s blocks are cached by its pinned version (``token``)."""
        return self.required or url in self

    def refuse(self, url: str, reason: str) -> PinMismatch:
        """Record ``url`` as changed (logged once per target) and return the read's error."""
        self.stats.pin_refusals += 1
        if self._changed.peek(url) is None:
            self.stats.pinned_targets_changed += 1
            self._changed.put(url, reason)
            if self.required:
                log.error("target %s is not its pinned version (%s): its reads fail with EIO until "
                          "it is pinned again (refmount verify SOURCE --pin FILE, then remount)",
                          redact_url(url), reason)
            else:
                log.error("target %s is not the version its references recorded (%s): their reads "
                          "fail with EIO (-o no_virtual_pins reads it as it is now)",
                          redact_url(url), reason)
        return self._error(url, reason)

    @staticmethod
    def _error(url: str, reason: str) -> PinMismatch:
        e = PinMismatch(url, f"not the pinned version: {reason}")
        e.logged = True  # once per target, above
        return e
