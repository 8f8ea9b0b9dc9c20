"""The columnar key index: one sorted Arrow table, persisted as an Arrow IPC file and
memory-mapped by the daemon; ``KeyIndex`` reads it.

There is no Python object per key. A reference set of ten million keys is a few
contiguous buffers (sorted key bytes + offsets, kinds, URL ids, offsets, lengths, inline
bytes), so lookups are binary searches over a memory map and a remount of an unchanged
set only maps the file again. ``IndexBuilder`` (``indexbuilder.py``) makes the table,
``indexfiles.py`` writes it.
"""

from __future__ import annotations

import bisect
import mmap
import os
import stat
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from refmount.refs.model import Ref, ReferenceSetError, RefKind

INDEX_FORMAT = "refmount-index-1"

SCHEMA = pa.schema(
    [
        ("key", pa.large_binary()),  # UTF-8 key, sorted bytewise, unique
        ("kind", pa.int8()),  # RefKind
        ("url", pa.dictionary(pa.int32(), pa.large_string())),  # index 0 when no URL
        ("offset", pa.int64()),
        ("length", pa.int64()),  # -1: whole target of unknown size
        ("data", pa.large_binary()),  # inline bytes; empty for other kinds
    ]
)


class KeyIndex:
    """Read-only view of a written index: sorted keys and their references."""

    def __init__(self, table: pa.Table, metadata: dict[str, str] | None = None) -> None:
        self.table = table.combine_chunks() if table.num_rows else table
        self.metadata = metadata or {}
        n = self.n = table.num_rows

        def column(name: str) -> pa.Array:
            col = self.table[name]
            return col.chunk(0) if col.num_chunks else pa.array([], col.type)

        key = column("key")
        self._koff = np.frombuffer(key.buffers()[1], np.int64, n + 1, key.offset * 8)
        self._kbuf = memoryview(key.buffers()[2] or b"")
        self._kinds = _view(column("kind"), np.int8)
        url = column("url")
        self._url_ids = _view(url.indices, np.int32) if n else np.zeros(0, np.int32)
        self._url_strings = url.dictionary if n else pa.array([], pa.large_string())
        self._offsets = _view(column("offset"), np.int64)
        self._lengths = _view(column("length"), np.int64)
        data = column("data")
        self._doff = np.frombuffer(data.buffers()[1], np.int64, n + 1, data.offset * 8)
        self._dbuf = memoryview(data.buffers()[2] or b"")
        self.keys = _KeySequence(self._koff, self._kbuf, n)

    @classmethod
    def open(cls, path: str) -> KeyIndex:
        """Memory-map an index file: pages are read on demand and shared with the page cache.
        Only a regular file of this user's is read, never through a symlink: the index is
        the tree the mount serves."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise ReferenceSetError(f"{path}: not an index file of this user's")
            if st.st_size == 0:
                raise ReferenceSetError(f"{path}: not a refmount index of this version")
            mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped)))
        if reader.schema.metadata is None or reader.schema.metadata.get(b"format") != INDEX_FORMAT.encode():
            raise ReferenceSetError(f"{path}: not a refmount index of this version")
        meta = {k.decode(): v.decode() for k, v in reader.schema.metadata.items()}
        return cls(reader.read_all(), meta)

    def __len__(self) -> int:
        return self.n

    def key(self, i: int) -> bytes:
        return self._kbuf[self._koff[i] : self._koff[i + 1]].tobytes()

    def bisect(self, key: bytes, lo: int = 0, hi: int | None = None) -> int:
        return bisect.bisect_left(self.keys, key, lo, self.n if hi is None else hi)

    def ref(self, i: int, view: bool = False) -> Ref:
        """Key i's reference; ``view``: inline bytes as a view into the mapped index (no
        copy, so that open handles of a large inline value cost no memory each)."""
        kind = RefKind(int(self._kinds[i]))
        if kind is RefKind.INLINE:
            mapped = self._dbuf[self._doff[i] : self._doff[i + 1]]
            data = mapped if view else mapped.tobytes()
            return Ref(kind, None, 0, len(data), data)  # type: ignore[arg-type]
        url = self._url_strings[int(self._url_ids[i])].as_py()
        return Ref(kind, url, int(self._offsets[i]), int(self._lengths[i]))

    def size(self, i: int) -> int:
        """Byte size of key i, or -1 for a whole-file target whose size is not yet known."""
        return int(self._lengths[i])

    def urls(self) -> Iterator[str]:
        """The distinct target URLs that some key uses."""
        used = np.unique(self._url_ids[self._kinds != RefKind.INLINE])
        for uid in used.tolist():
            yield self._url_strings[uid].as_py()

    def first_with_url(self, url: str) -> int:
        uid = self._url_strings.to_pylist().index(url)
        hits = np.flatnonzero((self._url_ids == uid) & (self._kinds != RefKind.INLINE))
        return int(hits[0])

    def iter_refs(self) -> Iterator[tuple[bytes, Ref]]:
        for i in range(self.n):
            yield self.key(i), self.ref(i)


def _view(array: pa.Array, dtype: type) -> np.ndarray:
    """A zero-copy numpy view of a null-free fixed-width Arrow array. (``to_numpy()``
    faults in several times the column's size; a view touches pages only when read.)"""
    if array.null_count:
        raise ValueError("index columns have no nulls")
    item = np.dtype(dtype).itemsize
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * item)


class _KeySequence:
    """Sequence protocol over the key column, so ``bisect`` runs its loop in C."""

    __slots__ = ("_buf", "_n", "_off")

    def __init__(self, off: np.ndarray, buf: memoryview, n: int) -> None:
        # offsets through a memoryview: its items are Python ints, a numpy array's are numpy
        # scalars, several times slower to make and to slice with (each probe of a lookup)
        self._off, self._buf, self._n = memoryview(off), buf, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        off = self._off
        return self._buf[off[i] : off[i + 1]].tobytes()
