"""S3 listing pages walked from a tree (``http/s3listing.py``), without a server: every page
boundary, continuation, start-after and delimiter case against S3's semantics computed from
the sorted keys, for a ``KeyTree`` seeking by binary search and for the same tree walked as an
unsorted one (skipping instead)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.http.s3listing import BadToken, Cursor, decode_token, encode_token, list_page
from refmount.http.s3xml import ListItem
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.tree import KeyTree

KEYS = [
    "a!",
    "a.b",
    "a/b",
    "a/c/d",
    "a/c/e",
    "a/c0",
    "a0",
    "b/x/y/z",
    "b/x_1",
    "b/x_2",
    "b_1",
    "c",
    ".zattrs",
    "d/e_f/g",
    "d/e_f/h",
    "d/e_g",
]


def tree_of(keys: list[str]) -> KeyTree:
    b = IndexBuilder()
    for k in keys:
        b.add_inline(k, k.encode())
    return KeyTree(KeyIndex(b.finish()))


class Unsorted:
    """A KeyTree asked only through the ``Tree`` protocol (as a Parquet or decoded tree is)."""

    def __init__(self, inner: KeyTree) -> None:
        self.inner = inner
        self.root = inner.root

    def node(self, ino):
        return self.inner.node(ino)

    async def lookup(self, parent, name):
        return await self.inner.lookup(parent, name)

    def entries(self, parent, start=0):
        return self.inner.entries(parent, start)


def expected(keys: list[str], prefix: str, delimiter: str | None, after: str | None) -> list[str]:
    """S3's answer: keys and common prefixes (as ``P:prefix``) in byte order."""
    out: list[str] = []
    for k in sorted(keys, key=str.encode):
        if not k.startswith(prefix):
            continue
        rest = k[len(prefix) :]
        if delimiter and delimiter in rest:
            cp = prefix + rest[: rest.index(delimiter) + len(delimiter)]
            if ("P:" + cp) not in out and (after is None or cp > after):
                out.append("P:" + cp)
            continue
        if after is None or k > after:
            out.append(k)
    return out


async def describe(node, key: bytes, size: int) -> ListItem:
    return ListItem(key, size, '"x"')


def all_pages(
    tree, prefix: str, delimiter: str | None, max_keys: int, after: str | None = None, sorted_tree=None
) -> tuple[list[str], int]:
    async def run() -> tuple[list[str], int]:
        got: list[str] = []
        cursor = None
        pages = 0
        scope = b"scope"
        while True:
            page = await list_page(
                tree,
                prefix=prefix.encode(),
                delimiter=delimiter.encode() if delimiter else None,
                max_keys=max_keys,
                describe=describe,
                cursor=cursor,
                after=after.encode() if after is not None and cursor is None else None,
                sorted_tree=sorted_tree,
            )
            pages += 1
            assert len(page.items) + len(page.prefixes) <= max_keys
            # keys and prefixes of one page interleave in byte order; S3 lists them apart
            got += sorted(
                [i.key.decode() for i in page.items] + ["P:" + p.decode() for p in page.prefixes],
                key=lambda s: s.removeprefix("P:").encode(),
            )
            if not page.truncated:
                return got, pages
            assert pages < 1000
            cursor = decode_token(encode_token(page.cursor, scope), scope)

    return trio.run(run)


CASES = [
    ("", None),
    ("", "/"),
    ("a", "/"),
    ("a/", "/"),
    ("a/c", "/"),
    ("a/c/", None),
    ("b", "_"),
    ("", "_"),
    ("d/", "_"),
    ("d/e", "_f/"),
    ("zz", None),
    ("a/b/", None),
    ("", "/c"),
    ("b/x", "/"),
]


@pytest.mark.parametrize(("prefix", "delimiter"), CASES)
@pytest.mark.parametrize("max_keys", [1, 2, 3, 1000])
@pytest.mark.parametrize("kind", ["sorted", "walked"])
def test_every_page_boundary_gives_s3s_listing(prefix, delimiter, max_keys, kind):
    t = tree_of(KEYS)
    tree, sorted_tree = (t, t) if kind == "sorted" else (Unsorted(t), None)
    got, pages = all_pages(tree, prefix, delimiter, max_keys, sorted_tree=sorted_tree)
    want = expected(KEYS, prefix, delimiter, None)
    assert got == want
    assert pages == max(1, -(-len(want) // max_keys)) or max_keys == 1000


@pytest.mark.parametrize("after", ["", "a", "a/", "a/c", "a/c/d", "a/c/zz", "a0", "b/x_1", "c", "zzz", "#"])
@pytest.mark.parametrize(("prefix", "delimiter"), [("", None), ("", "/"), ("a/", "/"), ("b", "_")])
@pytest.mark.parametrize("kind", ["sorted", "walked"])
def test_start_after(after, prefix, delimiter, kind):
    t = tree_of(KEYS)
    tree, sorted_tree = (t, t) if kind == "sorted" else (Unsorted(t), None)
    got, _ = all_pages(tree, prefix, delimiter, 2, after=after, sorted_tree=sorted_tree)
    want = expected(KEYS, prefix, delimiter, after if after >= prefix else None)
    assert got == want


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(
        st.text("ab/_.", min_size=1, max_size=6).filter(
            lambda k: (
                "//" not in k
                and not k.startswith("/")
                and not k.endswith("/")
                and all(p not in (".", "..") for p in k.split("/"))
            )
        ),
        min_size=1,
        max_size=25,
        unique=True,
    ),
    prefix=st.text("ab/_", max_size=3),
    delimiter=st.sampled_from([None, "/", "_", "b/"]),
    max_keys=st.integers(1, 4),
)
def test_any_keys_any_listing(keys, prefix, delimiter, max_keys):
    # a key that is also a directory of others is not a tree
    keys = [k for k in keys if not any(o.startswith(k + "/") for o in keys)]
    t = tree_of(keys)
    for tree, sorted_tree in ((t, t), (Unsorted(t), None)):
        got, _ = all_pages(tree, prefix, delimiter, max_keys, sorted_tree=sorted_tree)
        assert got == expected(keys, prefix, delimiter, None)


def test_an_extra_item_is_listed_at_the_root_once_in_byte_order():
    t = tree_of([".a", "a", "b"])
    extra = ListItem(b".zmetadata", 3, '"z"')
    got: list[bytes] = []
    cursor: Cursor | None = None
    while True:
        page = trio.run(
            lambda: list_page(
                t,
                prefix=b"",
                delimiter=None,
                max_keys=1,
                describe=describe,
                cursor=cursor,  # noqa: B023 (called at once)
                sorted_tree=t,
                extra=extra,
            )
        )
        got += [i.key for i in page.items]
        if not page.truncated:
            break
        cursor = page.cursor
    assert got == [b".a", b".zmetadata", b"a", b"b"]


def test_tokens_of_another_listing_or_forged_are_refused():
    token = encode_token(Cursor([3, 5]), b"one")
    assert decode_token(token, b"one").tokens == [3, 5]
    for bad, scope in ((token, b"two"), ("!!", b"one"), ("e30=", b"one"), ("x" * 9000, b"one")):
        with pytest.raises(BadToken):
            decode_token(bad, scope)


def test_keys_xml_cannot_carry_are_listed_only_url_encoded():
    t = tree_of(["a\x01b", "ok"])
    for url, want in ((False, [b"ok"]), (True, [b"a\x01b", b"ok"])):
        page = trio.run(
            lambda: list_page(
                t, prefix=b"", delimiter=None, max_keys=10, describe=describe, sorted_tree=t,
                url=url,  # noqa: B023 (called at once)
            )
        )
        assert [i.key for i in page.items] == want
