"""The Icechunk reader against repositories that icechunk 1.1 writes (format version 1): what it
returns equals what icechunk's own store serves from the same repository — every node's
zarr.json, every chunk's bytes (inline, native, virtual), for each branch, tag and snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.icechunkrepos import V1Repo, open_icechunk, store_get, store_keys, write_v1_repo

from refmount.refs.icechunk import ChunkRef, IcechunkError, Repository, Snapshot
from refmount.refs.icechunk.ids import is_id12

pytest.importorskip("icechunk")


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> V1Repo:
    base = tmp_path_factory.mktemp("icechunk-v1")
    return write_v1_repo(base / "repo", base / "data")


def chunk_bytes(repo: Repository, ref: ChunkRef) -> bytes:
    if ref.kind == "inline":
        assert ref.data is not None
        return ref.data
    url = repo.object_url(ref.location) if ref.kind == "native" else ref.location
    assert url is not None
    path = Path(url.removeprefix("file://"))
    with path.open("rb") as f:
        f.seek(ref.offset)
        data = f.read(ref.length)
    if ref.kind == "native" and ref.offset == 0:
        assert len(data) == ref.length == path.stat().st_size
    return data


def chunk_key(path: str, coords: tuple[int, ...]) -> str:
    return f"{path}/c/" + "/".join(map(str, coords)) if path else "c/" + "/".join(map(str, coords))


def compare(repo: Repository, snap: Snapshot, store: object) -> int:
    """Everything ``snap`` holds equals what icechunk's ``store`` serves; the number of chunks."""
    keys = store_keys(store)
    assert [n.path for n in snap.nodes] == sorted(
        k.removesuffix("zarr.json").rstrip("/") for k in keys if k.endswith("zarr.json"))
    chunks = 0
    mine = set()
    for node in snap.nodes:
        key = f"{node.path}/zarr.json" if node.path else "zarr.json"
        assert node.zarr_json == store_get(store, key), key
        assert json.loads(node.zarr_json)["node_type"] == node.kind
        if node.kind != "array":
            assert snap.chunk_count(node.path) == 0
            continue
        listed = list(snap.chunks(node.path))
        assert snap.chunk_count(node.path) == len(listed)
        for coords, ref in listed:
            key = chunk_key(node.path, coords)
            mine.add(key)
            assert chunk_bytes(repo, ref) == store_get(store, key), key
            assert snap.chunk(node.path, coords) == ref
            chunks += 1
    assert mine == {k for k in keys if not k.endswith("zarr.json")}
    return chunks


def test_refs(v1: V1Repo) -> None:
    repo = Repository.open(str(v1.path), {})
    assert repo.format_version == 1
    assert repo.branches() == {"main": v1.snapshots["virtual"], "dev": v1.snapshots["dev"]}
    assert repo.tags() == {"v1.0": v1.snapshots["virtual"]}  # "gone" was deleted
    assert repo.resolve() == v1.snapshots["virtual"]
    assert repo.resolve(branch="dev") == v1.snapshots["dev"]
    assert repo.resolve(tag="v1.0") == v1.snapshots["virtual"]
    assert repo.resolve(snapshot=v1.snapshots["structure"]) == v1.snapshots["structure"]
    with pytest.raises(IcechunkError, match="tag 'gone' was deleted"):
        repo.resolve(tag="gone")
    with pytest.raises(IcechunkError, match="no branch 'nope'"):
        repo.resolve(branch="nope")
    with pytest.raises(IcechunkError, match="not a branch name"):
        repo.resolve(branch="../refs")
    with pytest.raises(IcechunkError, match="not a snapshot id"):
        repo.resolve(snapshot="../../etc/passwd")
    assert repo.virtual_chunk_containers() == [v1.container]
    assert Repository.detect(str(v1.path), {})
    assert not Repository.detect(str(v1.data_dir), {})
    with pytest.raises(IcechunkError, match="not an Icechunk repository"):
        Repository.open(str(v1.data_dir), {})


@pytest.mark.parametrize("ref", [{"branch": "main"}, {"branch": "dev"}, {"tag": "v1.0"}])
def test_snapshot_equals_icechunk(v1: V1Repo, ref: dict[str, str]) -> None:
    repo = Repository.open(str(v1.path), {})
    snap = repo.snapshot(repo.resolve(**ref))
    store = open_icechunk(v1.path, v1.container, **ref)
    assert compare(repo, snap, store) > 30


def test_snapshot_info_and_history(v1: V1Repo) -> None:
    repo = Repository.open(str(v1.path), {})
    snap = repo.snapshot(v1.snapshots["virtual"])
    assert snap.info.id == v1.snapshots["virtual"] and is_id12(snap.info.id)
    assert snap.info.parent_id == v1.snapshots["structure"]
    assert snap.info.message == "virtual chunks"
    assert snap.info.flushed_at.endswith("Z") and snap.info.flushed_at[:2] == "20"
    first = repo.snapshot(v1.snapshots["structure"])
    assert first.info.parent_id == "1CECHNKREP0F1RSTCMT0"  # the repository's initial commit
    assert repo.snapshot("1CECHNKREP0F1RSTCMT0").nodes == []
    # the older snapshot has no virtual chunks yet
    assert first.chunk_count("virtual") == 0 and snap.chunk_count("virtual") == 3


def test_kinds(v1: V1Repo) -> None:
    repo = Repository.open(str(v1.path), {})
    snap = repo.snapshot(repo.resolve())
    assert {ref.kind for _, ref in snap.chunks("inline")} == {"inline"}
    assert {ref.kind for _, ref in snap.chunks("grp/native")} == {"native"}
    assert [c for c, _ in snap.chunks("grp/native")] == [(0, 0), (0, 1), (1, 0)]
    assert snap.chunk("grp/native", (1, 1)) is None  # the fill value: never written
    assert snap.chunk("grp/native", (7, 7)) is None
    assert snap.chunk("grp/native", (0,)) is None
    assert snap.chunk("grp", (0,)) is None and snap.chunk("nope", (0,)) is None
    virtual = dict(snap.chunks("virtual"))
    assert {r.kind for r in virtual.values()} == {"virtual"}
    assert {r.location for r in virtual.values()} == {v1.h5_file.as_uri()}
    assert virtual[(0,)].last_modified == 4102444800 and virtual[(0,)].etag is None  # 2100-01-01
    assert virtual[(1,)].etag == v1.etag and virtual[(1,)].last_modified is None
    assert virtual[(2,)].etag is None and virtual[(2,)].last_modified is None
    values = np.concatenate([np.frombuffer(chunk_bytes(repo, virtual[(i,)]), "<i4") for i in range(3)])
    assert (values == v1.h5_values).all()  # the HDF5 file's chunks, as h5py wrote them
    assert snap.node("grp/sub/deeper") is not None and snap.node("grp/sub/deeper").kind == "group"
    assert json.loads(snap.node("").zarr_json)["attributes"] == {"title": "refmount test"}


def test_split_manifest_loads_only_what_covers(v1: V1Repo) -> None:
    """The split array (5 x 5 chunks, 2 per manifest along each dimension) has 9 manifests; a
    chunk's lookup reads only the one whose extents cover it."""
    repo = Repository.open(str(v1.path), {})
    snap = repo.snapshot(repo.resolve())
    shape = snap.array_info("split")
    assert shape is not None and len(shape.manifests) == 9
    ref = snap.chunk("split", (4, 3))
    assert ref is not None and ref.kind == "native"
    assert len(repo._manifests) == 1  # the LRU of manifests holds the one that was read
    assert snap.chunk_count("split") == 25
    assert len(repo._manifests) == 9
    assert repo._manifests.weight == sum(m.nbytes for m in repo._manifests.values())
    order = [c for c, _ in snap.chunks("split")]
    assert sorted(order) == [(i, j) for i in range(5) for j in range(5)]


def test_manifest_cache_is_bounded(v1: V1Repo) -> None:
    repo = Repository.open(str(v1.path), {}, manifest_cache_bytes=1)
    snap = repo.snapshot(repo.resolve())
    assert snap.chunk_count("split") == 25
    assert len(repo._manifests) == 1  # a manifest over the bound: only the newest is kept


def test_large_manifest(tmp_path: Path) -> None:
    """90,000 virtual chunk references in one manifest (more than the verifier's slice of 65,536
    tables): each one as icechunk was given it, found by coordinates and listed in C order."""
    import icechunk as ic
    import zarr

    cfg = ic.RepositoryConfig.default()
    cfg.set_virtual_chunk_container(ic.VirtualChunkContainer("s3://bucket/", ic.s3_store(region="us-east-1")))
    repo = ic.Repository.create(ic.local_filesystem_storage(str(tmp_path / "r")), config=cfg)
    s = repo.writable_session("main")
    zarr.group(store=s.store).create_array("v", shape=(300, 300), chunks=(1, 1), dtype="<i4", fill_value=0)
    specs = [ic.VirtualChunkSpec(index=[i, j], location=f"s3://bucket/f{i}.nc", offset=j * 4, length=4,
                                 etag_checksum=f"e{j}" if j % 2 else None)
             for i in range(300) for j in range(300)]
    s.store.set_virtual_refs("v", specs, validate_containers=False)
    s.commit("large")
    mine = Repository.open(str(tmp_path / "r"), {})
    snap = mine.snapshot(mine.resolve())
    assert snap.chunk_count("v") == 90_000
    coords = np.concatenate(list(snap.chunk_coords("v")))
    assert coords.shape == (90_000, 2)
    assert (coords[:, 0] * 300 + coords[:, 1] == np.arange(90_000)).all()
    for i, j in [(0, 0), (299, 299), (123, 45), (200, 7)]:
        ref = snap.chunk("v", (i, j))
        assert ref == ChunkRef("virtual", location=f"s3://bucket/f{i}.nc", offset=j * 4, length=4,
                               etag=f"e{j}" if j % 2 else None)
    listed = list(snap.chunks("v"))
    assert len(listed) == 90_000 and listed[12_345][1] == snap.chunk("v", listed[12_345][0])
    assert snap.chunk("v", (300, 0)) is None


@pytest.mark.parametrize("path", ["grp/native", "inline", "split", "virtual", "grp", "nope"])
def test_chunk_listing_equals_chunks(v1: V1Repo, path: str) -> None:
    repo = Repository.open(str(v1.path), {})
    snap = repo.snapshot(repo.resolve())
    listed = list(snap.chunks(path))
    pairs = list(snap.chunk_listing(path))
    coords = [tuple(c) for cs, _ in pairs for c in cs.tolist()]
    sizes = [s for _, ss in pairs for s in ss.tolist()]
    assert coords == [c for c, _ in listed]
    assert sizes == [len(r.data) if r.kind == "inline" else r.length for _, r in listed]
    assert [tuple(c) for cs in snap.chunk_coords(path) for c in cs.tolist()] == coords
    assert len(coords) == snap.chunk_count(path)


def test_concurrent_lookups(v1: V1Repo) -> None:
    """Worker threads looking chunks up at once share the manifests' LRU (the daemon's use)."""
    from concurrent.futures import ThreadPoolExecutor

    repo = Repository.open(str(v1.path), {}, manifest_cache_bytes=4096)
    snap = repo.snapshot(repo.resolve())
    expected = dict(snap.chunks("split"))
    coords = [(i, j) for i in range(5) for j in range(5)] * 8
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: snap.chunk("split", c), coords))
    assert got == [expected[c] for c in coords]
