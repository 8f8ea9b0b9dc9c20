"""WebDAV listings of ``refmount serve`` (PROPFIND, Depth 0 and 1), read by rclone's webdav
backend (listing and ``rclone mount``) and obstore's ``HTTPStore``; every write method 405;
Depth infinity refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.datasets import write_json

pytestmark = [pytest.mark.timeout(600)]

D = "{DAV:}"


@pytest.fixture
def keyset(datasets):
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "a&b<c>.txt": "amp",
        "sp ace.txt": "space",
        "dir/sub/one": "1",
        "dir/three": "3",
        "big": [str(datasets.blob), 10, 5000],
    }
    return write_json(datasets.blob.parent.parent / "davkeys.json", refs)


def props(body: bytes) -> dict[str, dict[str, str | None]]:
    out = {}
    for r in ET.fromstring(body).iter(f"{D}response"):
        href = r.find(f"{D}href").text
        p = r.find(f"{D}propstat/{D}prop")
        out[href] = {
            "dir": p.find(f"{D}resourcetype/{D}collection") is not None,
            **{
                k: (p.find(f"{D}{k}").text if p.find(f"{D}{k}") is not None else None)
                for k in ("getcontentlength", "getetag", "getlastmodified", "displayname")
            },
        }
    return out


def test_propfind_depths_options_and_writes(serve, keyset):
    s = serve(keyset)
    r = s.request("OPTIONS", "/")
    assert r.status == 204 and r.headers["dav"] == "1" and "PROPFIND" in r.headers["allow"]
    r = s.request("PROPFIND", "/", {"Depth": "1"})
    assert r.status == 207, r
    got = props(r.body)
    assert set(got) == {"/", "/.zgroup", "/.zmetadata", "/a%26b%3Cc%3E.txt", "/sp%20ace.txt", "/dir/", "/big"}
    for href in ("/big", "/a%26b%3Cc%3E.txt", "/.zmetadata"):
        head = s.request("HEAD", href)
        assert (
            got[href]["getetag"] == head.headers["etag"]
            and got[href]["getcontentlength"] == head.headers["content-length"]
            and got[href]["getlastmodified"] == head.headers["last-modified"]
        )
    assert got["/dir/"]["dir"] and got["/a%26b%3Cc%3E.txt"]["displayname"] == "a&b<c>.txt"
    assert set(props(s.request("PROPFIND", "/dir/", {"Depth": "1"}).body)) == {
        "/dir/",
        "/dir/sub/",
        "/dir/three",
    }
    assert set(props(s.request("PROPFIND", "/dir/", {"Depth": "0"}).body)) == {"/dir/"}
    assert props(s.request("PROPFIND", "/big", {"Depth": "0"}).body)["/big"]["getcontentlength"] == "5000"
    assert s.request("PROPFIND", "/nope", {"Depth": "1"}).status == 404
    for depth in ({"Depth": "infinity"}, {}):
        r = s.request("PROPFIND", "/", depth)
        assert r.status == 403 and b"propfind-finite-depth" in r.body
    for method in ("PUT", "DELETE", "MKCOL", "PROPPATCH", "LOCK", "UNLOCK", "COPY", "MOVE", "POST"):
        r = s.request(method, "/big")
        assert r.status == 405 and "PROPFIND" in r.headers["allow"], method


def test_rclone_webdav_and_obstore_http_store_list_and_read(serve, keyset, datasets):
    s = serve(keyset)
    rclone = shutil.which("rclone")
    assert rclone, "rclone is not installed (scripts/setup.sh installs it)"
    out = subprocess.run(
        [rclone, "lsf", "-R", "--files-only", f":webdav,url='{s.url}':"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RCLONE_CONFIG": "/dev/null"},
    )
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:-1]) == sorted(
        [".zgroup", ".zmetadata", "a&b<c>.txt", "sp ace.txt", "dir/sub/one", "dir/three", "big"]
    )
    out = subprocess.run(
        [rclone, "cat", f":webdav,url='{s.url}':big"],
        capture_output=True,
        timeout=120,
        env={**os.environ, "RCLONE_CONFIG": "/dev/null"},
    )
    assert out.returncode == 0 and out.stdout == datasets.blob.read_bytes()[10:5010]
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(s.url, client_options={"allow_http": True})
    listed = obstore.list_with_delimiter(store, "dir")
    assert [o["path"] for o in listed["objects"]] == ["dir/three"] and listed["common_prefixes"] == [
        "dir/sub"
    ]
    top = obstore.list_with_delimiter(store)
    head = s.request("HEAD", "/big")
    big = next(o for o in top["objects"] if o["path"] == "big")
    assert big["size"] == 5000 and big["e_tag"] == head.headers["etag"]
    assert bytes(obstore.get_range(store, "big", start=0, end=100)) == datasets.blob.read_bytes()[10:110]


def test_a_catalogues_root_lists_its_sets_and_each_set_its_keys(serve, keyset, tmp_path):
    cat = tmp_path / "cat"
    cat.mkdir()
    (cat / "one.json").write_text(keyset.read_text())
    (cat / "two.json").write_text('{"x": "1"}')
    s = serve(cat, "catalog", f"allow_local={cat}:{keyset.parent}")
    got = props(s.request("PROPFIND", "/", {"Depth": "1"}).body)
    assert set(got) == {"/", "/one/", "/two/"} and all(p["dir"] for p in got.values())
    assert set(props(s.request("PROPFIND", "/two/", {"Depth": "1"}).body)) == {
        "/two/",
        "/two/x",
        "/two/.zmetadata",
    }
    assert (
        props(s.request("PROPFIND", "/one/big", {"Depth": "0"}).body)["/one/big"]["getcontentlength"]
        == "5000"
    )
    assert s.request("PROPFIND", "/", {"Depth": "infinity"}).status == 403


def test_rclone_mount_over_webdav_lists_and_reads_what_the_http_view_serves(serve, keyset, tmp_path):
    """A FUSE mount of the HTTP view by a WebDAV client (``rclone mount`` over its webdav backend,
    which walks the tree with PROPFIND Depth 1): the same tree, sizes and bytes."""
    s = serve(keyset)
    rclone, fusermount = shutil.which("rclone"), shutil.which("fusermount3")
    assert rclone and fusermount, "rclone and fusermount3 are installed by scripts/setup.sh"
    mnt = tmp_path / "davmnt"
    mnt.mkdir()
    proc = subprocess.Popen(
        [rclone, "mount", f":webdav,url='{s.url}':", str(mnt), "--read-only", "--vfs-cache-mode", "off"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "RCLONE_CONFIG": "/dev/null"},
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mnt):
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
            assert time.monotonic() < deadline, "rclone mount did not mount in 60 s"
            time.sleep(0.1)
        seen = {}
        for root, _dirs, files in os.walk(mnt):
            for name in files:
                path = os.path.join(root, name)
                seen[os.path.relpath(path, mnt)] = (os.stat(path).st_size, Path(path).read_bytes())
        assert sorted(seen) == sorted(
            [".zgroup", ".zmetadata", "a&b<c>.txt", "sp ace.txt", "dir/sub/one", "dir/three", "big"]
        )
        for key, (size, data) in seen.items():
            http = s.request("GET", "/" + urllib.parse.quote(key))
            assert http.status == 200 and data == http.body and size == len(http.body), key
        with open(mnt / "big", "rb") as f:  # a read in the middle: a ranged GET
            f.seek(1234)
            assert f.read(100) == s.request("GET", "/big", {"Range": "bytes=1234-1333"}).body
        with pytest.raises(OSError):
            (mnt / "new").write_bytes(b"x")
    finally:
        subprocess.run([fusermount, "-u", str(mnt)], capture_output=True, timeout=30)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
