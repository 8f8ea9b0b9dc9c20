"""KeyTree's computed inode numbers and resume tokens, over random key sets (no FUSE)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.tree import ROOT_INODE, KeyTree

NAME = st.text(alphabet="ab0.-_/z", min_size=1, max_size=6).filter(
    lambda s: all(p not in ("", ".", "..") for p in s.split("/")))


def tree_of(raw: set[str]) -> KeyTree | None:
    dirs = {k[:i] for k in raw for i, c in enumerate(k) if c == "/"}
    keys = {k for k in raw if k not in dirs}
    if not keys:
        return None
    b = IndexBuilder()
    b.add_items((k, k) for k in keys)
    return KeyTree(KeyIndex(b.finish()))


@settings(max_examples=100, deadline=None)
@given(st.sets(NAME, min_size=1, max_size=30))
def test_every_prefix_of_every_key_has_one_inode_that_decodes_back(raw: set[str]) -> None:
    tree = tree_of(raw)
    if tree is None:
        return
    index = tree.index
    seen: dict[int, bytes] = {ROOT_INODE: b""}
    for i in range(index.n):
        key = index.key(i)
        parts = key.split(b"/")
        node = tree.node(tree.file_ino(i))
        assert node is not None and not node.is_dir and node.index == i and node.depth == len(parts)
        assert seen.setdefault(node.ino, key) == key
        # Walk up: each ancestor is a directory whose inode names its first key and depth.
        depth = len(parts) - 1
        while node.depth > 1:
            node = tree.parent(node)
            assert node.is_dir and node.depth == depth
            prefix = b"/".join(parts[:depth])
            assert tree.path(node) == prefix
            assert index.key(node.index).startswith(prefix + b"/")
            assert node.index == 0 or not index.key(node.index - 1).startswith(prefix + b"/")
            assert tree.node(node.ino) == node
            assert seen.setdefault(node.ino, prefix) == prefix  # one inode, one path
            depth -= 1
        assert tree.parent(node) == tree.root
    # A directory inode deeper than its key's own directories does not exist.
    for i in range(index.n):
        assert tree.node(tree.dir_ino(i, index.key(i).count(b"/") + 1)) is None
    assert tree.node(tree.file_ino(index.n)) is None


@settings(max_examples=100, deadline=None)
@given(st.sets(NAME, min_size=1, max_size=30), st.data())
def test_readdir_resumes_after_any_token(raw: set[str], data: st.DataObject) -> None:
    tree = tree_of(raw)
    if tree is None:
        return
    todo = [tree.root]
    while todo:
        node = todo.pop()
        listed = list(tree.children(node))
        names = [e[0] for e in listed]
        assert len(names) == len(set(names))  # one entry per name
        todo.extend(tree.node(e[1]) for e in listed if e[2])  # type: ignore[misc]
        if listed:
            i = data.draw(st.integers(0, len(listed) - 1))
            assert list(tree.children(node, listed[i][3])) == listed[i + 1 :]
