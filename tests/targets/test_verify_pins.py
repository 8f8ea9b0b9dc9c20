"""``refmount verify`` and ``-o pins=FILE`` through real servers and mounts.

* verify against the fault server (a target that 403s, one that errors, a truncated one, a
  missing one), a local file outside ``allow_local``: one table row each, exit status 1, the
  same in ``--json``;
* ``verify --pin``, then mounts with ``-o pins=FILE`` of a set whose targets are served by
  nginx and read from a local file: reads are right; then both targets are rewritten in place
  (same size, other bytes). Blocks cached before (on disk) may still be served; every other
  read gives EIO; no read ever gives a byte of the new version — not even one an unpinned
  mount cached meanwhile; the log names each target once;
* ``refmount serve -o pins=FILE``: 502 for a changed target's key;
* S3: an unversioned object rewritten gives EIO, a versioned one is read at its pinned version.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path

import pytest
from support.faultserver import Fault
from support.mounts import run_cli
from support.paths import read_or_errno
from support.probes import log_lines, stats
from support.servers import moto_s3
from support.serving import serve_cli

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

KiB = 1024
CHUNK = 64 * KiB
N = 8  # keys per target


def test_verify_reports_every_problem_target(srv, tmp_path) -> None:
    srv.put("good.bin", b"g" * 1000)
    srv.put("forbidden.bin", b"f" * 1000)
    srv.put("broken.bin", b"b" * 1000)
    srv.put("short.bin", b"s" * 500)
    srv.set_faults("/forbidden.bin", [Fault("status", times=None, status=403, methods=("HEAD", "GET"))])
    srv.set_faults("/broken.bin", [Fault("status", times=None, status=500, methods=("HEAD", "GET"))])
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"x" * 10)
    inside = tmp_path / "set"
    inside.mkdir()
    (inside / "local.bin").write_bytes(b"l" * 100)
    refs = {".zgroup": '{"zarr_format": 2}',
            "a/0": [srv.url_for("/good.bin"), 0, 600], "a/1": [srv.url_for("/good.bin"), 600, 400],
            "b/0": [srv.url_for("/forbidden.bin"), 0, 10],
            "c/0": [srv.url_for("/broken.bin"), 0, 10],
            "d/0": [srv.url_for("/short.bin"), 400, 200],
            "e/0": [srv.url_for("/absent.bin", userinfo="user:hunter2"), 0, 10],
            "f/0": [str(inside / "local.bin"), 0, 100],
            "g/0": [str(outside / "secret.bin"), 0, 10],
            "h/0": [str(inside / "gone.bin"), 0, 10]}
    source = inside / "refs.json"
    source.write_text(json.dumps(refs))
    opts = f"timeout=5,retries=0,allow_local={inside}"
    r = run_cli("verify", source, "-o", opts)
    assert r.returncode == 1, r.stderr
    rows = {line.split()[1].rsplit("/", 1)[-1]: line.split()[0] for line in r.stdout.splitlines()[2:-1]}
    assert rows == {"forbidden.bin": "forbidden", "broken.bin": "error", "short.bin": "short",
                    "absent.bin": "missing", "secret.bin": "forbidden", "gone.bin": "missing"}, r.stdout
    assert r.stdout.splitlines()[-1] == "8 targets, 2 ok, 2 missing, 2 forbidden, 1 short, 1 error"
    assert "hunter2" not in r.stdout + r.stderr

    r = run_cli("verify", source, "-o", opts, "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["summary"]["targets"] == 8 and out["summary"]["ok"] == 2
    by_name = {t["url"].rsplit("/", 1)[-1]: t for t in out["targets"]}
    assert by_name["short.bin"] == {"url": srv.url_for("/short.bin"), "status": "short",
                                    "needed": 600, "size": 500,
                                    "reason": "500 bytes, references read up to byte 600"}
    assert by_name["good.bin"]["status"] == "ok" and by_name["good.bin"]["size"] == 1000
    assert "hunter2" not in r.stdout
    # each target asked once per run (the forbidden and broken ones: no retries asked for)
    assert srv.count("/good.bin", method=None) == 2 and srv.count("/broken.bin", method=None) == 2


def _rewrite(path: Path, later_by: float = 0.0) -> None:
    """Other bytes in place, the same size (as a repacked file); ``later_by`` moves the mtime
    on (nginx's ETag and Last-Modified count whole seconds)."""
    data = bytes(255 - b for b in path.read_bytes())
    with open(path, "r+b") as f:
        f.write(data)
    if later_by:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + int(later_by * 1e9)))


@pytest.fixture
def pinned_set(nginx, nginx_root, tmp_path):
    """A set of N keys into an nginx-served target and N into a local one, its pin file, and
    the bytes of the pinned version per key."""
    served = nginx_root / f"pins-{uuid.uuid4().hex[:8]}"
    served.mkdir()
    rng = random.Random(7)
    http_file, local_file = served / "remote.bin", tmp_path / "local.bin"
    http_file.write_bytes(rng.randbytes(N * CHUNK))
    local_file.write_bytes(rng.randbytes(N * CHUNK))
    refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
    old: dict[str, bytes] = {}
    for name, url, path in (("h", f"{nginx.url}/{served.name}/remote.bin", http_file),
                            ("l", str(local_file), local_file)):
        data = path.read_bytes()
        for i in range(N):
            refs[f"{name}/{i}"] = [url, i * CHUNK, CHUNK]
            old[f"{name}/{i}"] = data[i * CHUNK:(i + 1) * CHUNK]
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    pins = tmp_path / "pins.json"
    r = run_cli("verify", source, "--pin", pins)
    assert r.returncode == 0 and r.stdout.strip() == "2 targets, 2 ok", r.stdout + r.stderr
    pinned = json.loads(pins.read_text())["targets"]
    assert set(pinned[f"{nginx.url}/{served.name}/remote.bin"]) == {"size", "etag", "last_modified"}
    assert set(pinned[str(local_file)]) == {"size", "mtime_ns"}
    try:
        yield source, pins, old, (http_file, local_file)
    finally:
        shutil.rmtree(served, ignore_errors=True)


def test_a_pinned_mount_never_serves_a_changed_targets_bytes(mount, serve, pinned_set) -> None:
    source, pins, old, files = pinned_set
    opts = (f"pins={pins}", "max_readahead=0")  # only the blocks read are cached
    m = mount(source, *opts)
    warm = ["h/0", "h/1", "l/0", "l/1"]
    for key in warm:
        assert (m / key).read_bytes() == old[key]
    m.cleanup()  # the cache writer has written the warm blocks when the daemon is gone

    _rewrite(files[0], later_by=5)
    _rewrite(files[1])
    r = run_cli("verify", source, "-o", f"pins={pins}")
    assert r.returncode == 1 and r.stdout.splitlines()[-1] == "2 targets, 0 ok, 2 changed", r.stdout

    # An unpinned mount sharing the cache reads (and caches) the new version of every key...
    unpinned = mount(source, "max_readahead=0")
    new = {key: (unpinned / key).read_bytes() for key in old}
    assert all(new[key] != old[key] for key in old)
    unpinned.cleanup()

    # ... which a pinned mount never serves: the old bytes (cached before the change) or EIO.
    m = mount(source, *opts)
    got = {key: read_or_errno(m / key) for key in sorted(old)}
    for key, value in got.items():
        right = value == old[key] or value == errno.EIO
        assert right, f"{key}: {value if isinstance(value, int) else 'bytes of the new version'}"
    failed = {key for key, value in got.items() if value == errno.EIO}
    assert failed >= set(old) - set(warm), failed  # nothing but what was cached before is served
    assert {"h/0", "l/0"} - failed, "no block cached before the change was served"
    for _ in range(3):  # more reads: still EIO, still one log line per target
        assert read_or_errno(m / "h/5") == errno.EIO and read_or_errno(m / "l/5") == errno.EIO
    for f in files:
        assert len(log_lines(m, f"{f.name} is not its pinned version")) == 1, m.log_text()
    s = stats(m)
    assert s["pinned_targets_changed"] == 2 and s["pin_refusals"] >= len(failed) + 6

    # refmount serve shares the core: 502 for a changed target's key, logged once.
    served = serve(source, f"pins={pins}")
    for _ in range(2):
        assert served.request("GET", "/h/3").status == 502
        assert served.request("GET", "/l/3").status == 502
    assert served.log_text().count("remote.bin is not its pinned version") == 1
    assert served.stats()["pin_refusals"] >= 4


def test_a_mount_with_a_malformed_pin_file_is_refused(mount_fails, tmp_path) -> None:
    (tmp_path / "t.bin").write_bytes(b"t" * 10)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"k/0": ["t.bin", 0, 10]}))
    bad = tmp_path / "bad-pins.json"
    bad.write_text('{"format": "refmount-pins-1", "targets": {"x": {"size": "big"}}}')
    mount_fails(source, f"pins={bad}", must_mention=("pins", str(bad)))
    partial = tmp_path / "partial-pins.json"
    partial.write_text('{"format": "refmount-pins-1", "targets": {}}')
    mount_fails(source, f"pins={partial}", must_mention=("not pinned",))
    # hostile pin files, through both front ends: one line each, at once
    deep = tmp_path / "deep-pins.json"
    deep.write_text('{"format": "refmount-pins-1", "targets": ' + "[" * 200_000 + "]" * 200_000 + "}")
    digits = tmp_path / "digits-pins.json"
    digits.write_text('{"format": "refmount-pins-1", "targets": {"t.bin": {"size": 1' + "0" * 5000 + "}}}")
    big = tmp_path / "big-pins.json"
    big.write_bytes(b" " * ((64 << 20) + 1))
    for pins, words in ((deep, "nested deeper than 3 levels"), (digits, "not valid JSON"),
                        (big, "larger than 64 MiB"), ("/dev/zero", "is not a regular file")):
        began = time.monotonic()
        _, line = mount_fails(source, f"pins={pins}", must_mention=("pins", words))
        assert "recursion" not in line and "unexpected" not in line, line
        r = serve_cli(source, f"pins={pins}")
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
        assert time.monotonic() - began < 30


def test_s3_pins_read_a_versioned_object_by_its_version_and_refuse_others(mount, tmp_path) -> None:
    """Unversioned bucket: the object rewritten gives EIO (its ETag, asked before and after
    the read). Versioned bucket: the pinned version is read by its id, whatever came after."""
    import s3fs

    one, two = os.urandom(4 * CHUNK), os.urandom(4 * CHUNK)
    with moto_s3({"plain/a.bin": one}) as endpoint:
        fs = s3fs.S3FileSystem(key="test", secret="test", skip_instance_cache=True,
                               client_kwargs={"endpoint_url": endpoint, "region_name": "eu-west-1"})
        fs.mkdir("kept")
        fs.call_s3("put_bucket_versioning", Bucket="kept",
                   VersioningConfiguration={"Status": "Enabled"})
        fs.pipe("kept/b.bin", two)
        refs = {".zgroup": '{"zarr_format": 2}'}
        for name, url in (("a", "s3://plain/a.bin"), ("b", "s3://kept/b.bin")):
            for i in range(4):
                refs[f"{name}/{i}"] = [url, i * CHUNK, CHUNK]
        source = tmp_path / "refs.json"
        source.write_text(json.dumps(refs))
        remote = json.dumps({"key": "test", "secret": "test",
                             "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"}})
        pins = tmp_path / "pins.json"
        r = run_cli("verify", source, "--pin", pins, "-o", f"remote_options={remote}")
        assert r.returncode == 0, r.stdout + r.stderr
        pinned = json.loads(pins.read_text())["targets"]
        assert "version_id" in pinned["s3://kept/b.bin"] and "etag" in pinned["s3://plain/a.bin"]
        fs.pipe("plain/a.bin", bytes(255 - b for b in one))  # rewritten, the same size
        fs.pipe("kept/b.bin", bytes(255 - b for b in two))
        m = mount(source, f"pins={pins}", f"remote_options={remote}", "no_disk_cache")
        for i in range(4):
            assert read_or_errno(m / f"a/{i}") == errno.EIO
            assert (m / f"b/{i}").read_bytes() == two[i * CHUNK:(i + 1) * CHUNK]
        assert len(log_lines(m, "s3://plain/a.bin is not its pinned version")) == 1


def test_the_table_of_a_pin_file_is_handed_over_and_left_nowhere(mount, serve, tmp_path, monkeypatch) -> None:
    """The CLI parses ``-o pins=FILE`` once and hands its table to what serves in a private
    temporary file (targets/pinhandover.py): what serves removes it once mapped, and a start
    refused after it was written (a target not pinned), detached or ``-f``, mount or serve,
    removes it too."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    (tmp_path / "t.bin").write_bytes(b"t" * 10)
    (tmp_path / "u.bin").write_bytes(b"u" * 10)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"k/0": [str(tmp_path / "t.bin"), 0, 10]}))
    pins = tmp_path / "pins.json"
    assert run_cli("verify", source, "--pin", pins).returncode == 0
    m = mount(source, f"pins={pins}", "no_disk_cache")
    assert (m / "k/0").read_bytes() == b"t" * 10
    served = serve(source, f"pins={pins}")
    assert served.request("GET", "/k/0").body == b"t" * 10
    assert not list(runtime.iterdir()), f"left behind while serving: {list(runtime.iterdir())}"
    unpinned = tmp_path / "unpinned.json"
    unpinned.write_text(json.dumps({"k/0": [str(tmp_path / "t.bin"), 0, 10],
                                    "k/1": [str(tmp_path / "u.bin"), 0, 10]}))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for foreground in ([], ["-f"]):
        r = run_cli(unpinned, mnt, "-o", f"pins={pins},no_disk_cache", *foreground)
        assert r.returncode == 1 and "not pinned" in r.stderr, r.stderr
        r = serve_cli(unpinned, f"pins={pins}", "no_disk_cache", foreground=bool(foreground))
        assert r.returncode == 1 and "not pinned" in r.stderr, r.stderr
        assert not list(runtime.iterdir()), f"left behind: {list(runtime.iterdir())}"
