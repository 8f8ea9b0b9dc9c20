"""The HTML index (refmount.http.listing) read by the real clients over HTTP, without a mount.

A directory tree with awkward names gets an ``index.html`` in every directory written by
``html_index``; nginx serves it. GDAL 3.6's ``/vsicurl/`` (its Python bindings, from Debian's
``python3-gdal``, a dependency of ``gdal-bin``) and fsspec's ``HTTPFileSystem`` list it and
read files by the names they listed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import unquote_to_bytes

import fsspec
import pytest
from support.servers import NginxServer

from refmount.http.listing import Entry, html_index

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-gdal is installed for it, not the venv
FILES = [
    b"plain.bin", b".zarray", b"0.0.0", b"a b", "ünï".encode(), b"x&y", b"q?z", b"%41", b'a"b',
    b"it's", b"<b>", b"#frag", b"\xff\xfe", b"new\nline", b"-Jan-x", b"http:", b"Parent Directory",
]
DIRS = [b"sub dir", b"d&<", "ü b".encode()]

GDAL_WALK = r"""
import json, sys
from osgeo import gdal
gdal.UseExceptions()
base = sys.argv[1]
out = {}
def walk(rel):
    names = gdal.ReadDir(f"/vsicurl/{base}/{rel}")
    out[rel] = names
    for n in names or []:
        path = f"/vsicurl/{base}/{rel}{n}"
        st = gdal.VSIStatL(path)
        if st.IsDirectory():
            walk(f"{rel}{n}/")
        else:
            f = gdal.VSIFOpenL(path, "rb")
            data = gdal.VSIFReadL(1, st.size, f)
            gdal.VSIFCloseL(f)
            out[f"{rel}{n}"] = data.hex()
walk("")
print(json.dumps(out))
"""


def content(name: bytes) -> bytes:
    return b"<" + name + b">"


def build(root: Path, rel: bytes = b"", depth: int = 0) -> set[bytes]:
    """Files and directories under ``root/rel`` with an ``index.html`` each; their paths."""
    here = os.path.join(bytes(root), rel)
    os.makedirs(here, exist_ok=True)
    paths = set()
    entries = []
    for name in FILES:
        with open(os.path.join(here, name), "wb") as f:
            f.write(content(name))
        entries.append(Entry(name, False, len(content(name))))
        paths.add(rel + name)
    if depth < 1:
        for d in DIRS:
            paths |= build(root, rel + d + b"/", depth + 1)
            entries.append(Entry(d, True, None))
            paths.add(rel + d + b"/")
    with open(os.path.join(here, b"index.html"), "wb") as f:
        f.write(html_index(b"/" + rel, entries, mtime=1_790_000_000))
    return paths


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "root"
    paths = build(root)
    with NginxServer(root, run_dir=tmp_path / "run") as srv:
        yield srv, paths


def test_gdal_lists_and_reads_the_index(served):
    srv, paths = served
    proc = subprocess.run([SYSTEM_PYTHON, "-c", GDAL_WALK, srv.url], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    listed = {unquote_to_bytes(rel) + unquote_to_bytes(n) + (b"/" if (rel + n + "/") in out else b"")
              for rel, names in out.items() if isinstance(names, list) for n in names}
    assert listed == paths
    files = {unquote_to_bytes(k): bytes.fromhex(v) for k, v in out.items() if isinstance(v, str)}
    assert len(files) == sum(not p.endswith(b"/") for p in paths)
    for path, data in files.items():
        assert data == content(path.rsplit(b"/", 1)[-1])


def test_fsspec_lists_and_reads_the_index(served):
    srv, paths = served
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    found: set[bytes] = set()
    todo = [srv.url + "/"]
    while todo:
        url = todo.pop()
        for item in fs.ls(url, detail=True):
            rel = unquote_to_bytes(item["name"][len(srv.url) + 1:])
            found.add(rel)
            if item["type"] == "directory":
                todo.append(item["name"])
            elif rel in (b"a b", b"q?z", b"\xff\xfe", b"sub dir/#frag"):
                assert fs.cat(item["name"]) == content(rel.rsplit(b"/", 1)[-1])
    assert found == paths
