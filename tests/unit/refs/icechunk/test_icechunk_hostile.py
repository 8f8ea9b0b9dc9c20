"""Hostile Icechunk repositories: every malformed, truncated, bombed or oversized object is one
IcechunkError line, in bounded time and memory — never an IndexError, struct.error, KeyError or
a loop that follows what the bytes claim."""

from __future__ import annotations

import random
import time
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
import zstandard
from support.bombs import zstd_rle
from support.icechunkrepos import (
    NodeSpec,
    RefSpec,
    build_manifest,
    build_snapshot,
    icechunk_object,
    write_built_repo,
)

from refmount.refs.icechunk import IcechunkError, Repository, ids, schema
from refmount.refs.icechunk.config import containers_from_flexbuffer, containers_from_yaml
from refmount.refs.icechunk.fbs import ArrayManifest
from refmount.refs.icechunk.fbs import Manifest as FbManifest
from refmount.refs.icechunk.header import HEADER_SIZE, payload
from refmount.refs.icechunk.manifest import Manifest
from refmount.refs.icechunk.snapshot import Snapshot
from refmount.refs.icechunk.verify import Vectors, verify
from refmount.refs.limits import DEFAULT_LIMITS, Limits

SID = "1CECHNKREP0F1RSTCMT0"
MID_RAW = bytes(11) + b"\x10"
MID = ids.encode(MID_RAW)
NODE = b"\7" * 8
MiB = 1 << 20


def good_snapshot(**kw: object) -> bytes:
    arr = NodeSpec("/arr", "array", b'{"zarr_format":3,"node_type":"array"}', NODE, ndim=2,
                   manifests=[(MID_RAW, [(0, 4), (0, 4)])])
    return build_snapshot(SID, [NodeSpec("/"), NodeSpec("/g"), arr], **kw)  # type: ignore[arg-type]


def good_manifest() -> bytes:
    refs = [RefSpec((0, 0), inline=b"abc"), RefSpec((0, 1), chunk_id=b"\1" * 12, length=5),
            RefSpec((1, 0), location="s3://b/f.nc", offset=3, length=4, etag="e")]
    return build_manifest(MID, [(NODE, refs)])


def built_repo(root: Path, snapshot: bytes | None = None, manifest: bytes | None = None) -> Repository:
    write_built_repo(root, SID, snapshot if snapshot is not None else good_snapshot(),
                     {MID: manifest if manifest is not None else good_manifest()})
    return Repository.open(str(root), {})


def read_all(repo: Repository) -> int:
    snap = repo.snapshot(repo.resolve())
    n = 0
    for node in snap.nodes:
        for _ in snap.chunks(node.path):
            n += 1
    return n


def test_built_repository_reads(tmp_path: Path) -> None:
    repo = built_repo(tmp_path)
    assert read_all(repo) == 3
    snap = repo.snapshot(SID)
    assert snap.chunk("arr", (0, 0)).data == b"abc"
    assert snap.chunk("arr", (0, 1)).location == "chunks/" + ids.encode(b"\1" * 12)
    assert snap.chunk("arr", (1, 0)).etag == "e"


@pytest.mark.parametrize("what", ["snapshots/" + SID, "manifests/" + MID])
def test_truncated_objects(tmp_path: Path, what: str) -> None:
    repo = built_repo(tmp_path)
    obj = tmp_path / what
    whole = obj.read_bytes()
    for cut in sorted({0, 5, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3, len(whole) // 2, len(whole) - 1}):
        obj.write_bytes(whole[:cut])
        with pytest.raises(IcechunkError) as e:
            read_all(Repository.open(str(tmp_path), {}))
        assert "\n" not in str(e.value) and what.split("/")[1] in str(e.value)
    obj.write_bytes(whole)
    assert read_all(repo) == 3


def test_wrong_magic_type_version_compression(tmp_path: Path) -> None:
    built_repo(tmp_path)
    obj = tmp_path / "snapshots" / SID
    whole = obj.read_bytes()
    for patch, message in [((0, b"X"), "no ICE"), ((36, b"\x09"), "spec version 9"),
                           ((37, b"\x02"), "manifest object where a snapshot"),
                           ((37, b"\x63"), "unknown Icechunk file type"),
                           ((38, b"\x07"), "unknown Icechunk compression")]:
        at, byte = patch
        obj.write_bytes(whole[:at] + byte + whole[at + 1:])
        with pytest.raises(IcechunkError, match=message):
            Repository.open(str(tmp_path), {}).snapshot(SID)
    obj.write_bytes(whole[:HEADER_SIZE] + b"not zstd at all")
    with pytest.raises(IcechunkError, match="not zstd data"):
        Repository.open(str(tmp_path), {}).snapshot(SID)


def test_flatbuffer_offsets_out_of_range() -> None:
    data = bytearray(good_snapshot())
    data[0:4] = (len(data) + 100).to_bytes(4, "little")
    with pytest.raises(IcechunkError, match="malformed flatbuffer: an offset to the root table points past"):
        Snapshot(bytes(data), "s", SID, DEFAULT_LIMITS, lambda m: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(IcechunkError, match="too short for a flatbuffer"):
        verify(b"\0\0", schema.SNAPSHOT, "s")
    # the root's vtable pointing before the buffer
    data = bytearray(good_snapshot())
    root = int.from_bytes(data[0:4], "little")
    data[root:root + 4] = (-(1 << 30)).to_bytes(4, "little", signed=True)
    with pytest.raises(IcechunkError, match="vtable of a Snapshot table lies outside"):
        verify(bytes(data), schema.SNAPSHOT, "s")


def test_huge_vector_length() -> None:
    data = bytearray(good_snapshot())
    nodes = verify(bytes(data), schema.SNAPSHOT, "s").children["nodes"]
    assert isinstance(nodes, Vectors)
    at = int(nodes.start[0]) - 4
    data[at:at + 4] = (0x7FFFFFFF).to_bytes(4, "little")
    t = time.monotonic()
    with pytest.raises(IcechunkError, match=r"Snapshot\.nodes is longer than the buffer"):
        verify(bytes(data), schema.SNAPSHOT, "s")
    assert time.monotonic() - t < 1


def test_overlapping_vectors_are_refused() -> None:
    """2000 ArrayManifest tables that all share one vector of 1000 chunk references: honest
    buffers never do this, and following it would multiply the work by 2000."""
    b = flatbuffers.Builder(1 << 16)
    refs = []
    for i in range(1000):
        from refmount.refs.icechunk.fbs import ChunkRef
        ChunkRef.StartIndexVector(b, 1)
        b.PrependUint32(i)
        index = b.EndVector()
        ChunkRef.Start(b)
        ChunkRef.AddIndex(b, index)
        refs.append(ChunkRef.End(b))
    ArrayManifest.StartRefsVector(b, len(refs))
    for r in reversed(refs):
        b.PrependUOffsetTRelative(r)
    shared = b.EndVector()
    arrays = []
    for _ in range(2000):
        ArrayManifest.Start(b)
        b.Prep(1, 8)
        for _ in range(8):
            b.PrependUint8(7)
        ArrayManifest.AddNodeId(b, b.Offset())
        ArrayManifest.AddRefs(b, shared)
        arrays.append(ArrayManifest.End(b))
    FbManifest.StartArraysVector(b, len(arrays))
    for a in reversed(arrays):
        b.PrependUOffsetTRelative(a)
    vec = b.EndVector()
    FbManifest.Start(b)
    b.Prep(1, 12)
    for x in reversed(MID_RAW):
        b.PrependUint8(x)
    FbManifest.AddId(b, b.Offset())
    FbManifest.AddArrays(b, vec)
    b.Finish(FbManifest.End(b))
    t = time.monotonic()
    with pytest.raises(IcechunkError, match="overlapping vectors"):
        Manifest(bytes(b.Output()), "m", MID, 1024)
    assert time.monotonic() - t < 2


def test_zstd_bomb(tmp_path: Path) -> None:
    """A manifest that would decompress to 4 GiB is refused after EXPANSION_FLOOR (64 MiB)."""
    built_repo(tmp_path)
    (tmp_path / "manifests" / MID).write_bytes(icechunk_object(b"", 2)[:HEADER_SIZE] + zstd_rle(4 << 30))
    t = time.monotonic()
    with pytest.raises(IcechunkError, match="decompresses to more than 200 times"):
        read_all(Repository.open(str(tmp_path), {}))
    assert time.monotonic() - t < 10
    # and within max_source, whatever the ratio
    (tmp_path / "manifests" / MID).write_bytes(
        icechunk_object(b"", 2)[:HEADER_SIZE] + zstandard.ZstdCompressor().compress(bytes(3 * MiB)))
    write_built_repo(tmp_path, SID, good_snapshot(), {})
    repo = Repository.open(str(tmp_path), {}, Limits(max_source=2 * MiB))
    with pytest.raises(IcechunkError, match="more than 2,097,152 bytes"):
        read_all(repo)


def test_object_size_cap(tmp_path: Path) -> None:
    built_repo(tmp_path)
    (tmp_path / "snapshots" / SID).write_bytes(bytes(3 * MiB))
    with pytest.raises(IcechunkError, match="larger than 2,097,152 bytes"):
        Repository.open(str(tmp_path), {}, Limits(max_source=2 * MiB)).snapshot(SID)


@pytest.mark.parametrize(("path", "limits", "message"), [
    ("/" + "/".join(["d"] * 5000), DEFAULT_LIMITS, "5000 levels deep"),
    ("/" + "x" * (70 << 10), DEFAULT_LIMITS, "a node path of 71,681 bytes"),
    ("/a/b/c/d", Limits(max_key_depth=3), "4 levels deep"),
    ("/a//b", DEFAULT_LIMITS, "not canonical"),
    ("/a/../../etc", DEFAULT_LIMITS, "not canonical"),
    ("a/b", DEFAULT_LIMITS, "not canonical"),
])
def test_bad_node_paths(path: str, limits: Limits, message: str) -> None:
    data = build_snapshot(SID, [NodeSpec("/"), NodeSpec(path)])
    with pytest.raises(IcechunkError, match=message):
        Snapshot(data, "s", SID, limits, lambda m: None)  # type: ignore[arg-type,return-value]


def test_node_metadata_bound() -> None:
    data = build_snapshot(SID, [NodeSpec("/"), NodeSpec("/a", zarr_json=b"{" + b" " * 5000 + b"}")])
    with pytest.raises(IcechunkError, match="metadata of node /a is 5,002 bytes"):
        Snapshot(data, "s", SID, Limits(max_inline=4096), lambda m: None)  # type: ignore[arg-type,return-value]


def test_node_count_bound() -> None:
    data = build_snapshot(SID, [NodeSpec("/"), NodeSpec("/a"), NodeSpec("/b")])
    with pytest.raises(IcechunkError, match=r"3 nodes \(limit max_keys=2"):
        Snapshot(data, "s", SID, Limits(max_keys=2), lambda m: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(IcechunkError, match="two nodes with one path"):
        Snapshot(build_snapshot(SID, [NodeSpec("/"), NodeSpec("/a"), NodeSpec("/a")]), "s", SID,
                 DEFAULT_LIMITS, lambda m: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(IcechunkError, match="not the one its name says"):
        Snapshot(build_snapshot(SID, [NodeSpec("/")]), "s", MID, DEFAULT_LIMITS, lambda m: None)  # type: ignore[arg-type,return-value]


def test_chunk_refs_malformed() -> None:
    neither = build_manifest(MID, [(NODE, [RefSpec((0, 0))])])
    with pytest.raises(IcechunkError, match="not exactly one of inline, chunk_id, location or compressed"):
        Manifest(neither, "m", MID, 1024)
    both = build_manifest(MID, [(NODE, [RefSpec((0, 0), inline=b"x", location="s3://x")])])
    with pytest.raises(IcechunkError, match="not exactly one"):
        Manifest(both, "m", MID, 1024)
    twice = build_manifest(MID, [(NODE, [RefSpec((0, 1), inline=b"x"), RefSpec((0, 0), inline=b"y"),
                                         RefSpec((0, 1), inline=b"z")])])
    with pytest.raises(IcechunkError, match="two chunk references to the same chunk"):
        Manifest(twice, "m", MID, 1024).refs_of(NODE, 2)
    wrong_ndim = build_manifest(MID, [(NODE, [RefSpec((0, 0, 0), inline=b"x")])])
    with pytest.raises(IcechunkError, match="3 coordinates in an array of 2 dimensions"):
        Manifest(wrong_ndim, "m", MID, 1024).refs_of(NODE, 2)
    unsorted = build_manifest(MID, [(NODE, [RefSpec((1, 0), inline=b"b"), RefSpec((0, 3), inline=b"a")])])
    refs = Manifest(unsorted, "m", MID, 1024).refs_of(NODE, 2)
    assert refs is not None and refs.coords.tolist() == [[0, 3], [1, 0]] and refs.ref(0).data == b"a"
    bad_utf8 = build_manifest(MID, [(NODE, [RefSpec((0, 0), location="x")])]).replace(b"x\0", b"\xff\0")
    with pytest.raises(IcechunkError, match="not UTF-8"):
        Manifest(bad_utf8, "m", MID, 1024).refs_of(NODE, 2).ref(0)


def mutations(data: bytes, seed: int, count: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        b = bytearray(data)
        for _ in range(rnd.choice([1, 1, 2, 4, 16])):
            i = rnd.randrange(len(b))
            b[i] = rnd.choice([0, 0xFF, 0x7F, 0x80, rnd.randrange(256)])
        if rnd.random() < 0.1:
            b = b[:rnd.randrange(len(b))]
        out.append(bytes(b))
    return out


def shared_snapshot() -> bytes:
    """Nodes that share one stored zarr.json (as FlatBuffers allow)."""
    doc = b'{"zarr_format":3,"node_type":"group","attributes":{"shared":true}}'
    arr = NodeSpec("/arr", "array", doc, NODE, ndim=2, manifests=[(MID_RAW, [(0, 4), (0, 4)])])
    return build_snapshot(SID, [NodeSpec("/", zarr_json=doc), NodeSpec("/g", zarr_json=doc), arr,
                                NodeSpec("/g/h", zarr_json=doc)], share=True)


def shared_manifest() -> bytes:
    """Chunk references that share one stored inline chunk."""
    refs = [RefSpec((i, j), inline=b"shared") for i in range(3) for j in range(3)]
    return build_manifest(MID, [(NODE, [*refs, RefSpec((3, 0), chunk_id=b"\1" * 12, length=5)])], share=True)


def test_mutated_snapshots_and_manifests() -> None:
    """2,300 random corruptions of a snapshot's and a manifest's flatbuffer (some whose
    tables share vectors): each one is read in full or refused with IcechunkError, nothing
    else, each quickly."""
    manifest = good_manifest()
    refused = 0
    slowest = 0.0
    for data in (mutations(good_snapshot(), 1, 500) + mutations(good_snapshot(v2=True), 2, 300)
                 + mutations(shared_snapshot(), 5, 400)):
        t = time.monotonic()
        try:
            snap = Snapshot(data, "s", SID, DEFAULT_LIMITS, lambda m: Manifest(manifest, "m", MID, 1024))
            for n in snap.nodes:
                list(snap.chunks(n.path))
                snap.chunk(n.path, (0, 1))
        except IcechunkError as e:
            assert "\n" not in str(e)
            refused += 1
        slowest = max(slowest, time.monotonic() - t)
    for data in mutations(manifest, 3, 700) + mutations(shared_manifest(), 6, 400):
        t = time.monotonic()
        try:
            m = Manifest(data, "m", MID, 1024)
            for node in list(m.arrays):
                refs = m.refs_of(node, 2)
                if refs is not None:
                    one_by_one = [refs.ref(i) for i in range(len(refs))]
                    assert refs.refs(np.arange(len(refs))) == one_by_one
        except IcechunkError as e:
            assert "\n" not in str(e)
            refused += 1
        slowest = max(slowest, time.monotonic() - t)
    assert refused > 400
    assert slowest < 2


def test_config_hostile() -> None:
    with pytest.raises(IcechunkError, match="YAML aliases are not accepted"):
        containers_from_yaml(b"a: &x [1, 2]\nb: *x\n", "c")
    with pytest.raises(IcechunkError, match="not valid YAML"):
        containers_from_yaml(b"a: [\n", "c")
    assert containers_from_yaml(b"virtual_chunk_containers:\n  s3://b/:\n    url_prefix: s3://b/\n"
                                b"    store: !s3 {region: x}\n", "c").prefixes == ["s3://b/"]
    rnd = random.Random(4)
    for _ in range(2000):
        blob = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))
        try:
            containers_from_flexbuffer(blob, "c")
        except IcechunkError as e:
            assert "\n" not in str(e)


def test_ref_json_hostile(tmp_path: Path) -> None:
    built_repo(tmp_path)
    ref = tmp_path / "refs" / "branch.main" / "ref.json"
    for text, message in [(b"{", "not JSON"), (b'{"snapshot": "../../x"}', "no snapshot id"),
                          (b"[1]", "no snapshot id"), (b" " * (1 << 20), "larger than 65,536 bytes")]:
        ref.write_bytes(text)
        with pytest.raises(IcechunkError, match=message):
            Repository.open(str(tmp_path), {}).resolve()
    ref.write_bytes(b'{"snapshot": "' + ids.encode(b"\2" * 12).encode() + b'"}')
    repo = Repository.open(str(tmp_path), {})
    with pytest.raises(IcechunkError, match="missing from the repository"):
        repo.snapshot(repo.resolve())


def test_manifest_extents_and_ids(tmp_path: Path) -> None:
    arr = NodeSpec("/arr", "array", b"{}", NODE, ndim=2, manifests=[(MID_RAW, [(0, 4)])])
    with pytest.raises(IcechunkError, match="extents have 1 dimensions, the array 2"):
        Snapshot(build_snapshot(SID, [NodeSpec("/"), arr]), "s", SID, DEFAULT_LIMITS,
                 lambda m: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(IcechunkError, match="manifest's id is not the one its name says"):
        Manifest(good_manifest(), "m", ids.encode(b"\3" * 12), 1024)


def test_payload_uncompressed_and_bounds() -> None:
    raw = good_manifest()
    obj = icechunk_object(raw, 2, compress=False)
    assert payload(obj, "m", 2, 1 << 20, 200)[1] == raw
    with pytest.raises(IcechunkError, match="more than 10 bytes"):
        payload(obj, "m", 2, 10, 200)
    assert np.frombuffer(raw, np.uint8).size == len(raw)


def test_credentials_in_the_url_are_not_shown(tmp_path: Path) -> None:
    """A repository URL with user information: messages name it masked, and storage that
    cannot be reached is named for what it is."""
    with pytest.raises(IcechunkError, match=r"^file://\*\*\*@.*: not an Icechunk repository"):
        Repository.open(f"file://user:s3cr3t@{tmp_path}", {})
    with pytest.raises(IcechunkError, match=r"^http://\*\*\*@x\.invalid/repo/repo: cannot be read") as e:
        Repository.open("http://user:s3cr3t@x.invalid/repo", {}, Limits(source_timeout=60))
    assert "s3cr3t" not in str(e.value)


def test_manifest_entries_bound(tmp_path: Path) -> None:
    write_built_repo(tmp_path, SID, good_snapshot(), {MID: good_manifest()})
    repo = Repository.open(str(tmp_path), {}, Limits(max_keys=3))  # the snapshot has 3 nodes
    refs = [RefSpec((0, i), inline=b"x") for i in range(4)]
    (tmp_path / "manifests" / MID).write_bytes(icechunk_object(build_manifest(MID, [(NODE, refs)]), 2))
    with pytest.raises(IcechunkError, match=r"4 chunk references \(limit max_keys=3\)"):
        read_all(repo)
