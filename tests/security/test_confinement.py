"""Confinement: reference sets are untrusted.

* A private mount (no allow_other/allow_root) may read any local file: only its owner can use
  it, so nothing is gained. A SHARED mount may read local targets only under ``allow_local``
  (default: the directory of a local SOURCE; nothing for a remote SOURCE), with symlinks
  resolved, checked at mount and again at every read. Tested by mounting as root with
  ``allow_other`` and reading as ``nobody`` (setpriv), including a target swapped for a
  symlink to /etc/shadow after mounting, a Parquet chunk pointing at /etc/shadow, and chained
  fsspec URLs whose inner file system would open local files itself.
* Credentials (remote_options, URL user:password@ and token/signature query values, SOURCE URL,
  the environment) never appear in the daemon log, xattrs, /proc/<daemon>/cmdline or environ,
  /proc/mounts, ``ps`` output or CLI error messages (sentinel secrets).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from support.confinement import as_nobody, mkdir_public, parquet_set, write_json
from support.mounts import (
    CLI,
    is_mounted,
    mount_entries,
    opts_arg,
    run_cli,
    stop_foreground,
)

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

SHADOW = Path("/etc/shadow")


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def shadow_bytes() -> bytes:
    data = SHADOW.read_bytes()
    assert len(data) >= 20, "/etc/shadow is too short to recognise"
    return data


def nobody_cat(path) -> subprocess.CompletedProcess:
    return as_nobody("cat", str(path))


def assert_no_leak(r: subprocess.CompletedProcess, secret: bytes, what: str) -> None:
    for needle in (secret[:20], secret.splitlines()[0][:12]):
        assert needle not in r.stdout, f"{what}: nobody read /etc/shadow through the mount!"


def errno_of(path) -> int | None:
    try:
        Path(path).read_bytes()
    except OSError as e:
        return e.errno
    return None


def refusal_problems(m, keys, secret: bytes, eio_message: bool) -> list[str]:
    """What is wrong with reading ``keys`` of mount ``m``: as nobody, the secret must not
    leak and the read must fail (with "Input/output error" when ``eio_message``); as root
    through the mount, EIO."""
    problems = []
    for key in keys:
        r = nobody_cat(m / key)
        try:
            assert_no_leak(r, secret, key)
        except AssertionError as e:
            problems.append(str(e))
            continue
        if eio_message and (r.returncode == 0 or b"Input/output error" not in r.stderr):
            problems.append(f"{key}: expected EIO, got rc={r.returncode} {r.stderr!r}")
        elif not eio_message and r.returncode == 0:
            problems.append(f"{key}: nobody read {len(r.stdout)} bytes")
        if errno_of(m / key) != errno.EIO:  # the same for root reading through the mount
            problems.append(f"{key}: root read through the mount: {errno_of(m / key)}")
    return problems


# --- private vs shared mounts at mount time --------------------------------------------------------


def test_private_mount_may_read_any_local_file(mount, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.bin").write_bytes(b"0123456789")
    src = tmp_path / "refs" / "refs.json"
    src.parent.mkdir()
    write_json(src, {"f": [str(elsewhere / "f.bin"), 2, 5], "shadow": [str(SHADOW), 0, 4]})
    m = mount(src, "no_disk_cache")
    assert (m / "f").read_bytes() == b"23456"
    assert (m / "shadow").read_bytes() == SHADOW.read_bytes()[:4]  # root may read it anyway
    assert stat.S_IMODE(os.stat(m.path).st_mode) == 0o555
    assert "allow_other" not in next(e for e in mount_entries() if e[1] == str(m.path))[3]


def test_shared_mount_refuses_targets_outside_allowed_dirs(mount_fails, tmp_path):
    """allow_other / allow_root mounts: every way of naming a file outside the set's directory
    is refused at mount, naming the key and the way to allow it."""
    src_dir = tmp_path / "set"
    src_dir.mkdir()
    (src_dir / "inside.bin").write_bytes(b"fine")
    os.symlink(SHADOW, src_dir / "link-to-shadow")
    os.symlink("/etc", src_dir / "etc-link")
    outside = {
        "absolute": [str(SHADOW), 0, 10],
        "file-url": [f"file://{SHADOW}"],
        "root-home": ["file:///root/.ssh/id_rsa", 0, 10],
        "dotdot-relative": ["../../../../../../../../etc/shadow", 0, 10],
        "dotdot-absolute": [f"{src_dir}/../../../../../../etc/shadow", 0, 10],
        "local-protocol": [f"local://{SHADOW}", 0, 10],
        "chained-cache": [f"simplecache::file://{SHADOW}", 0, 10],
        "symlink-in-set-dir": [str(src_dir / "link-to-shadow"), 0, 10],
        "symlinked-dir-in-set-dir": [str(src_dir / "etc-link" / "shadow"), 0, 10],
        "proc-environ": ["/proc/self/environ"],
    }
    cases = []
    for i, (name, value) in enumerate(outside.items()):
        src = write_json(src_dir / f"refs-{i}.json", {"ok": [str(src_dir / "inside.bin")],
                                                        f"k/{name}": value})
        cases.append((name, src, "allow_other"))
        if name in ("absolute", "symlink-in-set-dir", "chained-cache"):
            cases.append((name, src, "allow_root"))
    mnts = [mount_fails.new_mountpoint("fail") for _ in cases]

    def one(i: int) -> str | None:
        name, src, share = cases[i]
        try:
            _r, line = mount_fails(src, share, "no_disk_cache", must_mention=(f"k/{name}",),
                                   mnt=mnts[i])
        except AssertionError as e:
            return f"{name} ({share}): {e}"
        return None if "allow_local" in line else f"{name}: no hint how to allow it: {line}"

    with ThreadPoolExecutor(4) as ex:
        problems = [p for p in ex.map(one, range(len(cases))) if p]
    assert not problems, "\n\n".join(problems)


def test_shared_mount_of_a_remote_source_allows_no_local_files(mount, mount_fails, srv, tmp_path):
    data = tmp_path / "local.bin"
    data.write_bytes(b"local data")
    srv.put("data/remote.bin", b"remote data")
    srv.put("local.json", json.dumps({"k/local": [str(data), 0, 5]}).encode())
    srv.put("remote.json", json.dumps({"k/remote": [srv.url_for("data/remote.bin"), 0, 6]}).encode())
    _r, line = mount_fails(srv.url_for("local.json"), "allow_other", "no_disk_cache",
                           must_mention=("k/local", "allow_local"))
    assert "none" in line, line
    m = mount(srv.url_for("remote.json"), "allow_other", "no_disk_cache")
    assert (m / "k/remote").read_bytes() == b"remote"
    # an explicit allow_local= opens exactly that directory
    m2 = mount(srv.url_for("local.json"), "allow_other", "no_disk_cache", f"allow_local={tmp_path}")
    assert (m2 / "k/local").read_bytes() == b"local"


# --- an unprivileged user reading through an allow_other mount ---------------------------------------


def test_nobody_cannot_read_shadow_through_an_allow_other_mount(mount, public, shadow_bytes):
    """Mounted by root with allow_other: nobody reads the set's own files, and gets EIO (never
    the bytes) where a target is swapped for a symlink to /etc/shadow after mounting, or its
    directory for a symlink to /etc."""
    src_dir = mkdir_public(public / "set")
    (src_dir / "data.bin").write_bytes(bytes(range(256)) * 4)
    (src_dir / "swap.bin").write_bytes(b"S" * 4096)
    (src_dir / "whole.bin").write_bytes(b"W" * 300)
    mkdir_public(src_dir / "sub")
    (src_dir / "sub" / "shadow").write_bytes(b"decoy " * 20)
    for p in src_dir.rglob("*"):
        if p.is_file():
            p.chmod(0o600)  # nobody could not read them directly: only through the mount
    src = write_json(src_dir / "refs.json", {
        "ok": [str(src_dir / "data.bin"), 16, 32],
        "swap/early": [str(src_dir / "swap.bin"), 0, 100],
        "swap/late": [str(src_dir / "swap.bin"), 0, 64],
        "swap/whole": [str(src_dir / "whole.bin")],
        "dirswap/shadow": [str(src_dir / "sub" / "shadow"), 0, 30],
    })
    mnt = mkdir_public(public / "mnt")
    m = mount(src, "allow_other", "no_disk_cache", mnt=mnt)

    direct = nobody_cat(SHADOW)
    assert direct.returncode != 0, "nobody can read /etc/shadow directly: test is meaningless"
    r = nobody_cat(m / "ok")
    assert r.returncode == 0 and r.stdout == (bytes(range(256)) * 4)[16:48], r.stderr
    assert nobody_cat(m / "swap/early").stdout == b"S" * 100

    # swap the targets after mounting
    (src_dir / "swap.bin").unlink()
    os.symlink(SHADOW, src_dir / "swap.bin")
    (src_dir / "whole.bin").unlink()
    os.symlink(SHADOW, src_dir / "whole.bin")
    shutil.rmtree(src_dir / "sub")
    os.symlink("/etc", src_dir / "sub")

    problems = refusal_problems(m, ("swap/late", "swap/whole", "dirswap/shadow"), shadow_bytes,
                                eio_message=True)
    assert not problems, "\n".join(problems)
    log = m.log.read_text(errors="replace")
    assert "read failed: key=swap/late" in log and "outside the allowed directories" in log
    # the mount keeps serving
    assert nobody_cat(m / "ok").returncode == 0


def test_nobody_cannot_read_shadow_through_a_parquet_chunk(mount, public, shadow_bytes):
    root = mkdir_public(public / "set.parquet")
    (root / "inside.bin").write_bytes(b"inside bytes")
    parquet_set(root, [
        (str(root / "inside.bin"), 0, 6, None),  # v/0: fine
        (str(SHADOW), 0, 30, None),  # v/1: a range of /etc/shadow
        (f"file://{SHADOW}", 0, 0, None),  # v/2: the whole of it
        ("../../../../../../../etc/shadow", 5, 10, None),  # v/3: relative escape
        (None, 0, 0, b"raw"),  # v/4: inline
    ])
    mnt = mkdir_public(public / "mnt")
    m = mount(root, "allow_other", "no_disk_cache", mnt=mnt)  # lazy: mounting succeeds
    assert nobody_cat(m / "v/0").stdout == b"inside"
    assert nobody_cat(m / "v/4").stdout == b"raw"
    problems = refusal_problems(m, ("v/1", "v/2", "v/3"), shadow_bytes, eio_message=False)
    assert not problems, "\n".join(problems)
    assert nobody_cat(m / "v/0").returncode == 0


CHAINED = {
    # fsspec's ReferenceFileSystem reads a refs file and then opens ITS targets itself
    "reference-local-refs": "reference://shadow::{set}/evil.json",
    "reference-remote-refs": "reference://shadow::{http}/evil.json",
    # DirFileSystem joins paths under a root it does not confine
    "dir-dotdot": "dir://../../../../../../etc/shadow::file://{set}",
}


@pytest.mark.parametrize("vector", list(CHAINED), ids=list(CHAINED))
@pytest.mark.parametrize("ref", ["range", "whole"])
def test_chained_urls_cannot_smuggle_local_files(mount, mount_fails, public, srv, shadow_bytes,
                                                 vector, ref):
    """A chained URL whose links all pass the check, but whose inner file system opens a local
    file of its own choosing: refused at mount, or EIO at read — never the bytes."""
    set_dir = mkdir_public(public / "set")
    evil = json.dumps({"shadow": [str(SHADOW)]}).encode()
    (set_dir / "evil.json").write_bytes(evil)
    srv.put("evil.json", evil)
    url = CHAINED[vector].format(set=set_dir, http=srv.url)
    value = [url, 0, 24] if ref == "range" else [url]
    src = write_json(set_dir / "refs.json", {"ok": "inline", "smuggled": value})
    mnt = mkdir_public(public / "mnt")
    r = run_cli(str(src), str(mnt), *opts_arg(
        [f"log={public / 'chained.log'}", "allow_other", "no_disk_cache"]))
    m = mount.track(src, "allow_other", "no_disk_cache", mnt=mnt)  # cleaned up either way
    m.refresh_procs()
    if r.returncode != 0:  # refused at mount: fine, if it says so in one line
        assert len(r.stderr_lines) == 1 and "smuggled" in r.stderr, r.stderr
        assert not is_mounted(mnt)
        return
    got = nobody_cat(mnt / "smuggled")
    assert_no_leak(got, shadow_bytes, f"{vector} ({ref})")
    assert got.returncode != 0, f"{vector}: nobody read {len(got.stdout)} bytes"


# --- credentials never leak ------------------------------------------------------------------------

SECRETS = {
    "remote_options": "SENTINEL-RO-7f3a",
    "target_options": "SENTINEL-TO-91bc",
    "url_password": "SENTINEL-PW-55de",
    "url_token": "SENTINEL-TOK-0a0a",
    "url_signature": "SENTINEL-SIG-beef",
    "source_password": "SENTINEL-SRCPW-c0c0",
    "environment": "SENTINEL-ENV-d00d",
}


def _find_secrets(where: str, text: str | bytes, found: list[str],
                  secrets: dict[str, str] = SECRETS) -> None:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    for name, secret in secrets.items():
        if secret in text:
            line = next(ln for ln in text.splitlines() if secret in ln)
            found.append(f"{name} secret in {where}: {line.strip()[:300]}")


def test_sentinel_secrets_never_appear(mount, mount_fails, srv, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRETS["environment"])
    monkeypatch.setenv("REFMOUNT_TEST_TOKEN", SECRETS["environment"])
    blob = bytes(range(256)) * 64
    srv.put("data/ok.bin", blob)
    srv.put("data/flaky.bin", blob)
    srv.put("data/short.bin", blob)
    srv.put("data/slow.bin", blob)
    tok = f"token={SECRETS['url_token']}"
    sig = f"X-Amz-Signature={SECRETS['url_signature']}&X-Amz-Credential=AKIA/x"
    userinfo = f"reader:{SECRETS['url_password']}"

    # A: remote_options carry an Authorization header; URLs carry tokens/signatures.
    refs_a = {
        "ok": [srv.url_for("data/ok.bin"), 0, 100],
        "e500": [srv.url_for("data/flaky.bin", query=tok), 0, 100],
        "e404": [srv.url_for("data/missing.bin", query=sig), 0, 100],
        "short": [srv.url_for("data/short.bin", query=tok), 100, 100],
        "slow": [srv.url_for("data/slow.bin", query=sig), 0, 100],
        "whole404": [srv.url_for("data/missing2.bin", query=tok)],
    }
    src_a = write_json(tmp_path / "a.json", refs_a)
    remote = {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRETS['remote_options']}"}}}
    srv.add_fault("/data/flaky.bin", "status", times=None, status=500)
    srv.add_fault("/data/short.bin", "short", times=None)
    srv.add_fault("/data/slow.bin", "stall", times=None, seconds=60)
    # timeouts far above a loaded machine's answer time: only "slow" may time out (it stalls)
    m_a = mount(src_a, f"remote_options={json.dumps(remote)}", "no_disk_cache", "retries=1",
                "timeout=5")
    # B: user:password@ in target URLs, and in the SOURCE URL (served by the same server).
    refs_b = {
        "ok": [srv.url_for("data/ok.bin", userinfo=userinfo), 0, 100],
        "e404": [srv.url_for("data/missing.bin", userinfo=userinfo), 0, 100],
        "e500": [srv.url_for("data/flaky.bin", userinfo=userinfo), 0, 100],
        "drop": [srv.url_for("data/short.bin", userinfo=userinfo, query=tok), 0, 100],
    }
    srv.put("refs/b.json", json.dumps(refs_b).encode())
    src_b = srv.url_for("refs/b.json", userinfo=f"src:{SECRETS['source_password']}")
    target = {"headers": {"X-Source-Token": SECRETS["target_options"]}}
    m_b = mount(src_b, f"target_options={json.dumps(target)}", "no_disk_cache", "retries=1",
                "timeout=30")

    for m, refs in ((m_a, refs_a), (m_b, refs_b)):
        for key in refs:
            with contextlib.suppress(OSError):
                (m / key).read_bytes()
    assert (m_a / "ok").read_bytes() == blob[:100]
    assert (m_b / "ok").read_bytes() == blob[:100]
    # the secrets were really used
    seen = srv.log(method=None)
    assert any(r.headers.get("Authorization") == f"Bearer {SECRETS['remote_options']}" for r in seen)
    assert any(r.headers.get("X-Source-Token") == SECRETS["target_options"] for r in seen)
    assert any(r.headers.get("Authorization", "").startswith("Basic ") for r in seen)

    found: list[str] = []
    failing = []
    # CLI errors that involve the secrets
    failing.append(mount_fails(srv.url_for("refs/missing.json",
                                           userinfo=f"src:{SECRETS['source_password']}",
                                           query=tok), "no_disk_cache")[0])
    failing.append(mount_fails(srv.url_for("refs/missing.json"), "no_disk_cache",
                               f"target_options={json.dumps(target)}")[0])
    bad = write_json(tmp_path / "bad.json", {"k": [f"nosuch://{userinfo}@h/x?{tok}", 0, 1]})
    failing.append(mount_fails(bad, "no_disk_cache", f"remote_options={json.dumps(remote)}")[0])
    bad_opts = f"remote_options={json.dumps(remote)[:-3]}"  # invalid JSON around a secret
    failing.append(mount_fails(src_a, "no_disk_cache", bad_opts)[0])
    for r in failing:
        _find_secrets(f"CLI stderr of {' '.join(r.args[3:5])}", r.stderr, found)

    for m in (m_a, m_b):
        assert m.result is not None
        _find_secrets(f"CLI stderr of mount {m.path.name}", m.result.stderr, found)
        _find_secrets(f"daemon log {m.log.name}", m.log.read_bytes(), found)
        x = subprocess.run(["getfattr", "-d", "-m", "-", "-R", str(m.path)], capture_output=True)
        _find_secrets(f"xattrs of {m.path.name}", x.stdout + x.stderr, found)
        st = subprocess.run([*CLI, "stats", str(m.path)], capture_output=True)
        _find_secrets(f"refmount stats {m.path.name}", st.stdout + st.stderr, found)
        m.refresh_procs()
        assert m.procs
        for p in m.procs:
            cmdline = Path(f"/proc/{p.pid}/cmdline").read_bytes()
            _find_secrets(f"/proc/{p.pid}/cmdline", cmdline.replace(b"\0", b" "), found)
            environ = Path(f"/proc/{p.pid}/environ").read_bytes()
            not_env = {k: v for k, v in SECRETS.items() if k != "environment"}
            _find_secrets(f"/proc/{p.pid}/environ", environ.replace(b"\0", b"\n"), found, not_env)
    _find_secrets("/proc/mounts", Path("/proc/mounts").read_text(), found)
    ps = subprocess.run(["ps", "-eo", "pid,args", "--width", "100000"], capture_output=True)
    _find_secrets("ps -eo args", ps.stdout, found)
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            _find_secrets(f"cmdline of pid {p.pid}", " ".join(p.info["cmdline"] or []), found)
    assert not found, "secrets leaked:\n" + "\n".join(dict.fromkeys(found))



def _refmount_family(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    return []


def _cmdlines(procs: list[psutil.Process]) -> dict[int, bytes]:
    seen = {}
    for p in procs:
        with contextlib.suppress(OSError):
            seen[p.pid] = Path(f"/proc/{p.pid}/cmdline").read_bytes().replace(b"\0", b" ")
    return seen


@pytest.mark.parametrize("how", ["service", "foreground-typed"])
def test_sentinel_secrets_stay_off_every_command_line(mount, srv, tmp_path, how):
    """SOURCE with user:password@, inline target_options and remote_options holding sentinel
    secrets, mounted as refmount@.service does (``--env``: SOURCE and options in the
    environment) and by hand with ``-f`` (all of it typed on the command line). The command
    line of every refmount process — the serving one, the indexer while it parses, the cache
    writer — is sampled from the start until the mount has served a read: the service's never
    holds a secret; the typed one's holds none from the moment the CLI has masked it (one
    warning says they were visible until then)."""
    blob = bytes(range(256)) * 4
    srv.put("data/ok.bin", blob)
    # the indexer lives for its imports at least: long enough to be sampled
    refs = {"ok": [srv.url_for("data/ok.bin"), 0, 100], "big": [srv.url_for("data/ok.bin")]}
    srv.put("refs/s.json", json.dumps(refs).encode())
    source = srv.url_for("refs/s.json", userinfo=f"src:{SECRETS['source_password']}")
    target = {"headers": {"X-Source-Token": SECRETS["target_options"]}}
    remote = {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRETS['remote_options']}"}}}
    m = mount.track(source, f"target_options={json.dumps(target)}",
                    f"remote_options={json.dumps(remote)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFMOUNT_")}
    if how == "service":
        env.update({"REFMOUNT_SOURCE": source, "REFMOUNT_OPTIONS": ",".join(m.opts)})
        argv = [*CLI, "--env", str(m.path), "-f"]
    else:
        argv = [*CLI, source, str(m.path), "-f", *opts_arg(m.opts)]
    err_path = tmp_path / "stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    m.procs.append(psutil.Process(proc.pid))
    samples: list[tuple[float, dict[int, bytes]]] = []
    masked_at = None  # the first sample whose CLI command line is masked
    indexer_seen = writer_seen = False
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            family = _refmount_family(proc.pid)
            lines = _cmdlines(family)
            samples.append((time.monotonic(), lines))
            if masked_at is None and b"***" in lines.get(proc.pid, b""):
                masked_at = len(samples) - 1
            indexer_seen |= any(b"refmount.serving.indexer" in c for c in lines.values())
            writer_seen |= any(b"refmount.cache.writer" in c for c in lines.values())
            if writer_seen and is_mounted(m.path):
                break
            assert proc.poll() is None, err_path.read_text(errors="replace")
            time.sleep(0.01)
        assert (m / "ok").read_bytes() == blob[:100]
        assert indexer_seen and writer_seen, "did not see the indexer and the cache writer"
        found: list[str] = []
        if how == "service":
            checked = samples
        else:
            assert masked_at is not None, "the typed command line was never masked"
            checked = samples[masked_at:]
        for _t, lines in checked:
            for pid, line in lines.items():
                _find_secrets(f"/proc/{pid}/cmdline", line, found)
        for p in _refmount_family(proc.pid)[1:]:  # children: nothing of it in the environment
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{p.pid}/environ").read_bytes().replace(b"\0", b"\n")
                _find_secrets(f"/proc/{p.pid}/environ", environ, found)
        stderr = err_path.read_text(errors="replace")
        _find_secrets("stderr", stderr, found)
        assert not found, "secrets on a command line:\n" + "\n".join(dict.fromkeys(found))
        warned = "credentials on the command line" in stderr
        assert warned == (how != "service"), stderr
    finally:
        stop_foreground(proc, m.path)
