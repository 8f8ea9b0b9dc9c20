"""ChunkTree without FUSE: the tree of a Parquet set and its inode arithmetic, over random
array grids, separators, record sizes and absent chunks (record files from memory)."""

from __future__ import annotations

import json
import math
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.refs import Ref, RefKind, chunktree
from refmount.refs.chunktree import ChunkTree
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.parquetset import ArraySpec, ParquetSet, Record
from refmount.refs.tree import ROOT_INODE, Node

PATHS = ("a", "g/b", "g/h/c")


@dataclass
class Case:
    tree: ChunkTree
    files: dict[str, Ref]  # every key the tree must show
    absent: set[str]  # chunk keys of rows without a value
    loads: list[tuple[int, int]]


class MemoryRecords:
    """What ChunkTree asks of a RecordCache: ``get(array id, record number)``, and
    ``present(array id)``: the record files there are, when ``listable`` (else None, as for
    a store that cannot list a directory)."""

    def __init__(self, tables: dict[tuple[int, int], pa.Table], loads: list[tuple[int, int]],
                 listable: bool = True) -> None:
        self.tables = tables
        self.loads = loads
        self.listable = listable
        self.decoded: dict[tuple[int, int], Record] = {}  # as RecordCache keeps them

    async def get(self, aid: int, record: int) -> Record:
        self.loads.append((aid, record))
        await trio.lowlevel.checkpoint()
        if (aid, record) not in self.decoded:
            self.decoded[aid, record] = Record(self.tables.get((aid, record)),
                                               f"memory://{aid}/refs.{record}.parq")
        return self.decoded[aid, record]

    async def present(self, aid: int) -> np.ndarray | None:
        await trio.lowlevel.checkpoint()
        if not self.listable:
            return None
        return np.array(sorted(r for a, r in self.tables if a == aid), np.int64)


def chunk_name(spec: ArraySpec, number: int) -> str:
    dims = spec.grid or (1,)
    return spec.separator.join(str(int(i)) for i in np.unravel_index(number, dims))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    record_size = draw(st.integers(1, 5))
    n_arrays = draw(st.integers(1, len(PATHS)))
    builder = IndexBuilder()
    files: dict[str, Ref] = {}
    absent: set[str] = set()
    tables: dict[tuple[int, int], pa.Table] = {}

    def meta(key: str, value: dict) -> None:
        data = json.dumps(value).encode()
        builder.add_inline(key, data)
        files[key] = Ref(RefKind.INLINE, None, 0, len(data), data)

    meta(".zgroup", {"zarr_format": 2})
    specs = []
    for aid, path in enumerate(sorted(PATHS[:n_arrays])):
        ndim = draw(st.integers(0, 3))
        shape = draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim))
        chunks = draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
        sep = draw(st.sampled_from([".", "/"]))
        meta(f"{path}/.zarray", {"shape": shape, "chunks": chunks, "dimension_separator": sep})
        if draw(st.booleans()):
            meta(f"{path}/.zattrs", {"n": aid})
        grid = tuple(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
        spec = ArraySpec(path, grid, sep)
        specs.append(spec)
        present = draw(st.lists(st.booleans(), min_size=spec.count, max_size=spec.count))
        rows = []
        for number, here in enumerate(present):
            key = f"{path}/{chunk_name(spec, number)}"
            if not here:
                rows.append((None, 0, 0, None))
                absent.add(key)
            elif number % 2:
                rows.append((f"/data/{path}", number * 10, number + 1, None))
                files[key] = Ref(RefKind.RANGE, f"/data/{path}", number * 10, number + 1)
            else:
                raw = key.encode()
                rows.append((None, 0, 0, raw))
                files[key] = Ref(RefKind.INLINE, None, 0, len(raw), raw)
        for r in range(0, len(rows), record_size):
            part = rows[r : r + record_size]
            if all(row == (None, 0, 0, None) for row in part) and draw(st.booleans()):
                continue  # no record file at all: its keys are absent too
            tables[(aid, r // record_size)] = pa.table({
                "path": pa.array([p[0] for p in part], pa.string()),
                "offset": pa.array([p[1] for p in part], pa.int64()),
                "size": pa.array([p[2] for p in part], pa.int64()),
                "raw": pa.array([p[3] for p in part], pa.binary()),
            })
    pset = ParquetSet("memory://set", record_size, KeyIndex(builder.finish()), specs)
    loads: list[tuple[int, int]] = []
    tree = ChunkTree(pset, MemoryRecords(tables, loads, draw(st.booleans())))  # type: ignore[arg-type]
    return Case(tree, files, absent, loads)


async def walk(tree: ChunkTree) -> dict[str, tuple[int, Node]]:
    """Every file reachable by readdir: path -> (size listed, node), checking each step."""
    out: dict[str, tuple[int, Node]] = {}
    todo = [(tree.root, "")]
    inodes: set[int] = {ROOT_INODE}
    while todo:
        node, prefix = todo.pop()
        listed = []
        async for name, ino, is_dir, token, size in tree.entries(node):
            listed.append((name, ino, is_dir, token, size))
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
        # Resuming after any entry's token lists exactly the entries after it.
        for i, (_name, _ino, _d, token, _s) in enumerate(listed):
            rest = [e async for e in tree.entries(node, token)]
            assert rest == listed[i + 1 :]
    return out


@settings(max_examples=60, deadline=None)
@given(cases())
def test_listing_lookup_and_references_show_exactly_the_keys(case: Case) -> None:
    async def check() -> None:
        tree = case.tree
        found = await walk(tree)
        assert set(found) == set(case.files)
        assert len(tree) == len(case.tree.meta) + sum(a.count for a in tree.arrays)
        for path, (size, node) in found.items():
            ref = await tree.ref(node)
            assert ref == case.files[path]
            assert size == await tree.size(node) == ref.length
        for path in case.absent:  # rows without a value are not files
            node = tree.root
            parts = path.encode().split(b"/")
            for part in parts[:-1]:
                node = await tree.lookup(node, part)
                assert node is not None and node.is_dir
            assert await tree.lookup(node, parts[-1]) is None

    trio.run(check)


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(0, 2**63 - 1))
def test_unknown_inode_numbers_are_not_found_or_are_real(case: Case, ino: int) -> None:
    node = case.tree.node(ino)
    if node is not None:
        path = case.tree.path(node).decode()
        assert node.ino == ino
        assert any(k == path or k.startswith(path + "/") for k in case.files) or node.is_dir


@settings(max_examples=30, deadline=None)
@given(cases(), st.sampled_from([b"", b"-1", b"01", b"00", b"99", b"1.", b".1", b"x", b"0.0.0.0"]))
def test_names_that_are_not_chunk_coordinates_are_not_found(case: Case, name: bytes) -> None:
    async def check() -> None:
        for aid, spec in enumerate(case.tree.arrays):
            array_dir = case.tree.array_dir(aid)
            node = await case.tree.lookup(array_dir, name)
            if node is not None:  # only a real chunk name in range may resolve
                assert name.decode() in {chunk_name(spec, n) for n in range(spec.count)} | {
                    chunk_name(spec, n).split("/")[0] for n in range(spec.count)}

    trio.run(check)


@settings(max_examples=20, deadline=None)
@given(cases())
def test_metadata_keys_load_no_record(case: Case) -> None:
    async def check() -> None:
        for key in case.files:
            if key.rpartition("/")[2].startswith("."):
                node = case.tree.root
                for part in key.encode().split(b"/"):
                    node = await case.tree.lookup(node, part)
                    assert node is not None
                await case.tree.ref(node)
        assert case.loads == []

    trio.run(check)


# ---- listing a huge grid: bounded work per call ------------------------------------------------


def one_row(raw: bytes) -> pa.Table:
    return pa.table({"path": pa.nulls(1, pa.string()), "offset": pa.array([0], pa.int64()),
                     "size": pa.array([0], pa.int64()), "raw": pa.array([raw], pa.binary())})


def huge_grid(record_size: int, tables: dict[int, pa.Table], listable: bool,
              shape: tuple[int, ...] = (2**39,), sep: str = ".") -> tuple[ChunkTree, list]:
    builder = IndexBuilder()
    builder.add_inline("x/.zarray", json.dumps({"shape": list(shape), "chunks": [1] * len(shape)}).encode())
    pset = ParquetSet("memory://set", record_size, KeyIndex(builder.finish()),
                      [ArraySpec("x", shape, sep)])
    loads: list[tuple[int, int]] = []
    records = MemoryRecords({(0, r): t for r, t in tables.items()}, loads, listable)
    return ChunkTree(pset, records), loads  # type: ignore[arg-type]


async def names(tree: ChunkTree, node: Node, start: int = 0) -> list[tuple[bytes, int]]:
    return [(name, token) async for name, _ino, _d, token, _s in tree.entries(node, start)]


def test_a_grid_of_2_39_chunks_in_records_of_one_row_lists_in_bounded_work() -> None:
    """shape [2**39], record_size 1, one record file: the listing is the one chunk. From a
    store that lists the array's directory, no absent record file is asked for; from one
    that cannot, at most MAX_EMPTY_RECORDS are, and the listing ends there."""
    async def check() -> None:
        for listable, most in ((True, 1), (False, 1 + chunktree.MAX_EMPTY_RECORDS)):
            tree, loads = huge_grid(1, {0: one_row(b"one")}, listable)
            array = tree.array_dir(0)
            with trio.fail_after(5):
                listed = await names(tree, array)
            assert [n for n, _t in listed] == [b".zarray", b"0"]
            assert len(loads) <= most
            loads.clear()
            assert await names(tree, array, listed[-1][1]) == []  # resuming after the last: done
            assert len(loads) <= most

    trio.run(check)


def test_a_listing_with_entries_ends_its_call_at_a_run_of_empty_records() -> None:
    """Records 0 and 1000 have a key, the 999 between are absent and the store cannot list:
    the call gives chunk 0 and stops after MAX_EMPTY_RECORDS absent records; the next call,
    from there, finds nothing within the same budget and the listing ends."""
    async def check() -> None:
        tree, loads = huge_grid(1, {0: one_row(b"a"), 1000: one_row(b"b")}, False, shape=(2000,))
        array = tree.array_dir(0)
        listed = await names(tree, array)
        assert [n for n, _t in listed] == [b".zarray", b"0"]
        assert len(loads) == 1 + chunktree.MAX_EMPTY_RECORDS
        listable, _ = huge_grid(1, {0: one_row(b"a"), 1000: one_row(b"b")}, True, shape=(2000,))
        assert [n for n, _t in await names(listable, listable.array_dir(0))] == [b".zarray", b"0", b"1000"]

    trio.run(check)


def test_one_record_of_2_39_rows_declared_lists_the_rows_the_file_has() -> None:
    """record_size 2**39 with a record file of one row: nothing is sized by record_size."""
    async def check() -> None:
        tree, _ = huge_grid(2**39, {0: one_row(b"one")}, False)
        with trio.fail_after(5):
            assert [n for n, _t in await names(tree, tree.array_dir(0))] == [b".zarray", b"0"]

    trio.run(check)


def test_listing_a_dense_record_is_linear_and_checkpoints() -> None:
    """A record of 100,000 keys: every call yields to the loop (the listing can be cancelled)
    and taking the first entries of a call costs no more than a batch of names."""
    n = 100_000
    table = pa.table({"path": pa.nulls(n, pa.string()), "offset": pa.array(np.zeros(n, np.int64)),
                      "size": pa.array(np.zeros(n, np.int64)), "raw": pa.array([b"v"] * n, pa.binary())})

    async def check() -> None:
        tree, _ = huge_grid(n, {0: table}, True, shape=(n,))
        array = tree.array_dir(0)
        token, listed = 0, 0
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 20  # ~1 s; names of a whole record per call: ~60 s
            while True:  # as readdir does: ~100 names per call, resuming from the last token
                got = []
                async with aclosing(tree.entries(array, token)) as entries:
                    async for name, _ino, _d, tok, _s in entries:
                        got.append((name, tok))
                        if len(got) == 100:
                            break
                if not got:
                    break
                listed += len(got)
                token = got[-1][1]
        assert listed == n + 1
        # Cancelling a listing that is under way: it stops at its next checkpoint.
        with trio.move_on_after(0) as cancelled:
            async for _entry in tree.entries(array):
                pass
        assert cancelled.cancelled_caught

    trio.run(check)
