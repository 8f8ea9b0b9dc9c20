"""Through a real mount: the tree equals the key list, every st_size is exact, every file's bytes
equal the referenced bytes; ls/cat/dd and reads at odd offsets, short reads at EOF."""

from __future__ import annotations

import os
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.paths import implied_dirs, walk

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

REF_SETS = ["hand_local", "hand_http", "nc4_local", "nc4_http", "nc3_local", "nc3_http"]


@pytest.mark.parametrize("name", REF_SETS)
def test_tree_equals_key_list(shared_mounts, name):
    m = shared_mounts.get(name)
    keys = set(shared_mounts.datasets.load(name))
    files, dirs = walk(m)
    assert files == keys, (sorted(keys - files)[:10], sorted(files - keys)[:10])
    assert dirs == implied_dirs(keys)


@pytest.mark.parametrize("name", REF_SETS)
def test_stat_sizes_and_modes(shared_mounts, name):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    refs = ds.load(name)
    wrong = {}
    for key, value in refs.items():
        st_ = os.stat(m / key)
        assert stat.S_ISREG(st_.st_mode), key
        assert stat.S_IMODE(st_.st_mode) == 0o444, (key, oct(st_.st_mode))
        expected = len(ds.expected_bytes(value))
        if st_.st_size != expected:
            wrong[key] = (st_.st_size, expected)
    assert not wrong, f"st_size (got, expected): {wrong}"
    for d in implied_dirs(refs) | {""}:
        st_ = os.stat(m / d)
        assert stat.S_ISDIR(st_.st_mode), d
        assert stat.S_IMODE(st_.st_mode) == 0o555, (d, oct(st_.st_mode))


@pytest.mark.parametrize("name", REF_SETS)
def test_bytes_of_every_file(shared_mounts, name):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    wrong = []
    for key, value in ds.load(name).items():
        with open(m / key, "rb") as f:
            got = f.read()
        if got != ds.expected_bytes(value):
            wrong.append(key)
    assert not wrong, f"content differs for {len(wrong)} keys: {wrong[:20]}"


@pytest.mark.parametrize("name", ["hand_local", "hand_http"])
def test_hand_written_values(shared_mounts, name):
    """The Version 0 value forms, spelled out."""
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    assert (m / "hello.txt").read_bytes() == b"hello world\n"
    uni = "h\u00e9llo \u2713 \u2014 \u00fcn\u00efc\u00f6de \U0001f600\n".encode()
    assert (m / "unicode.txt").read_bytes() == uni
    assert os.stat(m / "unicode.txt").st_size == len(uni)  # bytes, not characters
    assert (m / "control.txt").read_bytes() == b"nul\x00tab\tnewline\nend"
    assert (m / "empty.txt").read_bytes() == b""
    # base64: decoded size, not the encoded length
    all_bytes = (m / "b64/all_bytes.bin").read_bytes()
    assert all_bytes[:256] == bytes(range(256)) and len(all_bytes) == 556
    assert os.stat(m / "b64/all_bytes.bin").st_size == 556
    assert (m / "b64/short").read_bytes() == b"ab"
    assert (m / "b64/empty").read_bytes() == b""
    # JSON objects: json.dumps(obj)
    obj = {"a": 1, "nested": {"b": [1, 2.5, None, True]}, "s": "x\u00e9y"}
    import json

    assert (m / "json/obj.json").read_text() == json.dumps(obj)
    assert (m / "json/empty.json").read_bytes() == b"{}"
    assert (m / "json/.zattrs").read_text() == json.dumps({"_ARRAY_DIMENSIONS": ["x"],
                                                            "units": "m"})
    # whole targets and ranges
    blob = ds.blob.read_bytes()
    assert os.stat(m / "whole/blob.bin").st_size == len(blob)
    assert (m / "whole/blob.bin").read_bytes() == blob
    assert (m / "whole/tiny.bin").read_bytes() == b"!"
    assert (m / "whole/file-url.bin").read_bytes() == b"!"
    assert (m / "range/middle").read_bytes() == blob[12_345 : 12_345 + 4_321]
    assert (m / "range/large").read_bytes() == blob[1_000 : 1_000 + 700_001]
    assert (m / "range/last").read_bytes() == blob[-10:]
    assert (m / "range/one").read_bytes() == blob[777:778]
    assert (m / "a/b/c/d/e/deep.txt").read_bytes() == b"deep down\n"
    assert sorted(os.listdir(m / "a")) == ["b", "top"]
    assert sorted(os.listdir(m / "a/b")) == ["c", "sibling"]
    assert (m / "dir with space/file name.txt").read_bytes() == b"spaces are fine\n"


def test_ls_la(shared_mounts):
    m = shared_mounts.get("hand_local")
    ds = shared_mounts.datasets
    refs = ds.load("hand_local")
    out = subprocess.run(["ls", "-la", "--time-style=+", str(m / "range")],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines()[1:]:
        parts = line.split()
        rows[parts[-1]] = (parts[0], int(parts[4]))
    assert rows["."][0].startswith("dr-xr-xr-x")
    for name in ("first", "middle", "large", "last", "one"):
        mode, size = rows[name]
        assert mode.startswith("-r--r--r--"), line
        assert size == len(ds.expected_bytes(refs[f"range/{name}"]))
    root = subprocess.run(["ls", "-la", str(m)], capture_output=True, text=True,
                          check=True).stdout
    for entry in (".zgroup", "a", "b64", "json", "range", "whole", "hello.txt"):
        assert any(line.endswith(" " + entry) for line in root.splitlines()), (entry, root)


@pytest.mark.parametrize("name", ["nc4_local", "nc4_http", "hand_http"])
def test_cat(shared_mounts, name):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    refs = ds.load(name)
    for key in (".zgroup", ".zattrs", "temp/.zarray", "temp/0.0.0", "flags/0.0", "whole/blob.bin"):
        if key not in refs:
            continue
        out = subprocess.run(["cat", str(m / key)], capture_output=True, check=True).stdout
        assert out == ds.expected_bytes(refs[key]), key


DD_CASES = [
    # (bs, skip, count)
    (7, 3, 5),
    (1, 0, 1),
    (13, 17, 1),
    (4093, 5, 3),
    (65537, 1, 3),
    (131071, 3, 2),
    (1_000_003, 0, 1),
    (999, 1500, 1),  # offset past EOF of the 1 MiB blob: nothing
]


@pytest.mark.parametrize("name", ["hand_local", "hand_http"])
@pytest.mark.parametrize("key", ["whole/blob.bin", "range/large", "range/middle"])
def test_dd_odd_offsets(shared_mounts, name, key):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    data = ds.expected_bytes(ds.load(name)[key])
    for bs, skip, count in DD_CASES:
        out = subprocess.run(
            ["dd", f"if={m / key}", f"bs={bs}", f"skip={skip}", f"count={count}",
             "status=none"],
            capture_output=True, check=True,
        ).stdout
        assert out == data[bs * skip : bs * (skip + count)], (key, bs, skip, count)
    # the last bytes, asking for more than there is: a short read
    out = subprocess.run(
        ["dd", f"if={m / key}", "bs=1", f"skip={len(data) - 3}", "count=10", "status=none"],
        capture_output=True, check=True,
    ).stdout
    assert out == data[-3:]


@pytest.mark.parametrize("name", ["hand_local", "hand_http", "nc4_local"])
def test_reads_past_eof_are_short(shared_mounts, name):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    refs = ds.load(name)
    keys = [k for k in refs if isinstance(refs[k], list)][:6] + [
        k for k in refs if isinstance(refs[k], str | dict)][:6]
    for key in keys:
        data = ds.expected_bytes(refs[key])
        fd = os.open(m / key, os.O_RDONLY)
        try:
            n = len(data)
            assert os.pread(fd, n + 4096, 0) == data, key
            assert os.pread(fd, 100, max(n - 5, 0)) == data[max(n - 5, 0) :], key
            assert os.pread(fd, 100, n) == b"", key
            assert os.pread(fd, 100, n + 12345) == b"", key
        finally:
            os.close(fd)


@pytest.mark.parametrize("name", ["hand_local", "hand_http"])
def test_random_preads(shared_mounts, name):
    m = shared_mounts.get(name)
    ds = shared_mounts.datasets
    refs = ds.load(name)
    files = {k: ds.expected_bytes(refs[k]) for k in ("whole/blob.bin", "range/large",
                                                       "range/middle", "b64/all_bytes.bin")}

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(key=st.sampled_from(sorted(files)), offset=st.integers(0, 1_600_000),
           size=st.integers(0, 300_000))
    def check(key, offset, size):
        fd = os.open(m / key, os.O_RDONLY)
        try:
            assert os.pread(fd, size, offset) == files[key][offset : offset + size]
        finally:
            os.close(fd)

    check()


@pytest.mark.parametrize("name", ["hand_http", "nc4_local"])
def test_concurrent_readers(mount, http_datasets, name):
    """Many threads reading the same and different files at once, on a fresh mount (nothing
    cached yet): every read gets exactly its bytes."""
    m = mount(http_datasets.refs[name])
    refs = http_datasets.load(name)
    keys = [k for k, v in refs.items() if isinstance(v, list)]
    expected = {k: http_datasets.expected_bytes(refs[k]) for k in keys}

    def read(i: int) -> list[str]:
        bad = []
        for k in keys[i % len(keys):] + keys[: i % len(keys)]:
            with open(m / k, "rb") as f:
                if f.read() != expected[k]:
                    bad.append(k)
        return bad

    with ThreadPoolExecutor(16) as pool:
        bad = [k for result in pool.map(read, range(32)) for k in result]
    assert not bad, f"wrong bytes under concurrency: {sorted(set(bad))[:10]}"


def test_statfs(shared_mounts):
    m = shared_mounts.get("hand_local")
    st_ = os.statvfs(m.path)
    assert st_.f_namemax >= 255
    out = subprocess.run(["df", str(m.path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


JSON_EDGE_CASES = {
    # ints beyond 64 bits are valid JSON; Python's json reads and writes them exactly
    "big-ints": '{"u.json": {"u": 12345678901234567890}, '
                '"n.json": {"n": -98765432109876543210}, "plain": "x"}',
    "other": '{"exp.json": {"a": 1e300, "b": 5e-324, "c": 1.5e-10, "d": 123456789012345680.0}, '
             '"deep.json": {"a": [[[[[[[[[[{"b": [[[[[]]]]]}]]]]]]]]]]}, '
             '"dup.json": {"k": 1, "k": 2}, "plain": "x"}',
}


@pytest.mark.parametrize("case", list(JSON_EDGE_CASES))
def test_json_object_values_edge_cases(mount, tmp_path, case):
    """JSON-object values read back as ``json.dumps`` of what Python's json parses
    (duplicate keys: the last wins)."""
    import json

    text = JSON_EDGE_CASES[case]
    src = tmp_path / "refs.json"
    src.write_text(text)
    m = mount(src)
    wrong = {}
    for key, value in json.loads(text).items():
        expected = json.dumps(value).encode() if isinstance(value, dict) else value.encode()
        got = (m / key).read_bytes()
        if got != expected or os.stat(m / key).st_size != len(expected):
            wrong[key] = (got, expected)
    assert not wrong, wrong
