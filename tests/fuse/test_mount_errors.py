"""Bad input: the CLI exits non-zero with ONE line ``refmount: error: ...`` naming the problem,
and leaves no mount and no daemon behind (checked in /proc/mounts and /proc/*/cmdline)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]


def write(tmp_path, name: str, text: str | bytes):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_missing_source(mount_fails, tmp_path):
    mount_fails(tmp_path / "no-such-refs.json", must_mention=("no-such-refs.json",))


def test_missing_compressed_source(mount_fails, tmp_path):
    mount_fails(tmp_path / "no-such-refs.json.zst", must_mention=("no-such-refs.json.zst",))


def test_missing_source_over_http(mount_fails, nginx):
    mount_fails(f"{nginx.url}/refs/no-such-refs.json", must_mention=("no-such-refs.json",))


@pytest.mark.parametrize(
    "text",
    ['{"a": "b",', '{"a": "b"} trailing', "", "   ", "{'a': 'b'}", '{"a": [1, 2}',
     "\x00\x01binary"],
    ids=["truncated", "trailing", "empty", "blank", "single-quotes", "bad-bracket", "binary"],
)
def test_malformed_json(mount_fails, tmp_path, text):
    src = write(tmp_path, "bad.json", text)
    mount_fails(src, must_mention=("json",))


@pytest.mark.parametrize("text", ['["a", "b"]', '"just a string"', "42", "null", "true"],
                         ids=["array", "string", "number", "null", "bool"])
def test_top_level_not_an_object(mount_fails, tmp_path, text):
    src = write(tmp_path, "notobj.json", text)
    mount_fails(src, must_mention=("object",))


@pytest.mark.parametrize("name", ["refs.json.gz", "refs.json.zst"])
def test_corrupt_compressed_source(mount_fails, tmp_path, name):
    """Not gzip/zstd data at all: the error line names the source file."""
    src = write(tmp_path, name, b"this is not compressed data at all")
    mount_fails(src, must_mention=(name,))


def test_gzip_of_malformed_json(mount_fails, tmp_path):
    src = write(tmp_path, "refs.json.gz", gzip.compress(b'{"a": '))
    mount_fails(src, must_mention=("json",))


BAD_VALUES = {
    "int": 5,
    "float": 1.5,
    "null": None,
    "bool": True,
    "empty-list": [],
    "two-items": ["/etc/hostname", 0],
    "four-items": ["/etc/hostname", 0, 1, 2],
    "url-not-string": [1],
    "url-not-string-range": [7, 0, 10],
    "offset-string": ["/etc/hostname", "0", 10],
    "length-string": ["/etc/hostname", 0, "10"],
    "offset-float": ["/etc/hostname", 1.5, 10],
    "offset-negative": ["/etc/hostname", -1, 10],
    "length-negative": ["/etc/hostname", 0, -10],
    "nested-list": [["/etc/hostname"]],
}


@pytest.mark.parametrize("value", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_value_of_wrong_type(mount_fails, tmp_path, value):
    refs = {".zgroup": '{"zarr_format":2}', "ok/file": "fine", "bad/key": value}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    mount_fails(src, must_mention=("bad/key",))


@pytest.mark.parametrize("payload", ["abc", "a", "%%%%", "Zm9v!!!!", "Zm9v\u00e9A=="],
                         ids=["bad-padding", "one-char", "not-alphabet", "junk-tail",
                              "non-ascii"])
def test_bad_base64(mount_fails, tmp_path, payload):
    refs = {"ok/file": "fine", "bad/key": "base64:" + payload}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    mount_fails(src, must_mention=("bad/key",))


def test_missing_mountpoint(mount_fails, datasets, tmp_path):
    mount_fails(datasets.refs["hand_local"], mnt=tmp_path / "no-such-dir",
                must_mention=("no-such-dir",))


def test_mountpoint_is_a_file(mount_fails, datasets, tmp_path):
    f = write(tmp_path, "a-file", "x")
    mount_fails(datasets.refs["hand_local"], mnt=f, must_mention=("a-file",))


@pytest.mark.parametrize(
    "opt", ["no_such_option=1", "remote_options=not-json", "target_options=[1]",
            "timeout=soon", "uid=someone", "log_level=loud", "timeout=nan", "attr_timeout=inf",
            "uid=-5", "gid=1099511627776", "umask=1022", "cache_size=nan"],
    ids=["unknown", "remote-options-not-json", "target-options-not-object", "timeout",
         "uid", "log-level", "timeout-nan", "attr-timeout-inf", "uid-negative", "gid-too-big",
         "umask-not-a-mode", "cache-size-nan"],
)
def test_bad_option(mount_fails, datasets, opt):
    mount_fails(datasets.refs["hand_local"], opt, must_mention=(opt.split("=")[0],))


def test_error_then_good_mount_on_same_mountpoint(mount_fails, mount, datasets, tmp_path):
    """A failed attempt leaves the mountpoint usable."""
    mnt = tmp_path / "reuse"
    mnt.mkdir()
    mount_fails(write(tmp_path, "bad.json", "[1]"), mnt=mnt)
    m = mount(datasets.refs["hand_local"], mnt=mnt)
    assert (m / "hello.txt").read_bytes() == b"hello world\n"


def test_allow_local_confines_local_targets(mount_fails, mount, datasets, tmp_path):
    """allow_local=DIR: local targets outside DIR are refused at mount time, naming the key."""
    refs = {"inside": "text", "outside/blob": [str(datasets.blob), 10, 20]}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    _r, line = mount_fails(src, f"allow_local={tmp_path}", must_mention=("outside/blob",))
    assert "allow_local" in line, line
    m = mount(src, f"allow_local={datasets.data_dir}")
    assert (m / "outside/blob").read_bytes() == datasets.blob.read_bytes()[10:30]


def test_shared_mount_confines_local_targets_to_source_dir(mount_fails, mount, datasets,
                                                           tmp_path):
    """With allow_other (a shared mount) the default allows only SOURCE's directory; a private
    mount (the default) may read any local file its user can."""
    refs = {"outside/blob": [str(datasets.blob), 10, 20]}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    _r, line = mount_fails(src, "allow_other", must_mention=("outside/blob",))
    assert "allow_local" in line, line
    m = mount(src)  # private
    assert (m / "outside/blob").read_bytes() == datasets.blob.read_bytes()[10:30]
    m2 = mount(datasets.refs["hand_local"], "allow_other")  # targets below SOURCE's directory
    assert (m2 / "range/one").read_bytes() == datasets.blob.read_bytes()[777:778]


@pytest.mark.parametrize("target", ["{data}/../../../../../../etc/hostname",
                                    "file://{data}/../../../../../../etc/hostname"],
                         ids=["dotdot-path", "dotdot-file-url"])
def test_local_target_escaping_with_dotdot_refused(mount_fails, datasets, target):
    refs = {"sneaky": [target.format(data=datasets.data_dir)]}
    src = write(datasets.root, "sneaky.json", json.dumps(refs))
    try:
        mount_fails(src, f"allow_local={datasets.data_dir}", must_mention=("sneaky",))
    finally:
        src.unlink()


BAD_KEYS = {
    "empty": "",
    "leading-slashes": "//abs/key",
    "double-slash": "a//b",
    "trailing-slash": "dir/",
    "dot": "a/./b",
    "dotdot": "../escape",
    "inner-dotdot": "a/../b",
    "only-dot": ".",
    "only-dotdot": "..",
    "nul": "nul\x00key",
    "too-long": "d/" + "x" * 256,
}


@pytest.mark.parametrize("key", list(BAD_KEYS.values()), ids=list(BAD_KEYS))
def test_bad_key_refused_by_default(mount_fails, tmp_path, key):
    refs = {"good/file": "fine", key: "data"}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    _r, line = mount_fails(src)
    printable = key and key.isprintable() and len(key) < 100
    if printable:
        assert key in line, f"error line does not name the key {key!r}: {line}"


def test_file_that_is_also_a_directory_refused(mount_fails, tmp_path):
    refs = {"x/y": "file y", "x/y/z": "y as a directory"}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    _r, line = mount_fails(src)
    assert "x/y" in line, line


def test_bad_keys_skip(mount, tmp_path):
    """bad_keys=skip mounts the good keys and leaves the bad ones out."""
    refs = {"good/file": "fine", "top": "top", **{k: "bad" for k in BAD_KEYS.values()}}
    src = write(tmp_path, "refs.json", json.dumps(refs))
    m = mount(src, "bad_keys=skip")
    found = set()
    for dirpath, _dirnames, filenames in os.walk(m.path):
        rel = os.path.relpath(dirpath, m.path)
        found.update(f if rel == "." else f"{rel}/{f}" for f in filenames)
    assert found == {"good/file", "top"}
    assert (m / "good/file").read_bytes() == b"fine"


@pytest.mark.parametrize("refs", [[["a", "b"]], "x", 5], ids=["list", "string", "number"])
def test_version_1_refs_that_is_not_an_object(mount_fails, tmp_path, refs):
    """Not an empty mount: the set is refused, naming the section."""
    src = write(tmp_path, "refs.json", json.dumps({"version": 1, "refs": refs}))
    mount_fails(src, must_mention=("'refs'",))
