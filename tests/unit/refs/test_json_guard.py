"""The JSON guard without FUSE: chunking that keeps yajl linear, the nesting and token-length
scan (compared with the real depth of random documents cut at random places), and the
decompression-ratio guard."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import zlib

import ijson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.refs import ReferenceSetError, build_index
from refmount.refs.limits import CHUNK, JsonReader, Limits, _Scanner
from refmount.refs.source import Inflating

LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet='ab"\\[]{}\n ,:é',
                                                                  max_size=12))
DOCS = st.recursive(LEAF, lambda c: st.lists(c, max_size=4) | st.dictionaries(
    st.text(alphabet='k"\\[{', max_size=4), c, max_size=4), max_leaves=40)


def depth(v: object) -> int:
    if isinstance(v, list):
        return 1 + max((depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((depth(x) for x in v.values()), default=0)
    return 0


class Pieces(io.RawIOBase):
    """A stream returning the document in the given pieces (short reads, as a pipe does)."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
        self.parts = [data[a:b] for a, b in itertools.pairwise(bounds)]

    def read(self, n: int = -1) -> bytes:
        return self.parts.pop(0) if self.parts else b""


@settings(max_examples=300, deadline=None)
@given(DOCS, st.lists(st.integers(0, 10**6), max_size=8), st.booleans())
def test_scanner_depth_is_the_documents_depth(doc, cuts, ascii_only):
    data = json.dumps(doc, ensure_ascii=ascii_only).encode()
    real = depth(doc)
    scanner = _Scanner("doc", Limits(max_nesting=10**6))
    for part in Pieces(data, cuts).parts:
        scanner.scan(part)
    assert scanner.depth == 0 and not scanner.in_string
    if real:
        ok = _Scanner("doc", Limits(max_nesting=real))
        low = _Scanner("doc", Limits(max_nesting=real - 1))
        for part in Pieces(data, cuts).parts:
            ok.scan(part)  # never refused at exactly its depth
        with pytest.raises(ReferenceSetError, match="max_nesting"):
            for part in Pieces(data, cuts).parts:
                low.scan(part)


@settings(max_examples=100, deadline=None)
@given(DOCS, st.lists(st.integers(0, 10**6), max_size=8))
def test_reader_hands_ijson_the_same_document(doc, cuts):
    data = json.dumps({"k": doc}).encode()
    reader = JsonReader(Pieces(data, cuts), "doc", Limits())
    assert list(ijson.items(reader, "k")) == [doc]


def test_chunks_double_while_a_token_goes_on_and_reset_after():
    body = b'{"a": "' + b"x" * (40 * CHUNK) + b'", "b": [1, 2], "c": "y"}'
    reader = JsonReader(io.BytesIO(body), "doc", Limits())
    sizes = []
    while data := reader.read(CHUNK):
        sizes.append(len(data))
    assert sizes[:5] == [CHUNK, CHUNK, 2 * CHUNK, 4 * CHUNK, 8 * CHUNK]  # the 1st holds a quote
    assert len(sizes) < 10 and sum(sizes) == len(body)


def test_escaped_quotes_and_backslashes_across_chunk_boundaries():
    for pad in range(6):
        text = "p" * (CHUNK - 3 - pad) + '\\\\\\"[' * 3 + "]\\\\"
        data = json.dumps({"k": text}).encode()
        reader = JsonReader(io.BytesIO(data), "doc", Limits(max_nesting=1))
        assert dict(ijson.kvitems(reader, "")) == {"k": text}


def test_token_limit_refuses_while_streaming():
    limits = Limits(max_inline=1 << 10)
    data = b'{"k": "' + b"z" * (3 * limits.max_token) + b'"}'  # chunks double: one ends inside
    with pytest.raises(ReferenceSetError, match="max_inline=1K"):
        for _ in ijson.kvitems(JsonReader(io.BytesIO(data), "doc", limits), ""):
            pass


def test_gzip_bomb_is_refused_after_the_floor(tmp_path):
    src = tmp_path / "bomb.json.gz"
    member = gzip.compress(b"a" * (16 << 20), 1)
    src.write_bytes(gzip.compress(b'{"k": "', 1) + member * 16 + gzip.compress(b'"}', 1))
    with pytest.raises(ReferenceSetError, match=r"max_ratio=200") as info:
        build_index(str(src), {})
    assert "times its compressed size" in str(info.value)


def test_max_source_bounds_a_plain_source_while_it_streams(tmp_path):
    src = tmp_path / "big.json"
    src.write_text(json.dumps({f"k{i}": "x" * 100 for i in range(30_000)}))  # ~3.4 MB
    with pytest.raises(ReferenceSetError, match=r"max_source=1M"):
        build_index(str(src), {}, limits=Limits(max_source=1 << 20))
    assert len(build_index(str(src), {}, limits=Limits(max_source=4 << 20)).finish()) == 30_000
    assert len(build_index(str(src), {}, limits=Limits(max_source=0)).finish()) == 30_000


def test_max_source_counts_decompressed_bytes(tmp_path):
    src = tmp_path / "big.json.gz"
    src.write_bytes(gzip.compress(json.dumps({f"k{i}": "x" * 100 for i in range(30_000)}).encode()))
    assert src.stat().st_size < 1 << 20
    with pytest.raises(ReferenceSetError, match=r"max_source=2M"):
        build_index(str(src), {}, limits=Limits(max_source=2 << 20))


@pytest.mark.parametrize("wrap", ["zlib", "raw"])
def test_http_deflate_inflates_in_bounded_reads(wrap):
    data = json.dumps({f"k{i}": i for i in range(50_000)}).encode()
    packed = zlib.compress(data, 9)
    if wrap == "raw":  # servers that send raw deflate for "deflate"
        packed = packed[2:-4]
    stream = Inflating(io.BytesIO(packed))
    out = []
    while piece := stream.read(1000):
        assert len(piece) <= 1000
        out.append(piece)
    assert b"".join(out) == data
    assert Inflating(io.BytesIO(packed)).read() == data
