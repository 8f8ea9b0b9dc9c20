"""The attribute rule of the decoded view without FUSE: ``_FillValue`` from ``fill_value``, typed
as the array's dtype; every number typed for netCDF-C's zarr reader (``_NCZARR_ATTR``); values
it has no type for made text or left out; the same in ``.zmetadata``."""

from __future__ import annotations

import json

import pytest

from refmount.decode.ncattrs import NCZARR_ATTR, dumps_zattrs, is_fill_of, netcdf_type, netcdf_zattrs
from refmount.decode.view import DecodedView


def zarray(dtype="<f4", fill_value=None, **kw) -> dict:
    return {"zarr_format": 2, "shape": [4, 6], "chunks": [2, 3], "dtype": dtype,
            "compressor": {"id": "zlib", "level": 1}, "filters": None,
            "fill_value": fill_value, "order": "C", **kw}


DIMS = {"_ARRAY_DIMENSIONS": ["y", "x"], "units": "K", "long_name": "air temperature"}


@pytest.mark.parametrize("dtype, fill, nctype", [
    ("<f4", -9999.0, "<f4"),  # kerchunk's netCDF4 float
    (">f4", 1.0000000200408773e20, "<f4"),  # netCDF3 (big-endian)
    ("<f8", "NaN", "<f8"),
    ("<f8", "-Infinity", "<f8"),
    ("<i4", -1, "<i4"),
    (">i2", -999, "<i2"),  # a packed short
    ("|i1", -128, "|i1"),
    ("|u1", 254, "|u1"),
    ("<u8", 2**64 - 1, "<u8"),
    ("<i8", -(2**63), "<i8"),
    ("<f4", 0, "<f4"),  # a JSON integer for a float array
    ("<i2", -32767.0, "<i2"),  # an integral JSON number for an integer array
])
def test_fill_value_becomes_a_typed_fill_value_attribute(dtype, fill, nctype):
    out = netcdf_zattrs(zarray(dtype, fill), DIMS)
    assert list(out) == ["_FillValue", *DIMS, NCZARR_ATTR]  # first, the rest in their order
    assert out["_FillValue"] == fill
    assert out[NCZARR_ATTR] == {"types": {"_FillValue": nctype}}
    assert {k: out[k] for k in DIMS} == DIMS


@pytest.mark.parametrize("meta", [
    zarray("<f4", None),  # no fill value
    zarray("<f2", 0.0),  # not a netCDF type
    zarray("|b1", False),
    zarray("<M8[ns]", 0),
    zarray([["a", "<i4"], ["b", "<f8"]], "AAAAAAAAAAAAAAAA"),  # structured
    zarray("<f4", "a string"),  # not a fill value of the dtype
    zarray("<f4", True),
    zarray("<i2", 40000),  # out of range
    zarray("<i4", 1.5),
    zarray("|u1", -1),
])
def test_no_fill_value_attribute(meta):
    assert netcdf_zattrs(meta, DIMS) == DIMS


@pytest.mark.parametrize("attrs, typed", [
    ({"valid_range": [0, 200]}, {"valid_range": "|u1"}),  # NCZarr alone: byte, then 200 fails the file
    ({"valid_min": 1, "flag_values": [1, 2, 4]}, {"valid_min": "|u1", "flag_values": "|u1"}),
    ({"count": 5, "big": 2**40, "huge": 2**63}, {"count": "<i4", "big": "<i8", "huge": "<u8"}),
    ({"scale_factor": 0.10000000149011612, "add_offset": 0.5}, {"scale_factor": "<f4", "add_offset": "<f8"}),
    ({"mixed": [1, 2.5]}, {"mixed": "<f8"}),
    ({"title": "t", "wkt": "GEOGCS[" + "x" * 5000 + "]", "obj": {"a": 1}}, {}),
])
def test_every_number_gets_a_type(attrs, typed):
    out = netcdf_zattrs(zarray("|u1"), attrs)
    assert {k: out[k] for k in attrs} == attrs
    assert out.get(NCZARR_ATTR, {"types": {}})["types"] == typed


def test_values_netcdf_has_none_for():
    out = netcdf_zattrs(None, {"n": None, "e": [], "s": ["a", "b"], "nested": [[1], 2], "b": True})
    assert out == {"s": "a, b", "nested": "[[1], 2]", "b": 1, NCZARR_ATTR: {"types": {"b": "|u1"}}}


def test_char_fill_value_and_malformed_fill():
    char = {**zarray("|S1"), "dtype": "<U1"}
    assert netcdf_zattrs(char, {"_FillValue": "x", **DIMS}) == {"_FillValue": "x", **DIMS}
    assert netcdf_zattrs(char, {"_FillValue": "xy"}) == {}
    assert netcdf_zattrs(zarray("<i2", -1), {"_FillValue": "x"}) == {}  # NCZarr would refuse it
    assert netcdf_zattrs(zarray("<f4", -9999.0), ["not", "an", "object"]) is None


def test_a_fill_value_attribute_already_there_is_kept_and_typed():
    attrs = {"_FillValue": -1e20, **DIMS}
    out = netcdf_zattrs(zarray("<f4", -9999.0), attrs)  # the attribute wins over fill_value
    assert out == {**attrs, NCZARR_ATTR: {"types": {"_FillValue": "<f4"}}}


def test_existing_nczarr_types_are_kept():
    attrs = {**DIMS, "valid_range": [0, 10],
             NCZARR_ATTR: {"types": {"valid_range": "<i2", "_FillValue": "<i4", "bad": "x"}, "other": 1}}
    out = netcdf_zattrs(zarray("<i2", -1), attrs)
    assert out is not None and out["_FillValue"] == -1
    assert out[NCZARR_ATTR] == {"other": 1, "types": {"_FillValue": "<i2", "valid_range": "<i2"}}


def test_netcdf_type_and_is_fill_of():
    assert netcdf_type("<f4") == netcdf_type(">f4") == "<f4"
    assert netcdf_type("|u1") == "|u1"
    assert netcdf_type("not a dtype") is None
    assert netcdf_type(None) is None
    assert is_fill_of("Infinity", "<f8") and not is_fill_of("inf", "<f8")
    assert is_fill_of(-128, "|i1") and not is_fill_of(-129, "|i1")
    assert not is_fill_of(None, "<i4")
    assert not is_fill_of(1e300, "<f4")


# --- through the DecodedView ---------------------------------------------------------------


def meta_keys(**arrays: tuple[dict, dict]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {".zgroup": b'{"zarr_format": 2}',
                                    ".zattrs": json.dumps({"title": "t"}).encode()}
    for path, (za, attrs) in arrays.items():
        out[f"{path}/.zarray"] = json.dumps(za).encode()
        out[f"{path}/.zattrs"] = json.dumps(attrs).encode()
    return out


def test_view_serves_the_attributes_of_decoded_plain_and_nested_arrays():
    plain = {**zarray("<i4", -1), "compressor": None}  # needs no decoding: .zattrs all the same
    keys = meta_keys(temp=(zarray(">f4", -9999.0), DIMS), counts=(plain, DIMS),
                     nofill=(zarray("<f4"), DIMS), **{"sub/inner": (zarray("<f8", "NaN"), DIMS)})
    view = DecodedView(keys)
    assert "counts" in view.plain and "temp" in view.arrays
    for key, fill, nctype in [("temp/.zattrs", -9999.0, "<f4"), ("counts/.zattrs", -1, "<i4"),
                              ("sub/inner/.zattrs", "NaN", "<f8")]:
        served = view.metadata(key)
        assert served is not None
        attrs = json.loads(served)
        assert attrs["_FillValue"] == fill and attrs[NCZARR_ATTR]["types"]["_FillValue"] == nctype
        assert view.size(key, 10) == len(served)
    assert json.loads(view.metadata("nofill/.zattrs")) == DIMS
    assert json.loads(view.metadata(".zattrs")) == {"title": "t"}  # a group's attributes
    sizer = view.entry_sizer("temp")
    assert sizer(".zattrs", 5) == len(view.metadata("temp/.zattrs") or b"")


def test_view_leaves_attributes_of_arrays_it_cannot_read_alone():
    keys = meta_keys(temp=(zarray("<f4", -9999.0), DIMS))
    keys["temp/.zattrs"] = b"{not json"
    keys["ref/.zarray"] = None  # not inline
    keys["ref/.zattrs"] = json.dumps(DIMS).encode()
    keys["odd/.zattrs"] = None
    view = DecodedView(keys)
    assert view.metadata("temp/.zattrs") is None
    assert view.is_hidden("ref/.zarray") and view.is_hidden("ref/.zattrs")  # netCDF clients see no ref
    assert "ref" in view.left_out and "ref" in view.left_out_line()
    assert view.metadata("odd/.zattrs") is None


def test_consolidated_metadata_carries_the_same_attributes():
    za = zarray("<f4", -9999.0)
    keys = meta_keys(temp=(za, DIMS))
    keys[".zmetadata"] = json.dumps({"zarr_consolidated_format": 1, "metadata": {
        ".zgroup": {"zarr_format": 2}, "temp/.zarray": za, "temp/.zattrs": DIMS,
        "grp/.zattrs": {"a": 1}}}).encode()
    view = DecodedView(keys)
    zmeta = json.loads(view.metadata(".zmetadata") or b"")["metadata"]
    assert zmeta["temp/.zattrs"] == json.loads(view.metadata("temp/.zattrs") or b"")
    assert zmeta["temp/.zattrs"]["_FillValue"] == -9999.0
    assert zmeta["grp/.zattrs"] == {"a": 1, NCZARR_ATTR: {"types": {"a": "<i4"}}}
    # an array that needs no decoding still gets its attributes there
    plain = {**zarray("<i2", -1), "compressor": None}
    keys = {".zmetadata": json.dumps({"zarr_consolidated_format": 1, "metadata": {
        "p/.zarray": plain, "p/.zattrs": DIMS}}).encode(),
        "p/.zarray": json.dumps(plain).encode(), "p/.zattrs": json.dumps(DIMS).encode()}
    zmeta = json.loads(DecodedView(keys).metadata(".zmetadata") or b"")["metadata"]
    assert zmeta["p/.zattrs"][NCZARR_ATTR] == {"types": {"_FillValue": "<i2"}}


def test_text_is_served_in_utf8_for_netcdf_c():
    """netCDF-C 4.9 reads the JSON escape \\u00b0 as the letters u00b0: the view writes UTF-8."""
    out = dumps_zattrs({"units": "\u00b0C", "q": 'a"b'})
    assert "°C".encode() in out and b"\\u00b0" not in out and json.loads(out)["q"] == 'a"b'
    assert json.loads(dumps_zattrs({"odd": "\ud800"}))["odd"] == "\ud800"  # not Unicode: escaped
