"""IndexBuilder and KeyIndex without FUSE: what goes in comes out sorted, unique (last value
wins), validated, and the same through an index file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.refs import Ref, ReferenceSetError, RefKind
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.indexfiles import summary_metadata, write_index
from refmount.refs.keyrules import keys_that_are_directories
from refmount.refs.limits import Limits

KEY = st.text(alphabet="ab0/", min_size=1, max_size=5).filter(
    lambda s: all(p not in ("", ".", "..") for p in s.split("/")))
VALUE = st.one_of(
    st.text(alphabet="xyz", max_size=4),
    st.builds(lambda u, o, n: [u, o, n], st.sampled_from(["s3://b/1", "/f/2"]),
              st.integers(0, 2**40), st.integers(0, 2**20)),
    st.builds(lambda u: [u], st.sampled_from(["s3://b/1", "http://h/3"])),
)


def as_ref(value: object) -> Ref:
    if isinstance(value, str):
        return Ref(RefKind.INLINE, None, 0, len(value.encode()), value.encode())
    assert isinstance(value, list)
    if len(value) == 1:
        return Ref(RefKind.WHOLE, value[0], 0, -1)
    return Ref(RefKind.RANGE, value[0], value[1], value[2])


def without_dirs(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    keys = {k for k, _ in pairs}
    dirs = {k[:i] for k in keys for i, c in enumerate(k) if c == "/"}
    return [(k, v) for k, v in pairs if k not in dirs]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(KEY, VALUE), max_size=30), st.booleans())
def test_keys_come_out_sorted_unique_last_wins(pairs: list[tuple[str, object]], one_by_one: bool
                                               ) -> None:
    pairs = without_dirs(pairs)
    b = IndexBuilder()
    if one_by_one:
        for k, v in pairs:
            b.add_value(k, v)
    else:
        b.add_items(pairs)
    index = KeyIndex(b.finish())
    expected = dict(pairs)  # a JSON object: the last value of a key wins
    keys = [index.key(i) for i in range(index.n)]
    assert keys == sorted(k.encode() for k in expected)
    assert {k.decode(): r for k, r in index.iter_refs()} == {k: as_ref(v) for k, v in expected.items()}
    for i, k in enumerate(keys):
        assert index.bisect(k) == i
        assert index.size(i) == as_ref(expected[k.decode()]).length
    assert set(index.urls()) == {v[0] for v in expected.values() if isinstance(v, list)}


def test_round_trip_through_an_index_file(tmp_path: Path) -> None:
    b = IndexBuilder()
    b.add_items([("b", ["s3://x/y", 5, 6]), ("a/.zarray", "{}"), ("c", ["s3://x/z"])])
    table = b.finish()
    meta = summary_metadata(table)
    assert meta == {"keys": "3", "targets": "2", "referenced_bytes": "6", "inline_bytes": "2"}
    write_index(table, str(tmp_path / "i.arrow"), meta)
    index = KeyIndex.open(str(tmp_path / "i.arrow"))
    assert index.metadata["keys"] == "3"
    assert dict(index.iter_refs()) == dict(KeyIndex(table).iter_refs())
    assert index.key(index.first_with_url("s3://x/z")) == b"c"
    view = index.ref(0, view=True)
    assert isinstance(view.data, memoryview) and bytes(view.data) == b"{}"


def test_leading_slash_is_the_root_and_counted() -> None:
    b = IndexBuilder()
    b.add_items([("/a/b", "1"), ("c", "2")])
    index = KeyIndex(b.finish())
    assert [index.key(i) for i in range(index.n)] == [b"a/b", b"c"]
    assert b.quirks["keys had a leading '/'"] == 1
    clash = IndexBuilder()
    clash.add_items([("/a", "1"), ("a", "2")])
    with pytest.raises(ReferenceSetError, match="are the same path"):
        clash.finish()


@pytest.mark.parametrize(("key", "why"), [
    ("a//b", "empty, '.' or '..'"), ("a/../b", "empty, '.' or '..'"), ("", "is empty"),
    ("a\x00b", "NUL"), ("x" * 256, "over 255 bytes"),
])
def test_keys_that_cannot_be_paths_are_refused_or_skipped(key: str, why: str) -> None:
    b = IndexBuilder()
    b.add_items([(key, "v"), ("ok", "w")])
    with pytest.raises(ReferenceSetError, match=why):
        b.finish()
    skip = IndexBuilder("skip")
    skip.add_items([(key, "v"), ("ok", "w")])
    index = KeyIndex(skip.finish())
    assert [index.key(i) for i in range(index.n)] == [b"ok"] and skip.skipped == [key]


def test_a_key_that_is_also_a_directory_is_refused() -> None:
    b = IndexBuilder()
    b.add_items([("a", "1"), ("a/b", "2")])
    with pytest.raises(ReferenceSetError, match="both a file and a directory"):
        b.finish()


# Bytes on both sides of '/' (0x2F) in byte order, so that keys under "a/" are not always
# next to "a": "a", "a-1", "a.b", "a/c", "a0".
NEAR_SLASH = st.text(alphabet="a.-!/0\x01é", min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(NEAR_SLASH, max_size=25, unique=True))
def test_keys_that_are_directories_match_the_prefixes_of_the_keys(keys: list[str]) -> None:
    raw = sorted(k.encode() for k in keys)
    prefixes = {k[:i] for k in raw for i, c in enumerate(k) if c == ord("/")}
    mask = keys_that_are_directories(pa.array(raw, pa.large_binary()))
    assert [k for k, m in zip(raw, mask, strict=True) if m] == [k for k in raw if k in prefixes]


DEEP_KEYS = r"""
import resource, sys
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # should the bound break badly
warm = IndexBuilder("skip")  # first use of the kernels on the same paths: not what is measured
warm.add_items([("a/b", "v"), ("a/b.x", "v"), ("a/b/c", "v"), ("c" * 300 + "/d", "v")])
warm.finish()
deep = "/".join(["a"] * 4093)
extra = sys.argv[1]
pairs = [(f"k{i}/{deep}", "v") for i in range(100)]
pairs += [(f"k{i}/{deep}{extra}", "w") for i in range(100) if extra]
b = IndexBuilder("skip")
b.add_items(pairs)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = KeyIndex(b.finish()).n
print(n, len(b.skipped), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.parametrize("extra", ["", ".x", "/b"])
def test_deep_keys_are_checked_in_memory_linear_in_their_size(extra: str) -> None:
    """100 keys of 4,094 components (820 KB): every directory prefix of every key would be
    1.6 GB. Checking them grows the peak RSS by a small multiple of the keys, with and
    without neighbours that the keys are prefixes of (".x": the sort, no clash; "/b": the
    keys are directories too, and skipped)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", DEEP_KEYS, extra], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    n, skipped, grown_kib = map(int, r.stdout.split())
    assert (n, skipped) == {"": (100, 0), ".x": (200, 0), "/b": (100, 100)}[extra]
    assert grown_kib < 64 << 10, f"peak RSS grew by {grown_kib >> 10} MiB"


def test_limits_bound_keys_and_inline_values() -> None:
    limits = Limits(max_inline=4, max_key_depth=2, max_key_length=8)
    for pairs, why in (([("k", "12345")], "max_inline"), ([("k", "base64:AAAAAAAA")], "max_inline"),
                       ([("a/b/c", "1")], "max_key_depth"), ([("abcdefghi", "1")], "max_key_length")):
        b = IndexBuilder(limits=limits)
        with pytest.raises(ReferenceSetError, match=why):
            b.add_items(pairs)
            b.finish()


@pytest.mark.parametrize("value", [[1, 2, 3], ["u", -1, 2], ["u", 1.5, 2], ["u", 1], [], None, 5,
                                   ["", 0, 1], ["u", 2**63 - 1, 1]])
def test_malformed_values_are_refused(value: object) -> None:
    b = IndexBuilder()
    with pytest.raises(ReferenceSetError, match="key 'k'"):
        b.add_items([("k", value)])
        b.finish()


def test_generated_columns_join_the_index() -> None:
    b = IndexBuilder()
    b.add_items([("m", "meta")])
    keys = pa.array(["g/0", "g/1"], pa.large_string())
    b.add_columns(keys, pa.array(["s3://a", "s3://b"]), np.array([0, 10]), np.array([10, 5]), "gen")
    b.add_columns(pa.array(["w/0"], pa.large_string()), pa.array(["s3://a"]), None, None, "gen")
    index = KeyIndex(b.finish())
    assert dict(index.iter_refs()) == {
        b"g/0": Ref(RefKind.RANGE, "s3://a", 0, 10), b"g/1": Ref(RefKind.RANGE, "s3://b", 10, 5),
        b"m": Ref(RefKind.INLINE, None, 0, 4, b"meta"), b"w/0": Ref(RefKind.WHOLE, "s3://a", 0, -1),
    }
    with pytest.raises(ReferenceSetError, match="negative"):
        b.add_columns(keys, pa.array(["s3://a", "s3://b"]), np.array([0, -1]), np.array([1, 1]), "gen")


def test_repeated_keys_are_not_held_until_the_end() -> None:
    """A set that repeats a few keys (a decompression bomb of duplicates) holds about one row
    per distinct key and batch while it is read, not one per repetition; the last value of
    each key still wins, across batches and within one."""
    n = 300_000
    b = IndexBuilder()
    b.add_items((f"k{i % 3}", [f"s3://b/{i}", i, 1]) for i in range(n))
    b.add_value("k1", "inline wins")
    assert len(b) < 70_000, len(b)  # the batch being filled, and 3 rows per batch before it
    index = KeyIndex(b.finish())
    refs = {k.decode(): r for k, r in index.iter_refs()}
    assert refs == {"k0": as_ref([f"s3://b/{n - 3}", n - 3, 1]),
                    "k1": as_ref("inline wins"),
                    "k2": as_ref([f"s3://b/{n - 1}", n - 1, 1])}


def test_repeats_within_a_batch_keep_the_last_value_in_reading_order() -> None:
    b = IndexBuilder()
    pairs = [(f"d/{i % 1000}", [f"u{i}", i, 2]) for i in range(70_000)]  # > one batch
    b.add_items(pairs)
    index = KeyIndex(b.finish())
    expected = dict(pairs)
    assert {k.decode(): r for k, r in index.iter_refs()} == {k: as_ref(v)
                                                            for k, v in expected.items()}
