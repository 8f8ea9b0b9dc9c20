"""One array's plan without FUSE: which arrays decode, chunk bytes equal to what zarr's codecs
give, the rewritten ``.zarray``, errors on corrupt chunks, the chunk grid."""

from __future__ import annotations

import base64
import zlib

import numpy as np
import pytest
from support.zarrchunks import SHUFFLE_ZLIB, encode, zarray

from refmount.decode.codecplan import DecodeError, plan_array, rewrite_zarray


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


def test_corrupt_or_mis_sized_chunks_raise_naming_the_codec():
    meta = zarray("<f4", **SHUFFLE_ZLIB)
    array, _ = plan_array("v", meta)
    good = encode(meta, np.ones((2, 3), "f4"))
    with pytest.raises(DecodeError, match="zlib"):
        array.decode(good[:10] + b"\xff" * 20)
    short = zlib.compress(np.ones(5, "f4").tobytes())  # a chunk of 5 values, not 6
    with pytest.raises(DecodeError, match="expected 24"):
        plan_array("v", zarray("<f4", compressor={"id": "zlib"}))[0].decode(short)


def test_chunk_grid_names_and_numbers_chunks_in_c_order():
    array, _ = plan_array("g/v", zarray("<f4", shape=(5, 7), chunks=(2, 3), compressor={"id": "zlib"}))
    assert array.grid == (3, 3)
    assert array.chunk_rel("g/v/1.2") == "1.2"
    assert array.coords("g/v/1.2") == (5, (3, 3))
    assert array.coords("g/v/3.0") is None  # beyond the grid
    assert [array.chunk_name(n, array.grid) for n in (0, 5, 8)] == ["0.0", "1.2", "2.2"]
    root, _ = plan_array("", zarray("<f4", shape=(4,), chunks=(2,), compressor={"id": "zlib"},
                                    dimension_separator="/"))
    assert root.chunk_rel("1") == "1" and root.coords("1") == (1, (2,))
    scalar, _ = plan_array("s", zarray("<f4", shape=(), chunks=(), compressor={"id": "zlib"}))
    assert scalar.coords("s/0") == (0, (1,)) and scalar.chunk_name(0, (1,)) == "0"
