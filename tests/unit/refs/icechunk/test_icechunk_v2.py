"""The Icechunk reader on format version 2: icechunk's own test repository written by icechunk
2.0 (tests/data/icechunk/test-repo-v2, see its README), and version 2 layouts built here from
the spec (shape_v2, dictionary-compressed virtual chunk locations)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zstandard
from support.icechunkrepos import NodeSpec, RefSpec, build_manifest, build_snapshot, icechunk_object

from refmount.refs.icechunk import IcechunkError, Repository, ids
from refmount.refs.icechunk.manifest import Manifest
from refmount.refs.icechunk.snapshot import Snapshot
from refmount.refs.limits import DEFAULT_LIMITS

REPO = Path(__file__).parents[3] / "data" / "icechunk" / "test-repo-v2"
MAIN_HISTORY = ["set virtual chunk", "fill data", "empty structure", "Repository initialized"]


def history(repo: Repository, snapshot_id: str) -> list[str]:
    out = []
    sid: str | None = snapshot_id
    while sid is not None:
        info = repo.snapshot(sid).info
        out.append(info.message)
        sid = info.parent_id
    return out


def decode(repo: Repository, snap: Snapshot, path: str, coords: tuple[int, ...]) -> np.ndarray:
    """A chunk decoded by its zarr.json (bytes, then zstd: what these arrays use)."""
    meta = json.loads(snap.node(path).zarr_json)
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "zstd"]
    ref = snap.chunk(path, coords)
    assert ref is not None
    if ref.kind == "inline":
        raw = ref.data
    else:
        obj = Path(repo.object_url(ref.location))
        assert obj.stat().st_size == ref.length and ref.offset == 0
        raw = obj.read_bytes()
    dtype = {"float32": "<f4", "int8": "i1"}[meta["data_type"]]
    return np.frombuffer(zstandard.ZstdDecompressor().decompress(raw), dtype)


def test_refs_and_history() -> None:
    repo = Repository.open(str(REPO), {})
    assert repo.format_version == 2
    assert Repository.detect(str(REPO), {})
    assert set(repo.branches()) == {"main", "my-branch"}
    assert set(repo.tags()) == {"it works!", "it also works!"}
    with pytest.raises(IcechunkError, match="tag 'deleted' was deleted"):
        repo.resolve(tag="deleted")
    with pytest.raises(IcechunkError, match="no branch"):
        repo.resolve(branch="nope")
    assert history(repo, repo.resolve()) == MAIN_HISTORY
    branch = ["some more structure", "delete a chunk", *MAIN_HISTORY]
    assert history(repo, repo.resolve(branch="my-branch")) == branch
    assert history(repo, repo.resolve(tag="it also works!")) == branch
    assert history(repo, repo.resolve(tag="it works!")) == branch[1:]
    assert repo.virtual_chunk_containers() == ["s3://testbucket/"]
    snap = repo.snapshot(repo.resolve())
    assert snap.info.flushed_at.startswith("2026-04-08T16:15:57")


def test_nodes_and_chunks() -> None:
    repo = Repository.open(str(REPO), {})
    main = repo.snapshot(repo.resolve())
    assert [(n.path, n.kind) for n in main.nodes] == [
        ("", "group"), ("group1", "group"), ("group1/big_chunks", "array"), ("group1/small_chunks", "array")]
    for n in main.nodes:
        assert json.loads(n.zarr_json)["node_type"] == n.kind
    big = dict(main.chunks("group1/big_chunks"))
    assert sorted(big) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert big[(0, 0)].kind == "virtual"
    assert big[(0, 0)].location == "s3://testbucket/can_read_old/chunk-1"
    assert big[(0, 0)].length == big[(0, 1)].length == 19
    for c in [(0, 1), (1, 0), (1, 1)]:
        assert big[c].kind == "native"
        assert (decode(repo, main, "group1/big_chunks", c) == np.full(25, 42.0, "<f4")).all()
    for i in range(5):
        assert main.chunk("group1/small_chunks", (i,)).kind == "inline"
        assert decode(repo, main, "group1/small_chunks", (i,)).tolist() == [84]
    branch = repo.snapshot(repo.resolve(branch="my-branch"))
    assert branch.chunk("group1/small_chunks", (4,)) is None  # deleted on that branch
    assert branch.chunk_count("group1/small_chunks") == 4
    assert branch.node("group2/group3/group4/group5/inner").kind == "array"
    assert branch.chunk_count("group2/group3/group4/group5/inner") == 0
    assert [n.path for n in branch.nodes if n.kind == "group"] == [
        "", "group1", "group2", "group2/group3", "group2/group3/group4", "group2/group3/group4/group5"]


def test_every_snapshot_reads(tmp_path: Path) -> None:
    repo = Repository.open(str(REPO), {})
    for sid in repo._info.snapshots:
        snap = repo.snapshot(sid)
        for n in snap.nodes:
            for _, ref in snap.chunks(n.path):
                if ref.kind == "native":
                    assert Path(repo.object_url(ref.location)).stat().st_size == ref.length


def test_v2_without_repo_object_is_not_a_repository(tmp_path: Path) -> None:
    shutil.copytree(REPO / "snapshots", tmp_path / "snapshots")
    assert not Repository.detect(str(tmp_path), {})
    with pytest.raises(IcechunkError, match="not an Icechunk repository"):
        Repository.open(str(tmp_path), {})


def test_built_v2_snapshot_and_compressed_locations() -> None:
    """Version 2 layouts icechunk 2 writes but test-repo-v2 does not hold: an array's shape in
    shape_v2, and virtual chunk locations compressed with the manifest's zstd dictionary."""
    mid = ids.encode(bytes(11) + b"\x10")
    node = NodeSpec("/a", "array", b'{"zarr_format":3,"node_type":"array"}', b"\7" * 8, ndim=2,
                    manifests=[(ids.decode(mid), [(0, 3), (0, 3)])])
    data = build_snapshot("1CECHNKREP0F1RSTCMT0", [NodeSpec("/"), node], v2=True)
    manifests: dict[str, Manifest] = {}
    snap = Snapshot(data, "built", "1CECHNKREP0F1RSTCMT0", DEFAULT_LIMITS, manifests.__getitem__)
    assert snap.array_info("a").ndim == 2
    dictionary = b"s3://bucket/some/long/prefix/of/files/file-"
    cdict = zstandard.ZstdCompressionDict(dictionary)
    comp = zstandard.ZstdCompressor(dict_data=cdict)
    refs = [RefSpec((i, j), compressed_location=comp.compress(f"{dictionary.decode()}{i}{j}.nc".encode()),
                    offset=10 * i, length=7) for i in range(3) for j in range(3)]
    m = build_manifest(mid, [(b"\7" * 8, refs)], dictionary=dictionary)
    manifests[mid] = Manifest(m, "built manifest", mid, 1024)
    got = dict(snap.chunks("a"))
    assert len(got) == 9
    assert got[(2, 1)].location == "s3://bucket/some/long/prefix/of/files/file-21.nc"
    assert got[(2, 1)].offset == 20 and got[(2, 1)].length == 7
    assert snap.chunk("a", (1, 2)).location.endswith("file-12.nc")
    small = Manifest(m, "built manifest", mid, 8)  # locations longer than the bound are refused
    with pytest.raises(IcechunkError, match="cannot be decompressed within 8 bytes"):
        small.refs_of(b"\7" * 8, 2).ref(0)


def test_header_spec_version(tmp_path: Path) -> None:
    """A version 2 object in a version 1 repository is refused."""
    sid = "1CECHNKREP0F1RSTCMT0"
    (tmp_path / "snapshots").mkdir()
    (tmp_path / "refs" / "branch.main").mkdir(parents=True)
    (tmp_path / "refs" / "branch.main" / "ref.json").write_text(json.dumps({"snapshot": sid}))
    (tmp_path / "snapshots" / sid).write_bytes(icechunk_object(build_snapshot(sid, [NodeSpec("/")]), 1, 2))
    repo = Repository.open(str(tmp_path), {})
    with pytest.raises(IcechunkError, match="spec version 2 snapshot in a version 1 repository"):
        repo.snapshot(sid)
