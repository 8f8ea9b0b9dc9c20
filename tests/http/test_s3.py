"""``refmount serve --s3-listen``: the S3 dialect read by real S3 clients on loopback (boto3
unsigned and signed, s3fs with xarray, the aws CLI, rclone's s3 backend with V1 listings, GDAL's
/vsis3/), their answers equal to the HTTP view's; listings paged at every boundary; signature
failures refused with S3's error XML."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import netCDF4
import numpy as np
import pytest
import xarray as xr
from botocore import UNSIGNED
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.exceptions import ClientError
from support.datasets import write_json
from support.servers import free_port

pytestmark = [pytest.mark.timeout(600)]

SECRET = "s3cr3t-Never-Shown-0123456789abcdef"


def s3_serve(serve, source, *opts: str):
    port = free_port()
    s = serve(source, f"s3_listen=127.0.0.1:{port}", *opts)
    return s, f"http://127.0.0.1:{port}"


def client(endpoint: str, signed: tuple[str, str] | None = None):
    cfg = Config(
        signature_version=UNSIGNED if signed is None else "s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1},
    )
    kw = {} if signed is None else {"aws_access_key_id": signed[0], "aws_secret_access_key": signed[1]}
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg, **kw)


@pytest.fixture
def keyset(tmp_path, datasets) -> Path:
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "a&b<c>.txt": "amp",
        "sp ace+plus.txt": "plus",
        "dir/sub/one": "1",
        "dir/sub/two": "2",
        "dir/three": "3",
        "dir/q'uote\"": "4",
        "big": [str(datasets.blob), 1000, 300_000],
    }
    refs.update({f"many/k{i:03d}": f"v{i}" for i in range(25)})
    local = datasets.blob.parent.parent / "s3keys.json"  # next to data/: allow_local covers the blob
    return write_json(local, refs)


def all_keys(s3, bucket: str, page: int, **kw) -> tuple[list[str], list[str], int]:
    keys, prefixes, pages = [], [], 0
    for p in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": page}, **kw
    ):
        pages += 1
        keys += [o["Key"] for o in p.get("Contents", [])]
        prefixes += [c["Prefix"] for c in p.get("CommonPrefixes", [])]
    return keys, prefixes, pages


def test_boto3_unsigned_lists_and_reads_what_the_http_view_serves(serve, keyset, datasets):
    s, endpoint = s3_serve(serve, keyset, "s3_bucket=refs")
    s3 = client(endpoint)
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["refs"]
    refs = json.loads(keyset.read_text())
    want = sorted([*refs, ".zmetadata"], key=str.encode)  # the synthesized .zmetadata too
    for page in (1, 2, 7, 1000):
        keys, prefixes, pages = all_keys(s3, "refs", page)
        assert keys == want and not prefixes and pages == -(-len(want) // page), page
    # delimiter at every level, pages of 1 and 2: keys and common prefixes as S3 gives them
    for page in (1, 2, 1000):
        keys, prefixes, _ = all_keys(s3, "refs", page, Delimiter="/")
        assert prefixes == ["dir/", "many/"] and keys == [k for k in want if "/" not in k]
        keys, prefixes, _ = all_keys(s3, "refs", page, Delimiter="/", Prefix="dir/")
        assert prefixes == ["dir/sub/"] and keys == ["dir/q'uote\"", "dir/three"]
    keys, _, _ = all_keys(s3, "refs", 3, Prefix="many/k01", StartAfter="many/k012")
    assert keys == [f"many/k{i:03d}" for i in range(13, 20)]
    # V1 with markers (rclone's default), with and without a delimiter
    seen, marker = [], ""
    while True:
        r = s3.list_objects(Bucket="refs", Marker=marker, MaxKeys=4, Prefix="many/")
        seen += [o["Key"] for o in r.get("Contents", [])]
        if not r["IsTruncated"]:
            break
        marker = r.get("NextMarker") or seen[-1]
    assert seen == [f"many/k{i:03d}" for i in range(25)]
    # objects: bytes, sizes and ETags equal to the HTTP view's
    for key in ("a&b<c>.txt", "sp ace+plus.txt", "dir/q'uote\"", "big", ".zmetadata"):
        quoted = "/" + urllib.request.quote(key)
        http = s.request("GET", quoted)
        obj = s3.get_object(Bucket="refs", Key=key)
        assert obj["Body"].read() == http.body and obj["ETag"] == http.headers["etag"], key
        head = s3.head_object(Bucket="refs", Key=key)
        assert head["ContentLength"] == len(http.body) and head["ETag"] == http.headers["etag"]
        assert head["LastModified"].timestamp() == pytest.approx(
            time.mktime(time.strptime(http.headers["last-modified"], "%a, %d %b %Y %H:%M:%S GMT"))
            - time.timezone
        )
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket="refs")["Contents"]}
    assert (
        listed["big"]["Size"] == 300_000
        and listed["big"]["ETag"] == s.request("HEAD", "/big").headers["etag"]
    )
    blob = datasets.blob.read_bytes()[1000:301_000]
    r = s3.get_object(Bucket="refs", Key="big", Range="bytes=10-19")
    assert r["Body"].read() == blob[10:20] and r["ContentRange"] == "bytes 10-19/300000"
    etag = r["ETag"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="refs", Key="big", Range="bytes=400000-")
    assert (
        e.value.response["Error"]["Code"] == "InvalidRange"
        and e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416
    )
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="refs", Key="big", IfNoneMatch=etag)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="refs", Key="big", IfMatch='"other"')
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    assert s3.get_object(Bucket="refs", Key="big", IfMatch=etag)["ContentLength"] == 300_000
    for call, code in (
        (lambda: s3.get_object(Bucket="refs", Key="nope"), "NoSuchKey"),
        (lambda: s3.get_object(Bucket="refs", Key="dir"), "NoSuchKey"),
        (lambda: s3.list_objects_v2(Bucket="other"), "NoSuchBucket"),
        (lambda: s3.put_object(Bucket="refs", Key="new", Body=b"x"), "NotImplemented"),
        (lambda: s3.delete_object(Bucket="refs", Key="big"), "NotImplemented"),
        (lambda: s3.create_multipart_upload(Bucket="refs", Key="new"), "NotImplemented"),
        (lambda: s3.get_object_tagging(Bucket="refs", Key="big"), "NotImplemented"),
        (lambda: s3.list_objects_v2(Bucket="refs", ContinuationToken="forged"), "InvalidArgument"),
    ):
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["Error"]["Code"] == code
    # the raw XML: escaped keys, url encoding as botocore asks for it (and decodes)
    raw = urllib.request.urlopen(f"{endpoint}/refs?list-type=2&prefix=a&fetch-owner=true").read().decode()
    assert (
        "<Key>a&amp;b&lt;c&gt;.txt</Key>" in raw and "<Owner><ID>" in raw and "<KeyCount>1</KeyCount>" in raw
    )
    raw = urllib.request.urlopen(f"{endpoint}/refs?list-type=2&prefix=sp&encoding-type=url").read().decode()
    assert "<Key>sp%20ace%2Bplus.txt</Key>" in raw
    assert s3.head_bucket(Bucket="refs")["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_signed_access_and_every_refusal(serve, keyset, tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    s, endpoint = s3_serve(
        serve, keyset, "s3_bucket=refs", "s3_access_key=AKIDREFMOUNT", f"s3_secret_key=@{secret_file}"
    )
    good = client(endpoint, ("AKIDREFMOUNT", SECRET))
    assert good.get_object(Bucket="refs", Key="dir/three")["Body"].read() == b"3"
    assert [o["Key"] for o in good.list_objects_v2(Bucket="refs", Prefix="dir/sub/")["Contents"]] == [
        "dir/sub/one",
        "dir/sub/two",
    ]
    # other signers: obstore (Rust's object_store) and rclone (the Go SDK, V1 listings with markers)
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        "refs",
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="AKIDREFMOUNT",
        secret_access_key=SECRET,
        client_options={"allow_http": True},
    )
    assert [o["path"] for b in obstore.list(store, "many/", chunk_size=4) for o in b] == [
        f"many/k{i:03d}" for i in range(25)
    ]
    assert bytes(obstore.get(store, "sp ace+plus.txt").bytes()) == b"plus"
    rclone_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    rclone_env["RCLONE_CONFIG"] = "/dev/null"
    remote = (
        f":s3,provider=Other,endpoint='{endpoint}',list_version=1,list_chunk=4,force_path_style=true,"
        f"env_auth=false,access_key_id=AKIDREFMOUNT,secret_access_key='{SECRET}':refs"
    )
    out = subprocess.run(
        [shutil.which("rclone") or "rclone", "lsf", "-R", "--files-only", remote],
        capture_output=True,
        text=True,
        timeout=120,
        env=rclone_env,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:-1]) == sorted([*json.loads(keyset.read_text()), ".zmetadata"])
    url = good.generate_presigned_url(
        "get_object", Params={"Bucket": "refs", "Key": "a&b<c>.txt"}, ExpiresIn=60
    )
    assert urllib.request.urlopen(url).read() == b"amp"

    def refused(call) -> str:
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        return e.value.response["Error"]["Code"]

    assert (
        refused(lambda: client(endpoint, ("AKIDREFMOUNT", "wrong")).list_objects_v2(Bucket="refs"))
        == "SignatureDoesNotMatch"
    )
    assert (
        refused(lambda: client(endpoint, ("AKIDOTHER", SECRET)).list_objects_v2(Bucket="refs"))
        == "InvalidAccessKeyId"
    )
    assert refused(lambda: client(endpoint).list_objects_v2(Bucket="refs")) == "AccessDenied"

    def http_error(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}))
        return e.value.code, e.value.read().decode()

    expired = good.generate_presigned_url("get_object", Params={"Bucket": "refs", "Key": "big"}, ExpiresIn=1)
    time.sleep(2.2)
    status, body = http_error(expired)
    assert status == 403 and "<Code>AccessDenied</Code>" in body and "expired" in body
    tampered = url.replace("a%26b", "b%26b")
    assert http_error(tampered)[0] == 403
    # a request signed an hour ago (a skewed clock), by botocore's own signer
    from botocore.auth import S3SigV4Auth
    from botocore.credentials import Credentials

    req = AWSRequest(method="GET", url=f"{endpoint}/refs/big")
    signer = S3SigV4Auth(Credentials("AKIDREFMOUNT", SECRET), "s3", "us-east-1")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 3600))
    req.context["timestamp"] = stamp
    req.headers["X-Amz-Date"] = stamp
    req.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
    req.headers["Host"] = endpoint.removeprefix("http://")
    signer._inject_signature_to_request(
        req, signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
    )
    status, body = http_error(req.url, dict(req.headers.items()))
    assert status == 403 and "<Code>RequestTimeTooSkewed</Code>" in body
    # the secret is nowhere: not in ps, not in the log
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert SECRET not in ps and SECRET not in s.log_text()


def test_auth_token_without_a_key_pair_is_refused_at_start(tmp_path, keyset):
    from support.serving import serve_cli

    token = tmp_path / "token"
    token.write_text("tok\n")
    r = serve_cli(keyset, f"auth_token=@{token}", f"s3_listen=127.0.0.1:{free_port()}", "no_disk_cache")
    assert r.returncode == 1 and "needs s3_access_key" in r.stderr, r.stderr


def test_xarray_over_s3fs_equals_the_original(serve, datasets):
    import s3fs

    s, endpoint = s3_serve(serve, datasets.refs["nc4_local"], "decode", "s3_bucket=nc4")
    fs = s3fs.S3FileSystem(anon=True, client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
    assert "nc4/temp" in fs.ls("nc4")
    d = xr.open_zarr(fs.get_mapper("nc4"), consolidated=True)
    o = xr.open_dataset(datasets.nc4)
    for v in o.variables:
        np.testing.assert_array_equal(d[v].values, o[v].values, err_msg=v)
    assert fs.info("nc4/temp/.zarray")["size"] == len(s.request("GET", "/temp/.zarray").body)


def test_catalogue_sets_are_buckets_for_the_aws_cli_rclone_and_gdal(serve, datasets, tmp_path):
    cat = tmp_path / "cat"
    cat.mkdir()
    for name in ("nc4_local", "hand_local"):
        shutil.copy(datasets.refs[name], cat / f"{name.replace('_', '-')}.json")
    s, endpoint = s3_serve(serve, cat, "catalog", "decode", f"allow_local={cat}:{datasets.blob.parent}")
    names = [b["Name"] for b in client(endpoint).list_buckets()["Buckets"]]
    assert names == sorted(names) and {"nc4-local", "hand-local"} <= set(names), names
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    aws = shutil.which("aws")
    assert aws, "the aws CLI (awscli, on PATH) is not installed"
    out = subprocess.run(
        [aws, "s3", "ls", "--no-sign-request", "--endpoint-url", endpoint, "s3://nc4-local/temp/"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0 and ".zarray" in out.stdout, out.stderr
    dest = tmp_path / "zarray"
    out = subprocess.run(
        [
            aws,
            "s3",
            "cp",
            "--no-sign-request",
            "--endpoint-url",
            endpoint,
            "s3://nc4-local/temp/.zarray",
            str(dest),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert dest.read_bytes() == s.request("GET", "/nc4-local/temp/.zarray").body
    # rclone: provider Other lists with ListObjects V1 (markers)
    rclone = shutil.which("rclone")
    assert rclone, "rclone is not installed (scripts/setup.sh installs it)"
    remote = (
        f":s3,provider=Other,endpoint='{endpoint}',list_version=1,list_chunk=3,force_path_style=true,"
        "env_auth=false,access_key_id=,secret_access_key=:"
    )
    # (rclone's AWS SDK reads AWS_CA_BUNDLE, which it cannot use over plain HTTP)
    rclone_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    rclone_env["RCLONE_CONFIG"] = "/dev/null"
    out = subprocess.run(
        [rclone, "lsf", "-R", "--files-only", remote + "nc4-local"],
        capture_output=True,
        text=True,
        timeout=120,
        env=rclone_env,
    )
    assert out.returncode == 0, out.stderr
    http_keys = []
    with contextlib.closing(urllib.request.urlopen(f"{endpoint}/nc4-local?list-type=2")) as r:
        http_keys = [k for k in r.read().decode().split("<Key>")[1:]]
    assert sorted(out.stdout.split()) == sorted(k.split("</Key>")[0] for k in http_keys)
    # GDAL /vsis3/ (its multidimensional Zarr driver over the decoded view)
    gdal_env = {
        **os.environ,
        "AWS_S3_ENDPOINT": endpoint.removeprefix("http://"),
        "AWS_NO_SIGN_REQUEST": "YES",
        "AWS_VIRTUAL_HOSTING": "FALSE",
        "AWS_HTTPS": "NO",
        "GDAL_PAM_ENABLED": "NO",
        "GDAL_HTTP_MAX_RETRY": "0",
        "CPL_VSIL_CURL_CACHE_SIZE": "0",
    }
    out = subprocess.run(
        ["gdalmdiminfo", 'ZARR:"/vsis3/nc4-local"'], capture_output=True, text=True, env=gdal_env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert {"temp", "precise"} <= set(json.loads(out.stdout)["arrays"])
    with netCDF4.Dataset(datasets.nc4) as f:
        f.set_auto_maskandscale(False)
        temp = f["temp"][:]
    dest = tmp_path / "temp1.bin"
    out = subprocess.run(
        ["gdal_translate", "-q", "-of", "ENVI", 'ZARR:"/vsis3/nc4-local":/temp:1', str(dest)],
        capture_output=True,
        text=True,
        env=gdal_env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.fromfile(dest, "<f4").reshape(20, 30), temp[1])


def test_zarr_3_through_obstore_s3store_equals_the_original(serve, datasets):
    import obstore
    import zarr
    from obstore.store import S3Store

    s, endpoint = s3_serve(serve, datasets.refs["nc4_local"], "decode", "s3_bucket=nc4")
    store = S3Store(
        "nc4", endpoint=endpoint, region="us-east-1", skip_signature=True, client_options={"allow_http": True}
    )
    listed = obstore.list_with_delimiter(store, "temp")
    assert "temp/.zarray" in [o["path"] for o in listed["objects"]]
    assert obstore.head(store, "temp/.zarray")["e_tag"] == s.request("HEAD", "/temp/.zarray").headers["etag"]
    every = [o["path"] for batch in obstore.list(store, chunk_size=7) for o in batch]
    assert every == sorted(every) and "temp/.zarray" in every and ".zmetadata" in every
    group = zarr.open_group(zarr.storage.ObjectStore(store, read_only=True), mode="r", zarr_format=2)
    with netCDF4.Dataset(datasets.nc4) as f:
        f.set_auto_maskandscale(False)
        np.testing.assert_array_equal(group["temp"][:], f["temp"][:])
        np.testing.assert_array_equal(group["precise"][:], f["precise"][:])


def test_a_reloaded_set_is_a_bucket_with_cors_and_bounded_queries(serve, keyset):
    s, endpoint = s3_serve(serve, keyset, "reload=300", "cors=*", "s3_bucket=refs")
    s3 = client(endpoint)
    assert s3.get_object(Bucket="refs", Key="dir/three")["Body"].read() == b"3"
    assert [
        c["Prefix"] for c in s3.list_objects_v2(Bucket="refs", Delimiter="/").get("CommonPrefixes", [])
    ] == ["dir/", "many/"]
    r = urllib.request.urlopen(
        urllib.request.Request(f"{endpoint}/refs/big", headers={"Origin": "http://x.example"})
    )
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    pre = urllib.request.Request(
        f"{endpoint}/refs/big",
        method="OPTIONS",
        headers={
            "Origin": "http://x.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "range",
        },
    )
    r = urllib.request.urlopen(pre)
    assert r.status == 204 and "GET" in r.headers["Access-Control-Allow-Methods"]
    for query, code in (
        ("&".join(f"p{i}=1" for i in range(70)), "InvalidArgument"),
        ("list-type=2&max-keys=x", "InvalidArgument"),
        ("list-type=2&prefix=" + "a" * 1100, "InvalidArgument"),
        ("list-type=2&encoding-type=xml", "InvalidArgument"),
        ("uploads", "NotImplemented"),
        ("acl", "NotImplemented"),
    ):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{endpoint}/refs?{query}")
        assert f"<Code>{code}</Code>" in e.value.read().decode(), query
    assert s.stats()["http_status"].get("500") is None
