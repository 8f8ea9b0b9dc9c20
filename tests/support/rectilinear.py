"""An Icechunk repository (built from the spec's flatbuffers) holding an array on a
rectilinear chunk grid (zarr-extensions ``rectilinear``: chunks of 3 and 5 rows) beside a
regular one, both with inline chunks: ``regular`` (int32, 8 values, chunks of 4) and ``rect``
(int32, 8 x 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from refmount.refs.icechunk import ids
from support.icechunkrepos import NodeSpec, RefSpec, build_manifest, build_snapshot, write_built_repo

SID = "RECT1N1EARREP0000000"
MID_RAW = bytes(11) + b"\x31"
MID = ids.encode(MID_RAW)
REGULAR, RECT = b"\x31" * 8, b"\x32" * 8
CODECS = b'"codecs":[{"name":"bytes","configuration":{"endian":"little"}}]'
KEYS = b'"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}}'
REGULAR_JSON = (b'{"zarr_format":3,"node_type":"array","shape":[8],"data_type":"int32",'
                b'"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[4]}},'
                + KEYS + b',"fill_value":0,' + CODECS + b'}')
RECT_JSON = (b'{"zarr_format":3,"node_type":"array","shape":[8,2],"data_type":"int32",'
             b'"chunk_grid":{"name":"rectilinear","configuration":{"kind":"inline",'
             b'"chunk_shapes":[[3,5],2]}},' + KEYS + b',"fill_value":0,' + CODECS + b'}')


def rectilinear_repo(root: Path) -> np.ndarray:
    """The repository at ``root``; the values of ``regular``."""
    regular = np.arange(8, dtype="<i4") * 11
    nodes = [NodeSpec("/"),
             NodeSpec("/rect", "array", RECT_JSON, RECT, ndim=2, manifests=[(MID_RAW, [(0, 2), (0, 1)])]),
             NodeSpec("/regular", "array", REGULAR_JSON, REGULAR, ndim=1, manifests=[(MID_RAW, [(0, 2)])])]
    manifest = build_manifest(MID, [
        (REGULAR, [RefSpec((0,), inline=regular[:4].tobytes()), RefSpec((1,), inline=regular[4:].tobytes())]),
        (RECT, [RefSpec((0, 0), inline=np.ones((3, 2), "<i4").tobytes()),
                RefSpec((1, 0), inline=np.ones((5, 2), "<i4").tobytes())])])
    write_built_repo(root, SID, build_snapshot(SID, nodes), {MID: manifest})
    return regular
