"""``refmount serve`` under hostile sets and clients: what it synthesizes from a set stays within
the bounds of its inputs (the audit's sets: four inline ``.zattrs`` of many megabytes, a set
of many small arrays), each refused with a 503 of fixed text and one log line."""

from __future__ import annotations

import gzip
import json
import os
import time

import pytest

pytestmark = [pytest.mark.long(45), pytest.mark.timeout(600)]


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


def test_clients_that_never_read_a_listing_hold_no_one_elses(serve, tmp_path):
    """Eight clients ask for a listing of 100,000 keys (about 6 MB) and never read it: a listing
    of the root and a key are still answered at once, long before ``client_timeout``; each
    of the eight is then disconnected after it, the server's memory bounded meanwhile."""
    import socket

    from support.datasets import write_json

    refs = {f"d/k{i:06d}": "x" for i in range(100_000)}
    refs[".zgroup"] = '{"zarr_format":2}'
    s = serve(write_json(tmp_path / "refs.json", refs), "client_timeout=40")
    assert s.request("GET", "/").status == 200
    before = s.rss()
    stuck = []
    try:
        for _ in range(8):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect((s.host, s.port))
            c.sendall(b"GET /d/ HTTP/1.1\r\nHost: x\r\n\r\n")
            stuck.append(c)
        time.sleep(3)  # each has filled its socket buffers and waits for its client
        for _ in range(3):
            t0 = time.monotonic()
            r = s.request("GET", "/?format=json", timeout=60)
            assert r.status == 200 and b'"d"' in r.body
            assert s.request("GET", "/.zgroup", timeout=60).status == 200
            assert time.monotonic() - t0 < 10, time.monotonic() - t0
        assert s.rss() - before < 128 << 20
    finally:
        for c in stuck:
            c.close()


MALFORMED_WITH_TOKEN = [
    b"GET / HTTP/1.1\r\nAuthorization: Bearer {t}\x01\r\n\r\n",
    b"GET / HTTP/1.1\r\nAuthorization: Bearer {t}\r\nBad\x00Name: x\r\n\r\n",
    b"GET /Bearer%20{t} HTTP/9.9\r\n\r\n",
    b"GET / HTTP/1.1\r\nAuthorization: Bearer {t}\r\nContent-Length: -1\r\n\r\n",
    b"GET / HTTP/1.1\r\nAuthorization: Bearer {t}\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n",
    b"GET / HTTP/1.1\r\nAuthorization: Bearer {t}\r\nX: " + b"y" * 9000 + b"\r\n\r\n",
    b"G\x00T /?token {t} HTTP/1.1\r\n\r\n",
]


def test_malformed_requests_carrying_the_token_never_log_it(serve, tmp_path):
    """Requests aiohttp refuses as bad, each carrying the server's own bearer token: a 4xx,
    and the token in no line of the log (aiohttp's messages quote the request)."""
    import socket

    from support.datasets import write_json

    token = "s3cr3tTOKENvalue42"
    (tmp_path / "token").write_text(token + "\n")
    src = write_json(tmp_path / "refs.json", {".zgroup": '{"zarr_format":2}'})
    s = serve(src, f"auth_token=@{tmp_path / 'token'}", "log_level=debug")
    for raw in MALFORMED_WITH_TOKEN:
        with socket.create_connection((s.host, s.port), timeout=30) as c:
            c.sendall(raw.replace(b"{t}", token.encode()))
            reply = c.recv(4096)
        assert reply.startswith(b"HTTP/1.") and reply.split()[1][:1] == b"4", (raw[:60], reply[:200])
    assert s.request("GET", "/.zgroup", {"Authorization": f"Bearer {token}"}).status == 200
    log = s.log_text()
    assert token not in log, [ln for ln in log.splitlines() if token in ln]
    # one line per 10 s for them all, no traceback (a client cannot fill the log)
    assert "Traceback" not in log and "refused 1 malformed HTTP request (400)" in log, log


def test_refusals_show_fixed_texts_in_bodies_and_stats(serve, tmp_path):
    """A target swapped for a symlink leaving the set's directory after the server started:
    a 502 with a fixed text, and the stats (what any client of the server reads) say only
    which kind of failure and which key; the target path, the allowed directory and the
    refusal's words are in the log only."""
    from support.datasets import write_json

    setdir = tmp_path / "set-dir-XQ7"
    setdir.mkdir()
    (setdir / "data.bin").write_bytes(b"x" * 100)
    (tmp_path / "outside-Q9.bin").write_bytes(b"y" * 100)
    src = write_json(setdir / "refs.json", {"k": [str(setdir / "data.bin"), 0, 10]})
    s = serve(src, "no_disk_cache", "retries=0")
    (setdir / "data.bin").unlink()
    (setdir / "data.bin").symlink_to(tmp_path / "outside-Q9.bin")
    r = s.request("GET", "/k")
    assert r.status == 502 and r.body == b"a target of this key could not be read\n", r
    stats = s.stats()
    assert stats["last_error"]["key"] == "k" and stats["last_error"]["target"] is None
    assert stats["last_error"]["reason"] == "a target may not be read by this mount (the log says why)"
    del stats["source"]  # SOURCE is the server's own configuration, shown on purpose
    shown = json.dumps(stats) + r.body.decode()
    assert "XQ7" not in shown and "Q9" not in shown and "allowed" not in shown, shown
    assert "outside" in s.log_text()


def test_sets_held_by_clients_count_against_max_open_memory(serve, tmp_path):
    """A catalogue of sets of one 4 MB key each (about 13 MiB open, with its memory cache):
    clients that ask for the key of two sets and never read hold them; a third set would pass
    max_open_memory=32M and is refused with a 503 of fixed text; once the holders go, it opens."""
    import base64
    import socket

    from support.datasets import write_json

    cat = tmp_path / "cat"
    cat.mkdir()
    payload = os.urandom(4 << 20)
    for name in "abc":
        write_json(cat / f"{name}.json", {"k": "base64:" + base64.b64encode(payload).decode()})
    s = serve(cat, "catalog", "max_open_memory=32M", "client_timeout=60", "no_disk_cache")
    holders = []
    try:
        for name in "ab":
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect((s.host, s.port))
            c.sendall(f"GET /{name}/k HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            holders.append(c)
        deadline = time.monotonic() + 60  # each indexed, then its answer stuck
        while s.stats()["sets_open"] < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        assert s.stats()["sets_open"] == 2, (s.stats(), s.log_text())
        r = s.request("GET", "/c/k")
        assert r.status == 503 and b"max_open_memory" in r.body, r
        assert "would pass max_open_memory=32 MiB" in s.log_text()
    finally:
        for c in holders:
            c.close()
    deadline = time.monotonic() + 30
    while (r := s.request("GET", "/c/k")).status != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert r.status == 200 and r.body == payload


def test_an_http_1_0_listing_ends_with_the_connection(serve, tmp_path):
    """HTTP/1.0 has no chunked encoding: a listing (GET and HEAD) is answered, its page ending
    when the server closes the connection (found by the fuzz run: it was a 500)."""
    import socket

    from support.datasets import write_json

    s = serve(write_json(tmp_path / "refs.json", {"d/x": "1", "d/y": "2"}))
    for method in ("GET", "HEAD"):
        with socket.create_connection((s.host, s.port), timeout=30) as c:
            c.sendall(f"{method} /d/?format=json HTTP/1.0\r\n\r\n".encode())
            got = b""
            while piece := c.recv(65536):
                got += piece
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"200", got[:300]
        assert b"chunked" not in head.lower()
        if method == "GET":
            assert [e["name"] for e in json.loads(body)["entries"]] == ["x", "y"], body
