"""The tree of an Icechunk snapshot without FUSE and without a repository on disk: a small
in-memory fake of the reader's API (``refs/icechunk/repository.py``) under random arrays
(dimensions, grids, chunk key encodings and separators, chunks absent, inline, native and
virtual), and the keys, option and authorisation logic of the format."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.base.errors import ReadError
from refmount.refs import Ref, RefKind
from refmount.refs.icechunk.format import ChunkRefs, IcechunkFormat, metadata_keys, revision_choice
from refmount.refs.icechunk.keys import ChunkKeys, UnsupportedArray
from refmount.refs.icechunk.repository import ChunkRef, IcechunkError, Node, SnapshotInfo
from refmount.refs.icechunk.tree import ChunkSource, IcechunkTree
from refmount.refs.limits import DEFAULT_LIMITS
from refmount.refs.tree import ROOT_INODE
from refmount.refs.tree import Node as TreeNode
from refmount.targets.pins import Pins
from refmount.targets.rules import TargetRules
from refmount.targets.versions import Version
from refmount.targets.virtualaccess import VirtualAccess

PATHS = ("a", "g/b", "g/h/c")
CONTAINER = "http://127.0.0.1:9/data/"


@dataclass
class FakeSnapshot:
    """What the tree and the format ask of a ``Snapshot``."""

    nodes: list[Node]
    manifests: dict[str, dict[tuple[int, ...], ChunkRef]]
    info: SnapshotInfo = field(
        default_factory=lambda: SnapshotInfo("S" * 20, None, "2026-01-01T00:00:00Z", "m"))
    asked: list[str] = field(default_factory=list)

    def node(self, path: str) -> Node | None:
        return next((n for n in self.nodes if n.path == path), None)

    def chunk(self, path: str, coords: tuple[int, ...]) -> ChunkRef | None:
        self.asked.append(path)
        return self.manifests.get(path, {}).get(tuple(coords))

    def chunks(self, path: str) -> Iterator[tuple[tuple[int, ...], ChunkRef]]:
        self.asked.append(path)
        yield from sorted(self.manifests.get(path, {}).items())

    def chunk_listing(self, path: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Two "manifests": the chunks in C order, split in the middle (as the reader's)."""
        self.asked.append(path)
        items = sorted(self.manifests.get(path, {}).items())
        half = len(items) // 2
        for part in (items[:half], items[half:]):
            if part:
                ndim = len(part[0][0])
                coords = np.array([c for c, _ in part], np.uint32).reshape(len(part), ndim)
                sizes = np.array([len(r.data or b"") if r.kind == "inline" else r.length for _, r in part],
                                 np.int64)
                yield coords, sizes

    def chunk_count(self, path: str) -> int:
        return len(self.manifests.get(path, {}))


class FakeRepository:
    root = "s3://bucket/repo"
    format_version = 1

    def __init__(self, containers: list[str], names: dict[str, str] | None = None) -> None:
        self.containers = containers
        self.names = names or {}

    def virtual_chunk_containers(self) -> list[str]:
        return self.containers

    def virtual_chunk_container_names(self) -> dict[str, str]:
        return self.names

    def object_url(self, location: str) -> str:
        return f"{self.root}/{location}"


@dataclass
class Case:
    tree: IcechunkTree
    files: dict[str, Ref]
    snapshot: FakeSnapshot


def zarr_json(shape: list[int], chunks: list[int], encoding: str, sep: str) -> bytes:
    return json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "int8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": encoding, "configuration": {"separator": sep}},
        "fill_value": 0, "codecs": [{"name": "bytes"}],
    }).encode()


def expected_key(shape_dims: tuple[int, ...], coords: tuple[int, ...], encoding: str, sep: str) -> str:
    parts = [str(c) for c in coords]
    if encoding == "default":
        return sep.join(["c", *parts])
    return sep.join(parts) if parts else "0"


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_arrays = draw(st.integers(1, len(PATHS)))
    group = json.dumps({"zarr_format": 3, "node_type": "group"}).encode()
    nodes = [Node("", "group", group), Node("g", "group", group), Node("g/h", "group", group)]
    files = {key: Ref(RefKind.INLINE, None, 0, len(group), group)
             for key in ("zarr.json", "g/zarr.json", "g/h/zarr.json")}
    manifests: dict[str, dict[tuple[int, ...], ChunkRef]] = {}
    for path in PATHS[:n_arrays]:
        ndim = draw(st.integers(0, 3))
        shape = draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim))
        chunks = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
        encoding = draw(st.sampled_from(["default", "v2"]))
        sep = draw(st.sampled_from([".", "/"]))
        doc = zarr_json(shape, chunks, encoding, sep)
        nodes.append(Node(path, "array", doc))
        files[f"{path}/zarr.json"] = Ref(RefKind.INLINE, None, 0, len(doc), doc)
        dims = tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
        manifest = manifests[path] = {}
        for number in range(math.prod(dims)):
            coords = ChunkKeys(dims).coords(number)
            kind = draw(st.sampled_from(["absent", "inline", "native", "virtual"]))
            key = f"{path}/{expected_key(dims, coords, encoding, sep)}"
            if kind == "inline":
                data = key.encode()
                manifest[coords] = ChunkRef("inline", data=data)
                files[key] = Ref(RefKind.INLINE, None, 0, len(data), data)
            elif kind == "native":
                manifest[coords] = ChunkRef("native", location=f"chunks/{number:04d}", offset=0,
                                            length=number + 1)
                files[key] = Ref(RefKind.RANGE, f"s3://bucket/repo/chunks/{number:04d}", 0, number + 1)
            elif kind == "virtual":
                url = f"{CONTAINER}{path}.nc"
                manifest[coords] = ChunkRef("virtual", location=url, offset=number * 10, length=7)
                files[key] = Ref(RefKind.RANGE, url, number * 10, 7)
        if draw(st.booleans()) and dims:  # a chunk outside the grid (written before a resize)
            manifest[tuple(d for d in dims)] = ChunkRef("inline", data=b"gone")
    nodes.sort(key=lambda n: n.path)
    snapshot = FakeSnapshot(nodes, manifests)
    metadata, arrays = metadata_keys(snapshot, "error", DEFAULT_LIMITS)  # type: ignore[arg-type]
    access = VirtualAccess(TargetRules.from_json([{"prefix": CONTAINER}]), None, None)
    refs = ChunkRefs(FakeRepository([CONTAINER]), access)  # type: ignore[arg-type]
    tree = IcechunkTree(metadata, arrays, ChunkSource(snapshot.chunk, snapshot.chunk_listing, refs))
    return Case(tree, files, snapshot)


async def walk(tree: IcechunkTree) -> dict[str, tuple[int, TreeNode]]:
    """Every file reachable by readdir: path -> (size listed, node), checking each step."""
    out: dict[str, tuple[int, TreeNode]] = {}
    todo = [(tree.root, "")]
    inodes: set[int] = {ROOT_INODE}
    while todo:
        node, prefix = todo.pop()
        listed = []
        async with aclosing(tree.entries(node)) as entries:
            async for name, ino, is_dir, token, size in entries:
                listed.append((name, ino, is_dir, token, size))
        for name, ino, is_dir, _token, size in listed:
            assert ino not in inodes, "inode numbers are unique"
            inodes.add(ino)
            child = tree.node(ino)
            assert child is not None and child.ino == ino and child.is_dir == is_dir
            assert await tree.lookup(node, name) == child  # lookup agrees with readdir
            assert tree.parent(child) == node
            path = prefix + name.decode()
            assert tree.path(child) == path.encode()
            if is_dir:
                todo.append((child, path + "/"))
            else:
                out[path] = (size, child)
        for i, (_name, _ino, _d, token, _s) in enumerate(listed):  # resuming after any entry
            rest = [e async for e in tree.entries(node, token)]
            assert rest == listed[i + 1 :]
    return out


@settings(max_examples=80, deadline=None)
@given(cases())
def test_listing_lookup_and_references_show_exactly_the_written_chunks(case: Case) -> None:
    async def check() -> None:
        tree = case.tree
        found = await walk(tree)
        assert set(found) == set(case.files)
        for path, (size, node) in found.items():
            ref = await tree.ref(node)
            assert ref == case.files[path]
            assert size == await tree.size(node) == ref.length
        for path in case.files:  # every key is found by name from the root
            node: TreeNode | None = tree.root
            for part in path.encode().split(b"/"):
                assert node is not None
                node = await tree.lookup(node, part)
            assert node is not None and not node.is_dir

    trio.run(check)


@settings(max_examples=30, deadline=None)
@given(cases(), st.sampled_from([b"", b"-1", b"01", b"00", b"99", b"1.", b".1", b"x", b"c.", b"c", b"0.0.0.0",
                                 b"\xff"]))
def test_names_that_are_no_chunk_are_not_found(case: Case, name: bytes) -> None:
    async def check() -> None:
        tree = case.tree
        for aid, array in enumerate(tree.arrays):
            node = await tree.lookup(tree._array_dir[aid], name)
            if node is not None:
                path = tree.path(node).decode()
                assert path in case.files or any(k.startswith(path + "/") for k in case.files) \
                    or (node.is_dir and array.keys.nested)

    trio.run(check)


def test_a_listing_reads_the_manifests_once_per_array() -> None:
    doc = zarr_json([6], [1], "default", "/")
    root = Node("", "group", b'{"zarr_format":3,"node_type":"group"}')
    snap = FakeSnapshot([root, Node("x", "array", doc)],
                        {"x": {(i,): ChunkRef("inline", data=b"%d" % i) for i in range(0, 6, 2)}})
    metadata, arrays = metadata_keys(snap, "error", DEFAULT_LIMITS)  # type: ignore[arg-type]
    source = ChunkSource(snap.chunk, snap.chunk_listing, lambda c: Ref(RefKind.INLINE))
    tree = IcechunkTree(metadata, arrays, source)

    async def check() -> None:
        x = await tree.lookup(tree.root, b"x")
        assert x is not None
        c = await tree.lookup(x, b"c")
        assert c is not None and c.is_dir
        for _ in range(3):
            names = [e[0] async for e in tree.entries(c)]
            assert names == [b"0", b"2", b"4"]
        assert snap.asked.count("x") == 1

    trio.run(check)


# ---- chunk keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("encoding", "coords", "key"), [
    ({"name": "default"}, (0, 1), "c/0/1"),
    ({"name": "default", "configuration": {"separator": "."}}, (3, 1), "c.3.1"),
    ({"name": "v2"}, (0, 1), "0.1"),
    ({"name": "v2", "configuration": {"separator": "/"}}, (2, 0), "2/0"),
])
def test_chunk_keys_follow_the_encoding(encoding: dict, coords: tuple[int, ...], key: str) -> None:
    doc = {"shape": [10, 10], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 5]}},
           "chunk_key_encoding": encoding}
    keys = ChunkKeys.from_zarr_json(doc)
    assert keys.dims == (5, 2)
    assert keys.key(keys.number(coords)) == key


def test_zero_dimensional_arrays_have_one_chunk() -> None:
    grid = {"name": "regular", "configuration": {"chunk_shape": []}}
    assert ChunkKeys.from_zarr_json({"shape": [], "chunk_grid": grid}).key(0) == "c"
    v2 = ChunkKeys.from_zarr_json({"shape": [], "chunk_grid": grid, "chunk_key_encoding": {"name": "v2"}})
    assert v2.key(0) == "0" and v2.parse("0") == 0 and v2.parse("c") is None


@pytest.mark.parametrize("doc", [
    {"shape": [4], "chunk_grid": {"name": "rectilinear"}},
    {"shape": [4], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [0]}}},
    {"shape": [4], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 1]}}},
    {"shape": [2**41], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}}},
    {"shape": [4], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
     "chunk_key_encoding": {"name": "custom"}},
    {"shape": [4], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
     "chunk_key_encoding": {"name": "default", "configuration": {"separator": "-"}}},
])
def test_arrays_whose_keys_cannot_be_served_say_why(doc: dict) -> None:
    with pytest.raises(UnsupportedArray):
        ChunkKeys.from_zarr_json(doc)


# ---- revisions and authorisation ----------------------------------------------------------------


def test_one_revision_at_most() -> None:
    assert revision_choice(None) == {"branch": "main"}
    assert revision_choice({"tag": "v1"}) == {"tag": "v1"}
    with pytest.raises(IcechunkError, match=r"give one of branch=, tag=, snapshot= \(not branch= and tag=\)"):
        revision_choice({"branch": "a", "tag": "b"})


def test_other_formats_refuse_a_revision() -> None:
    from refmount.refs.jsonrefs import JsonFormat
    from refmount.refs.model import ReferenceSetError

    with pytest.raises(ReferenceSetError, match="branch= applies to an Icechunk repository"):
        JsonFormat().check_revision("x.json", {"branch": "dev"})
    JsonFormat().check_revision("x.json", {})


def test_a_local_file_is_not_a_repository(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "refs.json"
    f.write_text("{}")
    assert not IcechunkFormat().detect(str(f), {})


def virtual(url: str) -> ChunkRef:
    return ChunkRef("virtual", location=url, offset=3, length=4)


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://127.0.0.1:9/data/a.nc", True),
    ("HTTP://127.0.0.1:9/data/sub/b.nc", True),
    ("http://127.0.0.1:9/database.nc", False),  # not under the container
    ("http://127.0.0.1:9/data/../etc/passwd", False),  # climbs out of it
    ("http://127.0.0.1:9/data/%2e%2e/x", False),
    ("http://other/data/a.nc", False),
])
def test_virtual_chunks_are_read_only_under_a_declared_authorised_container(url: str, allowed: bool) -> None:
    rules = TargetRules.from_json([{"prefix": "http://127.0.0.1:9/"}])
    refs = ChunkRefs(FakeRepository([CONTAINER]), VirtualAccess(rules, None, None))  # type: ignore[arg-type]
    if allowed:
        assert refs(virtual(url)) == Ref(RefKind.RANGE, url, 3, 4)
    else:
        with pytest.raises(ReadError):
            refs(virtual(url))


def test_a_declared_container_needs_a_rule_or_allow_local() -> None:
    repo = FakeRepository([CONTAINER, "file:///srv/data/"])
    refused = ChunkRefs(repo, VirtualAccess(TargetRules(), None, None))  # type: ignore[arg-type]
    with pytest.raises(ReadError, match=r"container http://127.0.0.1:9/data/ is not authorised"):
        refused(virtual(CONTAINER + "a.nc"))
    with pytest.raises(ReadError, match="allow_local"):
        refused(virtual("file:///srv/data/a.nc"))
    local = ChunkRefs(repo, VirtualAccess(TargetRules(), ["/srv"], None))  # type: ignore[arg-type]
    assert local(virtual("file:///srv/data/a.nc")).url == "file:///srv/data/a.nc"
    one_file = TargetRules.from_json([{"prefix": CONTAINER + "a.nc"}])
    ruled = ChunkRefs(repo, VirtualAccess(one_file, None, None))  # type: ignore[arg-type]
    assert ruled(virtual(CONTAINER + "a.nc")).offset == 3
    with pytest.raises(ReadError):
        ruled(virtual(CONTAINER + "b.nc"))  # the rule covers a.nc only


def test_native_and_inline_chunks_need_no_authorisation() -> None:
    refs = ChunkRefs(FakeRepository([]), None)  # type: ignore[arg-type]
    assert refs(ChunkRef("native", location="chunks/AB", offset=1, length=2)) == Ref(
        RefKind.RANGE, "s3://bucket/repo/chunks/AB", 1, 2)
    assert refs(ChunkRef("inline", data=b"xy")) == Ref(RefKind.INLINE, None, 0, 2, b"xy")
    with pytest.raises(ReadError, match="outside every virtual chunk container"):
        refs(virtual(CONTAINER + "a.nc"))


def test_the_repository_objects_are_read_with_source_options() -> None:
    from refmount.targets.rules import with_own_objects

    user = TargetRules.from_json([{"prefix": "s3://other/", "options": {"anon": True}}])
    rules = with_own_objects(user, ("s3://bucket/repo/chunks", {"key": "K"}))
    assert rules.match("s3://bucket/repo/chunks/AB").options == {"key": "K"}
    assert rules.match("s3://other/x").number == 1
    assert with_own_objects(user, None) is user


def test_a_virtual_chunks_recorded_version_is_its_targets_pin() -> None:
    pins = Pins({}, "the reference", required=False)
    access = VirtualAccess(TargetRules.from_json([{"prefix": CONTAINER}]), None, pins)
    refs = ChunkRefs(FakeRepository([CONTAINER]), access)  # type: ignore[arg-type]
    refs(ChunkRef("virtual", location=CONTAINER + "a.nc", offset=0, length=1, etag='"abc"'))
    refs(ChunkRef("virtual", location=CONTAINER + "b.nc", offset=0, length=1, last_modified=1_700_000_000))
    refs(ChunkRef("virtual", location=CONTAINER + "c.nc", offset=0, length=1))
    assert pins.check(CONTAINER + "a.nc") == Version(etag='"abc"')
    assert pins.check(CONTAINER + "c.nc") is None  # nothing recorded: read unchecked
    by = pins.check(CONTAINER + "b.nc")
    assert by is not None
    assert by.mismatch(Version(last_modified="Tue, 14 Nov 2023 22:13:20 GMT")) is None  # that very second
    assert by.mismatch(Version(last_modified="Mon, 13 Nov 2023 10:00:00 GMT")) is None
    assert "after 2023-11-14T22:13:20Z" in (by.mismatch(Version(mtime_ns=1_700_000_001 * 10**9)) or "")
    assert "no modification time" in (by.mismatch(Version(size=3)) or "")
    assert not pins.keyed(CONTAINER + "c.nc") and pins.keyed(CONTAINER + "a.nc")


def test_only_a_format_with_revisions_names_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from refmount.refs import revision_identity

    f = tmp_path / "refs.json"
    f.write_text("{}")
    assert revision_identity(str(f), {}, timeout=5) is None
    # a remote reference file, by its name: no request asks whether it is a repository
    assert revision_identity("http://127.0.0.1:9/refs.json.gz", {}, timeout=5) is None
    parquet = tmp_path / "pq"
    parquet.mkdir()
    (parquet / ".zmetadata").write_text('{"record_size": 10, "metadata": {}}')
    assert revision_identity(str(parquet), {}, timeout=5) is None
