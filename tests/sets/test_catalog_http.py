"""Catalogues and set identities over HTTP and S3, without a mount: nginx serving a directory of
sets (its autoindex listing), a list file and a STAC Collection, and the ETag/Last-Modified that
tell a changed set; a server that does not answer (the fault-injecting server) within
``timeout``; a directory catalogue in moto's S3, whose listings s3fs caches."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest
from support.faultserver import FaultServer
from support.refsets import tiny_json, tiny_parquet
from support.servers import NginxServer, moto_s3

from refmount.base.errors import CatalogError
from refmount.sets.catalog import read_catalog
from refmount.sets.setidentity import source_identity

BOUNDS = {"max_sets": 100, "max_bytes": 1 << 20, "timeout": 10.0}
AUTOINDEX = "        location /cat/ { autoindex on; }"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("catalog-http")
    tiny_json(root / "src")
    data = (root / "src" / "refs.json").read_bytes()
    cat = root / "cat"
    cat.mkdir()
    (cat / "a.json").write_bytes(data)
    (cat / "b.json.gz").write_bytes(gzip.compress(data))
    tiny_parquet(cat / "run.parq", root / "pdata")
    (cat / "notes.txt").write_text("not a set")
    (root / "lists").mkdir()
    (root / "lists" / "sets.json").write_text(json.dumps({"sets": {
        "rel": "../cat/a.json", "hostroot": "/cat/b.json.gz",
        "opts": {"source": "../cat/a.json", "options": "decode,timeout=5"},
        "local": "file:///etc/passwd"}}))
    (root / "stac").mkdir()
    (root / "stac" / "item.json").write_text(json.dumps({
        "type": "Feature", "stac_version": "1.0.0", "id": "it", "geometry": None,
        "properties": {}, "links": [],
        "assets": {"refs": {"href": "../cat/a.json", "type": "application/json",
                            "roles": ["references"]}}}))
    (root / "stac" / "collection.json").write_text(json.dumps({
        "type": "Collection", "stac_version": "1.0.0", "id": "c",
        "links": [{"rel": "item", "href": "./item.json"}]}))
    with NginxServer(root, run_dir=tmp_path_factory.mktemp("catalog-nginx"),
                     server_extra=AUTOINDEX) as nginx:
        yield root, nginx.url


def test_http_directory(served) -> None:
    _root, url = served
    entries = read_catalog(f"{url}/cat/", {}, **BOUNDS)
    assert {n: e.source for n, e in entries.items()} == {
        "a": f"{url}/cat/a.json", "b": f"{url}/cat/b.json.gz", "run": f"{url}/cat/run.parq"}


def test_http_list_file_and_stac(served) -> None:
    _root, url = served
    entries = read_catalog(f"{url}/lists/sets.json", {}, **BOUNDS)
    assert {n: e.source for n, e in entries.items()} == {
        "hostroot": f"{url}/cat/b.json.gz", "opts": f"{url}/cat/a.json",
        "rel": f"{url}/cat/a.json"}
    assert entries["opts"].options == {"decode": "", "timeout": "5"}
    stac = read_catalog(f"{url}/stac/collection.json", {}, **BOUNDS)
    assert {n: e.source for n, e in stac.items()} == {"it": f"{url}/cat/a.json"}


def test_http_identity_changes(served) -> None:
    root, url = served
    path = root / "cat" / "a.json"
    first = source_identity(f"{url}/cat/a.json", {}, timeout=10.0)
    assert source_identity(f"{url}/cat/a.json", {}, timeout=10.0) == first
    # the same size, other content, one second later: nginx's ETag and Last-Modified change
    st = path.stat()
    tmp = root / "cat" / ".a.json.new"
    tmp.write_bytes(path.read_bytes().replace(b"AAEC", b"AAED"))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    os.rename(tmp, path)
    assert source_identity(f"{url}/cat/a.json", {}, timeout=10.0) != first
    # a Parquet directory over HTTP (no listing there): its .zmetadata
    run = source_identity(f"{url}/cat/run.parq", {}, timeout=10.0)
    meta = root / "cat" / "run.parq" / ".zmetadata"
    st = meta.stat()
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert source_identity(f"{url}/cat/run.parq", {}, timeout=10.0) != run
    with pytest.raises(FileNotFoundError):
        source_identity(f"{url}/cat/gone.json", {}, timeout=10.0)


def test_http_directory_without_listing(served) -> None:
    """nginx answers 403 for a directory it does not list: one line, no traceback."""
    _root, url = served
    with pytest.raises(CatalogError, match=r"/lists/: cannot read \(.*403"):
        read_catalog(f"{url}/lists/", {}, **BOUNDS)


def test_http_listing_without_its_slash(served) -> None:
    _root, url = served
    with pytest.raises(CatalogError, match="end the URL with /"):
        read_catalog(f"{url}/cat", {}, **BOUNDS)


def test_http_identity_without_validators(tmp_path: Path) -> None:
    """A server that sends neither ETag nor Last-Modified: the content tells the change."""
    with FaultServer(tmp_path) as srv:
        url = srv.put("a.json", b'{"a": "base64:AAEC"}')
        first = source_identity(url, {}, timeout=10.0)
        assert source_identity(url, {}, timeout=10.0) == first
        srv.put("a.json", b'{"a": "base64:AAED"}')  # the same size
        assert source_identity(url, {}, timeout=10.0) != first


def test_http_silent_server_times_out(tmp_path: Path) -> None:
    with FaultServer(tmp_path) as srv:
        url = srv.put("sets.json", json.dumps({"sets": {"a": "a.json"}}).encode())
        srv.put("a.json", b"{}")
        srv.add_fault("/sets.json", "stall", times=None, seconds=30, methods=("GET", "HEAD"))
        srv.add_fault("/a.json", "stall", times=None, seconds=30, methods=("GET", "HEAD"))
        t0 = time.monotonic()
        with pytest.raises(CatalogError, match="no answer within 1 s"):
            read_catalog(url, {}, max_sets=10, max_bytes=1 << 20, timeout=1.0)
        with pytest.raises(CatalogError, match="no answer within 1 s"):
            source_identity(srv.url_for("a.json"), {}, timeout=1.0)
        assert time.monotonic() - t0 < 10



def test_s3_directory_and_identity() -> None:
    """s3fs keeps listings: the identity of a set must still see it change."""
    import s3fs

    objects = {"cat/sets/a.json": b"{}", "cat/sets/run.parq/.zmetadata": b"{}",
               "cat/sets/run.parq/x/refs.0.parq": b"PAR1", "cat/sets/notes.txt": b"x"}
    with moto_s3(objects) as endpoint:
        options = {"key": "test", "secret": "test",
                   "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"}}
        entries = read_catalog("s3://cat/sets/", options, **BOUNDS)
        assert {n: e.source for n, e in entries.items()} == {
            "a": "s3://cat/sets/a.json", "run": "s3://cat/sets/run.parq"}
        writer = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        writer.pipe("cat/sets/b.json", b"{}")  # a new set: the catalogue is listed again
        assert list(read_catalog("s3://cat/sets/", options, **BOUNDS)) == ["a", "b", "run"]
        a = source_identity("s3://cat/sets/a.json", options, timeout=10.0)
        run = source_identity("s3://cat/sets/run.parq", options, timeout=10.0)
        assert source_identity("s3://cat/sets/a.json", options, timeout=10.0) == a
        writer.pipe("cat/sets/a.json", b"[]")  # the same size
        writer.pipe("cat/sets/run.parq/x/refs.1.parq", b"PAR1")
        assert source_identity("s3://cat/sets/a.json", options, timeout=10.0) != a
        assert source_identity("s3://cat/sets/run.parq", options, timeout=10.0) != run
