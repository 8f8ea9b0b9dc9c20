"""``refmount serve`` under hostile sets and clients: what it synthesizes from a set stays within
the bounds of its inputs (the audit's sets: four inline ``.zattrs`` of many megabytes, a set
of many small arrays), each refused with a 503 of fixed text and one log line."""

from __future__ import annotations

import gzip
import json
import time

import pytest

pytestmark = [pytest.mark.timeout(300)]


def test_zmetadata_of_huge_or_many_metadata_keys_is_refused_in_bounded_memory(serve, tmp_path):
    # four .zattrs of 12 MB each (under max_inline), 6 M JSON values in all: past the bound
    big = '{"v": [' + ",".join(["1.5"] * 3_000_000) + "]}"
    refs = {".zgroup": '{"zarr_format":2}', **{f"a{i}/.zattrs": big for i in range(4)},
            **{f"a{i}/.zarray": "{}" for i in range(4)}}
    src = tmp_path / "big.json.gz"
    src.write_bytes(gzip.compress(json.dumps(refs).encode(), 1))
    # and a set of 300,000 small arrays (2.4 M values): past the bound too
    many = {".zgroup": '{"zarr_format":2}'}
    for i in range(300_000):
        many[f"v{i}/.zarray"] = '{"shape": [1], "chunks": [1], "dtype": "<f4"}'
    src_many = tmp_path / "many.json.gz"
    src_many.write_bytes(gzip.compress(json.dumps(many).encode(), 1))
    for source in (src, src_many):
        s = serve(source, "no_disk_cache")
        before = s.rss()
        t0 = time.monotonic()
        for _ in range(3):  # refused once, then at once
            r = s.request("GET", "/.zmetadata")
            assert r.status == 503 and r.body.startswith(b"not served:"), r
        assert time.monotonic() - t0 < 30
        r = s.request("GET", "/?format=json")
        assert r.status == 200 and b".zmetadata" not in r.body
        assert s.request("GET", "/.zgroup").status == 200
        grown = s.rss() - before
        assert grown < 256 << 20, grown
        log = s.log_text()
        assert log.count("no consolidated metadata (.zmetadata) is served") == 1, log
        assert s.stats()["http_status"]["503"] == 3
