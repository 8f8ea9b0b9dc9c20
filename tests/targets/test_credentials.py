"""Credentials that refresh, through a real mount: a target rule's credential process asks
the fault server (which requires bearer tokens it issued less than a few seconds ago) for a
token; the mount refreshes it before it expires while readers keep reading, fails reads with
EIO (one log line) once the process fails and the token has expired, and recovers when the
process works again. The tokens appear nowhere: ps, /proc/mounts, the log, xattrs, stats."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.faultserver import TOKEN_PATH, FaultServer
from support.mounts import mount_entries, run_cli
from support.probes import log_lines, stats, wait_for

from refmount.targets.credentialoutput import parse_output

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

LIFETIME = 4.0  # seconds a token is valid: refreshed a quarter of that before it expires
STDERR_SECRET = "SENTINEL-stderr-91c2"  # what the failing process says on stderr


def credential_script(tmp_path: Path, srv: FaultServer) -> tuple[Path, Path, Path]:
    """A credential process: asks the server for a token (unless ``broken`` exists, then it
    fails saying a secret on stderr); each run appends a line to ``runs``."""
    broken, runs = tmp_path / "broken", tmp_path / "runs"
    script = tmp_path / "get-token.py"
    script.write_text(textwrap.dedent(f"""\
        import json, os, sys, time, urllib.request
        with open({str(runs)!r}, "a") as f:
            f.write(f"{{time.time()}}\\n")
        if os.path.exists({str(broken)!r}):
            print("identity provider says no: password={STDERR_SECRET}", file=sys.stderr)
            sys.exit(1)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
        with opener.open({srv.url + TOKEN_PATH!r}, timeout=10) as r:
            token = json.load(r)
        print(json.dumps({{"options": {{"headers": {{"Authorization": "Bearer " + token["token"]}}}},
                          "expiry": token["expiry"]}}))
        """))
    return script, broken, runs


def read_fresh(path: Path) -> bytes:
    """The file's bytes from the daemon (the page cache dropped first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)


class Readers:
    """Threads reading random keys through the mount until stopped; results per outcome."""

    def __init__(self, mnt: Path, expected: dict[str, bytes], n: int = 4) -> None:
        self.mnt, self.expected = mnt, expected
        self.ok = 0
        self.errors: list[tuple[float, str, str]] = []  # (wall clock, key, what)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(s,)) for s in range(n)]

    def _read(self, seed: int) -> None:
        rng = random.Random(seed)
        keys = sorted(self.expected)
        while not self._stop.is_set():
            key = rng.choice(keys)
            try:
                got = read_fresh(self.mnt / key)
                problem = None if got == self.expected[key] else "wrong bytes"
            except OSError as e:
                problem = os.strerror(e.errno or 0)
            with self._lock:
                if problem is None:
                    self.ok += 1
                else:
                    self.errors.append((time.time(), key, problem))

    def __enter__(self) -> Readers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


class CommandLines:
    """Every process's command line, sampled every 50 ms while it runs."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    with contextlib.suppress(OSError):
                        self.seen.add(Path(f"/proc/{pid}/cmdline").read_bytes())

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_credentials_refresh_under_reads_fail_with_eio_and_recover_and_never_show(
        mount, srv, tmp_path: Path) -> None:
    srv.require_bearer(LIFETIME)
    rng = random.Random(7)
    expected, refs = {}, {}
    for i in range(8):
        blob = rng.randbytes(4096 + i)
        refs[f"k{i}"] = [srv.put(f"data/k{i}.bin", blob), 0, len(blob)]
        expected[f"k{i}"] = blob
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    script, broken, runs = credential_script(tmp_path, srv)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"prefix": srv.url + "/data/",
                                  "credentials": {"process": [sys.executable, str(script)]}}]))
    rules.chmod(0o600)

    with CommandLines() as ps:
        m = mount(str(source), f"targets=@{rules}", "no_disk_cache", "memory_cache=0",
                  "max_readahead=0", "timeout=5", "retries=0")
        # 1. Tokens that expire every 4 s, under continuous reads: no read fails.
        with Readers(m.path, expected) as readers:
            time.sleep(3.2 * LIFETIME)
        assert readers.errors == [], readers.errors[:5]
        assert readers.ok > 100, readers.ok
        refreshed = len(runs.read_text().splitlines())
        assert refreshed >= 4, f"{refreshed} runs in {3.2 * LIFETIME} s"
        assert srv.count(None) > 0 and [r for r in srv.log(None) if r.status == 401] == []
        # Each token was fetched before the one before it expired, once three quarters of
        # its lifetime had passed (less the time the process takes to start and ask).
        expiries = list(srv.tokens_issued().values())
        early = [round(e - (f - LIFETIME), 2) for e, f in itertools.pairwise(expiries)]
        assert all(0 < x <= LIFETIME / 4 for x in early), early
        assert log_lines(m, "credentials for target rule 1") and log_lines(m, "generation 3")
        shown = stats(m)["credentials"]["1"]
        assert shown["generation"] >= 4 and not shown["failing"] and shown["failures"] == 0

        # 2. The process fails: once the token has expired reads fail with EIO, logged once.
        broken.touch()
        with Readers(m.path, expected, n=2) as readers:
            assert wait_for(lambda: readers.errors, LIFETIME + 3), "no read failed"
        assert {problem for _, _, problem in readers.errors} == {os.strerror(5)}  # EIO
        # Not before the last token stopped being used (a tenth of its lifetime before it
        # expired): until then reads went on with it.
        last_usable = max(srv.tokens_issued().values()) - LIFETIME / 10
        assert readers.errors[0][0] > last_usable - 0.05, "reads failed while a token was valid"
        lines = log_lines(m, "credentials for target rule 1")
        failures = [ln for ln in lines if "failed (exit status 1)" in ln]
        assert len(failures) == 1, "\n".join(lines)
        line = failures[0]
        assert "identity provider says no: password=***" in line and "EIO" in line, line
        assert log_lines(m, "read failed") == [], "each failed read was logged again"
        last = stats(m)["last_error"]
        assert last and "no valid credentials" in last["reason"], last
        assert stats(m)["credentials"]["1"]["failing"]

        # 3. It works again: reads recover (the next retry, at most 8 s after the failures
        # began) and it says so once.
        broken.unlink()
        recovered = wait_for(lambda: _try(m.path / "k0") == expected["k0"], 12, interval=0.25)
        assert recovered, m.log_text(20)
        assert len(log_lines(m, "works again after")) == 1
        shown = {
            "xattrs": json.dumps({k: [os.getxattr(m.path / k, a).decode()
                                      for a in os.listxattr(m.path / k)]
                                  for k in expected}),
            "root xattrs": json.dumps([os.getxattr(m.path, a).decode()
                                       for a in os.listxattr(m.path)]),
            "stats": run_cli("stats", str(m.path), "--json").stdout,
            "/proc/mounts": json.dumps(mount_entries()),
        }
    m.cleanup()
    shown["log"] = m.log.read_text(errors="replace")
    shown["ps"] = "\n".join(c.decode(errors="replace") for c in ps.seen)
    assert str(script) in shown["ps"], "the credential process was never seen running"
    tokens = srv.tokens_issued()
    assert len(tokens) >= 5
    for where, text in shown.items():
        leaked = [t for t in tokens if t in text]
        assert not leaked and STDERR_SECRET not in text, f"a credential in {where}"
    assert "generation" in shown["log"]


def _try(path: Path) -> bytes | int:
    try:
        return read_fresh(path)
    except OSError as e:
        return e.errno or 0


EXAMPLE = Path(__file__).resolve().parents[2] / "docs/examples/earthdata-s3-credentials.py"


def test_the_earthdata_example_prints_aws_credentials_refmount_reads(srv, tmp_path: Path) -> None:
    """docs/examples/earthdata-s3-credentials.py against a stand-in for a DAAC's
    s3credentials endpoint (bearer token required): its output is AWS's format, which
    refmount turns into s3fs's options; a refused token is one line on stderr, exit 1."""
    srv.require_bearer(60)
    srv.put("s3credentials", json.dumps({
        "accessKeyId": "AKIAEXAMPLE", "secretAccessKey": "wJalrXUtnFEMI/EXAMPLEKEY",
        "sessionToken": "FwoGZXIvYXdzEXAMPLE", "expiration": "2030-01-27 00:50:09+00:00"}).encode())
    token_file = tmp_path / "edl-token"
    token_file.write_text(str(srv.issue_token()["token"]) + "\n")
    env = {**os.environ, "EARTHDATA_TOKEN_FILE": str(token_file), "no_proxy": "*"}
    url = srv.url_for("s3credentials")
    r = subprocess.run([sys.executable, str(EXAMPLE), url], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    cred = parse_output(r.stdout.encode(), now=time.time())
    assert cred.options == {"key": "AKIAEXAMPLE", "secret": "wJalrXUtnFEMI/EXAMPLEKEY",
                            "token": "FwoGZXIvYXdzEXAMPLE"}
    assert cred.expiry == datetime(2030, 1, 27, 0, 50, 9, tzinfo=UTC).timestamp()
    token_file.write_text("not-a-token-this-server-issued")
    r = subprocess.run([sys.executable, str(EXAMPLE), url], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"{url}: HTTP 401 Unauthorized\n"


def test_refmount_serve_reads_under_a_rules_credential(serve, srv, tmp_path: Path) -> None:
    """The HTTP server runs the rules' credential processes as the mount does."""
    srv.require_bearer(60)
    blob = random.Random(3).randbytes(10_000)
    source = tmp_path / "refs.json"
    source.write_text(json.dumps({"a": [srv.put("data/a.bin", blob), 100, 5000]}))
    script, _, runs = credential_script(tmp_path, srv)
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"prefix": srv.url + "/data/",
                                  "credentials": {"process": [sys.executable, str(script)]}}]))
    s = serve(source, f"targets=@{rules}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(s.url.rstrip("/") + "/a", timeout=30) as r:
        assert r.read() == blob[100:5100]
    assert runs.read_text().count("\n") == 1 and len(srv.tokens_issued()) == 1
    assert [q for q in srv.log(None) if q.status == 401] == []
