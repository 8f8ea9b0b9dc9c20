"""The decoded view of a set without FUSE: which key is a decoded chunk, the rewritten
metadata (``.zarray``, ``.zmetadata``) and the served sizes."""

from __future__ import annotations

import json

from support.zarrchunks import SHUFFLE_ZLIB, view_of, zarray


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
    assert view.is_hidden("names/.zarray") and set(view.left_out) == {"names"}
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
