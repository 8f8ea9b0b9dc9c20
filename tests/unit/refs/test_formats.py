"""The Format interface without FUSE: detection, prepare, targets, the tree, references —
over a tiny JSON and a tiny Parquet set; and the seam itself (who may know formats)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from support.refsets import RefSet, tiny_json, tiny_parquet

import refmount
from refmount.cli.tools import expand, inspect
from refmount.config import MountConfig
from refmount.refs import (
    FORMATS,
    IndexFile,
    Ref,
    ReferenceSetError,
    detect_format,
    format_named,
    prepare_index,
)
from refmount.refs.limits import Limits
from refmount.refs.tree import Tree
from refmount.targets.policy import TargetRefused, check_targets

PACKAGE = Path(refmount.__file__).parent


@pytest.fixture
def json_set(tmp_path: Path) -> RefSet:
    return tiny_json(tmp_path / "j")


@pytest.fixture
def parquet_set(tmp_path: Path) -> RefSet:
    return tiny_parquet(tmp_path / "p", tmp_path / "data")


async def walk(tree: Tree) -> dict[str, tuple[int, Ref]]:
    """Every file reachable by listing from the root: path -> (size, reference)."""
    out: dict[str, tuple[int, Ref]] = {}
    todo = [(tree.root, "")]
    while todo:
        node, prefix = todo.pop()
        async for name, ino, is_dir, _token, size in tree.entries(node):
            child = tree.node(ino)
            assert child is not None and child.is_dir == is_dir
            assert await tree.lookup(node, name) == child
            if is_dir:
                todo.append((child, f"{prefix}{name.decode()}/"))
            else:
                assert size == await tree.size(child)
                out[prefix + name.decode()] = (size, await tree.ref(child))
    return out


def expected_size(ref: Ref) -> int:
    return ref.length


# ---- detection and the registry ----------------------------------------------------------------


def test_detect_picks_each_format(json_set: RefSet, parquet_set: RefSet) -> None:
    assert detect_format(str(json_set.source), {}).name == "json"
    assert detect_format(str(parquet_set.source), {}).name == "parquet"
    assert detect_format(str(parquet_set.source) + "/", {}).name == "parquet"
    assert detect_format(str(parquet_set.source / ".zmetadata"), {}).name == "parquet"
    # A directory without .zmetadata, or no file at all: JSON's parse says what is wrong.
    assert detect_format(str(parquet_set.source / "x"), {}).name == "json"


def test_registry_names_and_order() -> None:
    names = [f.name for f in FORMATS]
    assert len(set(names)) == len(names)
    assert names[-1] == "json"  # it claims everything: asked last
    for f in FORMATS:
        assert format_named(f.name) is f
    with pytest.raises(ValueError):
        format_named("nosuch")


def test_prepare_index_names_the_format(json_set: RefSet, parquet_set: RefSet) -> None:
    index = prepare_index(str(json_set.source), {})
    try:
        assert index.kind == "json" and index.temporary and os.path.exists(index.path)
    finally:
        os.unlink(index.path)
    pq_index = prepare_index(str(parquet_set.source), {})
    assert pq_index == IndexFile("", temporary=False, reused=False, kind="parquet")


def test_missing_source_is_a_reference_set_error(tmp_path: Path) -> None:
    with pytest.raises(ReferenceSetError, match="no such file"):
        prepare_index(str(tmp_path / "nothing.json"), {})


# ---- JSON -------------------------------------------------------------------------------------


def test_json_persisted_index_is_reused(json_set: RefSet, tmp_path: Path) -> None:
    fmt = format_named("json")
    first = fmt.prepare(str(json_set.source), {}, cache_dir=str(tmp_path / "cache"))
    assert not first.temporary and not first.reused
    assert first.path.startswith(str(tmp_path / "cache" / "index"))
    again = fmt.prepare(str(json_set.source), {}, cache_dir=str(tmp_path / "cache"))
    assert again.reused and again.path == first.path
    # Other limits are another identity: the set is checked again under them.
    other = fmt.prepare(str(json_set.source), {}, cache_dir=str(tmp_path / "cache"),
                        limits=Limits(max_inline=1 << 10))
    assert not other.reused and other.path != first.path


def test_json_sets_time_stamp_is_sources_in_every_index(json_set: RefSet, tmp_path: Path) -> None:
    # Two servers of one SOURCE (replicas, each with its own cache directory, indexing at
    # different times) give the same time stamp, hence the same entity tags.
    fmt = format_named("json")
    source = str(json_set.source)
    stamps = []
    for cache in ("a", "b"):
        index = fmt.prepare(source, {}, cache_dir=str(tmp_path / cache))
        os.utime(index.path, ns=(1, len(stamps) + 1))  # indexed at other times
        stamps.append(fmt.open_tree(index, source, {}).mtime_ns)
    assert stamps[0] == stamps[1]
    assert abs(stamps[0] - os.stat(source).st_mtime_ns) < 1000  # SOURCE's (fsspec: float seconds)


def test_json_limits_reach_the_parse(json_set: RefSet) -> None:
    with pytest.raises(ReferenceSetError, match="max_inline"):
        format_named("json").prepare(str(json_set.source), {}, limits=Limits(max_inline=8))


def test_json_targets_metadata_tree_and_references(json_set: RefSet) -> None:
    fmt = format_named("json")
    source = str(json_set.source)
    index = fmt.prepare(source, {})
    try:
        targets = dict(fmt.targets(index))
        assert set(targets) == json_set.targets
        for url, key_of in targets.items():
            key = key_of()
            assert json_set.refs[key].url == url
        assert len(fmt.metadata(index, source, {})) == len(json_set.refs)
        opened = fmt.open_tree(index, source, {})
        assert not os.path.exists(index.path)  # a temporary index is unlinked once mapped
    finally:
        if os.path.exists(index.path):
            os.unlink(index.path)
    assert opened.info["targets"] == str(len(json_set.targets))
    assert len(opened.tree) == len(json_set.refs)
    files = trio.run(walk, opened.tree)
    assert {k: r for k, (_, r) in files.items()} == json_set.refs
    assert all(size == expected_size(json_set.refs[k]) for k, (size, _) in files.items())
    quirks: dict[str, int] = {}
    assert dict(fmt.references(source, {}, quirks)) == json_set.refs
    assert quirks == {}


def test_json_quirks_are_reported(tmp_path: Path) -> None:
    source = tmp_path / "q.json"
    source.write_text('{"/a": "x", "b": NaN}'.replace('NaN', '"y"'))
    quirks: dict[str, int] = {}
    pairs = dict(format_named("json").references(str(source), {}, quirks))
    assert set(pairs) == {"a", "b"}
    assert quirks == {"keys had a leading '/'": 1}


def test_check_targets_refuses_a_target_outside_the_allowed_directories(json_set: RefSet,
                                                                      tmp_path: Path) -> None:
    fmt = format_named("json")
    index = fmt.prepare(str(json_set.source), {})
    try:
        allowed = MountConfig(source=str(json_set.source), mountpoint=str(tmp_path))
        check_targets(allowed, fmt.targets(index))
        confined = MountConfig(source=str(json_set.source), mountpoint=str(tmp_path),
                               allow_local=[str(tmp_path / "elsewhere")])
        with pytest.raises(TargetRefused, match=r"key '(a/1|deep/er/c|w)'"):
            check_targets(confined, fmt.targets(index))
    finally:
        os.unlink(index.path)


# ---- Parquet ----------------------------------------------------------------------------------


def test_parquet_targets_metadata_tree_and_references(parquet_set: RefSet) -> None:
    fmt = format_named("parquet")
    source = str(parquet_set.source)
    index = fmt.prepare(source, {})
    assert list(fmt.targets(index)) == []  # read lazily: checked at read time
    meta = fmt.metadata(index, source, {})
    assert {meta.key(i).decode() for i in range(meta.n)} == {
        k for k in parquet_set.refs if k.rpartition("/")[2].startswith(".")}
    opened = fmt.open_tree(index, source, {}, limits=Limits(max_inline=1 << 20))
    assert opened.info == {"record_size": "2", "arrays": "2"}
    assert opened.metadata.n == meta.n
    files = trio.run(walk, opened.tree)
    assert {k: r for k, (_, r) in files.items()} == parquet_set.refs
    assert all(size == expected_size(parquet_set.refs[k]) for k, (size, _) in files.items())
    assert not parquet_set.absent & set(files)
    assert dict(fmt.references(source, {})) == parquet_set.refs


def test_parquet_limits_reach_the_tree(parquet_set: RefSet) -> None:
    fmt = format_named("parquet")
    source = str(parquet_set.source)
    with pytest.raises(ReferenceSetError, match="max_inline"):
        fmt.prepare(source, {}, limits=Limits(max_inline=100))  # .zarray values are longer
    opened = fmt.open_tree(fmt.prepare(source, {}), source, {}, limits=Limits(max_inline=1000))
    assert opened.tree.records.max_inline == 1000  # type: ignore[attr-defined]


def test_parquet_tree_asks_the_policy_which_paths_are_relative(parquet_set: RefSet) -> None:
    asked: list[str] = []
    fmt = format_named("parquet")
    source = str(parquet_set.source)
    opened = fmt.open_tree(fmt.prepare(source, {}), source, {},
                           relative=lambda url: asked.append(url) or False)
    trio.run(walk, opened.tree)
    assert set(asked) == parquet_set.targets


# ---- the tools, through the interface --------------------------------------------------------


@pytest.mark.parametrize("which", ["json", "parquet"])
def test_expand_and_inspect_read_either_format(which: str, tmp_path: Path) -> None:
    s = tiny_json(tmp_path / "j") if which == "json" else tiny_parquet(tmp_path / "p", tmp_path / "d")
    out = tmp_path / "expanded.json"
    with open(out, "w") as f:
        assert expand(str(s.source), f, {}) == len(s.refs)
    again = format_named("json").references(str(out), {})
    assert dict(again) == s.refs
    info = inspect(str(s.source), {})
    assert info["format"] == which and info["keys"] == len(s.refs)
    assert info["targets"] == len(s.targets)


# ---- the seam ---------------------------------------------------------------------------------


def test_refs_package_does_not_import_the_mount_configuration() -> None:
    code = "import sys, refmount.refs; sys.exit('refmount.config' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def _imports(path: Path) -> set[str]:
    """Modules a file imports, as absolute names."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = f"{base}.{node.module}" if node.module and base else (node.module or base)
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)
    return names


def test_nothing_outside_refs_imports_a_format_module() -> None:
    """Formats are reached through the registry: the tree, the daemon, the policy and the
    tools see ``refmount.refs`` (Format, KeyIndex, Ref) and never one format's module."""
    private = {"refmount.refs.jsonrefs", "refmount.refs.parquet", "refmount.refs.parquetset",
               "refmount.refs.chunktree", "refmount.refs.v1", "refmount.refs.v1templates",
               "refmount.refs.v1columns", "refmount.refs.v1gen", "refmount.refs.jsonparse"}
    offenders = {}
    for path in PACKAGE.glob("*.py"):
        hits = {m for m in _imports(path) if any(m == p or m.startswith(p + ".") for p in private)}
        if hits:
            offenders[path.name] = sorted(hits)
    assert offenders == {}


def test_version_0_wrapped_in_refs_is_a_version_0_set(tmp_path: Path) -> None:
    """``{"version": 0, "refs": {...}}``: the README's Version 0, as some writers wrap it."""
    src = tmp_path / "v0.json"
    src.write_text('{"version": 0, "refs": {".zgroup": "{\\"zarr_format\\": 2}", "a": "xyz"}}')
    info = inspect(str(src), {})
    assert info["keys"] == 2 and info["inline_bytes"] == len('{"zarr_format": 2}') + 3
    src.write_text('{"version": 0, "templates": {"u": "x"}, "refs": {"a": "b"}}')
    with pytest.raises(ReferenceSetError, match="version 0 has no 'templates' or 'gen'"):
        inspect(str(src), {})
    src.write_text('{"version": 2, "refs": {}}')
    with pytest.raises(ReferenceSetError, match="unsupported reference set version 2"):
        inspect(str(src), {})


@pytest.mark.parametrize("doc", ['{"zarr_format": 2}',
                                 '{"shape": [2], "zarr_format": 2}',  # a .zarray: its second key
                                 '{"metadata": {".zgroup": {}}, "zarr_consolidated_format": 1}',
                                 '{"attributes": {}, "node_type": "group", "zarr_format": 3}'])
def test_zarr_metadata_given_as_source_is_not_a_reference_set(tmp_path: Path, doc: str) -> None:
    src = tmp_path / "meta.json"
    src.write_text(doc)
    with pytest.raises(ReferenceSetError, match="not a reference set: a zarr metadata document"):
        inspect(str(src), {})
