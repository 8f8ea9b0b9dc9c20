"""The S3 dialect serves what the HTTP view serves for every kind of set: a pinned set
(``-o pins=``, a changed target refused as ``502`` on both listeners) and an Icechunk repository,
raw (Zarr v3 keys) and through ``-o decode`` (Zarr v2), read by boto3 — every listed key, its
bytes, size and ETag equal to the HTTP view's, whose keys are walked with PROPFIND."""

from __future__ import annotations

import json
import os
import random
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path

import boto3
import numpy as np
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from support import icechunk_data as ic
from support.mounts import run_cli
from support.servers import free_port

pytestmark = [pytest.mark.timeout(600)]

D = "{DAV:}"


def s3_serve(serve, source, *opts: str):
    port = free_port()
    s = serve(source, f"s3_listen=127.0.0.1:{port}", "s3_bucket=b", *opts)
    cfg = Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    return s, boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1", config=cfg)


def http_keys(s, path: str = "/") -> list[str]:
    """Every file key of the HTTP view, walked one PROPFIND Depth 1 at a time."""
    r = s.request("PROPFIND", path, {"Depth": "1"})
    assert r.status == 207, r
    keys = []
    for resp in ET.fromstring(r.body).iter(f"{D}response"):
        href = resp.find(f"{D}href").text
        if href == path:
            continue
        if resp.find(f"{D}propstat/{D}prop/{D}resourcetype/{D}collection") is not None:
            keys += http_keys(s, href)
        else:
            keys.append(urllib.parse.unquote(href[1:]))
    return keys


def s3_keys(s3) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="b", PaginationConfig={"PageSize": 7})
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def assert_same_objects(s, s3) -> list[str]:
    keys = s3_keys(s3)
    assert sorted(keys) == sorted(http_keys(s)) and len(keys) == len(set(keys))
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket="b")["Contents"]} if len(keys) <= 1000 else {}
    for key in keys:
        http = s.request("GET", "/" + urllib.parse.quote(key))
        obj = s3.get_object(Bucket="b", Key=key)
        assert http.status == 200 and obj["Body"].read() == http.body, key
        assert obj["ETag"] == http.headers["etag"] and obj["ContentLength"] == len(http.body), key
        if key in listed:
            assert listed[key]["Size"] == len(http.body) and listed[key]["ETag"] == http.headers["etag"], key
    return keys


def test_a_pinned_set_through_s3_and_a_changed_target_refused(serve, tmp_path):
    rng = random.Random(55)
    target = tmp_path / "target.bin"
    target.write_bytes(rng.randbytes(8 * 4096))
    refs = {".zgroup": '{"zarr_format": 2}', **{f"t/{i}": [str(target), i * 4096, 4096] for i in range(8)}}
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    pins = tmp_path / "pins.json"
    r = run_cli("verify", str(source), "--pin", str(pins))
    assert r.returncode == 0 and r.stdout.strip() == "1 targets, 1 ok", r.stdout + r.stderr
    s, s3 = s3_serve(serve, source, f"pins={pins}", "no_disk_cache")
    keys = assert_same_objects(s, s3)
    assert sorted(keys) == sorted([*refs, ".zmetadata"])
    assert s3.get_object(Bucket="b", Key="t/3")["Body"].read() == target.read_bytes()[3 * 4096 : 4 * 4096]
    s.stop()
    st = target.stat()
    target.write_bytes(rng.randbytes(8 * 4096))  # another version: same size, later mtime
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    s, s3 = s3_serve(serve, source, f"pins={pins}", "no_disk_cache")
    assert s.request("GET", "/t/3").status == 502
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="b", Key="t/3")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
    assert s3_keys(s3) == sorted([*refs, ".zmetadata"], key=str.encode)  # listing needs no target


@pytest.fixture(scope="module")
def repo(tmp_path_factory, nginx, nginx_root) -> ic.Decodable:
    root = tmp_path_factory.mktemp("icechunk-s3") / "repo"
    return ic.build_decodable(root, Path(nginx_root) / "icechunk-s3", base_url="http://127.0.0.1/icechunk-s3")


@pytest.fixture(scope="module")
def authorise(nginx) -> str:
    return "targets=" + json.dumps(
        [{"prefix": "http://127.0.0.1/icechunk-s3/", "rewrite": f"{nginx.url}/icechunk-s3/"}]
    )


def test_an_icechunk_repository_raw_v3_through_s3(serve, repo, authorise):
    s, s3 = s3_serve(serve, repo.root, authorise, "no_disk_cache")
    keys = assert_same_objects(s, s3)
    for key in ("zarr.json", "temp/zarr.json", "virtual/c/0/0", "sharded/zarr.json"):
        assert key in keys, key
    assert json.loads(s3.get_object(Bucket="b", Key="temp/zarr.json")["Body"].read())["zarr_format"] == 3
    row = np.frombuffer(s3.get_object(Bucket="b", Key="virtual/c/1/0")["Body"].read(), "<f4")
    np.testing.assert_array_equal(row, (np.arange(ic.ROWS * ic.COLS, dtype="f4") * 0.5)[12:24])


def test_an_icechunk_repository_decoded_through_s3(serve, repo, authorise):
    import s3fs
    import xarray as xr

    s, s3 = s3_serve(serve, repo.root, authorise, "decode", "no_disk_cache")
    keys = assert_same_objects(s, s3)
    assert "temp/.zarray" in keys and ".zmetadata" in keys
    endpoint = s3.meta.endpoint_url
    fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
    d = xr.open_zarr(fs.get_mapper("b"), consolidated=True)
    np.testing.assert_array_equal(d["temp"].values, repo.dataset["temp"].values)
    np.testing.assert_array_equal(d["sharded"].values, repo.sharded)
