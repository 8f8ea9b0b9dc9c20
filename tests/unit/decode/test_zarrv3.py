"""Zarr v3 through the decoded view without FUSE: zarr.json shown as v2 metadata, the codec
chain, sharding (the index read once per shard, missing inner chunks as fill), chunk key
encodings, and what is refused and why."""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest
import trio
from support.v3store import decoded_tree, render_tree, store_refs

from refmount.decode.codecplan import DecodeError
from refmount.decode.sharding import EMPTY, ShardError, ShardIndexes, sharding_layout
from refmount.decode.zarrv3 import V3Error, parse_dtype, parse_node, v2_fill
from refmount.refs import Ref, RefKind

zarr = pytest.importorskip("zarr")


def make(tmp_path, **kwargs):
    """One v3 array ``a`` (zarr-python 3) in a local store; (store dir, the data written)."""
    store = zarr.storage.LocalStore(tmp_path / "s")
    data = kwargs.pop("data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root = zarr.create_group(store, zarr_format=3)
        a = root.create_array("a", shape=data.shape, dtype=data.dtype, **kwargs)
        a[...] = data
    return tmp_path / "s", data


def decoded(tmp_path, store_dir, ranges=False):
    tree = decoded_tree(store_refs(store_dir, ranges))
    return tree, render_tree(tree, tmp_path / "view")


def as_array(files, name="a"):
    meta = json.loads(files[f"{name}/.zarray"])
    dt = np.dtype(meta["dtype"])
    chunks = meta["chunks"]
    out = np.zeros(meta["shape"], dt)
    for key, data in files.items():
        head, _, rel = key.rpartition("/")
        if head != name or rel.startswith("."):
            continue
        idx = [int(i) for i in rel.split(".")] if meta["shape"] else []
        block = np.frombuffer(data, dt).reshape(chunks)
        where = tuple(slice(i * c, min((i + 1) * c, s))
                      for i, c, s in zip(idx, chunks, meta["shape"], strict=True))
        out[where] = block[tuple(slice(0, w.stop - w.start) for w in where)]
    return out


@pytest.mark.parametrize(("value", "dtype", "want"), [
    ("0x7fc00000", "f4", "NaN"), ("0x3ff0000000000000", "f8", 1.0), ("0x7f800000", "f4", "Infinity"),
    ("0xff800000", "f4", "-Infinity"), ("0x3c00", "f2", 1.0), ("-Infinity", "f8", "-Infinity"),
    (2.5, "f4", 2.5),
    (-3, "i2", -3), (True, "b1", True), ([1.0, "NaN"], "c8", [1.0, "NaN"]), (None, "f4", None),
])
def test_fill_values_in_v2_encoding(value, dtype, want):
    assert v2_fill(value, np.dtype(dtype)) == want


@pytest.mark.parametrize(("value", "dtype"), [("0x7fc0", "f4"), ("x", "f8"), (1.5, "i4"), ("1", "b1")])
def test_bad_fill_values_are_refused(value, dtype):
    with pytest.raises(V3Error):
        v2_fill(value, np.dtype(dtype))


def test_data_types():
    assert parse_dtype("uint16") == np.dtype("u2")
    def sized(name, n):
        return parse_dtype({"name": name, "configuration": {"length_bytes": n}})

    assert sized("null_terminated_bytes", 1) == np.dtype("S1")
    assert sized("fixed_length_utf32", 12) == np.dtype("<U3")
    assert parse_dtype("r16") == np.dtype("V2")
    with pytest.raises(V3Error, match="variable-length"):
        parse_dtype("string")
    with pytest.raises(V3Error, match="not known"):
        parse_dtype("bfloat16")


ARRAY = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "int32",
         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
         "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}


@pytest.mark.parametrize(("change", "why"), [
    ({"chunk_grid": {"name": "rectilinear"}}, "not regular"),
    ({"storage_transformers": [{"name": "x"}]}, "storage_transformers"),
    ({"chunk_key_encoding": {"name": "other"}}, "chunk_key_encoding"),
    ({"shape": [4, 2]}, "differ in length"),
    ({"node_type": "other"}, "node_type"),
    ({"zarr_format": 2}, "zarr_format 3"),
    ({"x": {"must_understand": True}}, "must be understood"),
])
def test_metadata_refused(change, why):
    with pytest.raises(V3Error, match=why):
        parse_node("a", {**ARRAY, **change})


def test_array_metadata_as_v2(tmp_path):
    data = np.arange(35, dtype=">f8").reshape(5, 7)
    store_dir, _ = make(tmp_path, data=data, chunks=(2, 3), fill_value=float("nan"),
                        serializer=zarr.codecs.BytesCodec(endian="big"),
                        filters=[zarr.codecs.TransposeCodec(order=[1, 0])],
                        dimension_names=["y", None],
                        attributes={"units": "K", "valid_range": [0, 10],
                                    "_FillValue": "AAAAAAAA+H8="})  # NaN, as xarray writes it
    tree, files = decoded(tmp_path, store_dir)
    zarray = json.loads(files["a/.zarray"])
    assert zarray == {"chunks": [2, 3], "compressor": None, "dimension_separator": ".", "dtype": "<f8",
                      "fill_value": "NaN", "filters": None, "order": "C", "shape": [5, 7], "zarr_format": 2}
    zattrs = json.loads(files["a/.zattrs"])
    assert zattrs["units"] == "K" and zattrs["_FillValue"] == "NaN"
    assert zattrs["_NCZARR_ATTR"]["types"] == {"_FillValue": "<f8", "valid_range": "<f8"}
    assert zattrs["_ARRAY_DIMENSIONS"] == ["_zdim_5", "_zdim_7"]  # a dimension without a name
    assert files[".zgroup"] == b'{\n    "zarr_format": 2\n}'
    assert not any(k.endswith("zarr.json") or "/c/" in k for k in files)
    np.testing.assert_array_equal(as_array(files), data)
    assert tree.view.codecs["a"] == ["zstd", "bytes", "transpose"]  # in decoding order


@pytest.mark.parametrize("encoding", [{"name": "v2", "separator": "."}, {"name": "v2", "separator": "/"},
                                      {"name": "default", "separator": "."}])
def test_chunk_key_encodings(tmp_path, encoding):
    data = np.arange(12, dtype="<i2").reshape(3, 4)
    store_dir, _ = make(tmp_path, data=data, chunks=(2, 2), chunk_key_encoding=encoding)
    _tree, files = decoded(tmp_path, store_dir)
    chunks = sorted(k for k in files if k.startswith("a/") and k[2] != ".")
    assert chunks == ["a/0.0", "a/0.1", "a/1.0", "a/1.1"]
    np.testing.assert_array_equal(as_array(files), data)


def test_zero_dimensional(tmp_path):
    store_dir, _ = make(tmp_path, data=np.array(7.5, "<f4"), compressors=[zarr.codecs.GzipCodec()])
    _tree, files = decoded(tmp_path, store_dir)
    assert json.loads(files["a/.zarray"])["shape"] == [1]
    assert np.frombuffer(files["a/0"], "<f4").tolist() == [7.5]


@pytest.mark.parametrize("dtype", ["<i4", "<f8", "u1"])
def test_zero_dimensional_never_written_is_its_fill_value(tmp_path, dtype):
    """CF's ``crs = 0`` as xarray writes it: zarr stores no chunk equal to the fill value."""
    store_dir, _ = make(tmp_path, data=np.array(0, dtype), fill_value=0)
    assert not any(p.name == "c" for p in (store_dir / "a").iterdir())  # never written
    _tree, files = decoded(tmp_path, store_dir)
    assert np.frombuffer(files["a/0"], dtype).tolist() == [0]
    store_dir, _ = make(tmp_path / "nine", data=np.array(9, dtype), fill_value=9)
    _tree, files = decoded(tmp_path / "nine", store_dir)
    assert np.frombuffer(files["a/0"], dtype).tolist() == [9]


def test_unknown_codec_is_left_out_with_its_reason(tmp_path, caplog):
    doc = {**ARRAY, "codecs": [{"name": "bytes"}, {"name": "fancy", "configuration": {}}]}
    refs = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group"}),
            "a/zarr.json": json.dumps(doc), "a/c/0": "base64:AAAA",
            "b/zarr.json": json.dumps(ARRAY), "b/c/0": "base64:" + "AQAAAAIAAAA="}
    tree = decoded_tree(refs)
    view = tree.view
    assert "fancy" in view.skipped["a"] and "fancy" in view.left_out["a"]
    assert "fancy" in json.loads(view.describe()["netcdf_left_out"])["a"]
    with caplog.at_level(logging.WARNING):
        view.warn()
    assert sum("fancy" in r.getMessage() for r in caplog.records) == 2  # as referenced; not seen by netCDF
    files = render_tree(tree, tmp_path / "view")
    # served as stored, for zarr v3 clients; no .zarray for netCDF clients
    assert "a/zarr.json" in files and "a/c/0" in files and "a/.zarray" not in files
    assert "b/zarr.json" not in files and np.frombuffer(files["b/0"], "<i4").tolist() == [1, 2]


def test_crc32c_mismatch_fails_the_chunk(tmp_path):
    data = np.arange(6, dtype="<i4")
    store_dir, _ = make(tmp_path, data=data, chunks=(3,), compressors=[zarr.codecs.Crc32cCodec()])
    chunk = store_dir / "a" / "c" / "1"
    raw = bytearray(chunk.read_bytes())
    raw[0] ^= 1
    chunk.write_bytes(bytes(raw))
    tree = decoded_tree(store_refs(store_dir))
    array = tree.view.arrays["a"]
    with pytest.raises(DecodeError, match="crc32c"):
        array.decode(bytes(raw))


def shard_reader(path):
    reads = []

    async def read_range(ref, off, n):
        reads.append((off, n))
        with open(path, "rb") as f:
            f.seek(off)
            return f.read(n)

    async def size(ref):
        return path.stat().st_size

    return ShardIndexes(read_range, size), reads


@pytest.mark.parametrize("location", ["end", "start"])
def test_shard_index_read_once_and_missing_inner_chunks_are_fill(tmp_path, location):
    data = np.arange(64, dtype="<u2").reshape(8, 8)
    store = zarr.storage.LocalStore(tmp_path / "s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="<u2", fill_value=9,
                              shards={"shape": (4, 8), "index_location": location},
                              compressors=[zarr.codecs.ZstdCodec()], zarr_format=3)
        a[:2, :4] = data[:2, :4]  # shard 0 holds 2 of its 8 inner chunks; shard 1 is not written
    tree = decoded_tree(store_refs(tmp_path / "s"))
    array = tree.view.arrays["a"]
    assert array.grid == (4, 4) and array.shard is not None
    shard = tmp_path / "s" / "a" / "c" / "0" / "0"
    shards, reads = shard_reader(shard)
    ref = Ref(RefKind.WHOLE, f"file://{shard}")

    async def main():
        out = {}
        for i in range(2):
            for j in range(4):
                _key, number = array.stored_location((i, j))
                stored = await shards.inner(ref, array.shard, number, array.stored_bound)
                out[(i, j)] = None if stored is None else np.frombuffer(array.decode(stored), "<u2")
        return out

    got = trio.run(main)
    assert shards.reads == 1  # one index for the shard's 8 inner chunks
    assert len(reads) == 1 + 2  # and the ranges of the two inner chunks it holds
    assert got[(0, 0)].tolist() == data[:2, :2].ravel().tolist()
    assert got[(0, 1)].tolist() == data[:2, 2:4].ravel().tolist()
    assert all(got[k] is None for k in got if k not in ((0, 0), (0, 1)))
    assert np.frombuffer(array.fill_chunk(), "<u2").tolist() == [9, 9, 9, 9]
    files = render_tree(tree, tmp_path / "view")
    # the listing: every inner chunk, those of the shard not stored too (as the fill value)
    assert sorted(k for k in files if not k.rpartition("/")[2].startswith(".") and k.startswith("a/")) == [
        f"a/{i}.{j}" for i in range(4) for j in range(4)]
    assert np.frombuffer(files["a/1.3"], "<u2").tolist() == [9, 9, 9, 9]
    assert np.frombuffer(files["a/3.3"], "<u2").tolist() == [9, 9, 9, 9]
    assert json.loads(files["a/.zarray"])["fill_value"] is None  # no declared missing value


def test_a_shard_index_is_cached_per_array_layout_not_per_bytes(tmp_path):
    """Two arrays referencing the same shard bytes with different ``index_codecs`` (little
    and big endian, one size): each decodes the index its own way, whichever reads first."""
    body = np.array([[0, 2], [EMPTY, EMPTY]], "<u8").tobytes()
    shard = tmp_path / "shard"
    shard.write_bytes(b"ab" + body)

    def layout(endian):
        codec = {"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2], "codecs": [{"name": "bytes"}], "index_location": "end",
            "index_codecs": [{"name": "bytes", "configuration": {"endian": endian}}]}}
        return sharding_layout([4], [4], codec)[0]

    little, big = layout("little"), layout("big")
    for order in ((little, big), (big, little)):
        shards, _reads = shard_reader(shard)
        for ref in (Ref(RefKind.WHOLE, f"file://{shard}"), Ref(RefKind.INLINE, None, 0, 34, b"ab" + body)):
            for lay in order:
                if lay is little:
                    assert trio.run(shards.inner, ref, lay, 0, None) == b"ab"
                else:
                    with pytest.raises(ShardError, match="runs past the shard"):
                        trio.run(shards.inner, ref, lay, 0, None)
        assert shards.reads == 4


def test_bad_shard_index(tmp_path):
    data = np.arange(16, dtype="<i4").reshape(4, 4)
    store_dir, _ = make(tmp_path, data=data, chunks=(2, 2), shards=(4, 4))
    tree = decoded_tree(store_refs(store_dir))
    array = tree.view.arrays["a"]
    shard = store_dir / "a" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-6] ^= 0xFF  # inside the index: its crc32c no longer matches
    shard.write_bytes(bytes(raw))
    shards, _reads = shard_reader(shard)
    ref = Ref(RefKind.WHOLE, f"file://{shard}")
    with pytest.raises(ShardError, match="crc32c"):
        trio.run(shards.inner, ref, array.shard, 0, array.stored_bound)
    # an index entry past the shard's end
    index = np.frombuffer(bytes(raw[-68:-4]), "<u8").reshape(4, 2).copy()
    index[0] = [10**9, 10]
    import google_crc32c

    body = index.tobytes()
    raw[-68:] = body + google_crc32c.value(body).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    shards, _reads = shard_reader(shard)
    with pytest.raises(ShardError, match="past the shard"):
        trio.run(shards.inner, ref, array.shard, 0, array.stored_bound)


def test_listing_resumes_and_inodes_resolve(tmp_path):
    data = np.arange(30, dtype="<f4").reshape(5, 6)
    store_dir, _ = make(tmp_path, data=data, chunks=(2, 2))
    tree = decoded_tree(store_refs(store_dir))

    async def main():
        adir = await tree.lookup(tree.root, b"a")
        every = [e async for e in tree.entries(adir)]
        assert [e[0] for e in every[:2]] == [b".zarray", b".zattrs"] and len(every) == 2 + 9
        for k, entry in enumerate(every):
            rest = [e async for e in tree.entries(adir, entry[3])]
            assert rest == every[k + 1 :]
            node = tree.node(entry[1])
            assert tree.path(node) == b"a/" + entry[0] and tree.parent(node).ino == adir.ino
        assert await tree.lookup(adir, b"zarr.json") is None and await tree.lookup(adir, b"c") is None
        assert await tree.lookup(adir, b"3.0") is None and await tree.lookup(adir, b"0.0") is not None
        root = [e[0] async for e in tree.entries(tree.root)]
        assert root == [b".zgroup", b".zattrs", b"a"]

    trio.run(main)


@pytest.mark.parametrize(("attrs", "dtype", "want"), [
    ({}, "f4", None), ({"_FillValue": "AAAAAAAA+H8="}, "f4", "NaN"),
    ({"_FillValue": "AAAAAICHw8A="}, "f8", -9999.0), ({"_FillValue": -9999.0}, "f8", -9999.0),
    ({"_FillValue": -1}, "i2", -1), ({"_FillValue": "AAAA"}, "f8", None), ({"_FillValue": True}, "i2", None),
])
def test_declared_missing_value(attrs, dtype, want):
    """Only a ``_FillValue`` attribute marks values missing (xarray reads v3 so); the v3
    fill_value (here 5) is the value of chunks not written."""
    from refmount.decode.zarrv3 import V3ArrayMeta, declared_fill, v2_array, v2_attrs

    meta = V3ArrayMeta("a", [2], [2], np.dtype(dtype), 5, [], "default", "/", attrs)
    assert declared_fill(meta) == want
    assert v2_array(meta, [2])["fill_value"] == want
    assert v2_attrs(meta).get("_FillValue") == want


def test_a_v3_chain_runs_in_a_codec_worker(tmp_path):
    """A v3 chain with a codec off the allow-list is decoded in a codec worker process, which
    builds it from its spec (``chain_from_spec``) as it builds v2's."""
    from refmount.decode.codecworker import CodecWorkers
    from refmount.decode.v3codecs import V3Chain, chain_from_spec

    data = np.arange(24, dtype=">f8").reshape(4, 6)
    store_dir, _ = make(tmp_path, data=data, chunks=(4, 6), serializer=zarr.codecs.BytesCodec(endian="big"),
                        filters=[zarr.codecs.TransposeCodec(order=[1, 0])],
                        compressors=[zarr.codecs.GzipCodec(), zarr.codecs.Crc32cCodec()])
    chain = decoded_tree(store_refs(store_dir)).view.arrays["a"].chain
    assert isinstance(chain, V3Chain) and not chain.isolated
    stored = (store_dir / "a" / "c" / "0" / "0").read_bytes()
    again = chain_from_spec(chain.spec())
    assert bytes(again.decode(stored)) == bytes(chain.decode(stored)) == data.astype("<f8").tobytes()
    workers = CodecWorkers(memory=256 << 20, cpu_seconds=5, timeout=60, label=str(tmp_path))
    try:
        assert workers.decode(chain.spec(), stored, chain.nbytes) == data.astype("<f8").tobytes()
    finally:
        workers.close()
    with pytest.raises(V3Error, match="not known"):
        V3Chain([{"name": "bytes"}, {"name": "fancy"}], np.dtype("f4"), (2,))
    odd = V3Chain([{"name": "bytes"}, {"name": "numcodecs.base64"}], np.dtype("f4"), (2,))
    assert not odd.isolated and odd.steps[0][2] == 8  # base64 decodes at most its input's bound


def test_arrays_too_large_to_serve_are_refused():
    """A hostile zarr.json: more chunks than the view numbers, a shard index larger than read."""
    from refmount.decode.v3view import plan_v3_array

    many = parse_node("a", {**ARRAY, "shape": [2**50], "chunk_grid": {
        "name": "regular", "configuration": {"chunk_shape": [1]}}})
    assert plan_v3_array(many, 256 << 20) == (
        None, f"{2**50:,} chunks, more than the {2**40:,} the view numbers")
    shard = {"name": "sharding_indexed", "configuration": {"chunk_shape": [1], "codecs": [{"name": "bytes"}]}}
    sharded = parse_node("a", {**ARRAY, "shape": [2**30], "chunk_grid": {
        "name": "regular", "configuration": {"chunk_shape": [2**30]}}, "codecs": [shard]})
    array, why = plan_v3_array(sharded, 256 << 20)
    assert array is None and "index is 17,179,869,184 bytes" in why


def test_inspect_lists_v3_arrays_and_why_one_is_not_decoded(tmp_path):
    from refmount.cli.tools import format_inspect, inspect

    doc = {**ARRAY, "codecs": [{"name": "bytes"}, {"name": "fancy"}]}
    refs = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group"}),
            "a/zarr.json": json.dumps(doc), "a/c/0": "base64:AAAA",
            "b/zarr.json": json.dumps(ARRAY), "b/c/0": "base64:AQAAAAIAAAA="}
    path = tmp_path / "v3.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    info = inspect(str(path), {})
    assert info["arrays"]["b"]["decode"] == "decoded" and info["arrays"]["b"]["codecs"] == ["bytes"]
    assert "fancy" in info["arrays"]["a"]["decode"] and "fancy" in info["arrays"]["a"]["netcdf"]
    assert "a: codec 'fancy' is not known to the decoded view" in format_inspect(info)
