"""A "rooted" Icechunk repository — at an object store's bucket root, every key starting with
'/' (``/refs/...``, ``/snapshots/...``: what icechunk before 2.1 wrote at an empty prefix,
earth-mover/icechunk#2239) — is refused with one line naming the layout and what to do; a
repository at a bucket root with standard keys is read. moto's S3 server holds both (the
repository built from the spec, tests/support/rectilinear.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.rectilinear import rectilinear_repo
from support.servers import moto_s3

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]


def test_a_rooted_repository_is_refused_and_a_bucket_root_one_read(mount, mount_fails, tmp_path) -> None:
    import boto3

    regular = rectilinear_repo(tmp_path / "repo")
    files = {str(p.relative_to(tmp_path / "repo")): p.read_bytes()
             for p in (tmp_path / "repo").rglob("*") if p.is_file()}
    with moto_s3({f"cleanb/{k}": v for k, v in files.items()}) as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="eu-west-1",
                              aws_access_key_id="test", aws_secret_access_key="test")
        client.create_bucket(Bucket="rootedb",
                             CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        for key, data in files.items():
            client.put_object(Bucket="rootedb", Key="/" + key, Body=data)
        options = {"key": "test", "secret": "test",
                   "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"}}
        (tmp_path / "opts.json").write_text(json.dumps(options))
        opt = f"target_options=@{tmp_path / 'opts.json'}"
        _, line = mount_fails("s3://rootedb", opt, must_mention=("keys start with '/'", "#2239"))
        assert "copy its objects to keys without the leading '/'" in line
        m = mount("s3://cleanb", opt, "no_disk_cache")
        got = zarr.open_array(str(Path(m.path) / "regular"), mode="r", zarr_format=3)[...]
        np.testing.assert_array_equal(got, regular)
        m.unmount()
