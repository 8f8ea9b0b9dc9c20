"""Reference sets as producers write them: bare ``NaN``/``Infinity``/``-Infinity`` (Python's
``json``), keys with a leading ``/``, and ``refmount inspect`` naming what it accepted.

The byte filter that lets yajl read the three tokens is checked without FUSE against Python's
``json.loads`` (hypothesis: random documents, random read sizes); the mounts are checked
against fsspec's ``ReferenceFileSystem`` reading the same file.
"""

from __future__ import annotations

import io
import json
import math
import os
import re

import fsspec
import ijson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.mounts import run_cli
from support.paths import walk

from refmount.refs.nonfinite import NonFiniteFilter, filtered

pytestmark = [pytest.mark.timeout(360)]

NAN_META = {"chunks": [4], "compressor": None, "dtype": "<f8", "fill_value": float("nan"),
            "filters": None, "order": "C", "shape": [8], "zarr_format": 2}
ATTRS = {"_ARRAY_DIMENSIONS": ["x"], "valid_max": float("inf"), "valid_min": float("-inf"),
         "note": "NaN and Infinity in a string stay text", "tricky": 'a "quoted" NaN\\'}


# --- the filter, without FUSE ----------------------------------------------------------------------


class Trickle(io.RawIOBase):
    """A stream answering each read with 1..max_read bytes (drawn), so tokens, escapes and
    strings straddle reads everywhere."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.pos, self.sizes, self.i = data, 0, sizes, 0

    def read(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        k = self.sizes[self.i % len(self.sizes)]
        self.i += 1
        out = self.data[self.pos : self.pos + k]
        self.pos += len(out)
        return out


def same(a, b) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


TEXT = st.sampled_from(["NaN", "Infinity", "-Infinity", "\\", '"', '\\"NaN', "é", "\x00", "N", "-I",
                        "Na", "x"])
STRINGS = st.lists(TEXT, max_size=5).map("".join)
ATOMS = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, None, True]),
                  st.integers(-(2**40), 2**40), st.floats(allow_nan=True), STRINGS)
VALUES = st.recursive(ATOMS, lambda c: st.lists(c, max_size=4) | st.dictionaries(STRINGS, c, max_size=4),
                      max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.dictionaries(STRINGS, VALUES, min_size=1, max_size=6),
       sizes=st.lists(st.integers(1, 12), min_size=1, max_size=8),
       indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_filter_reads_what_python_json_reads(doc, sizes, indent, ascii_only):
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    opener, backend = filtered(lambda: Trickle(text, sizes), ijson)
    with opener() as f:
        got = dict(backend.kvitems(f, "", use_float=True))
    assert same(json.loads(text), got), text


def test_filter_streams_in_bounded_pieces():
    """A 24 MB string and 100,000 NaNs go through with at most a few bytes held back."""
    big = b'{"s": "' + b"NaN \\\" Infinity " * 1_500_000 + b'", "v": [' + b"NaN, " * 100_000 + b"1]}"
    f = NonFiniteFilter(Trickle(big, [65536, 65535, 7]), "m" * 32)
    total = 0
    while chunk := f.read(65536):
        assert len(chunk) <= 65536 + 9 + 37 * (65536 // 3)
        assert f.held_back < 9
        total += len(chunk)
    assert f.replaced == 100_000
    assert total == len(big) + 100_000 * (len('"' + "m" * 32 + 'NaN"') - 3)


# --- mounts -------------------------------------------------------------------------------------------


def fsspec_view(src) -> dict[str, bytes]:
    """What fsspec's ReferenceFileSystem lists and serves (keys as its mapper gives them)."""
    fs = fsspec.filesystem("reference", fo=str(src))
    return {k: fs.cat_file(k) for k in fs.find("")}


def loads_equal(a: bytes, b: bytes) -> bool:
    return same(json.loads(a), json.loads(b))


def nan_set(target) -> dict:
    return {
        ".zgroup": {"zarr_format": 2},
        "x/.zarray": NAN_META,
        "x/.zattrs": ATTRS,
        "x/0": [str(target), 0, 32],
        "x/1": [str(target), 32, 32],
        "text": "NaN, Infinity",
    }


@pytest.mark.fuse
@pytest.mark.parametrize("version", [0, 1])
def test_nan_and_infinity_served_as_json_dumps_renders_them(mount, tmp_path, version):
    target = tmp_path / "data.bin"
    target.write_bytes(bytes(range(64)))
    refs = nan_set(target)
    doc = refs if version == 0 else {"version": 1, "templates": {"u": str(target)},
                                     "refs": {**refs, "x/1": ["{{u}}", 32, 32]}}
    src = tmp_path / "refs.json"
    src.write_text(json.dumps(doc))  # Python writes bare NaN / Infinity / -Infinity
    assert b"NaN" in src.read_bytes() and b"-Infinity" in src.read_bytes()
    m = mount(src, "no_disk_cache")
    files, _dirs = walk(m)
    theirs = fsspec_view(src)
    assert files == set(theirs)
    for key, value in refs.items():
        data = (m / key).read_bytes()
        assert os.stat(m / key).st_size == len(data)
        if isinstance(value, dict):
            assert data == json.dumps(value).encode(), key  # NaN stays NaN
            assert loads_equal(data, theirs[key]), key  # fsspec: the same JSON, maybe compact
        else:
            assert data == theirs[key], key
    assert b'"fill_value": NaN' in (m / "x/.zarray").read_bytes()


@pytest.mark.fuse
def test_big_set_with_nan_is_streamed_and_served(mount, tmp_path):
    """200,000 range keys after a NaN fill_value: parsed through the filter, every key there."""
    target = tmp_path / "data.bin"
    target.write_bytes(os.urandom(4096))
    src = tmp_path / "big.json"
    n = 200_000
    with open(src, "w") as f:
        f.write('{"x/.zarray": ' + json.dumps({**NAN_META, "shape": [n], "chunks": [1]}))
        f.write("".join(f', "x/{i}": ["{target}", {i % 4000}, {1 + i % 96}]' for i in range(n)))
        f.write(', "x/.zattrs": ' + json.dumps(ATTRS) + "}")
    m = mount(src, "no_disk_cache")
    names = os.listdir(m / "x")
    assert len(names) == n + 2
    blob = target.read_bytes()
    for i in (0, 1, 4321, n - 1):
        assert (m / f"x/{i}").read_bytes() == blob[i % 4000 : i % 4000 + 1 + i % 96]
    assert (m / "x/.zattrs").read_bytes() == json.dumps(ATTRS).encode()


@pytest.mark.fuse
def test_leading_slash_means_the_root(mount, tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(bytes(range(64)))
    refs = {"/.zgroup": '{"zarr_format":2}', "/x/.zarray": json.dumps({**NAN_META, "fill_value": None}),
            "/x/.zattrs": '{"_ARRAY_DIMENSIONS": ["x"]}', "/x/0": [str(target), 0, 32],
            "/x/1": [str(target), 32, 32], "notes/readme": "plain"}
    src = tmp_path / "refs.json"
    src.write_text(json.dumps(refs))
    m = mount(src, "no_disk_cache")
    files, dirs = walk(m)
    assert files == {".zgroup", "x/.zarray", "x/.zattrs", "x/0", "x/1", "notes/readme"}
    assert dirs == {"x", "notes"}
    fs = fsspec.filesystem("reference", fo=str(src))
    mapper = fs.get_mapper("")
    assert files == set(mapper)  # fsspec's mapper drops the '/' too
    for key in refs:
        assert (m / key.lstrip("/")).read_bytes() == fs.cat_file(key)
    import xarray as xr

    with xr.open_zarr(str(m), consolidated=False, zarr_format=2) as ds:
        assert list(ds.x.values.view("u1")[:4]) == [0, 1, 2, 3]


def test_leading_slash_clash_refused_naming_both(mount_fails, tmp_path):
    src = tmp_path / "refs.json"
    src.write_text(json.dumps({"/a/b": "one", "a/b": "two", "c": "three"}))
    _r, line = mount_fails(src)
    assert "'/a/b'" in line and "'a/b'" in line, line


def test_inspect_names_the_quirks(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(bytes(range(64)))
    refs = {("/" + k if k != "text" else k): v for k, v in nan_set(target).items()}
    src = tmp_path / "refs.json"
    src.write_text(json.dumps(refs))
    r = run_cli("inspect", str(src), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["quirks"] == {"keys had a leading '/'": 5,
                                              "numbers were a bare NaN or Infinity": 3}
    r = run_cli("inspect", str(src))
    assert "quirks accepted   5 keys had a leading '/'" in r.stdout, r.stdout
    assert "3 numbers were a bare NaN or Infinity" in r.stdout, r.stdout
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"a": '{"fill_value": "NaN"}'}))
    r = run_cli("inspect", str(plain), "--json")
    assert json.loads(r.stdout)["quirks"] == {}
    assert "quirks accepted" not in run_cli("inspect", str(plain)).stdout


def test_malformed_json_near_nan_still_refused_with_the_text_as_written(mount_fails, tmp_path):
    src = tmp_path / "refs.json"
    src.write_text('{"a": {"b": NaN,, "c": 1}}')
    _r, line = mount_fails(src, must_mention=("malformed JSON",))
    assert "near 'NaN,," in line and not re.search("[0-9a-f]{8}", line.split("near")[1]), line


@pytest.mark.fuse
def test_parquet_zmetadata_with_nan(mount, tmp_path):
    """refs_to_dataframe writes '.zmetadata' with bare NaN/Infinity when metadata values hold
    them: mounted, served as json.dumps renders them, counted by inspect."""
    from kerchunk.df import refs_to_dataframe

    target = tmp_path / "data.bin"
    target.write_bytes(bytes(range(64)))
    refs = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in nan_set(target).items()}
    del refs["text"]
    out = tmp_path / "refs.parq"
    refs_to_dataframe(refs, str(out), record_size=10)
    assert b"NaN" in (out / ".zmetadata").read_bytes()
    m = mount(out, "no_disk_cache")
    files, _dirs = walk(m)
    assert files == {".zgroup", ".zmetadata", "x/.zarray", "x/.zattrs", "x/0", "x/1"}
    assert (m / "x/.zarray").read_bytes() == json.dumps(NAN_META).encode()
    assert (m / "x/.zattrs").read_bytes() == json.dumps(ATTRS).encode()
    assert (m / "x/1").read_bytes() == bytes(range(32, 64))
    r = run_cli("inspect", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["quirks"] == {"numbers were a bare NaN or Infinity": 3}
