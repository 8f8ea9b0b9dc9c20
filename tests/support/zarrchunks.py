"""zarr v2 arrays for the decoded view's unit tests: a ``.zarray``, a chunk encoded as zarr
writes it (numcodecs), and a ``DecodedView`` over a few arrays' metadata."""

from __future__ import annotations

import json

import numcodecs
import numpy as np

from refmount.decode.view import DecodedView


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


def view_of(metas: dict[str, dict], extra: dict[str, bytes] | None = None) -> DecodedView:
    keys = {f"{p}/.zarray" if p else ".zarray": json.dumps(m).encode() for p, m in metas.items()}
    return DecodedView({**keys, **(extra or {})})
