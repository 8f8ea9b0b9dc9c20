"""``core.build_core``: one set's core, read without any front end (the calls both front ends
make: tree lookup, size, ref, then the reader or the decoder)."""

from __future__ import annotations

import json
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import trio

from refmount.base.errors import ReadError
from refmount.config import MountConfig, apply_options
from refmount.core.setcore import SetCore, build_core
from refmount.serving.preparation import index_source

DATA = bytes(range(256)) * 64


def make_core(tmp_path: Path, *options: str) -> SetCore:
    (tmp_path / "data.bin").write_bytes(DATA)
    chunk = np.arange(16, dtype="<i4")
    (tmp_path / "chunk.z").write_bytes(numcodecs.Zlib(1).encode(chunk.tobytes()))
    zarray = {"zarr_format": 2, "shape": [16], "chunks": [16], "dtype": "<i4",
              "compressor": {"id": "zlib", "level": 1}, "filters": None, "fill_value": 0,
              "order": "C"}
    refs = {".zgroup": '{"zarr_format":2}', "x/.zarray": json.dumps(zarray),
            "x/.zattrs": "{}", "x/0": [str(tmp_path / "chunk.z")],
            "raw/part": [str(tmp_path / "data.bin"), 100, 50], "gone": [str(tmp_path / "no.bin")]}
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    cfg = MountConfig(source=str(source), mountpoint="")
    apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", *options])
    return build_core(cfg, index_source(cfg))


async def read(core: SetCore, key: str) -> bytes:
    node = core.tree.root
    for part in key.split("/"):
        node = await core.tree.lookup(node, part.encode())
        assert node is not None, key
    ref = await core.tree.ref(node)
    size = await core.tree.size(node)
    array = core.array(node)
    if array is not None:
        assert core.decoder is not None
        return bytes(await core.decoder.read(key, array, ref, 0, size))
    if size < 0:
        size = await core.reader.size(ref)
    return bytes(await core.reader.read(ref, 0, size))


def run(core: SetCore, body):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            core.start(nursery)
            try:
                return await body()
            finally:
                nursery.cancel_scope.cancel()

    try:
        return trio.run(main)
    finally:
        core.close()


def test_core_reads_raw_and_fails_a_missing_target(tmp_path: Path) -> None:
    core = make_core(tmp_path)

    async def body() -> None:
        assert await read(core, "raw/part") == DATA[100:150]
        with pytest.raises(ReadError):
            await read(core, "gone")
        assert core.array(await core.tree.lookup(core.tree.root, b"raw")) is None

    run(core, body)
    assert core.info["keys"] == "6"
    assert set(core.metadata_keys()) == {".zgroup", "x/.zarray", "x/.zattrs"}


def test_core_decodes_under_decode(tmp_path: Path) -> None:
    core = make_core(tmp_path, "decode")

    async def body() -> bytes:
        return await read(core, "x/0")

    assert np.frombuffer(run(core, body), "<i4").tolist() == list(range(16))
    served = json.loads(core.metadata_keys()["x/.zarray"] or b"")
    assert served["compressor"] is None
