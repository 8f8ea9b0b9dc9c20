"""The decoded view without FUSE: which arrays decode, rewritten metadata, served sizes, chunk
bytes equal to what zarr's codecs give, errors on corrupt chunks, the bounded decoder."""

from __future__ import annotations

import base64
import json
import zlib

import numcodecs
import numpy as np
import pytest
import trio

from refmount.cache import MemoryLRU
from refmount.decoded import (
    ChunkDecoder,
    DecodedView,
    DecodeError,
    plan_array,
    rewrite_zarray,
)
from refmount.refs import Ref, RefKind


def zarray(dtype="<f4", shape=(4, 6), chunks=(2, 3), compressor=None, filters=None, **kw) -> dict:
    return {"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype,
            "compressor": compressor, "filters": filters, "fill_value": kw.pop("fill_value", None),
            "order": kw.pop("order", "C"), **kw}


def encode(meta: dict, values: np.ndarray) -> bytes:
    """A chunk as zarr writes it: values in the array's order, filters, then the compressor."""
    buf = np.ascontiguousarray(values.astype(np.dtype(meta["dtype"]))).tobytes(order=meta["order"])
    for f in meta["filters"] or []:
        buf = numcodecs.get_codec(f).encode(buf)
    if meta["compressor"]:
        buf = numcodecs.get_codec(meta["compressor"]).encode(buf)
    return bytes(buf)


SHUFFLE_ZLIB = {"filters": [{"id": "shuffle", "elementsize": 4}, {"id": "zlib", "level": 4}]}


@pytest.mark.parametrize("meta", [
    zarray(">f4", **SHUFFLE_ZLIB),  # kerchunk's HDF5: shuffle + zlib as filters
    zarray("<i2", filters=[{"id": "shuffle", "elementsize": 2}], compressor={"id": "zlib", "level": 1}),
    zarray(">f8"),  # netCDF3: big-endian, no codecs
    zarray("<f8", compressor={"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2}),
    zarray("<u2", compressor={"id": "zstd", "level": 3}, order="F"),
    zarray(">i4", compressor={"id": "lz4", "acceleration": 1}, dimension_separator="/"),
    zarray("<i4", compressor={"id": "gzip", "level": 5},
           filters=[{"id": "delta", "dtype": "<i4"}]),
])
def test_chunk_bytes_equal_zarr_decoding(meta):
    array, reason = plan_array("v", meta)
    assert reason is None and array is not None
    rng = np.random.default_rng(1)
    values = (rng.standard_normal((2, 3)) * 1000).astype(np.dtype(meta["dtype"]))
    out = array.decode(encode(meta, values))
    assert len(out) == array.nbytes == 2 * 3 * np.dtype(meta["dtype"]).itemsize
    le = np.dtype(meta["dtype"]).newbyteorder("<")
    got = np.frombuffer(out, le).reshape((2, 3), order=meta["order"])
    np.testing.assert_array_equal(got, values)


def test_arrays_that_need_nothing_are_plain_and_object_dtypes_are_skipped():
    assert plan_array("a", zarray("<f4")) == (None, None)
    assert plan_array("a", zarray("|u1")) == (None, None)
    _, why = plan_array("s", zarray("|O", filters=[{"id": "vlen-utf8"}]))
    assert why and "object" in why
    _, why = plan_array("c", zarray("<f4", compressor={"id": "no-such-codec-xyz"}))
    assert why and "no-such-codec-xyz" in why and "not available" in why


def test_rewritten_zarray_keeps_everything_but_codecs_and_byte_order():
    meta = zarray(">f4", fill_value=-9999.0, dimension_separator="/", **SHUFFLE_ZLIB)
    out = rewrite_zarray(meta)
    assert out["dtype"] == "<f4" and out["compressor"] is None and out["filters"] is None
    for k in ("shape", "chunks", "fill_value", "order", "dimension_separator", "zarr_format"):
        assert out[k] == meta[k]
    nan = rewrite_zarray(zarray(">f8", fill_value="NaN"))
    assert nan["fill_value"] == "NaN"
    # a structured fill value is base64 of its bytes: re-encoded for the new byte order
    dt = np.dtype([("a", ">i4"), ("b", ">f8")])
    fill = base64.b64encode(np.array([(7, 2.5)], dt).tobytes()).decode()
    s = rewrite_zarray(zarray([["a", ">i4"], ["b", ">f8"]], fill_value=fill))
    assert s["dtype"] == [["a", "<i4"], ["b", "<f8"]]
    le = np.frombuffer(base64.b64decode(s["fill_value"]), np.dtype([("a", "<i4"), ("b", "<f8")]))
    assert le[0]["a"] == 7 and le[0]["b"] == 2.5


def view_of(metas: dict[str, dict], extra: dict[str, bytes] | None = None) -> DecodedView:
    keys = {f"{p}/.zarray" if p else ".zarray": json.dumps(m).encode() for p, m in metas.items()}
    return DecodedView({**keys, **(extra or {})})


def test_view_sizes_keys_and_zmetadata():
    metas = {
        "temp": zarray(">f4", shape=(6, 20, 30), chunks=(2, 10, 15), **SHUFFLE_ZLIB),
        "g/sub/nested": zarray("<i2", chunks=(2, 3), compressor={"id": "zlib"},
                               dimension_separator="/"),
        "plain": zarray("<f8"),
        "names": zarray("|O", filters=[{"id": "vlen-utf8"}]),
    }
    zmeta = {"zarr_consolidated_format": 1,
             "metadata": {".zgroup": {"zarr_format": 2},
                          **{f"{p}/.zarray": m for p, m in metas.items()},
                          "temp/.zattrs": {"_ARRAY_DIMENSIONS": ["t", "y", "x"]}}}
    view = view_of(metas, {".zmetadata": json.dumps(zmeta).encode()})
    assert set(view.arrays) == {"temp", "g/sub/nested"}
    assert view.plain == {"plain"} and set(view.skipped) == {"names"}
    assert view.array_of("temp/0.1.1").path == "temp"
    assert view.array_of("temp/0.1") is None  # wrong number of dimensions
    assert view.array_of("temp/.zattrs") is None
    assert view.array_of("g/sub/nested/1/0").path == "g/sub/nested"
    assert view.array_of("g/sub/nested/1.0") is None
    assert view.array_of("plain/0.0") is None and view.array_of("names/0") is None
    assert view.size("temp/2.1.0", 123) == 2 * 10 * 15 * 4
    assert view.size("plain/0.0", 48) == 48
    z = json.loads(view.metadata("temp/.zarray"))
    assert z["dtype"] == "<f4" and z["filters"] is None and z["compressor"] is None
    assert view.size("temp/.zarray", 1) == len(view.metadata("temp/.zarray"))
    zm = json.loads(view.metadata(".zmetadata"))["metadata"]
    assert zm["temp/.zarray"] == z and zm["temp/.zattrs"] == {"_ARRAY_DIMENSIONS": ["t", "y", "x"]}
    assert zm["names/.zarray"] == metas["names"] and zm["plain/.zarray"] == metas["plain"]
    sizer = view.entry_sizer("g/sub/nested/1")
    assert sizer("0", 5) == 12 and sizer("x", 5) == 5
    assert view.entry_sizer("temp")(".zarray", 1) == len(view.metadata("temp/.zarray"))
    assert json.loads(view.describe()["not_decoded"]) == {"names": view.skipped["names"]}


def test_corrupt_or_mis_sized_chunks_raise_naming_the_codec():
    meta = zarray("<f4", **SHUFFLE_ZLIB)
    array, _ = plan_array("v", meta)
    good = encode(meta, np.ones((2, 3), "f4"))
    with pytest.raises(DecodeError, match="zlib"):
        array.decode(good[:10] + b"\xff" * 20)
    short = zlib.compress(np.ones(5, "f4").tobytes())  # a chunk of 5 values, not 6
    with pytest.raises(DecodeError, match="expected 24"):
        plan_array("v", zarray("<f4", compressor={"id": "zlib"}))[0].decode(short)


def test_decoder_shares_caches_and_bounds_bytes_in_flight():
    meta = zarray(">f4", shape=(2, 30), chunks=(2, 3), **SHUFFLE_ZLIB)
    view = view_of({"v": meta})
    array = view.arrays["v"]
    chunks = {f"v/0.{i}": encode(meta, np.full((2, 3), i, "f4")) for i in range(10)}
    stored_reads: list[bytes] = []
    peak = 0

    async def read_stored(ref: Ref) -> bytes:
        stored_reads.append(ref.data)
        await trio.sleep(0.001)
        return ref.data

    async def resolve(key: str):
        return (None, Ref(RefKind.INLINE, data=chunks[key])) if key in chunks else None

    async def main() -> None:
        nonlocal peak
        dec = ChunkDecoder(view, MemoryLRU(1 << 20), read_stored, resolve=resolve, threads=2,
                           max_bytes=2 * array.nbytes, ahead=3)
        orig_acquire = dec.budget.acquire

        async def acquire(n: int) -> None:
            nonlocal peak
            await orig_acquire(n)
            peak = max(peak, dec.budget.used)

        dec.budget.acquire = acquire
        async with trio.open_nursery() as nursery:
            dec.attach(nursery)
            ref0 = Ref(RefKind.INLINE, data=chunks["v/0.0"])
            got = await asyncio_gather(*[dec.read("v/0.0", array, ref0, 0, 1000) for _ in range(5)])
            assert all(bytes(g) == np.zeros(6, "<f4").tobytes() for g in got)
            assert len(stored_reads) == 1  # one decode for five concurrent readers
            ref1 = Ref(RefKind.INLINE, data=chunks["v/0.1"])
            part = await dec.read("v/0.1", array, ref1, 0, 8)
            assert bytes(part) == np.ones(2, "<f4").tobytes()
            tail = await dec.read("v/0.1", array, ref1, 20, 100)  # short at the end
            assert bytes(tail) == np.ones(1, "<f4").tobytes()
        # in order: the next chunks were decoded ahead, into the memory cache
        assert dec.decoded_ahead == 3
        for i in (2, 3, 4):
            assert bytes(dec.ready(f"v/0.{i}")) == np.full(6, i, "<f4").tobytes()
        assert dec.ready("v/0.5") is None
        assert 0 < peak <= 2 * array.nbytes
        dec.close()

    trio.run(main)


async def asyncio_gather(*coros):
    results = [None] * len(coros)

    async def run(i, c):
        results[i] = await c

    async with trio.open_nursery() as n:
        for i, c in enumerate(coros):
            n.start_soon(run, i, c)
    return results
