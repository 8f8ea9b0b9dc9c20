"""KeyTree without FUSE: the directory tree and inode arithmetic over random key sets."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.tree import ROOT_INODE, KeyTree

NAME = st.text(alphabet="ab0.-_/z", min_size=1, max_size=4).filter(
    lambda s: all(p not in ("", ".", "..") for p in s.split("/")))


def valid(keys: set[str]) -> set[str]:
    """Drop keys that are also a directory of another key (the index refuses those)."""
    dirs = {k[:i] for k in keys for i, c in enumerate(k) if c == "/"}
    return {k for k in keys if k not in dirs}


def tree_of(keys: set[str]) -> KeyTree:
    b = IndexBuilder()
    b.add_items((k, f"v:{k}") for k in sorted(keys))
    return KeyTree(KeyIndex(b.finish()))


def walk(tree: KeyTree) -> dict[str, int]:
    """Every file reachable from the root by readdir, path -> inode."""
    out: dict[str, int] = {}
    todo = [(tree.root, "")]
    while todo:
        node, path = todo.pop()
        for name, ino, is_dir, _token, _size in tree.children(node):
            child = tree.node(ino)
            assert child is not None and child.ino == ino and child.is_dir == is_dir
            assert tree.find(node, name) == child  # lookup agrees with readdir
            assert tree.parent(child).ino == node.ino
            sub = f"{path}{name.decode()}"
            if is_dir:
                todo.append((child, sub + "/"))
            else:
                out[sub] = ino
    return out


@settings(max_examples=200, deadline=None)
@given(st.sets(NAME, min_size=1, max_size=40))
def test_readdir_and_lookup_show_exactly_the_keys(raw: set[str]) -> None:
    keys = valid(raw)
    if not keys:
        return
    tree = tree_of(keys)
    files = walk(tree)
    assert set(files) == keys
    assert len(set(files.values())) == len(files)  # inodes are unique
    for path, ino in files.items():
        node = tree.node(ino)
        assert node is not None and tree.path(node) == path.encode()
        ref = asyncio.run(tree.ref(node))
        assert ref.data == f"v:{path}".encode()


@given(st.integers(min_value=0, max_value=2**40))
def test_inodes_of_unknown_numbers_are_not_found(ino: int) -> None:
    tree = tree_of({"a/b", "c"})
    node = tree.node(ino)
    if node is not None:
        assert ino == ROOT_INODE or tree.path(node) in (b"a", b"a/b", b"c")
