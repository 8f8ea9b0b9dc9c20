"""Prometheus metrics, scraped for real: a mount (``-o metrics=HOST:PORT``) and a ``refmount serve``
(``/.refmount/metrics`` behind its bearer token) on loopback, scraped by Debian's ``prometheus``
with its own configuration and storage; ``promtool check metrics`` on both expositions; counters
that move as reads happen (a cold read: a miss and a fetch; a warm one: a memory hit); a set of
10,000 keys over 10,000 targets whose keys, target URLs (userinfo, query) and credential option
hold sentinel values that never appear in an exposition nor in anything Prometheus stored."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest
from support.datasets import write_json
from support.servers import free_port

pytestmark = [pytest.mark.timeout(300)]

SECRET = "SENTINELsecret5d1e"
KEY = "SENTINELkey8a2c"
KEYS = 10_000
PIECE = 64


def get(url: str, token: str | None = None, timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def value(text: bytes, line_start: str) -> float:
    """The value of the sample whose line starts with ``line_start`` (name and labels)."""
    for line in text.decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in the exposition:\n{text.decode()}")


def read_uncached(path: Path) -> bytes:
    """The file's bytes read through the mount, not the kernel's page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def wait_text(url: str, ok, timeout: float = 30) -> bytes:
    """The exposition at ``url`` once ``ok(it)``, or the last one after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        text = get(url)[1]
        if ok(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def promtool_check(text: bytes) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (scripts/setup.sh installs Debian's prometheus)"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).decode()


def no_sentinel(text: bytes | str) -> None:
    data = text.encode() if isinstance(text, str) else text
    for sentinel in (SECRET, KEY):
        assert sentinel.encode() not in data, f"{sentinel} leaked"


@pytest.fixture
def sentinel_set(nginx, nginx_root, tmp_path) -> Path:
    """10,000 keys (names holding KEY), each over a target of its own (a URL holding SECRET
    in its userinfo and query string, read from nginx), and two keys sharing one block."""
    (nginx_root / "metrics").mkdir(exist_ok=True)
    (nginx_root / "metrics" / "data.bin").write_bytes(bytes(range(256)) * (KEYS * PIECE // 256))
    base = nginx.url.replace("http://", f"http://user:{SECRET}@") + "/metrics/data.bin"
    refs = {f"d/{KEY}{i}": [f"{base}?sig={SECRET}{i}", i * PIECE, PIECE] for i in range(KEYS)}
    refs["warm/a"] = [f"{base}?shared", 0, PIECE]
    refs["warm/b"] = [f"{base}?shared", PIECE, PIECE]
    return write_json(tmp_path / "sentinel.json", {"version": 1, "refs": refs})


@pytest.fixture
def prometheus(tmp_path):
    """Factory: ``start(jobs) -> base URL`` of a Prometheus scraping ``jobs`` every second."""
    exe = shutil.which("prometheus")
    assert exe, "prometheus is not installed (scripts/setup.sh installs Debian's prometheus)"
    procs: list[subprocess.Popen] = []

    def start(jobs: list[dict]) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                                      "scrape_configs": jobs}))
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert procs[-1].poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if get(url + "/-/ready", timeout=2)[0] == 200:
                    return url
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready: " + (tmp_path / "prometheus.log").read_text())

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def query(prom: str, expr: str) -> list[dict]:
    status, body = get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def wait_for(prom: str, expr: str, ok, timeout: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = query(prom, expr)
        if ok(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def by_job(result: list[dict]) -> dict[str, float]:
    return {r["metric"]["job"]: float(r["value"][1]) for r in result}


def test_prometheus_scrapes_a_mount_and_a_server(mount, serve, sentinel_set, prometheus, tmp_path):
    token = "metrics-token-" + SECRET
    (tmp_path / "token").write_text(token + "\n")
    options = f'remote_options={{"client_kwargs": {{"headers": {{"X-Sentinel": "{SECRET}"}}}}}}'
    mport = free_port()
    m = mount(sentinel_set, f"metrics=127.0.0.1:{mport}", options)
    s = serve(sentinel_set, f"auth_token=@{tmp_path / 'token'}", options)
    mount_url = f"http://127.0.0.1:{mport}/metrics"
    serve_url = s.url + ".refmount/metrics"

    # the exposition: promtool's conventions; the server's behind its token
    status, before = get(mount_url)
    assert status == 200
    promtool_check(before)
    assert get(serve_url)[0] == 401
    status, served_before = get(serve_url, token)
    assert status == 200
    promtool_check(served_before)
    assert get(f"http://127.0.0.1:{mport}/other")[0] == 404

    # a cold read: a miss and a fetch; a warm one (again, the kernel's pages dropped): a memory
    # hit, no fetch
    assert (m.path / "warm" / "a").read_bytes() == bytes(range(PIECE))
    cold = get(mount_url)[1]
    assert value(cold, "refmount_cache_misses_total") == value(before, "refmount_cache_misses_total") + 1
    assert value(cold, 'refmount_fetches_total{protocol="http"}') == 1
    assert value(cold, 'refmount_fuse_requests_total{kind="read"}') >= 1
    assert read_uncached(m.path / "warm" / "a") == bytes(range(PIECE))
    warm = get(mount_url)[1]
    assert value(warm, 'refmount_cache_hits_total{cache="memory"}') > value(
        cold, 'refmount_cache_hits_total{cache="memory"}')
    assert value(warm, 'refmount_fetches_total{protocol="http"}') == 1
    assert value(warm, 'refmount_request_duration_seconds_count{frontend="fuse"}') >= 2

    # the same over the server: 200s counted by status, the second GET from memory
    auth = {"Authorization": f"Bearer {token}"}
    assert s.request("GET", "/warm/a", auth).status == 200
    assert s.request("GET", "/warm/a", auth).status == 200
    get_200 = 'refmount_http_requests_total{method="GET",status="200"}'
    deadline = time.monotonic() + 30  # a request is counted once its last byte has left
    while value(served := get(serve_url, token)[1], get_200) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert value(served, get_200) >= 3
    assert value(served, 'refmount_fetches_total{protocol="http"}') == 1
    assert value(served, 'refmount_cache_hits_total{cache="memory"}') >= 1
    assert value(served, 'refmount_request_duration_seconds_count{frontend="http"}') >= 3

    # many keys over many targets: the series stay the same few
    for i in range(0, KEYS, 50):
        assert (m.path / "d" / f"{KEY}{i}").read_bytes() == bytes((i * PIECE + j) % 256 for j in range(PIECE))
        assert s.request("GET", f"/d/{KEY}{i}", auth).status == 200
    after, served_after = get(mount_url)[1], get(serve_url, token)[1]
    for text, first in ((after, warm), (served_after, served)):
        promtool_check(text)
        no_sentinel(text)
        assert value(text, 'refmount_fetches_total{protocol="http"}') >= KEYS // 50
        series = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
        assert len(series) == len([line for line in first.decode().splitlines()
                                   if line and not line.startswith("#")]), "series grew with keys"

    # the blocks the mount's cache writer process wrote, as the daemon counts them (the server
    # runs with no_disk_cache here)
    text = wait_text(mount_url, lambda t: value(t, 'refmount_cache_written_blocks_total{cache="disk"}') >= 1)
    assert value(text, 'refmount_cache_written_blocks_total{cache="disk"}') >= 1, text.decode()
    assert value(text, 'refmount_cache_written_bytes_total{cache="disk"}') > PIECE
    assert value(text, 'refmount_cache_bytes{cache="disk"}') > PIECE
    assert value(text, 'refmount_cache_evictions_total{cache="disk"}') == 0  # far below its bound

    # a real Prometheus scrapes both
    (tmp_path / "scrape-token").write_text(token)
    prom = prometheus([
        {"job_name": "mount", "static_configs": [{"targets": [f"127.0.0.1:{mport}"]}]},
        {"job_name": "serve", "metrics_path": "/.refmount/metrics",
         "authorization": {"credentials_file": str(tmp_path / "scrape-token")},
         "static_configs": [{"targets": [f"127.0.0.1:{s.port}"]}]},
    ])
    up = wait_for(prom, "up", lambda r: by_job(r) == {"mount": 1.0, "serve": 1.0})
    assert by_job(up) == {"mount": 1.0, "serve": 1.0}, get(f"{prom}/api/v1/targets")[1]
    fetched = wait_for(prom, 'refmount_fetches_total{protocol="http"}',
                       lambda r: len(r) == 2 and min(by_job(r).values()) >= KEYS // 50)
    assert min(by_job(fetched).values()) >= KEYS // 50, fetched
    assert by_job(query(prom, 'refmount_info{frontend="fuse"}')) == {"mount": 1.0}
    assert by_job(query(prom, 'refmount_info{frontend="http"}')) == {"serve": 1.0}
    # counters move as reads happen, as Prometheus sees them
    reads = by_job(query(prom, 'refmount_fuse_requests_total{kind="read"}'))["mount"]
    (m.path / "d" / f"{KEY}1").read_bytes()
    moved = wait_for(prom, 'refmount_fuse_requests_total{kind="read"}',
                     lambda r: by_job(r).get("mount", 0) > reads)
    assert by_job(moved)["mount"] > reads
    # nothing Prometheus stored holds a key, a URL or a secret
    status, names = get(f"{prom}/api/v1/labels")
    assert status == 200
    for name in json.loads(names)["data"]:
        status, values = get(f"{prom}/api/v1/label/{name}/values")
        assert status == 200
        no_sentinel(values)
    no_sentinel(get(f"{prom}/api/v1/query?query=" + urllib.parse.quote('{__name__=~"refmount_.*"}'))[1])
    no_sentinel(m.log_text())


def inline_set(path: Path, fill: int) -> None:
    path.write_text(json.dumps({".zgroup": '{"zarr_format": 2}',
                                "k": "base64:" + base64.b64encode(bytes([fill]) * 100).decode()}))


def test_a_catalogue_mount_and_server_count_their_sets_not_name_them(mount, serve, tmp_path):
    root = tmp_path / "catalogue"
    root.mkdir()
    inline_set(root / f"{KEY}a.json", 1)
    inline_set(root / f"{KEY}b.json", 2)
    port = free_port()
    m = mount(root, "catalog", f"metrics={port}")  # a port alone: on loopback
    url = f"http://127.0.0.1:{port}/metrics"
    status, text = get(url)
    assert status == 200
    promtool_check(text)
    assert value(text, "refmount_sets") == 2 and value(text, "refmount_sets_open") == 0
    assert (m.path / f"{KEY}a" / "k").read_bytes() == bytes([1]) * 100
    text = get(url)[1]
    assert value(text, "refmount_sets_open") == 1 and value(text, "refmount_set_opens_total") == 1
    assert value(text, 'refmount_fuse_requests_total{kind="read"}') >= 1
    assert value(text, "refmount_read_bytes_total") >= 100
    no_sentinel(text)
    # a reload (SIGUSR1) swaps a changed set in; a broken one keeps the old version, counted
    pid = m.procs[0].pid
    inline_set(root / f"{KEY}a.json", 3)
    os.kill(pid, signal.SIGUSR1)
    text = wait_text(url, lambda t: value(t, "refmount_set_reloads_total") == 1)
    assert value(text, "refmount_set_reloads_total") == 1, text.decode()
    assert value(text, "refmount_set_reload_failures_total") == 0
    assert (m.path / f"{KEY}a" / "k").read_bytes() == bytes([3]) * 100
    (root / f"{KEY}a.json").write_text('{"k": "broken')
    os.kill(pid, signal.SIGUSR1)
    text = wait_text(url, lambda t: value(t, "refmount_set_reload_failures_total") == 1)
    assert value(text, "refmount_set_reload_failures_total") == 1, text.decode()
    assert value(text, "refmount_set_index_failures_total") == 1
    assert value(text, "refmount_sets_failed") == 1 and value(text, "refmount_set_reloads_total") == 1
    no_sentinel(text)

    sport = free_port()
    s = serve(root, "catalog", f"metrics=127.0.0.1:{sport}")  # also on a listener of its own
    assert s.request("GET", f"/{KEY}b/k").status == 200
    status, text = get(s.url + ".refmount/metrics")
    assert status == 200
    promtool_check(text)
    assert value(text, "refmount_sets") == 2 and value(text, "refmount_sets_open") == 1
    # a request is counted once answered, after its last byte left: the next scrape shows it
    get_200 = 'refmount_http_requests_total{method="GET",status="200"}'
    text = wait_text(s.url + ".refmount/metrics", lambda t: (get_200 + " ").encode() in t)
    assert value(text, get_200) >= 1
    no_sentinel(text)
    status, text = get(f"http://127.0.0.1:{sport}/metrics")
    assert status == 200
    assert value(text, 'refmount_info{frontend="http"}') == 1 and value(text, "refmount_sets_open") == 1
    # a reload replaces b; the old version, idle, closes, and its counts stay in the sums
    read_before = value(text, "refmount_read_bytes_total")
    assert read_before >= 100
    inline_set(root / f"{KEY}b.json", 4)
    os.kill(s.pid, signal.SIGUSR1)
    text = wait_text(s.url + ".refmount/metrics", lambda t: value(t, "refmount_set_reloads_total") == 1)
    assert value(text, "refmount_set_reloads_total") == 1, text.decode()
    reply = s.request("GET", f"/{KEY}b/k")
    assert reply.status == 200 and reply.body == bytes([4]) * 100
    deadline = time.monotonic() + 10
    while "version 1 closed" not in s.log_text():
        assert time.monotonic() < deadline, "the replaced version did not close"
        time.sleep(0.1)
    text = get(s.url + ".refmount/metrics")[1]
    assert value(text, "refmount_read_bytes_total") >= read_before + 100, text.decode()


def test_a_metrics_address_in_use_is_one_error_and_nothing_mounted(mount_fails, sentinel_set):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _result, line = mount_fails(sentinel_set, f"metrics=127.0.0.1:{port}",
                                   must_mention=("metrics", "in use"))
    assert "-o metrics=" in line


def test_a_mount_without_the_option_listens_on_nothing_new(mount, sentinel_set):
    m = mount(sentinel_set)
    pid = m.procs[0].pid
    listening = [c for c in psutil.Process(pid).net_connections(kind="inet") if c.status == "LISTEN"]
    assert not listening, listening
