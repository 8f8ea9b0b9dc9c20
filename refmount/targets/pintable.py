"""Pins held compactly: target URL -> ``Version``, in a few arrays instead of Python objects.

A pin file may hold some 600,000 targets (``pins.MAX_PIN_FILE``); as a dict of ``Version``
objects, each with its URL and strings, that took about 4 times the file's size. Here each
target is one packed record in a single ``bytearray`` (its URL and pin: flags, size, the
strings present, the modification time), and two arrays find it: the 64-bit hashes of the
URLs, sorted, and where each record starts (``uint32``: the records are within the file's
size). What a target costs is its text plus about 30 bytes, less than its pin file's entry
(``"<URL>": {"size": ..., ...}``), so memory is at most the file's size and the peak while
building about 1.4 times it (the sort of the hashes at the end). A lookup is two binary
searches and the compare of one URL; the ``Version`` is made then.

Hashes are BLAKE2b (8 bytes) keyed with 16 random bytes of the table's own, so that a pin
file cannot be made of colliding URLs and a table means the same in every process: the CLI
that parsed a pin file hands its table to the serving process as a file (``save``), which
maps it (``map_table``) instead of parsing the pin file again. A URL listed twice keeps its
last pin, as a JSON object read into a dict would.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import struct
from array import array
from collections.abc import Iterator, Mapping

import numpy as np

from refmount.targets.versions import Version

__all__ = ["PinTable", "PinTableBuilder", "map_table"]

_HEAD = struct.Struct("<BQI")  # flags, size, length of the URL
_LEN = struct.Struct("<I")
_MTIME = struct.Struct("<q")
_STRINGS = ("etag", "last_modified", "version_id")  # flags 1, 2, 4 when present
_HAS_MTIME = 8
# A saved table: magic, hash key, rows, bytes of the records; then the sorted hashes (int64),
# the starts of their records (uint32) and the records.
_FILE_HEAD = struct.Struct("<8s16sQQ")
_MAGIC = b"RMPINTB1"
_KEY_BYTES = 16


class PinTableFileError(ValueError):
    """A saved table that is not one (not ours, not a regular file, inconsistent)."""


def _text(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def _hasher(key: bytes) -> object:
    return hashlib.blake2b(digest_size=8, key=key)


def _hash(hasher: object, url: str) -> int:
    h = hasher.copy()  # type: ignore[attr-defined]
    h.update(_text(url))
    return int.from_bytes(h.digest(), "little", signed=True)


class PinTableBuilder:
    """Add pins one at a time (``add``), then ``build`` the table."""

    def __init__(self) -> None:
        self._blob = bytearray()
        self._starts = array("I")
        self._hashes = array("q")
        self._key = os.urandom(_KEY_BYTES)
        self._hasher = _hasher(self._key)

    def add(self, url: str, version: Version) -> None:
        """Add the pin of ``url``. ValueError when a number does not fit (a size of 2^64 or
        more, a modification time outside 64 bits)."""
        if version.size is None:
            raise ValueError("\"size\" is missing")
        self.add_fields(url, version.size, version.etag, version.last_modified, version.version_id,
                        version.mtime_ns)

    def add_fields(self, url: str, size: int, etag: str | None, last_modified: str | None,
                   version_id: str | None, mtime_ns: int | None) -> None:
        """``add`` of the fields of a ``Version`` (what a pin file's parse calls, without
        making the ``Version``)."""
        if not 0 <= size < 1 << 64:
            raise ValueError("\"size\" is too large")
        if mtime_ns is not None and not -(1 << 63) <= mtime_ns < 1 << 63:
            raise ValueError("\"mtime_ns\" is too large")
        blob = self._blob
        if len(blob) >= 1 << 32:
            raise ValueError("too many pins")
        key = url.encode("utf-8", "surrogatepass")
        hasher = self._hasher.copy()  # type: ignore[attr-defined]
        hasher.update(key)
        self._hashes.append(int.from_bytes(hasher.digest(), "little", signed=True))
        start = len(blob)
        self._starts.append(start)
        blob += _HEAD.pack(0, size, len(key))
        blob += key
        flags = 0
        for bit, value in ((1, etag), (2, last_modified), (4, version_id)):  # _STRINGS' order
            if value is not None:
                flags |= bit
                data = value.encode("utf-8", "surrogatepass")
                blob += _LEN.pack(len(data))
                blob += data
        if mtime_ns is not None:
            flags |= _HAS_MTIME
            blob += _MTIME.pack(mtime_ns)
        blob[start] = flags

    def build(self) -> PinTable:
        hashes = np.frombuffer(self._hashes, dtype=np.int64) if self._hashes else np.empty(0, np.int64)
        order = np.argsort(hashes, kind="stable")  # a URL listed twice: its last pin after the first
        sorted_hashes = hashes[order]
        del hashes
        self._hashes = array("q")
        starts = np.frombuffer(self._starts, dtype=np.uint32) if self._starts else np.empty(0, np.uint32)
        sorted_starts = starts[order]
        del starts, order
        self._starts = array("I")
        blob, self._blob = self._blob, bytearray()
        table = PinTable(bytes(blob) if len(blob) < 1 << 20 else blob, sorted_hashes, sorted_starts,
                         self._key)
        return table.without_repeats()


class PinTable(Mapping[str, Version]):
    """URL -> pinned ``Version`` (see the module's docstring); made by ``PinTableBuilder``."""

    def __init__(self, blob: bytes | bytearray | memoryview, hashes: np.ndarray, starts: np.ndarray,
                 key: bytes) -> None:
        self._blob = blob
        self._hashes = hashes
        self._starts = starts
        self._key = key
        self._hasher = _hasher(key)

    def _url(self, row: int) -> bytes:
        start = int(self._starts[row])
        _, _, n = _HEAD.unpack_from(self._blob, start)
        at = start + _HEAD.size
        return bytes(self._blob[at : at + n])

    def _version(self, row: int) -> Version:
        start = int(self._starts[row])
        flags, size, n = _HEAD.unpack_from(self._blob, start)
        at = start + _HEAD.size + n
        strings: dict[str, str] = {}
        for bit, name in enumerate(_STRINGS):
            if flags & (1 << bit):
                (length,) = _LEN.unpack_from(self._blob, at)
                at += _LEN.size
                strings[name] = bytes(self._blob[at : at + length]).decode("utf-8", "surrogatepass")
                at += length
        mtime_ns = _MTIME.unpack_from(self._blob, at)[0] if flags & _HAS_MTIME else None
        return Version(size=size, mtime_ns=mtime_ns, **strings)

    def _row(self, url: str) -> int | None:
        h = _hash(self._hasher, url)
        lo = int(np.searchsorted(self._hashes, h, "left"))
        hi = int(np.searchsorted(self._hashes, h, "right"))
        if lo == hi:
            return None
        key = _text(url)
        for row in range(hi - 1, lo - 1, -1):
            if self._url(row) == key:
                return row
        return None

    def without_repeats(self) -> PinTable:
        """The table with each URL once (its last pin): rows of equal hashes compared."""
        same = np.flatnonzero(self._hashes[1:] == self._hashes[:-1])
        if not same.size:
            return self
        drop = [int(i) for i in same if self._url(int(i)) == self._url(int(i) + 1)]
        if not drop:
            return self
        keep = np.ones(len(self._hashes), bool)
        keep[drop] = False
        return PinTable(self._blob, self._hashes[keep], self._starts[keep], self._key)

    def __getitem__(self, url: str) -> Version:
        row = self._row(url) if isinstance(url, str) else None
        if row is None:
            raise KeyError(url)
        return self._version(row)

    def get(self, url: str, default: Version | None = None) -> Version | None:  # type: ignore[override]
        row = self._row(url) if isinstance(url, str) else None
        return default if row is None else self._version(row)

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and self._row(url) is not None

    def __len__(self) -> int:
        return len(self._hashes)

    def __iter__(self) -> Iterator[str]:
        for row in range(len(self._hashes)):
            yield self._url(row).decode("utf-8", "surrogatepass")

    @property
    def nbytes(self) -> int:
        """The bytes the table holds."""
        return len(self._blob) + self._hashes.nbytes + self._starts.nbytes

    def save(self, fd: int) -> None:
        """Write the table to ``fd`` (an open file of the caller's), for ``map_table``."""
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(_FILE_HEAD.pack(_MAGIC, self._key, len(self._hashes), len(self._blob)))
            f.write(np.ascontiguousarray(self._hashes, np.int64).tobytes())
            f.write(np.ascontiguousarray(self._starts, np.uint32).tobytes())
            f.write(self._blob)


def map_table(path: str) -> PinTable:
    """The table ``save`` wrote to ``path``, mapped (read-only, nothing parsed): a regular
    file of this user's, opened without following a symlink, whose parts add up.
    PinTableFileError otherwise; OSError if it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PinTableFileError(f"{path}: not a regular file of this user's")
        if st.st_size < _FILE_HEAD.size:
            raise PinTableFileError(f"{path}: not a table of pins")
        mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    magic, key, rows, blob_bytes = _FILE_HEAD.unpack_from(mapped, 0)
    at = _FILE_HEAD.size
    if magic != _MAGIC or at + rows * 12 + blob_bytes != len(mapped):
        mapped.close()
        raise PinTableFileError(f"{path}: not a table of pins")
    hashes = np.frombuffer(mapped, np.int64, rows, at)
    starts = np.frombuffer(mapped, np.uint32, rows, at + rows * 8)
    if rows and int(starts.max()) + _HEAD.size > blob_bytes:
        raise PinTableFileError(f"{path}: not a table of pins")
    return PinTable(memoryview(mapped)[at + rows * 12:], hashes, starts, key)
