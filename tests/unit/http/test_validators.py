"""refmount.http.validators: entity tags without fetching, If-None-Match and If-Modified-Since."""

from __future__ import annotations

import re
from email.utils import formatdate

from hypothesis import given
from hypothesis import strategies as st

from refmount.http.validators import (
    etag_for,
    is_not_modified,
    last_modified,
    not_modified,
    not_modified_since,
    ref_parts,
)
from refmount.refs import Ref, RefKind

MTIME_NS = 1_790_000_000_123_456_789
MTIME = MTIME_NS / 1e9
URL = "https://user:secret@example.org/data.nc?token=abc"


def tag(ref: Ref, *, identity: str = "set-1", mtime_ns: int = MTIME_NS, decoded: bool = False,
        size: int = 100) -> str:
    return etag_for(ref_parts(ref, set_identity=identity, mtime_ns=mtime_ns, decoded=decoded, size=size))


def test_etag_is_strong_quoted_hex_and_stable() -> None:
    ref = Ref(RefKind.RANGE, URL, 10, 100)
    etag = tag(ref)
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
    assert tag(Ref(RefKind.RANGE, URL, 10, 100)) == etag
    assert "secret" not in etag and "token" not in etag


def test_etag_changes_with_what_identifies_the_bytes() -> None:
    ref = Ref(RefKind.RANGE, URL, 10, 100)
    variants = {
        tag(ref),
        tag(Ref(RefKind.RANGE, URL, 11, 100)),
        tag(Ref(RefKind.RANGE, URL, 10, 101)),
        tag(Ref(RefKind.RANGE, URL + "x", 10, 100)),
        tag(Ref(RefKind.WHOLE, URL)),
        tag(ref, identity="set-2"),
        tag(ref, mtime_ns=MTIME_NS + 1),
        tag(ref, decoded=True),
        tag(ref, size=99),
        tag(Ref(RefKind.INLINE, None, 0, 3, b"abc"), size=3),
        tag(Ref(RefKind.INLINE, None, 0, 3, b"abd"), size=3),
    }
    assert len(variants) == 11


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_inline_tags_differ_when_bytes_differ(a: bytes, b: bytes) -> None:
    ta = tag(Ref(RefKind.INLINE, None, 0, len(a), a), size=len(a))
    tb = tag(Ref(RefKind.INLINE, None, 0, len(b), b), size=len(b))
    assert (ta == tb) == (a == b)


@given(st.text(max_size=20), st.text(max_size=20))
def test_parts_are_unambiguous(u: str, v: str) -> None:
    # A URL and an identity cannot trade characters and give the same parts.
    p1 = ref_parts(Ref(RefKind.WHOLE, u), set_identity=v, mtime_ns=0, decoded=False, size=0)
    p2 = ref_parts(Ref(RefKind.WHOLE, u + v), set_identity="", mtime_ns=0, decoded=False, size=0)
    assert (p1 == p2) == (v == "")


def test_if_none_match() -> None:
    etag = '"0123abcd"'
    assert not not_modified(None, etag)
    assert not_modified('"0123abcd"', etag)
    assert not_modified('W/"0123abcd"', etag)  # weak comparison
    assert not_modified('"x", "0123abcd"', etag)
    assert not_modified('"x",W/"0123abcd" , "y"', etag)
    assert not_modified(' , "x", , "0123abcd",', etag)  # empty list elements
    assert not_modified("*", etag)
    assert not_modified('"0123abcd"', 'W/"0123abcd"')
    assert not not_modified('"0123abcde"', etag)
    assert not not_modified("0123abcd", etag)  # unquoted: malformed
    assert not not_modified('"x" "0123abcd"', etag)  # no comma: malformed
    assert not not_modified('"a,b"', '"a"')
    assert not_modified('"a,b", "c"', '"a,b"')  # a comma inside a tag
    assert not not_modified("", etag)


def test_if_modified_since() -> None:
    assert last_modified(MTIME) == formatdate(int(MTIME), usegmt=True)
    assert last_modified(0) == "Thu, 01 Jan 1970 00:00:00 GMT"
    same = last_modified(MTIME)
    assert not_modified_since(same, MTIME)
    assert not_modified_since(last_modified(MTIME + 3600), MTIME)
    assert not not_modified_since(last_modified(MTIME - 1), MTIME)
    assert not not_modified_since(None, MTIME)
    assert not not_modified_since("yesterday", MTIME)
    assert not not_modified_since("Thu, 01 Jan 1970 00:00:00", MTIME)  # no zone
    assert not_modified_since("Sunday, 06-Nov-94 08:49:37 GMT", 784111777)  # RFC 850 form


def test_precedence() -> None:
    etag = '"e"'
    date = last_modified(MTIME)
    old = last_modified(MTIME - 10)
    kw = {"etag": etag, "mtime": MTIME}
    assert is_not_modified("GET", if_none_match='"e"', if_modified_since=None, **kw)
    assert is_not_modified("HEAD", if_none_match=None, if_modified_since=date, **kw)
    # If-None-Match present: If-Modified-Since is ignored, both ways.
    assert not is_not_modified("GET", if_none_match='"f"', if_modified_since=date, **kw)
    assert is_not_modified("GET", if_none_match='"e"', if_modified_since=old, **kw)
    assert not is_not_modified("POST", if_none_match='"e"', if_modified_since=None, **kw)
    assert not is_not_modified("GET", if_none_match=None, if_modified_since=None, **kw)


etagc = st.text(alphabet=st.characters(min_codepoint=0x23, max_codepoint=0x7E), max_size=12)


@given(st.lists(etagc, max_size=5), etagc, st.booleans(), st.sampled_from([",", ", ", " ,\t", ",,"]))
def test_if_none_match_lists(others: list[str], mine: str, weak: bool, sep: str) -> None:
    etag = f'"{mine}"'
    listed = [f'"{o}"' for o in others]
    header = sep.join([*listed, ('W/' if weak else '') + etag])
    assert not_modified(header, etag)
    assert not_modified(sep.join(listed), etag) == (etag in listed)


@given(st.text(max_size=60))
def test_any_header_is_answered(header: str) -> None:
    assert not_modified(header, '"abc"') in (True, False)
    assert not_modified_since(header, MTIME) in (True, False)
