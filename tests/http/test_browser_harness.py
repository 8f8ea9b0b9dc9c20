"""The browser harness (support/browser.py) proven on nginx, without a mount.

A page on one loopback origin fetches a chunk with ``Range`` (a suffix range: a CORS
preflight) and a missing key from nginx on another origin: with CORS headers on every answer
(404 included, preflight answered) the page reads both; from nginx without them the browser
refuses both and says so in its console. The serve tier uses the same harness against
``refmount serve``.
"""

from __future__ import annotations

import os

import pytest
from support.browser import Fetch, browser_fetch
from support.servers import NginxServer

pytestmark = pytest.mark.timeout(360)

CORS = """
        add_header Access-Control-Allow-Origin "*" always;
        add_header Access-Control-Expose-Headers "Content-Range, Content-Length, ETag, Accept-Ranges" always;
        add_header Access-Control-Allow-Headers "Range, If-None-Match" always;
        add_header Access-Control-Allow-Methods "GET, HEAD" always;
        if ($request_method = OPTIONS) { return 204; }
"""


def test_browser_reads_across_origins_only_with_cors(tmp_path):
    data, page = tmp_path / "data", tmp_path / "page"
    data.mkdir()
    page.mkdir()
    chunk = os.urandom(1000)
    (data / "chunk.bin").write_bytes(chunk)
    with NginxServer(page, run_dir=tmp_path / "run-page") as page_srv, \
            NginxServer(data, run_dir=tmp_path / "run-cors", server_extra=CORS) as cors, \
            NginxServer(data, run_dir=tmp_path / "run-plain") as plain:
        fetches = [
            Fetch("suffix", f"{cors.url}/chunk.bin", {"Range": "bytes=-10"}),
            Fetch("missing", f"{cors.url}/missing"),
            Fetch("plain-range", f"{plain.url}/chunk.bin", {"Range": "bytes=0-9"}),
            Fetch("plain-missing", f"{plain.url}/missing"),
        ]
        report = browser_fetch(page, page_srv.url, fetches, timeout=60)
        print(report.log())
        preflights = [ln for ln in cors.access_lines() if '"OPTIONS ' in ln]
    r = report.results
    assert set(r) == {f.name for f in fetches}, (report.returncode, report.stderr_tail)
    assert r["suffix"]["ok"] and r["suffix"]["status"] == 206, r["suffix"]
    assert r["suffix"]["headers"]["Content-Range"] == "bytes 990-999/1000"
    assert r["suffix"]["headers"]["ETag"]  # exposed: nginx sends no Accept-Ranges with a 206
    assert bytes.fromhex(r["suffix"]["head"]) == chunk[-10:]
    assert preflights, "the suffix range was sent without a preflight"
    assert r["missing"]["ok"] and r["missing"]["status"] == 404, r["missing"]
    for name in ("plain-range", "plain-missing"):
        assert not r[name]["ok"] and "Failed to fetch" in r[name]["error"], r[name]
    assert sum("blocked by CORS policy" in line for line in report.console) == 2, report.log()
    assert any(line.startswith("refmount-browser suffix: ") for line in report.console)
    assert report.seconds < 60
