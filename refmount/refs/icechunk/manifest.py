"""A manifest: the chunk references of one or more arrays, verified once, then looked up by
binary search on the chunk coordinates.

What a loaded manifest keeps per array is small: the position of each ChunkRef table in the
(verified) buffer and the chunk coordinates, as numpy arrays. A ChunkRef's other fields are
read from the buffer when that one reference is asked for; an inline chunk over SMALL_INLINE
bytes is a view of the buffer (memoryview), never a copy (a smaller one is copied, so that it
does not keep a whole manifest alive: whoever keeps views weighs the buffer they hold, as
tree.py's lookups do). References may share one stored inline vector, so each inline chunk
is bounded (``max_inline``) and so are all of them together, each reference counted
(``max_inline_total``): what they make, not what is stored.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import zstandard

from refmount.refs.icechunk import ids, schema
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.icechunk.records import ChunkRef
from refmount.refs.icechunk.verify import SLICE, Tables, Vectors, verify
from refmount.refs.limits import size_text

# ChunkRef's fields, by vtable offset (4 + 2 * slot; schema.CHUNK_REF)
_INLINE, _OFFSET, _LENGTH, _CHUNK_ID, _LOCATION, _ETAG, _LAST_MODIFIED, _COMPRESSED = (
    6, 8, 10, 12, 14, 16, 18, 20)
SMALL_INLINE = 4096  # inline chunks up to this size are copied, larger ones are views
_u16 = struct.Struct("<H").unpack_from
_u32 = struct.Struct("<I").unpack_from
_i32 = struct.Struct("<i").unpack_from
_u64 = struct.Struct("<Q").unpack_from


@dataclass
class ArrayRefs:
    """The references of one array in one manifest, sorted by coordinates."""

    manifest: Manifest
    pos: np.ndarray  # positions of the ChunkRef tables
    coords: np.ndarray  # (n, ndim) uint32

    def __len__(self) -> int:
        return len(self.pos)

    def find(self, coords: tuple[int, ...]) -> int | None:
        rows = self.coords
        n = len(rows)
        i = bisect_left(range(n), coords, key=lambda k: tuple(rows[k].tolist()))
        if i < n and tuple(rows[i].tolist()) == coords:
            return i
        return None

    def ref(self, i: int) -> ChunkRef:
        return self.manifest.chunk_ref(int(self.pos[i]))

    def within(self, lo: tuple[int, ...], hi: tuple[int, ...]) -> np.ndarray | None:
        """Indices of the references whose coordinates lie in [lo, hi) (a manifest's extents);
        None when all of them do (the usual case: checked on each dimension's range)."""
        c = self.coords
        if not len(c):
            return None
        if all(int(c[:, d].min()) >= lo[d] and int(c[:, d].max()) < hi[d] for d in range(c.shape[1])):
            return None
        keep = np.ones(len(c), bool)
        for d in range(c.shape[1]):
            keep &= (c[:, d] >= lo[d]) & (c[:, d] < hi[d])
        return np.flatnonzero(keep)

    def count_within(self, lo: tuple[int, ...], hi: tuple[int, ...]) -> int:
        rows = self.within(lo, hi)
        return len(self) if rows is None else len(rows)

    def sizes(self, rows: np.ndarray | None) -> np.ndarray:
        return self.manifest.sizes(self.pos if rows is None else self.pos[rows])

    def refs(self, rows: np.ndarray) -> list[ChunkRef]:
        """The references at ``rows``, their fields gathered for all of them at once."""
        return self.manifest.chunk_refs(self.pos[rows])


class Manifest:
    """A verified manifest object (its flatbuffer, decompressed)."""

    def __init__(self, data: bytes | bytearray, name: str, manifest_id: str, max_location: int,
                 max_refs: int = 1 << 62, *, max_inline: int = 1 << 62,
                 max_inline_total: int = 1 << 62) -> None:
        self.data = data
        self._view = memoryview(data)  # inline chunks are slices of it
        self.name = name
        self.max_location = max_location
        root = verify(data, schema.MANIFEST, name)
        if data[int(root.fields["id"][0]):int(root.fields["id"][0]) + 12] != ids.decode(manifest_id):
            raise IcechunkError(f"{name}: the manifest's id is not the one its name says")
        arrays = root.children["arrays"]
        assert isinstance(arrays, Vectors) and isinstance(arrays.items, Tables)
        items = arrays.items
        refs = items.children["refs"]
        assert isinstance(refs, Vectors) and isinstance(refs.items, Tables) and refs.first is not None
        chunk_refs = refs.items
        if len(chunk_refs) > max_refs:
            raise IcechunkError(f"{name}: {len(chunk_refs):,} chunk references (limit max_keys={max_refs:,})")
        dictionary = root.children["location_dictionary"]
        assert isinstance(dictionary, Vectors)
        algorithm_pos = int(root.fields["compression_algorithm"][0])
        self.algorithm = data[algorithm_pos] if algorithm_pos >= 0 else 1
        self.dictionary = (data[int(dictionary.start[0]):int(dictionary.start[0] + dictionary.length[0])]
                           if dictionary.start[0] >= 0 else None)
        self._decompressor: zstandard.ZstdDecompressor | None = None
        index = chunk_refs.children["index"]
        assert isinstance(index, Vectors)
        self.arrays: dict[bytes, tuple[int, int]] = {}  # node id -> (first, count) in chunk_refs
        node_pos = items.fields["node_id"]
        for a in range(len(items)):
            node = bytes(data[int(node_pos[a]):int(node_pos[a]) + 8])
            self.arrays[node] = (int(refs.first[a]), int(refs.length[a]))
        _check_inline(data, chunk_refs.pos, name, max_inline, max_inline_total)
        self._pos = chunk_refs.pos  # what is kept of the verification: three numbers a reference
        self._index_start = index.start
        self._index_length = index.length
        self._decoded: dict[bytes, ArrayRefs] = {}
        self._nbytes = len(data) + (24 + 8 + 16) * len(self._pos)

    def refs_of(self, node_id: bytes, ndim: int) -> ArrayRefs | None:
        """The references of the array ``node_id`` (None if this manifest has none)."""
        if node_id in self._decoded:
            return self._decoded[node_id]
        span = self.arrays.get(node_id)
        if span is None:
            return None
        first, count = span
        pos = self._pos[first:first + count]
        starts = self._index_start[first:first + count]
        lengths = self._index_length[first:first + count]
        if count and not (lengths == ndim).all():
            raise IcechunkError(f"{self.name}: a chunk reference with {int(lengths[lengths != ndim][0])} "
                                f"coordinates in an array of {ndim} dimensions")
        u8 = np.frombuffer(self.data, np.uint8)
        coords = np.empty((count, ndim), np.uint32)
        step = 4 * np.arange(ndim)[None, :]
        for i in range(0, count, SLICE):  # gathered a slice at a time: transient memory bounded
            at = starts[i:i + SLICE, None] + step
            coords[i:i + SLICE] = (u8[at].astype(np.uint32) | (u8[at + 1].astype(np.uint32) << 8)
                                   | (u8[at + 2].astype(np.uint32) << 16)
                                   | (u8[at + 3].astype(np.uint32) << 24))
        pos, coords = _sorted(pos, coords, self.name)
        refs = ArrayRefs(self, np.ascontiguousarray(pos), np.ascontiguousarray(coords))
        self._decoded[node_id] = refs
        return refs

    @property
    def nbytes(self) -> int:
        """The memory it holds, as the LRU weighs it: fixed when it is made (the buffer, what
        was kept of the verification, and room for each reference's position and coordinates
        once decoded), so that the LRU's sum stays exact."""
        return self._nbytes

    def _inline(self, start: int, size: int) -> bytes | memoryview:
        view = self._view[start:start + size]
        return bytes(view) if size <= SMALL_INLINE else view

    def chunk_ref(self, pos: int) -> ChunkRef:
        """The ChunkRef table at ``pos`` (verified) as a record."""
        data = self.data
        vt = pos - _i32(data, pos)[0]
        vtsize = _u16(data, vt)[0]

        def at(voff: int) -> int:
            return _u16(data, vt + voff)[0] if voff + 2 <= vtsize else 0

        def vector(voff: int) -> bytes | bytearray | None:
            o = at(voff)
            if not o:
                return None
            start = pos + o + _u32(data, pos + o)[0]
            return data[start + 4:start + 4 + _u32(data, start)[0]]

        o = at(_INLINE)
        if o:
            start = pos + o + _u32(data, pos + o)[0]
            size = _u32(data, start)[0]
            return ChunkRef("inline", data=self._inline(start + 4, size), length=size)
        o = at(_OFFSET)
        offset = _u64(data, pos + o)[0] if o else 0
        o = at(_LENGTH)
        length = _u64(data, pos + o)[0] if o else 0
        o = at(_CHUNK_ID)
        if o:
            return ChunkRef("native", location="chunks/" + ids.encode(bytes(data[pos + o:pos + o + 12])),
                            offset=offset, length=length)
        raw = vector(_LOCATION)
        if raw is None:
            raw = self._decompress_location(vector(_COMPRESSED) or b"")
        try:
            location = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise IcechunkError(f"{self.name}: a virtual chunk's location is not UTF-8") from None
        etag_raw = vector(_ETAG)
        etag = etag_raw.decode("utf-8", "replace") if etag_raw is not None else None
        o = at(_LAST_MODIFIED)
        last_modified = (_u32(data, pos + o)[0] or None) if o else None
        return ChunkRef("virtual", location=location, offset=offset, length=length, etag=etag,
                        last_modified=last_modified)

    def chunk_refs(self, pos: np.ndarray) -> list[ChunkRef]:
        """The ChunkRef tables at ``pos`` (verified) as records: their vtables and fields
        gathered with numpy, one Python object made per reference."""
        data = self.data
        f = _Fields(data, pos)

        def vector(voff: int) -> tuple[list[int], list[int]]:
            start, length = f.vector(voff)
            return start.tolist(), length.tolist()

        def scalar(voff: int, size: int) -> list[int]:
            return f.scalar(voff, size).tolist()

        field = f.field
        inline = vector(_INLINE)
        offset, length = scalar(_OFFSET, 8), scalar(_LENGTH, 8)
        chunk_id = field(_CHUNK_ID).tolist()
        location, etag = vector(_LOCATION), vector(_ETAG)
        last_modified = scalar(_LAST_MODIFIED, 4)
        has_lm = (field(_LAST_MODIFIED) >= 0).tolist()
        out = []
        for i in range(len(pos)):
            s = inline[0][i]
            if s >= 0:
                out.append(ChunkRef("inline", data=self._inline(s, inline[1][i]), length=inline[1][i]))
                continue
            c = chunk_id[i]
            if c >= 0:
                out.append(ChunkRef("native", location="chunks/" + ids.encode(bytes(data[c:c + 12])),
                                    offset=offset[i], length=length[i]))
                continue
            s = location[0][i]
            raw = data[s:s + location[1][i]] if s >= 0 else None
            if raw is None:
                out.append(self.chunk_ref(int(pos[i])))  # a compressed location: one at a time
                continue
            try:
                url = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise IcechunkError(f"{self.name}: a virtual chunk's location is not UTF-8") from None
            s = etag[0][i]
            out.append(ChunkRef("virtual", location=url, offset=offset[i], length=length[i],
                                etag=data[s:s + etag[1][i]].decode("utf-8", "replace") if s >= 0 else None,
                                last_modified=(last_modified[i] or None) if has_lm[i] else None))
        return out

    def sizes(self, pos: np.ndarray) -> np.ndarray:
        """The stored size of each chunk at ``pos``: an inline chunk's bytes, else its length."""
        out = np.empty(len(pos), np.int64)
        for i in range(0, len(pos), SLICE):
            f = _Fields(self.data, pos[i:i + SLICE])
            start, inline_length = f.vector(_INLINE)
            out[i:i + SLICE] = np.where(start >= 0, inline_length, f.scalar(_LENGTH, 8).astype(np.int64))
        return out

    def _decompress_location(self, raw: bytes | bytearray) -> bytes:
        if self.algorithm != 1:
            raise IcechunkError(f"{self.name}: a compressed virtual chunk location, but the manifest's "
                                f"location compression is {self.algorithm}, not zstd (1)")
        if self._decompressor is None:
            try:
                dict_data = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary else None
                self._decompressor = zstandard.ZstdDecompressor(dict_data=dict_data)
            except zstandard.ZstdError as e:
                raise IcechunkError(f"{self.name}: a bad location dictionary ({e})") from None
        try:
            # a frame that states its size is decompressed to that size: refuse one over the bound
            if zstandard.frame_content_size(raw) > self.max_location:
                raise zstandard.ZstdError("the frame states a larger size")
            out = self._decompressor.decompress(raw, max_output_size=self.max_location)
            if len(out) > self.max_location:
                raise zstandard.ZstdError("larger")
            return out
        except zstandard.ZstdError as e:
            raise IcechunkError(f"{self.name}: a compressed virtual chunk location cannot be "
                                f"decompressed within {self.max_location:,} bytes ({e})") from None


def _check_inline(data: bytes | bytearray, pos: np.ndarray, name: str, max_inline: int,
                  max_total: int) -> None:
    """Each inline chunk of the ChunkRef tables at ``pos`` within ``max_inline``, and all of
    them together within ``max_total``, each reference counted (shared vectors included)."""
    total = 0
    starts: list[np.ndarray] = []
    for i in range(0, len(pos), SLICE):
        start, length = _Fields(data, pos[i:i + SLICE]).vector(_INLINE)
        present = start >= 0
        if not present.any():
            continue
        biggest = int(length.max())
        if biggest > max_inline:
            raise IcechunkError(f"{name}: an inline chunk of {biggest:,} bytes (limit max_inline="
                                f"{size_text(max_inline)}): raise max_inline to read it")
        total += int(length[present].sum())
        starts.append(start[present])
        if total > max_total:
            every = np.concatenate(starts)
            shared = len(np.unique(every)) < len(every)
            raise IcechunkError(
                f"{name}: its inline chunks come to at least {total:,} bytes, past max_source="
                f"{size_text(max_total)}" + (" (references share one stored inline chunk, each "
                                             "reference counted)" if shared else "")
                + ": raise max_source to open it")


def _sorted(pos: np.ndarray, coords: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The references in ascending order of coordinates (as the spec asks manifests to store
    them; sorted here if not); two references to one chunk are refused."""
    if len(coords) < 2:
        return pos, coords
    ordered = True
    for i in range(0, len(coords) - 1, SLICE):  # a slice at a time: transient memory bounded
        a, b = coords[i:i + SLICE], coords[i + 1:i + 1 + SLICE]
        a = a[:len(b)]
        diff = a != b
        first = np.argmax(diff, axis=1)
        rows = np.arange(len(a))
        if not (diff.any(axis=1) & (b[rows, first] > a[rows, first])).all():
            ordered = False
            break
    if ordered:
        return pos, coords
    order = np.lexsort(coords.T[::-1])
    pos, coords = pos[order], coords[order]
    if (coords[1:] == coords[:-1]).all(axis=1).any():
        raise IcechunkError(f"{name}: two chunk references to the same chunk of an array")
    return pos, coords


def iter_refs(refs: ArrayRefs, rows: np.ndarray | None) -> Iterator[tuple[tuple[int, ...], ChunkRef]]:
    """(coords, ChunkRef) of ``rows`` (None: all), built BATCH at a time."""
    n = len(refs) if rows is None else len(rows)
    for i in range(0, n, BATCH):
        batch = np.arange(i, min(i + BATCH, n)) if rows is None else rows[i:i + BATCH]
        coords = refs.coords[batch].tolist()
        yield from zip(map(tuple, coords), refs.refs(batch), strict=True)


BATCH = 4096


class _Fields:
    """Fields of many verified ChunkRef tables, gathered with numpy."""

    def __init__(self, data: bytes | bytearray, pos: np.ndarray) -> None:
        self.u8 = np.frombuffer(data, np.uint8)
        self.pos = pos.astype(np.int64)
        self.vt = self.pos - _gather_i32(self.u8, self.pos)
        self.vtsize = _gather(self.u8, self.vt, 2)

    def field(self, voff: int) -> np.ndarray:
        """The field's position in each table, -1 where it is absent."""
        has = self.vtsize >= voff + 2
        o = np.zeros(len(self.pos), np.int64)
        o[has] = _gather(self.u8, self.vt[has] + voff, 2)
        return np.where(o != 0, self.pos + o, -1)

    def vector(self, voff: int) -> tuple[np.ndarray, np.ndarray]:
        """Each vector's first element's position (-1: absent) and its length."""
        at = self.field(voff)
        present = at >= 0
        start = np.full(len(self.pos), -1, np.int64)
        length = np.zeros(len(self.pos), np.int64)
        target = at[present] + _gather(self.u8, at[present], 4)
        start[present] = target + 4
        length[present] = _gather(self.u8, target, 4)
        return start, length

    def scalar(self, voff: int, size: int) -> np.ndarray:
        at = self.field(voff)
        present = at >= 0
        out = np.zeros(len(self.pos), np.uint64 if size == 8 else np.int64)
        out[present] = _gather(self.u8, at[present], size)
        return out


def _gather(u8: np.ndarray, p: np.ndarray, size: int) -> np.ndarray:
    """Little-endian unsigned integers of ``size`` bytes at positions ``p`` (in range)."""
    out = np.zeros(len(p), np.uint64 if size == 8 else np.int64)
    for k in range(size):
        out |= u8[p + k].astype(out.dtype) << out.dtype.type(8 * k)
    return out


def _gather_i32(u8: np.ndarray, p: np.ndarray) -> np.ndarray:
    v = _gather(u8, p, 4)
    return np.where(v >= 1 << 31, v - (1 << 32), v)
