"""``refmount serve``, the HTTP front end, read by real clients: xarray/zarr over fsspec's
HTTPFileSystem, GDAL's /vsicurl/, curl; a target failing mid-body; slow clients; the start-up
contract of the command (detached and -f with systemd's notify protocol)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import netCDF4
import numpy as np
import psutil
import pytest
import xarray as xr
from support.clients import run_client
from support.datasets import write_json
from support.faultserver import Fault
from support.mounts import CLI, cli_env, run_cli
from support.serving import serve_cli

pytestmark = [pytest.mark.timeout(600)]

GDAL_ENV = {**os.environ, "GDAL_PAM_ENABLED": "NO", "GDAL_HTTP_MAX_RETRY": "0",
            "CPL_VSIL_CURL_CACHE_SIZE": "0"}


def curl(*args: str) -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("curl")
    assert exe, "curl is not installed (scripts/setup.sh installs it)"
    return subprocess.run([exe, "-sS", "--max-time", "60", *args], capture_output=True, timeout=90)


def head_lines(out: bytes) -> dict[str, str]:
    """The headers of curl -D- output (the last response), lower-case names."""
    text = out.decode(errors="replace").split("\r\n\r\n")[0]
    lines = text.split("\r\n")
    headers = {"status": lines[0].split()[1]}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return headers


# --- xarray / zarr over fsspec's HTTPFileSystem ------------------------------------------------


@pytest.mark.parametrize("decode", [False, True], ids=["raw", "decode"])
def test_xarray_over_http_equals_the_original(serve, datasets, decode):
    s = serve(datasets.refs["nc4_local"], *(["decode"] if decode else []))
    d = xr.open_zarr(s.url, consolidated=True)  # the synthesized .zmetadata
    o = xr.open_dataset(datasets.nc4)
    assert set(o.variables) <= set(d.variables)
    for v in o.variables:
        np.testing.assert_array_equal(d[v].values, o[v].values, err_msg=v)
    zmeta = json.loads(s.request("GET", "/.zmetadata").body)["metadata"]
    codecs = {k: (m.get("compressor"), m.get("filters")) for k, m in zmeta.items() if k.endswith(".zarray")}
    assert any(c != (None, None) for c in codecs.values()) != decode, codecs  # decoded: no codecs
    import fsspec

    listed = fsspec.filesystem("http").ls(s.url, detail=False)  # parses the HTML index
    assert s.url + ".zmetadata" in listed and s.url + "temp/" in listed, listed


# --- GDAL /vsicurl/ on the decoded view ------------------------------------------------------------


def gdal(*args: str) -> str:
    return run_client(*args, env=GDAL_ENV)


def test_serving_compressed_arrays_without_decode_says_how_to_serve_them_decoded(serve, datasets):
    said = serve(datasets.refs["nc4_local"]).stderr
    assert "refmount: note: arrays" in said and "serve with 'refmount serve SOURCE -o decode'" in said, said
    assert "mount with" not in said
    assert "note" not in serve(datasets.refs["nc4_local"], "decode").stderr


def test_gdal_vsicurl_reads_the_decoded_view(serve, datasets, tmp_path):
    s = serve(datasets.refs["nc4_local"], "decode")
    with netCDF4.Dataset(datasets.nc4) as f:
        f.set_auto_maskandscale(False)
        temp, precise = f["temp"][:], f["precise"][:]
    where = f'ZARR:"/vsicurl/{s.url}"'
    info = json.loads(gdal("gdalmdiminfo", where))
    assert {"temp", "precise"} <= set(info["arrays"]), list(info["arrays"])
    # without .zmetadata, GDAL finds the arrays by listing directories (the HTML index)
    listed = json.loads(gdal("gdalmdiminfo", "-oo", "USE_ZMETADATA=NO", where))
    assert {"temp", "precise"} <= set(listed["arrays"]), list(listed["arrays"])
    out = tmp_path / "temp1.bin"
    gdal("gdal_translate", "-q", "-of", "ENVI", f"{where}:/temp:1", str(out))
    np.testing.assert_array_equal(np.fromfile(out, "<f4").reshape(20, 30), temp[1])
    text = gdal("gdalinfo", "-stats", f"{where}:/precise")
    stats = {k.lower(): float(v) for k, v in re.findall(r"STATISTICS_(MINIMUM|MAXIMUM|MEAN)=(\S+)", text)}
    assert stats["mean"] == pytest.approx(precise.mean(), rel=1e-12)


# --- HTTP as clients expect it: curl -------------------------------------------------------------


def test_ranges_validators_and_errors_with_curl(serve, datasets):
    s = serve(datasets.refs["hand_local"])
    blob = datasets.blob.read_bytes()
    size = len(blob)
    url = s.url + "whole/blob.bin"
    # HEAD of every key: sizes from the index, no fetch (a whole target's size is a stat)
    for key in ("range/large", "range/first", "hello.txt", "whole/blob.bin", "json/obj.json"):
        r = s.request("HEAD", "/" + key)
        assert r.status == 200 and r.headers["accept-ranges"] == "bytes", (key, r)
    assert s.request("HEAD", "/range/large").headers["content-length"] == "700001"
    assert s.stats()["requests"] == 0  # HEADs fetched nothing
    # single, open and suffix ranges
    for spec, (a, b) in {"100-199": (100, 200), f"{size - 50}-": (size - 50, size),
                         "-77": (size - 77, size)}.items():
        r = curl("-D-", "-r", spec, url)
        headers = head_lines(r.stdout)
        assert headers["status"] == "206", headers
        assert headers["content-range"] == f"bytes {a}-{b - 1}/{size}"
        assert r.stdout.split(b"\r\n\r\n", 1)[1] == blob[a:b]
    # the whole file, its ETag, If-None-Match -> 304
    r = curl("-D-", url)
    headers = head_lines(r.stdout)
    assert headers["status"] == "200" and r.stdout.split(b"\r\n\r\n", 1)[1] == blob
    etag = headers["etag"]
    assert etag.startswith('"') and "cache-control" in headers
    h304 = head_lines(curl("-D-", "-o", "/dev/null", "-H", f"If-None-Match: {etag}", url).stdout)
    assert h304["status"] == "304"
    # 416 with bytes */size; 404; 405 with Allow
    h416 = head_lines(curl("-D-", "-o", "/dev/null", "-r", f"{size}-", url).stdout)
    assert h416["status"] == "416" and h416["content-range"] == f"bytes */{size}"
    assert head_lines(curl("-D-", "-o", "/dev/null", s.url + "no/such/key").stdout)["status"] == "404"
    for method in ("PUT", "POST", "DELETE", "PATCH"):
        h = head_lines(curl("-D-", "-o", "/dev/null", "-X", method, "--data", "x", url).stdout)
        assert h["status"] == "405" and "GET" in h["allow"], (method, h)
    # a directory: HTML by default, JSON on request; without the slash, a redirect
    assert b'href="' in s.request("GET", "/range/").body
    entries = json.loads(s.request("GET", "/range/", {"Accept": "application/json"}).body)
    assert "large" in json.dumps(entries)
    assert s.request("GET", "/range").status == 301
    # the served bytes are the index's: a range past the end of nothing, inline keys
    assert s.request("GET", "/hello.txt").body == b"hello world\n"
    assert s.request("GET", "/range/middle").body == blob[12_345:12_345 + 4_321]
    counters = s.stats()
    assert counters["http_status"]["206"] >= 3 and counters["http_status"]["404"] >= 1
    r = run_cli("stats", s.url)  # the same counters from the command line
    assert r.returncode == 0 and "HTTP requests" in r.stdout and "fetches from targets" in r.stdout, r


def test_cors_on_every_response_and_the_preflight(serve, datasets):
    s = serve(datasets.refs["hand_local"], "cors=*")
    for path in ("/hello.txt", "/no/such/key", "/"):
        r = s.request("GET", path, {"Origin": "http://elsewhere.example"})
        assert r.headers.get("access-control-allow-origin") == "*", (path, r.status)
        assert "content-range" in r.headers.get("access-control-expose-headers", "").lower()
    r = s.request("OPTIONS", "/range/first", {"Origin": "http://elsewhere.example",
                                               "Access-Control-Request-Method": "GET",
                                               "Access-Control-Request-Headers": "range"})
    assert r.status == 204 and "GET" in r.headers["access-control-allow-methods"]
    assert "range" in r.headers["access-control-allow-headers"].lower()


def test_bearer_token(serve, datasets, tmp_path):
    token = "s3cr3t-t0ken-value"
    (tmp_path / "token").write_text(token + "\n")
    s = serve(datasets.refs["hand_local"], f"auth_token=@{tmp_path / 'token'}")
    assert s.request("GET", "/hello.txt").status == 401
    assert s.request("GET", "/hello.txt", {"Authorization": "Bearer wrong"}).status == 401
    r = s.request("GET", "/hello.txt", {"Authorization": f"Bearer {token}"})
    assert r.status == 200 and r.body == b"hello world\n"
    assert token not in s.log_text()


# --- readahead across keys ---------------------------------------------------------------------------


def test_keys_are_served_from_a_stretch_while_the_rest_of_it_is_still_coming(serve, srv, tmp_path):
    """Four keys in order start readahead: one request for the stretch after them (up to
    8 MiB). The target sends a quarter of that answer (the first request for 1 MiB or more),
    then stalls for 30 s. The keys in
    that quarter are served at once, from the loop, each as its bytes have arrived."""
    chunk, n = 64 * 1024, 160
    data = np.random.default_rng(9).bytes(n * chunk)
    url = srv.put("big.bin", data)
    refs = write_json(tmp_path / "refs.json", {f"a/{i}": [url, i * chunk, chunk] for i in range(n)})
    s = serve(refs, "retries=0", "timeout=60", "no_disk_cache")
    srv.set_faults("big.bin", [Fault("stall_body", times=1, fraction=0.25, seconds=30, min_bytes=2**20)])
    for i in range(4):  # read on demand, in order
        r = s.request("GET", f"/a/{i}", timeout=10)
        assert (r.status, r.body) == (200, data[i * chunk:(i + 1) * chunk])
    began = time.monotonic()
    for i in range(4, 4 + 16):  # the first MiB of the stretch: there within 2 s of the stall
        r = s.request("GET", f"/a/{i}", timeout=10)
        assert (r.status, r.body) == (200, data[i * chunk:(i + 1) * chunk]), i
    assert time.monotonic() - began < 10
    stretch = [q for q in srv.requests if q.fault == "stall_body"]
    assert len(stretch) == 1, srv.requests  # one request, still stalled
    stats = s.stats()
    assert stats["prefetch_hits"] >= 16, stats
    assert stats["http_planned_in_trio"] <= 4 + 1, stats  # the four misses (and the metadata at start)


# --- never wrong bytes: failing targets -----------------------------------------------------------


def test_target_failing_mid_body_aborts_the_transfer(serve, srv, tmp_path):
    data = np.random.default_rng(5).bytes(4 << 20)
    url = srv.put("big.bin", data)
    refs = write_json(tmp_path / "refs.json", {"big": [url, 0, len(data)], "whole": [url]})
    s = serve(refs, "retries=0", "timeout=5", "whole_fetch_limit=1M", "block_size=1M",
              "max_readahead=0", "memory_cache=8M")
    # the first block is served, every later request of the target fails
    srv.set_faults("big.bin", [Fault("delay", times=1, seconds=0.0),
                               Fault("status", times=None, status=500)])
    r = curl("-o", str(tmp_path / "out"), s.url + "big")
    assert r.returncode == 18, (r.returncode, r.stderr)  # CURLE_PARTIAL_FILE: never a clean 200
    got = (tmp_path / "out").read_bytes()
    assert len(got) < len(data) and data.startswith(got)
    # failing before the headers: 502
    srv.set_faults("big.bin", [Fault("status", times=None, status=500)])
    h = head_lines(curl("-D-", "-o", "/dev/null", "-r", "3000000-3000010", s.url + "big").stdout)
    assert h["status"] == "502", h
    # a stalled target: 504
    srv.set_faults("big.bin", [Fault("stall", times=None, seconds=30)])
    h = head_lines(curl("-D-", "-o", "/dev/null", "-r", "2500000-2500010", s.url + "big").stdout)
    assert h["status"] == "504", h
    last = s.stats()["last_error"]  # what `refmount stats URL` shows
    assert last["key"] == "big" and "timed out" in last["reason"], last
    srv.clear_faults()
    assert s.request("GET", "/big", {"Range": "bytes=0-9"}).body == data[:10]  # still serving


# --- bounds: slow clients ---------------------------------------------------------------------------


def test_slow_clients_leave_memory_bounded_and_others_served(serve, tmp_path):
    data = np.random.default_rng(6).bytes(32 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    refs = write_json(tmp_path / "refs.json", {"big": [str(tmp_path / "big.bin")],
                                               "small": [str(tmp_path / "big.bin"), 0, 1000]})
    s = serve(refs, "memory_cache=64M", "max_readahead=8M", "client_timeout=30")
    assert s.request("GET", "/small").body == data[:1000]
    before = s.rss()
    slow = []
    try:
        for _ in range(64):  # each asks for 32 MiB and never reads
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect((s.host, s.port))
            c.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            slow.append(c)
        time.sleep(3)
        t0 = time.monotonic()
        assert s.request("GET", "/big", timeout=30).body == data  # another client is served
        assert time.monotonic() - t0 < 20
        grown = s.rss() - before
        # unbounded, 64 x 32 MiB would be buffered; bounded: the memory cache and a piece each
        assert grown < 64 * 2**20 + 64 * 2 * 2**20, grown
        # they are held back, not dropped: each has been sent part of its response
        assert s.stats()["http_aborted"] == 0
    finally:
        for c in slow:
            c.close()
    assert s.stats()["http_connections"] <= 2
    assert "Traceback" not in s.log_text() and "Error handling request" not in s.log_text()


# --- the command: start-up contract ----------------------------------------------------------------


def test_port_in_use_is_one_error_line_and_nothing_left(datasets, tmp_path):
    # the processes this start leaves are told apart from other tests' by a mark they inherit
    mark = f"port-in-use-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = serve_cli(datasets.refs["hand_local"], "no_disk_cache", listen=f"127.0.0.1:{port}",
                      extra_env={"REFMOUNT_TEST_MARK": mark})
        assert r.returncode == 1, r
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("refmount: error: cannot listen on"), r.stderr
        assert "in use" in lines[0]
    time.sleep(0.5)
    left = []
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "refmount" in " ".join(p.info["cmdline"] or []) and \
                    p.environ().get("REFMOUNT_TEST_MARK") == mark:
                left.append(p)
    assert not left, left
    r = serve_cli(datasets.refs["hand_local"], "no_disk_cache", listen="nonsense")
    assert r.returncode == 1 and r.stderr.startswith("refmount: error: listen must be HOST:PORT"), r.stderr
    r = serve_cli(tmp_path / "missing.json", "no_disk_cache")
    assert r.returncode == 1 and r.stderr.startswith("refmount: error:"), r.stderr


def test_foreground_notifies_systemd_and_stops_on_sigterm(datasets, tmp_path):
    """As refmount-serve@.service runs it: SOURCE and options in the environment (--env), never
    on the command line."""
    sock_path = str(tmp_path / "notify")
    source = str(datasets.refs["hand_local"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(sock_path)
        notify.settimeout(60)
        env = {**cli_env(), "NOTIFY_SOCKET": sock_path, "REFMOUNT_SOURCE": source,
               "REFMOUNT_OPTIONS": "no_disk_cache"}
        proc = subprocess.Popen([*CLI, "serve", "--env", "--listen", "127.0.0.1:0", "-f"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            message = notify.recv(4096).decode()
            assert "READY=1" in message, message
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            assert source.encode() not in cmdline and b"no_disk_cache" not in cmdline, cmdline
            url = message.split("STATUS=serving ")[1].strip()
            import urllib.request

            assert urllib.request.urlopen(url + "hello.txt", timeout=10).read() == b"hello world\n"
            proc.terminate()
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = proc.stderr.read().decode() if proc.stderr else ""
        assert "stopped serving" in err, err


def test_python_api_served(datasets):
    import urllib.request

    import refmount

    with refmount.served(datasets.refs["hand_local"], no_disk_cache=True) as url:
        assert urllib.request.urlopen(url + "hello.txt", timeout=10).read() == b"hello world\n"
        port = int(url.rsplit(":", 1)[1].strip("/"))
    with socket.socket() as c, pytest.raises(OSError):
        c.connect(("127.0.0.1", port))  # stopped: nothing listens
    with pytest.raises(refmount.MountError, match="listen must be"), \
            refmount.served(datasets.refs["hand_local"], listen="bad"):
        pass


def test_serve_confines_local_targets(tmp_path):
    """A shared service: a set naming a local file outside SOURCE's directory is refused, as
    for an allow_other mount."""
    (tmp_path / "sets").mkdir()
    refs = write_json(tmp_path / "sets" / "refs.json", {"x": ["/etc/hostname"]})
    r = serve_cli(refs, "no_disk_cache")
    assert r.returncode == 1, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("refmount: error:"), r.stderr
    assert "/etc/hostname" in lines[0], r.stderr


def test_browser_reads_a_range_and_a_missing_key_across_origins(serve, datasets, tmp_path):
    """Headless Chromium on a page from another origin fetch()es a chunk with a suffix Range
    (a CORS preflight) and a missing key: with cors=* it reads both; without, it is refused."""
    from support.browser import Fetch, browser_fetch
    from support.servers import NginxServer

    blob = datasets.blob.read_bytes()
    with_cors = serve(datasets.refs["hand_local"], "cors=*")
    without = serve(datasets.refs["hand_local"])
    page = tmp_path / "page"
    page.mkdir()
    with NginxServer(page, run_dir=tmp_path / "run-page") as page_srv:
        fetches = [
            Fetch("suffix", with_cors.url + "whole/blob.bin", {"Range": "bytes=-10"}),
            Fetch("missing", with_cors.url + "no/such/key"),
            Fetch("refused", without.url + "whole/blob.bin", {"Range": "bytes=0-9"}),
        ]
        report = browser_fetch(page, page_srv.url, fetches, timeout=60)
    print(report.log())  # the console, in the test log
    r = report.results
    assert set(r) == {f.name for f in fetches}, (report.returncode, report.stderr_tail)
    assert r["suffix"]["ok"] and r["suffix"]["status"] == 206, r["suffix"]
    assert r["suffix"]["headers"]["Content-Range"] == f"bytes {len(blob) - 10}-{len(blob) - 1}/{len(blob)}"
    assert r["suffix"]["headers"]["ETag"] and r["suffix"]["headers"]["Accept-Ranges"] == "bytes"
    assert bytes.fromhex(r["suffix"]["head"]) == blob[-10:]
    assert r["missing"]["ok"] and r["missing"]["status"] == 404, r["missing"]
    assert not r["refused"]["ok"], r["refused"]
    assert any("blocked by CORS policy" in line for line in report.console), report.log()
    assert with_cors.stats()["http_status"].get("204", 0) >= 1  # the preflight was answered


@pytest.mark.parametrize("decode", [False, True], ids=["raw", "decode"])
def test_parquet_set_over_http(serve, tmp_path, decode):
    """A Parquet reference set (kerchunk's refs_to_dataframe): its own .zmetadata at the root,
    chunks computed from the arrays' grids, read by xarray over HTTP."""
    from support import parquet_data as pdata

    nc = tmp_path / "data.nc"
    pdata.make_nc(nc)
    pq_set = pdata.kerchunk_to_parquet(pdata.kerchunk_refs(nc), tmp_path / "refs.parq", record_size=4)
    # a shared service: local targets beside a Parquet set are read only where allowed
    s = serve(pq_set, f"allow_local={tmp_path}", *(["decode"] if decode else []))
    d = xr.open_zarr(s.url, consolidated=True)
    o = xr.open_dataset(nc)
    for v in o.variables:
        np.testing.assert_array_equal(d[v].values, o[v].values, err_msg=v)
    assert b'href=".zmetadata"' in s.request("GET", "/").body
    if not decode:  # without allow_local, the target beside the set is refused when read
        confined = serve(pq_set)
        assert confined.request("GET", "/t/0").status == 502
        assert "outside the allowed directories" in confined.log_text()


def test_large_directory_listing_is_complete_and_streamed(serve, tmp_path):
    """300,000 keys in one directory: the HTML and JSON listings name every one, and the
    server's memory does not grow with the page (it is streamed as the tree gives entries)."""
    n = 300_000
    refs = {f"d/k{i:06d}": "x" for i in range(n)}
    refs[".zgroup"] = '{"zarr_format":2}'
    s = serve(write_json(tmp_path / "refs.json", refs))
    s.request("GET", "/")  # a small listing warms the process up
    before = s.rss()
    Path(f"/proc/{s.pid}/clear_refs").write_text("5")  # peak RSS from now on
    page = s.request("GET", "/d/").body
    assert page.count(b'<a href="k') == n, page[-300:]
    names = json.loads(s.request("GET", "/d/", {"Accept": "application/json"}).body)
    assert len(names["entries"]) == n
    peak = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{s.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    assert len(page) > 16 * 2**20 and peak - before < 16 * 2**20, (len(page), peak - before)
