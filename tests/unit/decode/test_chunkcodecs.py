"""Bounded decoding of a chunk (decode/chunkcodecs.py) and the codec worker processes
(decode/codecworker.py), without FUSE: no step produces more than the chunk's metadata allows,
whatever the stored bytes; codecs off the allow-list run in a worker whose death, memory or
CPU limit is an error for that chunk only."""

from __future__ import annotations

import json
import time
import tracemalloc
import zlib

import numcodecs
import numpy as np
import pytest
from support.bombs import bomb, zstd_rle
from support.crashcodec import (
    AbortCodec,
    HogCodec,
    NoisyCodec,
    PlainCodec,
    SegvCodec,
    SpinCodec,
    codec_env,
)

from refmount.decode.chunkcodecs import ChunkCodecs
from refmount.decode.codecplan import DecodeError, plan_array
from refmount.decode.codecworker import CodecWorkers, WorkerDied, WorkerError
from refmount.decode.view import DecodedView

MiB = 1 << 20


def zarray(dtype="<f4", shape=(4,), chunks=(4,), compressor=None, filters=None) -> dict:
    return {"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype,
            "compressor": compressor, "filters": filters, "fill_value": None, "order": "C"}


@pytest.mark.parametrize("codec_id", ["zlib", "gzip", "bz2", "lzma", "zstd", "blosc", "lz4"])
@pytest.mark.parametrize("as_filter", [False, True])
def test_a_bomb_is_refused_before_its_output_exists(codec_id, as_filter):
    """A chunk declared 1 KiB that inflates to 32 MiB: refused after at most the bound plus
    one streaming piece, as the compressor or as a filter (kerchunk's HDF5 layout)."""
    cfg = {"id": codec_id}
    meta = zarray("|u1", (1024,), (1024,), **({"filters": [cfg]} if as_filter else {"compressor": cfg}))
    array, why = plan_array("b", meta)
    assert why is None and not array.isolated
    data = bomb(codec_id, 32 * MiB)
    tracemalloc.start()
    try:
        t = time.monotonic()
        with pytest.raises(DecodeError, match=f"{codec_id}.*more than 1,024 bytes"):
            array.decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MiB, peak
    assert time.monotonic() - t < 5


def test_a_bomb_behind_a_bomb_and_a_lying_zstd_header():
    """compressor zlib + filter zlib (3.4 KB -> 2 GiB in the wild); a zstd frame whose header
    declares more than the chunk; blosc and lz4 headers are believed only up to the bound."""
    meta = zarray("|u1", (1024,), (1024,), compressor={"id": "zlib"}, filters=[{"id": "zlib"}])
    array, _ = plan_array("b", meta)
    inner = bomb("zlib", 64 * MiB)
    with pytest.raises(DecodeError, match="more than 2,176 bytes"):  # the inner stream's bound
        array.decode(zlib.compress(inner))
    honest = numcodecs.Zstd().encode(bytes(8 * MiB))  # the frame header says 8 MiB
    with pytest.raises(DecodeError, match="frame header says 8,388,608"):
        plan_array("z", zarray("|u1", (1024,), (1024,), compressor={"id": "zstd"}))[0].decode(honest)
    many = zstd_rle(128 << 10) * 100  # 100 frames: read across frames, still bounded
    with pytest.raises(DecodeError, match="more than"):
        plan_array("z", zarray("|u1", (1 << 20,), (1 << 20,), compressor={"id": "zstd"}))[0].decode(many)


def test_size_changing_filters_are_bounded_before_they_run():
    """An astype filter to S100000000 (24 bytes stored -> 2.4 GB); packbits and base64; a
    compressor whose output (a filter's encoded form) would be far larger than the chunk is
    refused at planning."""
    meta = zarray("|u1", (24,), (24,), filters=[
        {"id": "astype", "encode_dtype": "|u1", "decode_dtype": "|S100000000"}])
    array, why = plan_array("a", meta)
    assert why is None
    with pytest.raises(DecodeError, match=r"astype .*more than"):
        array.decode(bytes(24))
    _, why = plan_array("a", zarray("|S1", (8,), (8,), compressor={"id": "zlib"}, filters=[
        {"id": "astype", "encode_dtype": "|S100000000", "decode_dtype": "|S1"}]))
    assert why and "max_chunk_bytes" in why
    packed = plan_array("p", zarray("|b1", (16,), (16,), filters=[{"id": "packbits"}]))[0]
    assert bytes(packed.decode(numcodecs.PackBits().encode(np.ones(16, bool)))) == b"\1" * 16
    with pytest.raises(DecodeError, match="packbits"):
        packed.decode(b"\0" + b"\xff" * 1000)
    b64 = plan_array("s", zarray("|u1", (6,), (6,), filters=[{"id": "base64"}]))[0]
    assert bytes(b64.decode(b"YWJjZGVm")) == b"abcdef"
    with pytest.raises(DecodeError, match="base64"):
        b64.decode(b"YWJj" * 1000)


def test_an_honest_huge_chunk_is_served_as_referenced():
    """chunks [2**32] of u1: a decoded chunk over max_chunk_bytes is not decoded at all."""
    meta = zarray("|u1", (2**32,), (2**32,), compressor={"id": "zlib"})
    array, why = plan_array("h", meta)
    assert array is None and "max_chunk_bytes=268,435,456" in why
    assert plan_array("h", zarray("|u1", (2**20,), (2**20,), compressor={"id": "zlib"}),
                      max_chunk_bytes=MiB)[0] is not None
    view = DecodedView({"h/.zarray": json.dumps(meta).encode()})
    assert "h" in view.skipped and view.size("h/0", 77) == 77


def test_metadata_documents_over_their_cap_are_not_parsed():
    """A .zarray over 1 MiB is not parsed (its array as referenced); a .zmetadata over 16 MiB
    is not parsed and the arrays it describes are served as referenced, as it says."""
    good = json.dumps(zarray(compressor={"id": "zlib"})).encode()
    big = json.dumps({**zarray(compressor={"id": "zlib"}), "x": [1.5] * 300_000}).encode()
    assert len(big) > MiB
    root = json.dumps({"metadata": {"a/.zarray": zarray(compressor={"id": "zlib"}),
                                    "g/c/.zarray": zarray(compressor={"id": "zlib"})}}).encode()
    view = DecodedView({".zmetadata": root, "a/.zarray": good, "b/.zarray": big,
                        "g/c/.zarray": good, "g/.zmetadata": b" " * (17 * MiB)})
    assert set(view.arrays) == {"a"}
    assert "1,048,576" in view.skipped["b"] and "g/.zmetadata" in view.skipped["g/c"]
    assert view.metadata("g/c/.zarray") is None and view.metadata("g/.zmetadata") is None
    consolidated = json.loads(view.metadata(".zmetadata"))["metadata"]  # consistent with g's
    assert consolidated["a/.zarray"]["compressor"] is None
    assert consolidated["g/c/.zarray"]["compressor"] == {"id": "zlib"}


def test_codecs_off_the_allow_list_are_isolated():
    """numcodecs' built-ins run in process; anything else (a third-party codec, even one
    registered under a built-in's id) goes to a codec worker."""
    assert not plan_array("a", zarray(compressor={"id": "zlib"}, filters=[
        {"id": "shuffle", "elementsize": 4}]))[0].isolated
    chain = ChunkCodecs(None, [PlainCodec()], np.dtype("u1"), 4)
    assert chain.isolated

    class Impostor(PlainCodec):
        codec_id = "zlib"

    assert ChunkCodecs(Impostor(), [], np.dtype("u1"), 4).isolated


@pytest.fixture
def workers(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", codec_env(tmp_path / "codecs"))
    w = CodecWorkers(memory=256 * MiB, cpu_seconds=1, timeout=60, label=str(tmp_path))
    try:
        yield w
    finally:
        w.close()


def chain(codec, nbytes=4) -> ChunkCodecs:
    return ChunkCodecs(codec, [], np.dtype("u1"), nbytes, [codec.get_config()])


def test_a_worker_that_dies_fails_that_chunk_and_the_next_gets_a_new_one(workers):
    plain = chain(PlainCodec())
    assert workers.decode(plain.spec(), b"abcd", 4) == b"abcd"
    for codec, signal_name in ((AbortCodec(), "SIGABRT"), (SegvCodec(), "SIGSEGV")):
        with pytest.raises(WorkerDied, match=signal_name):
            workers.decode(chain(codec).spec(), b"abcd", 4)
        assert workers.decode(plain.spec(), b"wxyz", 4) == b"wxyz"
    assert workers.deaths == 2 and workers.started == 3
    # a codec that writes to its stdout does not break the pipe protocol
    assert workers.decode(chain(NoisyCodec()).spec(), b"abcd", 4) == b"abcd"
    assert workers.decode(plain.spec(), b"abcd", 4) == b"abcd" and workers.started == 3


def test_worker_memory_and_cpu_are_limited(workers):
    with pytest.raises(WorkerError, match="MemoryError"):
        workers.decode(chain(HogCodec(gib=2)).spec(), b"abcd", 4)
    with pytest.raises(WorkerDied, match="SIGXCPU"):
        workers.decode(chain(SpinCodec()).spec(), b"abcd", 4)
    with pytest.raises(WorkerError, match="more than 4 bytes"):
        workers.decode(chain(PlainCodec()).spec(), b"abcde", 4)  # the worker checks the size too
    assert workers.decode(chain(PlainCodec()).spec(), b"abcd", 4) == b"abcd"


def test_bomb_inside_a_worker_chain_is_bounded_too(workers):
    """A built-in step in a chain that runs in the worker keeps its bound there (after a
    codec whose sizes are not known: the ceiling, twice max_chunk_bytes in a mount)."""
    comp = numcodecs.Zlib()
    c = ChunkCodecs(comp, [PlainCodec()], np.dtype("u1"), 1024,
                    [comp.get_config(), PlainCodec().get_config()], ceiling=2048)
    with pytest.raises(WorkerError, match=r"zlib.*more than 2,048 bytes"):
        workers.decode(c.spec(), bomb("zlib", 32 * MiB), 1024)


@pytest.mark.parametrize("checksum", ["crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3"])
def test_checksum_filters_decode_within_their_bound(checksum):
    """A checksum filter's output is its input less the 4-byte checksum: a v2 array with one
    (and a Zarr v3 ``crc32c``) decodes, and a mismatch fails naming the codec."""
    data = np.arange(256, dtype="<f4")
    filt = numcodecs.get_codec({"id": checksum})
    comp = numcodecs.Zlib(level=1)
    stored = comp.encode(filt.encode(data.tobytes()))
    chain = ChunkCodecs(comp, [filt], np.dtype("<f4"), data.nbytes)
    assert bytes(chain.decode(stored)) == data.tobytes()
    bad = bytearray(filt.encode(data.tobytes()))
    bad[10] ^= 1
    with pytest.raises(ValueError, match=checksum):
        chain.decode(comp.encode(bytes(bad)))
