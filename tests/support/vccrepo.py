"""An Icechunk repository whose virtual chunks have relative locations (``vcc://NAME/path``,
``_vcc://NAME/path``), as icechunk 2.x writes them, built from the spec's flatbuffers (no
icechunk 2.x runs on Python 3.11): its config declares the container ``data`` (URL prefix
``file://FILES/``). Arrays (float32, 8 values, chunks of 4, uncompressed):

* ``v``: chunk 0 ``vcc://data/a.bin``, chunk 1 ``_vcc://data/sub/b.bin``;
* ``w``: chunk 0 ``vcc://nowhere/a.bin`` (a container the repository does not declare),
  chunk 1 the absolute ``file://FILES/a.bin``;
* ``x``: chunk 0 ``vcc://data/../outside.bin`` (climbs out of the container), chunk 1 inline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refmount.refs.icechunk import ids
from support.icechunkrepos import NodeSpec, RefSpec, build_manifest, build_snapshot, write_built_repo

SID = "VCCREP0F1RSTCMT00000"
MID_RAW = bytes(11) + b"\x21"
MID = ids.encode(MID_RAW)
V, W, X = b"\x11" * 8, b"\x12" * 8, b"\x13" * 8
ARRAY = (b'{"zarr_format":3,"node_type":"array","shape":[8],"data_type":"float32",'
         b'"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4]}},'
         b'"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},'
         b'"fill_value":-1.0,"codecs":[{"name":"bytes","configuration":{"endian":"little"}}]}')


@dataclass
class VccRepo:
    root: Path
    files: Path  # the container's directory
    container: str  # its URL prefix
    v: np.ndarray  # the values of array v (chunk 0 from a.bin, chunk 1 from sub/b.bin)
    a: np.ndarray  # a.bin's 4 values (w's chunk 1)


def config_yaml(container: str, name: str = "data") -> str:
    return ("virtual_chunk_containers:\n"
            f"  {container}:\n    name: {name}\n    url_prefix: {container}\n"
            "    store: !local_file_system {}\n")


def vcc_repo(root: Path, files: Path) -> VccRepo:
    (files / "sub").mkdir(parents=True, exist_ok=True)
    a = np.array([1.5, 2.5, 3.5, 4.5], "<f4")
    b = np.array([-7, 8, -9, 10], "<f4")
    (files / "a.bin").write_bytes(b"HEAD" + a.tobytes())
    (files / "sub" / "b.bin").write_bytes(b.tobytes())
    (files.parent / "outside.bin").write_bytes(bytes(16))
    container = f"file://{files}/"
    nodes = [NodeSpec("/"),
             NodeSpec("/v", "array", ARRAY, V, ndim=1, manifests=[(MID_RAW, [(0, 2)])]),
             NodeSpec("/w", "array", ARRAY, W, ndim=1, manifests=[(MID_RAW, [(0, 2)])]),
             NodeSpec("/x", "array", ARRAY, X, ndim=1, manifests=[(MID_RAW, [(0, 2)])])]
    manifest = build_manifest(MID, [
        (V, [RefSpec((0,), location="vcc://data/a.bin", offset=4, length=16),
             RefSpec((1,), location="_vcc://data/sub/b.bin", offset=0, length=16)]),
        (W, [RefSpec((0,), location="vcc://nowhere/a.bin", offset=4, length=16),
             RefSpec((1,), location=f"{container}a.bin", offset=4, length=16)]),
        (X, [RefSpec((0,), location="vcc://data/../outside.bin", offset=0, length=16),
             RefSpec((1,), inline=np.zeros(4, "<f4").tobytes())])])
    write_built_repo(root, SID, build_snapshot(SID, nodes), {MID: manifest})
    (root / "config.yaml").write_text(config_yaml(container))
    return VccRepo(root, files, container, np.concatenate([a, b]), a)
