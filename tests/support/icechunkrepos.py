"""Icechunk repositories for tests: written by icechunk 1.x (format version 1), and objects
built here from the spec (flatbuffers made with the accessors flatc generated, in refmount's
refs/icechunk/fbs) for what icechunk does not write: format version 2 layouts and hostile
input."""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np
import zstandard

from refmount.refs.icechunk import ids
from refmount.refs.icechunk.fbs import (
    ArrayManifest,
    ArrayNodeData,
    ChunkRef,
    GroupNodeData,
    Manifest,
    ManifestRef,
    NodeSnapshot,
    Snapshot,
)
from refmount.refs.icechunk.header import MAGIC

# ---- repositories written by icechunk 1.x


@dataclass
class V1Repo:
    path: Path
    data_dir: Path
    h5_file: Path
    h5_values: np.ndarray
    snapshots: dict[str, str] = field(default_factory=dict)  # commit message -> snapshot id
    container: str = ""
    etag: str = ""


def write_v1_repo(path: Path, data_dir: Path) -> V1Repo:
    """A repository with groups, native, inline and virtual chunks (an HDF5 file's chunks, with
    an ETag and a last-modified checksum), an array whose manifest is split, several commits,
    a branch, a tag and a deleted tag."""
    import h5py
    import icechunk as ic
    import zarr

    data_dir.mkdir(parents=True, exist_ok=True)
    h5 = data_dir / "virt.h5"
    values = np.arange(12, dtype="<i4")
    with h5py.File(h5, "w") as f:
        f.create_dataset("v", data=values, chunks=(4,))
    with h5py.File(h5, "r") as f:
        dsid = f["v"].id
        spans = [(dsid.get_chunk_info(i).byte_offset, dsid.get_chunk_info(i).size) for i in range(3)]
    container = data_dir.as_uri() + "/"
    cfg = ic.RepositoryConfig.default()
    cfg.inline_chunk_threshold_bytes = 12
    store = ic.local_filesystem_store(str(data_dir))
    cfg.set_virtual_chunk_container(ic.VirtualChunkContainer(container, store))
    cfg.manifest = ic.ManifestConfig(splitting=ic.ManifestSplittingConfig.from_dict(
        {ic.ManifestSplitCondition.name_matches("split.*"): {ic.ManifestSplitDimCondition.Any(): 2}}))
    repo = ic.Repository.create(ic.local_filesystem_storage(str(path)), config=cfg,
                                authorize_virtual_chunk_access={container: None})
    out = V1Repo(path, data_dir, h5, values, container=container)
    s = repo.writable_session("main")
    root = zarr.group(store=s.store, attributes={"title": "refmount test"})
    g = root.create_group("grp", attributes={"a": 1})
    a = g.create_array("native", shape=(10, 10), chunks=(5, 5), dtype="float32", fill_value=float("nan"),
                       dimension_names=("y", "x"))
    a[:] = np.arange(100, dtype="float32").reshape(10, 10)
    a[5:, 5:] = float("nan")  # that chunk is the fill value: not written
    small = root.create_array("inline", shape=(5,), chunks=(1,), dtype="int8", fill_value=8)
    small[:] = np.arange(5, dtype="int8")
    split = root.create_array("split", shape=(10, 10), chunks=(2, 2), dtype="int16", fill_value=0)
    split[:] = np.arange(100, dtype="int16").reshape(10, 10) + 1
    g.create_group("sub").create_group("deeper")
    root.create_array("virtual", shape=(12,), chunks=(4,), dtype="<i4", fill_value=0, compressors=None)
    out.snapshots["structure"] = s.commit("structure")
    s = repo.writable_session("main")
    url = h5.as_uri()
    st = h5.stat()  # the ETag of a local file as icechunk's object store makes it
    out.etag = f"{st.st_ino:x}-{st.st_mtime_ns // 1000:x}-{st.st_size:x}"
    s.store.set_virtual_ref("virtual/c/0", url, offset=spans[0][0], length=spans[0][1],
                            checksum=datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC))
    s.store.set_virtual_ref("virtual/c/1", url, offset=spans[1][0], length=spans[1][1], checksum=out.etag)
    s.store.set_virtual_ref("virtual/c/2", url, offset=spans[2][0], length=spans[2][1])
    out.snapshots["virtual"] = s.commit("virtual chunks")
    repo.create_branch("dev", snapshot_id=out.snapshots["structure"])
    s = repo.writable_session("dev")
    arr = zarr.open_array(s.store, path="inline", mode="a")
    arr[:] = np.full(5, 3, dtype="int8")
    out.snapshots["dev"] = s.commit("dev change")
    repo.create_tag("v1.0", snapshot_id=out.snapshots["virtual"])
    repo.create_tag("gone", snapshot_id=out.snapshots["virtual"])
    repo.delete_tag("gone")
    return out


def open_icechunk(path: Path, container: str, **ref: str) -> Any:
    """icechunk's own read-only store of the repository at ``path``."""
    import icechunk as ic

    repo = ic.Repository.open(ic.local_filesystem_storage(str(path)),
                              authorize_virtual_chunk_access={container: None})
    return repo.readonly_session(**(ref or {"branch": "main"})).store


def store_get(store: Any, key: str) -> bytes | None:
    from zarr.core.buffer import default_buffer_prototype

    async def get() -> bytes | None:
        b = await store.get(key, prototype=default_buffer_prototype())
        return None if b is None else b.to_bytes()

    return asyncio.run(get())


def store_keys(store: Any) -> list[str]:
    async def keys() -> list[str]:
        return [k async for k in store.list()]

    return sorted(asyncio.run(keys()))


# ---- objects built from the spec


def icechunk_object(payload: bytes, file_type: int, version: int = 1, compress: bool = True) -> bytes:
    """An Icechunk object: the 39-byte header, then ``payload`` (zstd-compressed)."""
    impl = b"refmount-tests".ljust(24, b" ")
    body = zstandard.ZstdCompressor().compress(payload) if compress else payload
    return MAGIC + impl + bytes([version, file_type, 1 if compress else 0]) + body


def _bytes_vector(b: flatbuffers.Builder, data: bytes) -> int:
    return b.CreateByteVector(data)


def _id(b: flatbuffers.Builder, raw: bytes) -> int:
    b.Prep(1, len(raw))
    for x in reversed(raw):
        b.PrependUint8(x)
    return b.Offset()


@dataclass
class NodeSpec:
    path: str  # "/" or "/a/b"
    kind: str = "group"
    zarr_json: bytes = b'{"zarr_format":3,"node_type":"group"}'
    node_id: bytes = b"\1" * 8
    ndim: int = 1
    manifests: list[tuple[bytes, list[tuple[int, int]]]] = field(default_factory=list)  # id, extents


class _Shared:
    """Byte vectors made once per content when ``share`` is set: every table whose vector has
    those bytes points at the one stored vector (FlatBuffers allow it; honest writers do not)."""

    def __init__(self, b: flatbuffers.Builder, share: bool) -> None:
        self.b = b
        self.share = share
        self.made: dict[bytes, int] = {}

    def __call__(self, data: bytes) -> int:
        if not self.share:
            return _bytes_vector(self.b, data)
        if data not in self.made:
            self.made[data] = _bytes_vector(self.b, data)
        return self.made[data]


def build_snapshot(snapshot_id: str, nodes: list[NodeSpec], message: str = "built",
                   v2: bool = False, share: bool = False) -> bytes:
    """A Snapshot flatbuffer (version 1 layout, or version 2's: shape_v2, no parent); with
    ``share``, nodes whose ``zarr.json`` are equal share one stored vector."""
    b = flatbuffers.Builder(1024)
    vector = _Shared(b, share)
    node_offsets = []
    for n in nodes:
        path = b.CreateString(n.path)
        user = vector(n.zarr_json)
        if n.kind == "array":
            mrefs = []
            for mid, extents in n.manifests:
                ManifestRef.StartExtentsVector(b, len(extents))
                for lo, hi in reversed(extents):
                    b.Prep(4, 8)
                    b.PrependUint32(hi)
                    b.PrependUint32(lo)
                ext = b.EndVector()
                ManifestRef.Start(b)
                ManifestRef.AddObjectId(b, _id(b, mid))
                ManifestRef.AddExtents(b, ext)
                mrefs.append(ManifestRef.End(b))
            ArrayNodeData.StartManifestsVector(b, len(mrefs))
            for m in reversed(mrefs):
                b.PrependUOffsetTRelative(m)
            manifests = b.EndVector()
            shape_v2 = None
            if v2:
                from refmount.refs.icechunk.fbs import DimensionShapeV2
                dims = []
                for _ in range(n.ndim):
                    DimensionShapeV2.Start(b)
                    DimensionShapeV2.AddArrayLength(b, 10)
                    DimensionShapeV2.AddNumChunks(b, 10)
                    dims.append(DimensionShapeV2.End(b))
                ArrayNodeData.StartShapeV2Vector(b, n.ndim)
                for d in reversed(dims):
                    b.PrependUOffsetTRelative(d)
                shape_v2 = b.EndVector()
                ArrayNodeData.StartShapeVector(b, 0)
            else:
                ArrayNodeData.StartShapeVector(b, n.ndim)
                for _ in range(n.ndim):
                    b.Prep(8, 16)
                    b.PrependUint64(1)
                    b.PrependUint64(10)
            shape = b.EndVector()
            ArrayNodeData.Start(b)
            ArrayNodeData.AddShape(b, shape)
            ArrayNodeData.AddManifests(b, manifests)
            if shape_v2 is not None:
                ArrayNodeData.AddShapeV2(b, shape_v2)
            data = ArrayNodeData.End(b)
            kind = 1
        else:
            GroupNodeData.Start(b)
            data = GroupNodeData.End(b)
            kind = 2
        NodeSnapshot.Start(b)
        NodeSnapshot.AddId(b, _id(b, n.node_id))
        NodeSnapshot.AddPath(b, path)
        NodeSnapshot.AddUserData(b, user)
        NodeSnapshot.AddNodeDataType(b, kind)
        NodeSnapshot.AddNodeData(b, data)
        node_offsets.append(NodeSnapshot.End(b))
    Snapshot.StartNodesVector(b, len(node_offsets))
    for o in reversed(node_offsets):
        b.PrependUOffsetTRelative(o)
    nodes_vec = b.EndVector()
    msg = b.CreateString(message)
    Snapshot.StartMetadataVector(b, 0)
    meta = b.EndVector()
    Snapshot.StartManifestFilesVector(b, 0)
    files = b.EndVector()
    Snapshot.Start(b)
    Snapshot.AddId(b, _id(b, ids.decode(snapshot_id)))
    Snapshot.AddNodes(b, nodes_vec)
    Snapshot.AddFlushedAt(b, 1_700_000_000_000_000)
    Snapshot.AddMessage(b, msg)
    Snapshot.AddMetadata(b, meta)
    Snapshot.AddManifestFiles(b, files)
    b.Finish(Snapshot.End(b))
    return bytes(b.Output())


@dataclass
class RefSpec:
    index: tuple[int, ...]
    inline: bytes | None = None
    chunk_id: bytes | None = None
    location: str | None = None
    compressed_location: bytes | None = None
    offset: int = 0
    length: int = 0
    etag: str | None = None


def build_manifest(manifest_id: str, arrays: list[tuple[bytes, list[RefSpec]]],
                   dictionary: bytes | None = None, share: bool = False) -> bytes:
    """A Manifest flatbuffer; with ``share``, references whose inline chunks are equal share
    one stored vector."""
    b = flatbuffers.Builder(1024)
    vector = _Shared(b, share)
    array_offsets = []
    for node_id, refs in arrays:
        ref_offsets = []
        for r in refs:
            ChunkRef.StartIndexVector(b, len(r.index))
            for x in reversed(r.index):
                b.PrependUint32(x)
            index = b.EndVector()
            inline = vector(r.inline) if r.inline is not None else None
            loc = b.CreateString(r.location) if r.location is not None else None
            cloc = _bytes_vector(b, r.compressed_location) if r.compressed_location is not None else None
            etag = b.CreateString(r.etag) if r.etag is not None else None
            ChunkRef.Start(b)
            ChunkRef.AddIndex(b, index)
            if inline is not None:
                ChunkRef.AddInline(b, inline)
            ChunkRef.AddOffset(b, r.offset)
            ChunkRef.AddLength(b, r.length)
            if r.chunk_id is not None:
                ChunkRef.AddChunkId(b, _id(b, r.chunk_id))
            if loc is not None:
                ChunkRef.AddLocation(b, loc)
            if cloc is not None:
                ChunkRef.AddCompressedLocation(b, cloc)
            if etag is not None:
                ChunkRef.AddChecksumEtag(b, etag)
            ref_offsets.append(ChunkRef.End(b))
        ArrayManifest.StartRefsVector(b, len(ref_offsets))
        for o in reversed(ref_offsets):
            b.PrependUOffsetTRelative(o)
        refs_vec = b.EndVector()
        ArrayManifest.Start(b)
        ArrayManifest.AddNodeId(b, _id(b, node_id))
        ArrayManifest.AddRefs(b, refs_vec)
        array_offsets.append(ArrayManifest.End(b))
    Manifest.StartArraysVector(b, len(array_offsets))
    for o in reversed(array_offsets):
        b.PrependUOffsetTRelative(o)
    arrays_vec = b.EndVector()
    dict_vec = _bytes_vector(b, dictionary) if dictionary is not None else None
    Manifest.Start(b)
    Manifest.AddId(b, _id(b, ids.decode(manifest_id)))
    Manifest.AddArrays(b, arrays_vec)
    if dict_vec is not None:
        Manifest.AddLocationDictionary(b, dict_vec)
        Manifest.AddCompressionAlgorithm(b, 1)
    b.Finish(Manifest.End(b))
    return bytes(b.Output())


def write_built_repo(root: Path, snapshot_id: str, snapshot: bytes, manifests: dict[str, bytes],
                     version: int = 1) -> None:
    """A version 1 repository of one snapshot (branch main) and its manifests."""
    (root / "snapshots").mkdir(parents=True, exist_ok=True)
    (root / "manifests").mkdir(exist_ok=True)
    (root / "refs" / "branch.main").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "branch.main" / "ref.json").write_text(f'{{"snapshot":"{snapshot_id}"}}')
    (root / "snapshots" / snapshot_id).write_bytes(icechunk_object(snapshot, 1, version))
    for mid, m in manifests.items():
        (root / "manifests" / mid).write_bytes(icechunk_object(m, 2, version))


@dataclass
class LocalVirtualRepo:
    root: Path
    files: Path  # the directory of the virtual chunks' file (the container)
    native: np.ndarray
    virtual: np.ndarray


def local_virtual_repo(root: Path, files: Path) -> LocalVirtualRepo:
    """A repository (icechunk 1.x) with a native array ``native`` (2,000 int32, chunks of 1,000:
    objects of the repository, not inline) and an
    array ``virtual`` (8 float32, chunks of 4) whose chunks are ranges of a local file under
    ``files``, a virtual chunk container ``file://FILES/`` — what VirtualiZarr's ``to_icechunk``
    of local netCDF files makes."""
    import icechunk as ic
    import zarr

    files.mkdir(parents=True, exist_ok=True)
    virtual = np.linspace(0, 7, 8, dtype="<f4")
    (files / "data.bin").write_bytes(b"HEAD" + virtual.tobytes())
    container = f"file://{files}/"
    config = ic.RepositoryConfig.default()
    store = ic.local_filesystem_store(str(files))
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(container, store))
    repo = ic.Repository.create(ic.local_filesystem_storage(str(root)), config)
    session = repo.writable_session("main")
    group = zarr.group(store=session.store)
    native = np.arange(2000, dtype="<i4") * 3
    group.create_array("native", shape=(2000,), chunks=(1000,), dtype="<i4", compressors=None,
                       fill_value=0)[:] = native
    group.create_array("virtual", shape=(8,), chunks=(4,), dtype="<f4", compressors=None, fill_value=0)
    for i in range(2):
        session.store.set_virtual_ref(f"virtual/c/{i}", f"{container}data.bin", offset=4 + 16 * i, length=16)
    session.commit("local virtual chunks")
    return LocalVirtualRepo(root, files, native, virtual)
