"""A snapshot: the nodes (groups and arrays, with their zarr.json) of one version of the
repository, and the chunk references of its arrays, read from their manifests on demand."""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from refmount.refs.icechunk import ids, schema
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.icechunk.fbs.ArrayNodeData import ArrayNodeData
from refmount.refs.icechunk.fbs.Snapshot import Snapshot as FbSnapshot
from refmount.refs.icechunk.manifest import ArrayRefs, Manifest, iter_refs
from refmount.refs.icechunk.records import ChunkRef, Node, SnapshotInfo
from refmount.refs.icechunk.verify import Tables, Union, Vectors, verify
from refmount.refs.limits import Limits, check_nesting, size_text


@dataclass(frozen=True)
class ManifestExtent:
    manifest_id: str
    lo: tuple[int, ...]  # inclusive
    hi: tuple[int, ...]  # exclusive

    def covers(self, coords: tuple[int, ...]) -> bool:
        return all(a <= c < b for a, c, b in zip(self.lo, coords, self.hi, strict=True))


@dataclass(frozen=True)
class ArrayInfo:
    node_id: bytes
    ndim: int
    manifests: tuple[ManifestExtent, ...]  # in ascending order of their lower corners


def iso_time(microseconds: int) -> str:
    try:
        t = datetime.datetime.fromtimestamp(microseconds / 1e6, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"@{microseconds}us"  # out of datetime's range: the raw value, still one line
    return t.isoformat().replace("+00:00", "Z")


def node_path(raw: bytes, name: str, limits: Limits) -> str:
    """A node's path without its leading slash ("" for the root), checked to be canonical and
    within the key bounds."""
    if len(raw) > limits.max_key_length:
        raise IcechunkError(f"{name}: a node path of {len(raw):,} bytes (limit max_key_length="
                            f"{limits.max_key_length})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise IcechunkError(f"{name}: a node path that is not UTF-8") from None
    if text == "/":
        return ""
    parts = text.split("/")
    if parts[0] != "" or any(p in ("", ".", "..") for p in parts[1:]) or "\0" in text:
        raise IcechunkError(f"{name}: the node path {text[:200]!r} is not canonical")
    if len(parts) - 1 > limits.max_key_depth:
        raise IcechunkError(f"{name}: a node path {len(parts) - 1} levels deep (limit max_key_depth="
                            f"{limits.max_key_depth})")
    return text[1:]


def check_metadata(data: bytes | bytearray, path_v: Vectors, user_v: Vectors, name: str,
                   limits: Limits) -> None:
    """Each node's ``zarr.json`` within ``max_inline`` (it becomes an inline key of the tree)
    and all of them together within ``max_metadata``, each node counted: nodes may share one
    stored vector, and every use of it is materialised (an index's inline value, a listing, a
    decoded view), so what is bounded is what they make, not what is stored."""

    def shown(i: int) -> str:
        start = int(path_v.start[i])
        return bytes(data[start:start + min(int(path_v.length[i]), 200)]).decode("utf-8", "replace")

    too_big = np.flatnonzero(user_v.length > limits.max_inline)
    if len(too_big):
        i = int(too_big[0])
        raise IcechunkError(f"{name}: the metadata of node {shown(i)} is {int(user_v.length[i]):,} bytes "
                            f"(limit max_inline={limits.max_inline:,})")
    total = np.cumsum(user_v.length, dtype=np.int64)
    if len(total) and int(total[-1]) > limits.max_metadata:
        i = int(np.argmax(total > limits.max_metadata))
        shared = len(np.unique(user_v.start)) < len(user_v.start)
        raise IcechunkError(
            f"{name}: the metadata of its nodes comes to {int(total[-1]):,} bytes, past "
            f"max_metadata={size_text(limits.max_metadata)} at node {shown(i)}"
            + (" (nodes share one stored zarr.json, each use counted)" if shared else "")
            + ": raise max_metadata to open it")


class Snapshot:
    """One snapshot, its nodes parsed at once (bounded by Limits), its manifests read lazily
    through ``load_manifest`` (the repository's LRU)."""

    def __init__(self, data: bytes | bytearray, name: str, snapshot_id: str, limits: Limits,
                 load_manifest: Callable[[str], Manifest], info: SnapshotInfo | None = None) -> None:
        self.name = name
        self._load_manifest = load_manifest
        root = verify(data, schema.SNAPSHOT, name)
        fb = FbSnapshot.GetRootAs(data, 0)
        if bytes(fb.Id().Bytes()) != ids.decode(snapshot_id):
            raise IcechunkError(f"{name}: the snapshot's id is not the one its name says")
        if info is None:
            parent = fb.ParentId()
            info = SnapshotInfo(snapshot_id, ids.encode(bytes(parent.Bytes())) if parent else None,
                                iso_time(fb.FlushedAt()), _text(fb.Message(), name))
        self.info = info
        count = fb.NodesLength()
        if count > limits.max_keys:
            raise IcechunkError(f"{name}: {count:,} nodes (limit max_keys={limits.max_keys:,})")
        # the nodes' fields from the verifier's positions (the generated accessors cost ~100 µs
        # a node); an array's data through the accessors
        tables = root.children["nodes"]
        assert isinstance(tables, Vectors) and isinstance(tables.items, Tables)
        t = tables.items
        path_v, user_v, union = t.children["path"], t.children["user_data"], t.children["node_data"]
        assert isinstance(path_v, Vectors) and isinstance(user_v, Vectors) and isinstance(union, Union)
        check_metadata(data, path_v, user_v, name, limits)
        nodes: list[Node] = []
        arrays: dict[str, ArrayInfo] = {}
        ps, pl = path_v.start.tolist(), path_v.length.tolist()
        us, ul = user_v.start.tolist(), user_v.length.tolist()
        kinds, rows = union.type.tolist(), union.row.tolist()
        id_pos = t.fields["id"].tolist()
        members = union.members.get(schema.NODE_ARRAY)
        array_pos = members.pos.tolist() if members is not None else []
        documents: dict[tuple[int, int], bytes] = {}  # nodes that share one stored vector share
        for i in range(count):  # one copy of it (each use was counted by check_metadata)
            path = node_path(bytes(data[ps[i]:ps[i] + pl[i]]), name, limits)
            zarr_json = documents.get((us[i], ul[i]))
            if zarr_json is None:
                zarr_json = documents[us[i], ul[i]] = bytes(data[us[i]:us[i] + ul[i]])
                check_nesting(zarr_json, f"{name}: node /{path}'s zarr.json", limits)
            if kinds[i] == schema.NODE_ARRAY:
                a = ArrayNodeData()
                a.Init(data, array_pos[rows[i]])
                arrays[path] = self._array(a, bytes(data[id_pos[i]:id_pos[i] + 8]), name)
                nodes.append(Node(path, "array", zarr_json))
            else:
                nodes.append(Node(path, "group", zarr_json))
        del root
        paths = [n.path for n in nodes]
        if paths != sorted(paths):
            nodes.sort(key=lambda n: n.path)
        if any(a.path == b.path for a, b in itertools.pairwise(nodes)):
            raise IcechunkError(f"{name}: two nodes with one path")
        self.nodes = nodes
        self._by_path = {n.path: n for n in nodes}
        self._arrays = arrays

    @staticmethod
    def _array(a: ArrayNodeData, node_id: bytes, name: str) -> ArrayInfo:
        ndim = a.ShapeV2Length() if not a.ShapeV2IsNone() else a.ShapeLength()
        extents = []
        for j in range(a.ManifestsLength()):
            mref = a.Manifests(j)
            if mref.ExtentsLength() != ndim:
                raise IcechunkError(f"{name}: a manifest's extents have {mref.ExtentsLength()} "
                                    f"dimensions, the array {ndim}")
            ranges = [mref.Extents(k) for k in range(ndim)]
            extents.append(ManifestExtent(ids.encode(bytes(mref.ObjectId().Bytes())),
                                          tuple(r.From_() for r in ranges), tuple(r.To() for r in ranges)))
        extents.sort(key=lambda e: e.lo)
        return ArrayInfo(node_id, ndim, tuple(extents))

    def node(self, path: str) -> Node | None:
        return self._by_path.get(path)

    def array_info(self, path: str) -> ArrayInfo | None:
        return self._arrays.get(path)

    def _refs(self, array: ArrayInfo, extent: ManifestExtent) -> ArrayRefs | None:
        return self._load_manifest(extent.manifest_id).refs_of(array.node_id, array.ndim)

    def chunk(self, path: str, coords: tuple[int, ...]) -> ChunkRef | None:
        """The chunk at ``coords`` of the array at ``path``; None where none was written (and for
        a path that is no array, or coordinates of the wrong number of dimensions)."""
        array = self._arrays.get(path)
        if array is None or len(coords) != array.ndim:
            return None
        coords = tuple(int(c) for c in coords)
        for extent in array.manifests:
            if extent.covers(coords):
                refs = self._refs(array, extent)
                i = refs.find(coords) if refs is not None else None
                return refs.ref(i) if refs is not None and i is not None else None
        return None

    def chunks(self, path: str) -> Iterator[tuple[tuple[int, ...], ChunkRef]]:
        """Every written chunk of the array, manifest by manifest: each manifest's chunks in C
        order of their coordinates, the manifests in C order of their extents' lower corners (so
        the whole is in C order when the array has a single manifest, or is split along its
        first dimension only). Only one manifest is held at a time beyond the repository's LRU."""
        array = self._arrays.get(path)
        if array is None:
            return
        for extent in array.manifests:
            refs = self._refs(array, extent)
            if refs is not None:
                yield from iter_refs(refs, refs.within(extent.lo, extent.hi))

    def chunk_coords(self, path: str) -> Iterator[np.ndarray]:
        """The coordinates of every written chunk of the array, as (n, ndim) uint32 arrays, one
        per manifest in the order of :meth:`chunks`: what a listing of chunk keys needs, without
        a record per chunk."""
        array = self._arrays.get(path)
        if array is None:
            return
        for extent in array.manifests:
            refs = self._refs(array, extent)
            if refs is not None:
                rows = refs.within(extent.lo, extent.hi)
                yield refs.coords if rows is None else refs.coords[rows]

    def chunk_listing(self, path: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(coordinates, sizes) of every written chunk of the array, one pair of arrays per
        manifest in the order of :meth:`chunks`: (n, ndim) uint32 and n int64 (an inline
        chunk's bytes, else the length its reference records) — a directory listing of a
        million chunks without a record per chunk."""
        array = self._arrays.get(path)
        if array is None:
            return
        for extent in array.manifests:
            refs = self._refs(array, extent)
            if refs is not None:
                rows = refs.within(extent.lo, extent.hi)
                yield (refs.coords if rows is None else refs.coords[rows]), refs.sizes(rows)

    def chunk_count(self, path: str) -> int:
        """Written chunks of the array (reads each of its manifests, through the LRU)."""
        array = self._arrays.get(path)
        if array is None:
            return 0
        total = 0
        for extent in array.manifests:
            refs = self._refs(array, extent)
            if refs is not None:
                total += refs.count_within(extent.lo, extent.hi)
        return total


def _text(raw: bytes | None, name: str) -> str:
    if raw is None:
        return ""
    return raw.decode("utf-8", "replace")
