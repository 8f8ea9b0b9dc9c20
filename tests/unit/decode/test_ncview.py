"""What netCDF-C is shown of each array (``ncview``), without FUSE: char as ``<U1``, a chunk
larger than the shape cut to it (and the decoded chunk with it), scalars as ``[1]``, dimension
names given one length each, and the arrays netCDF-C cannot read left out with a reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.zarrchunks import view_of, zarray

from refmount.decode.ncview import netcdf_array, resolve_dims


def test_char_is_u1_with_no_fill_and_zarr_keeps_s1():
    nc = netcdf_array(zarray("|S1", shape=(3, 8), chunks=(3, 8), fill_value="IA=="))
    assert nc.zarray["dtype"] == "<U1" and nc.zarray["fill_value"] is None and nc.why is None
    view = view_of({"names": zarray("|S1", shape=(3, 8), chunks=(3, 8), fill_value="IA==")},
                   {"names/.zattrs": b'{"_ARRAY_DIMENSIONS": ["station", "strlen"]}'})
    assert json.loads(view.metadata("names/.zarray"))["dtype"] == "<U1"
    assert json.loads(view.zarr_metadata("names/.zarray"))["dtype"] == "|S1"
    assert view.array_of("names/0.0") is None  # one byte a character: served as referenced


@pytest.mark.parametrize("dtype", [">f8", "<i4", "|u1"])
def test_a_chunk_larger_than_the_shape_is_cut(dtype):
    meta = zarray(dtype, shape=(3, 2), chunks=(512, 4))
    view = view_of({"time": meta}, {"time/.zattrs": b'{"_ARRAY_DIMENSIONS": ["time", "b"]}'})
    served = json.loads(view.metadata("time/.zarray"))
    assert served["chunks"] == [3, 2] and served["shape"] == [3, 2]
    array = view.array_of("time/0.0")
    assert array is not None and view.size("time/0.0", 99) == 3 * 2 * np.dtype(dtype).itemsize
    stored = np.arange(512 * 4).astype(dtype).reshape(512, 4)
    got = np.frombuffer(bytes(array.decode(stored.tobytes())), np.dtype(dtype).newbyteorder("<"))
    np.testing.assert_array_equal(got, stored[:3, :2].ravel())


def test_scalars_have_one_element_and_the_dimension_zdim_1():
    view = view_of({"crs": zarray("<i4", shape=(), chunks=(), fill_value=-2147483647)},
                   {"crs/.zattrs": b'{"_ARRAY_DIMENSIONS": [], "crs_wkt": "GEOGCRS[...]"}'})
    served = json.loads(view.metadata("crs/.zarray"))
    assert served["shape"] == [1] and served["chunks"] == [1]
    attrs = json.loads(view.metadata("crs/.zattrs"))
    assert attrs["_ARRAY_DIMENSIONS"] == ["_zdim_1"] and attrs["crs_wkt"] == "GEOGCRS[...]"


def test_dimension_names_get_one_length_each():
    dims = resolve_dims({"time": (["time"], [9]), "a": (["time", "x"], [3, 2]), "b": (["time"], [9]),
                         "g/v": (["g/level"], [2]), "c": (None, [4]), "d": (["time_3"], [7])})
    assert dims["time"] == ["time"] and dims["b"] == ["time"]  # the coordinate's length keeps it
    assert dims["a"] == ["time_3_", "x"]  # time_3 is taken by another dimension
    assert dims["c"] == ["_zdim_4"] and dims["d"] == ["time_3"]


@pytest.mark.parametrize("dtype, why", [
    ("|O", "variable-length"), ("|b1", "booleans"),
    ("<f2", "no netCDF type"), ("<U3", "unicode"), ("<M8[ns]", "no netCDF type"),
])
def test_what_netcdf_cannot_read_is_left_out_with_a_reason(dtype, why):
    assert why in netcdf_array(zarray(dtype)).why
    view = view_of({"v": zarray(dtype), "ok": zarray("<f4")})
    assert set(view.left_out) == {"v"} and view.is_hidden("v/.zarray") and not view.is_hidden("ok/.zarray")
    assert "v: " in view.left_out_line() and json.loads(view.describe()["netcdf_left_out"]) == view.left_out


def test_shapes_netcdf_refuses_are_left_out():
    assert "length 0" in netcdf_array(zarray("<f4", shape=(0, 3), chunks=(1, 3))).why
    assert "order F" in netcdf_array(zarray("<f4", order="F")).why
    assert netcdf_array(zarray("<f4", shape=(1, 5), chunks=(1, 5), order="F")).why is None


def test_fixed_width_strings_are_char_with_a_string_length_dimension():
    meta = zarray("|S5", shape=(4,), chunks=(2,), fill_value="")
    view = view_of({"names": meta}, {"names/.zattrs": b'{"_ARRAY_DIMENSIONS": ["station"]}'})
    served = json.loads(view.metadata("names/.zarray"))
    assert (served["dtype"], served["shape"], served["chunks"]) == ("<U1", [4, 5], [2, 5])
    assert json.loads(view.metadata("names/.zattrs"))["_ARRAY_DIMENSIONS"] == ["station", "string5"]
    zarr = json.loads(view.zarr_metadata("names/.zarray"))
    assert (zarr["dtype"], zarr["shape"], zarr["chunks"]) == ("|S5", [4], [2])
    names = view.suffixed("names")
    assert names is not None and names.fullmatch("1") and not names.fullmatch("1.0")
    slash = zarray("|S5", shape=(4,), chunks=(2,), dimension_separator="/")
    assert "dimension_separator" in netcdf_array(slash).why
    scalar = netcdf_array(zarray("|S3", shape=(), chunks=()))
    assert scalar.zarray["shape"] == [3] and not scalar.scalar


def test_a_zarray_naming_no_fill_value_is_shown_with_none():
    """A ``.zarray`` without ``fill_value`` (zarr's default: none): the view is built, the array
    shown with ``null``, and an empty ``.zarray`` is left out with a reason (never an error)."""
    meta = {"shape": [1], "chunks": [1], "dtype": "<f4"}
    assert netcdf_array(meta).zarray["fill_value"] is None
    view = view_of({"v": meta, "e": {}})
    assert json.loads(view.metadata("v/.zarray"))["fill_value"] is None
    assert "e" in view.left_out
