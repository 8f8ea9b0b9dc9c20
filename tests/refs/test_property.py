"""Property-based: random small reference sets — inline text, ``base64:``, JSON
objects, byte ranges and whole local files, under random valid keys, as Version 0 or Version 1
(with a template) — mount, and ``find``, ``stat`` and ``cat`` agree with the set exactly; the
daemon never dies and logs no unexpected exception.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.mounts import LIVE_MOUNTERS, Mounter, is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.long(40), pytest.mark.timeout(600)]

DATA_SIZES = {"a.bin": 70_001, "b.bin": 513, "empty.bin": 0}

# --- strategies -------------------------------------------------------------------------------------

_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00")
_short = st.text(_chars, min_size=1, max_size=10)
_long = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/"),
                min_size=240, max_size=255)
_tricky = st.sampled_from(["-n", "--", "...", " ", "a b", "\n", "\t", "*", "?", "\\", "'\"",
                           "\u00e9", "\u00c5\u0301", "\U0001f600", ".hidden", "x.", "CON"])
component = st.one_of(_short, _short, _short, _tricky, _long).filter(
    lambda c: c not in (".", "..") and len(c.encode()) <= 255)
path = st.lists(component, min_size=1, max_size=4)


@st.composite
def value(draw):
    kind = draw(st.sampled_from(["text", "base64", "json", "range", "range", "whole"]))
    if kind == "text":
        text = draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
        return text if not text.startswith("base64:") else "x" + text
    if kind == "base64":
        return "base64:" + base64.b64encode(draw(st.binary(max_size=300))).decode()
    if kind == "json":
        return draw(st.dictionaries(st.text(max_size=5),
                                    st.one_of(st.integers(-1000, 1000), st.text(max_size=8)),
                                    max_size=4))
    name = draw(st.sampled_from(sorted(DATA_SIZES)))
    if kind == "whole":
        return [name]
    size = DATA_SIZES[name]
    off = draw(st.integers(0, size))
    return [name, off, draw(st.integers(0, size - off))]


@st.composite
def reference_set(draw) -> dict[str, object]:
    """Keys that are valid paths and never both a file and a directory."""
    files: dict[tuple[str, ...], object] = {}
    dirs: set[tuple[str, ...]] = set()
    for p in draw(st.lists(path, min_size=1, max_size=20)):
        t = tuple(p)
        if t in files or t in dirs or any(t[:i] in files for i in range(1, len(t))):
            continue
        files[t] = draw(value())
        dirs.update(t[:i] for i in range(1, len(t)))
    return {"/".join(k): v for k, v in files.items()}


# --- expectations -------------------------------------------------------------------------------------


def expected_bytes(v, data_dir: Path) -> bytes:
    if isinstance(v, str):
        return base64.b64decode(v[7:]) if v.startswith("base64:") else v.encode()
    if isinstance(v, dict):
        return json.dumps(v).encode()
    blob = (data_dir / v[0]).read_bytes()
    return blob if len(v) == 1 else blob[v[1] : v[1] + v[2]]


def with_urls(refs: dict[str, object], data_dir: Path, version: int) -> dict:
    out = {}
    for k, v in refs.items():
        if isinstance(v, list):
            url = "{{d}}/" + v[0] if version == 1 else str(data_dir / v[0])
            v = [url, *v[1:]]
        out[k] = v
    if version == 1:
        return {"version": 1, "templates": {"d": str(data_dir)}, "refs": out}
    return out


# --- the property ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("property")
    data = d / "data"
    data.mkdir()
    for i, (name, size) in enumerate(DATA_SIZES.items()):
        (data / name).write_bytes(bytes((j * 7 + i) % 251 for j in range(size)))
    return d


_counter = [0]


@settings(max_examples=15, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(refs=reference_set(), version=st.sampled_from([0, 1]))
def test_find_stat_cat_agree_with_the_reference_set(workdir, refs, version):
    _counter[0] += 1
    ex = workdir / f"ex{_counter[0]}"
    ex.mkdir()
    data_dir = workdir / "data"
    src = ex / "refs.json"
    src.write_text(json.dumps(with_urls(refs, data_dir, version)))
    expected = {k: expected_bytes(v, data_dir) for k, v in refs.items()}
    dirs = {"/".join(k.split("/")[:i]) for k in refs for i in range(1, k.count("/") + 1)}

    mounter = Mounter(ex / "mounts")
    LIVE_MOUNTERS.append(mounter)
    try:
        m = mounter(src, "no_disk_cache")
        (daemon,) = [p for p in m.procs if "refmount.fuse.daemon" in " ".join(p.cmdline())]
        root = str(m.path)

        # find: the tree is exactly the keys and their parent directories
        r = subprocess.run(["find", root, "-mindepth", "1", "-printf", "%y %P\\0"],
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        entries = [e.decode() for e in r.stdout.split(b"\0") if e]
        got_files = {e[2:] for e in entries if e[0] == "f"}
        got_dirs = {e[2:] for e in entries if e[0] == "d"}
        assert {e[0] for e in entries} <= {"f", "d"}, entries
        assert got_files == set(expected), (got_files ^ set(expected))
        assert got_dirs == dirs, (got_dirs ^ dirs)

        keys = sorted(expected)
        paths = [os.path.join(root, k) for k in keys]
        # stat: sizes (GNU stat) and modes (os.stat)
        r = subprocess.run(["stat", "--printf", "%s\\n", "--", *paths], capture_output=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        sizes = [int(s) for s in r.stdout.split()]
        assert sizes == [len(expected[k]) for k in keys], [
            (k, s, len(expected[k])) for k, s in zip(keys, sizes, strict=True)
            if s != len(expected[k])]
        for p in paths:
            st_ = os.stat(p)
            assert stat.S_ISREG(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o444, p
        for d in dirs:
            st_ = os.stat(os.path.join(root, d))
            assert stat.S_ISDIR(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o555, d

        # cat: the bytes, all files in one go, then each file that differs
        r = subprocess.run(["cat", "--", *paths], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        if r.stdout != b"".join(expected[k] for k in keys):
            wrong = [k for k, p in zip(keys, paths, strict=True)
                     if subprocess.run(["cat", "--", p], capture_output=True).stdout != expected[k]]
            raise AssertionError(f"cat differs for {wrong!r}")

        # the daemon is alive, still mounted, and logged no unexpected exception
        assert daemon.is_running() and daemon.status() != psutil.STATUS_ZOMBIE
        assert is_mounted(m.path)
        log = m.log.read_text(errors="replace")
        assert "Traceback" not in log and " raised" not in log, log[-3000:]
        assert "read failed" not in log, log[-3000:]
    finally:
        LIVE_MOUNTERS.remove(mounter)
        problems = mounter.cleanup()
        assert not problems, problems
