"""Refusals that name the cause and the next step: a FUSE mount that the kernel side refuses
(no access to /dev/fuse, allow_other without user_allow_other) with libfuse's own reason, a
non-empty mountpoint, a mistyped option or command; ``refmount stats`` of a failing and of a
dead mount; the note that names compressed arrays when ``decode`` is off."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.confinement import interpreter_for_others, mkdir_public, refmount_as_nobody, write_json
from support.mounts import assert_cli_error, daemon_procs, is_mounted, run_cli, wait_gone

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

NOBODY = 65534


@contextlib.contextmanager
def file_mode(path: str, mode: int):
    old = os.stat(path).st_mode & 0o7777
    os.chmod(path, mode)
    try:
        yield
    finally:
        os.chmod(path, old)


@contextlib.contextmanager
def fuse_conf_without_user_allow_other():
    conf = Path("/etc/fuse.conf")
    old = conf.read_text() if conf.exists() else None
    kept = [ln for ln in (old or "").splitlines() if ln.strip() != "user_allow_other"]
    conf.write_text("\n".join(kept) + "\n")
    try:
        yield
    finally:
        if old is None:
            conf.unlink()
        else:
            conf.write_text(old)


@pytest.fixture
def nobody_set(public):
    """A set, a mountpoint and a cache directory that ``nobody`` may use."""
    src = write_json(public / "refs.json", {".zgroup": '{"zarr_format": 2}'})
    mnt = mkdir_public(public / "mnt")
    os.chown(mnt, NOBODY, NOBODY)
    cache = mkdir_public(public / "cache")
    os.chown(cache, NOBODY, NOBODY)
    with interpreter_for_others():
        yield src, mnt, cache
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)


def single_error(r) -> str:
    lines = r.stderr.decode(errors="replace").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refmount: error:"), lines
    return lines[0]


@pytest.mark.parametrize("foreground", [False, True], ids=["detached", "foreground"])
def test_no_access_to_dev_fuse_is_named(nobody_set, foreground):
    src, mnt, cache = nobody_set
    with file_mode("/dev/fuse", 0o600):
        r = refmount_as_nobody(str(src), str(mnt), "-o", f"cache_dir={cache}",
                               *(["-f"] if foreground else []))
    assert r.returncode == 1, r
    line = single_error(r)
    assert "/dev/fuse" in line and "Permission denied" in line, line
    assert "mount as root" in line, line
    assert not is_mounted(mnt)
    assert not daemon_procs(mnt)


def test_allow_other_without_user_allow_other_is_named(nobody_set):
    src, mnt, cache = nobody_set
    with fuse_conf_without_user_allow_other():
        r = refmount_as_nobody(str(src), str(mnt), "-o", f"cache_dir={cache},allow_other")
    assert r.returncode == 1, r
    line = single_error(r)
    assert "user_allow_other" in line and "/etc/fuse.conf" in line, line
    assert "without allow_other" in line, line
    assert not is_mounted(mnt)
    assert not daemon_procs(mnt)


def test_nonempty_mountpoint_refused_unless_asked(mount_fails, mount, datasets, tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    (mnt / "mine.txt").write_text("keep me")
    mount_fails(datasets.refs["hand_local"], mnt=mnt, must_mention=("not empty", "nonempty"))
    m = mount(datasets.refs["hand_local"], "nonempty", mnt=mnt)
    assert (m / "hello.txt").read_bytes() == b"hello world\n"


def test_mistyped_option_and_command_suggest_the_right_one(datasets, tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    r = run_cli(datasets.refs["hand_local"], mnt, "-o", "cache_sise=1G")
    assert r.returncode == 1
    assert r.stderr_lines == ["refmount: error: unknown option 'cache_sise': did you mean "
                              "'cache_size'? (see refmount --help)"], r.stderr
    r = run_cli("stat", mnt)
    assert r.returncode == 1
    assert r.stderr_lines == ["refmount: error: unknown command 'stat': did you mean 'stats'?"]
    assert not is_mounted(mnt)


def test_stats_shows_the_last_error_and_numbers(mount, datasets, tmp_path):
    missing = tmp_path / "gone.bin"
    src = write_json(tmp_path / "refs.json", {"ok": "fine", "broken": [str(missing), 0, 10]})
    m = mount(src)
    with pytest.raises(OSError) as e:
        (m / "broken").read_bytes()
    assert e.value.errno == errno.EIO
    r = run_cli("stats", m.path, "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["keys"] == 2 and isinstance(stats["errors"], int) and stats["errors"] >= 1
    last = stats["last_error"]
    assert last["key"] == "broken" and str(missing) in last["target"], last
    assert stats["log"] == str(m.log), stats
    r = run_cli("stats", m.path)
    assert "last error" in r.stdout and "broken" in r.stdout and str(m.log) in r.stdout, r.stdout


def test_stats_of_a_dead_mount_says_how_to_clear_it(mount, datasets):
    m = mount(datasets.refs["hand_local"])
    os.listdir(m.path)
    m.kill_daemons(signal.SIGKILL)
    assert not wait_gone(m.procs, 10)
    r = run_cli("stats", m.path)
    assert r.returncode == 1
    assert r.stderr_lines == [f"refmount: error: {m.path}: stale mount (its daemon died); clear it "
                              f"with 'fusermount3 -uz {m.path}'"], r.stderr


def test_start_line_names_options_as_written(mount, datasets):
    m = mount(datasets.refs["hand_local"], "umask=027", "remote_options={\"secret_key\":\"s3nt1nel\"}")
    (m / "hello.txt").read_bytes()
    text = m.log.read_text()
    start = [ln for ln in text.splitlines() if " mounted " in ln]
    assert start, text
    assert "umask=027" in start[0] and 'remote_options={"secret_key":***}' in start[0], start[0]
    assert "s3nt1nel" not in text
    assert "memory_cache_size" not in start[0]  # option names, not field names


def test_a_note_names_compressed_arrays_when_decode_is_off(mount, datasets):
    m = mount(datasets.refs["nc4_local"])
    notes = [ln for ln in m.result.stderr_lines if ln.startswith("refmount: note:")]
    assert len(notes) == 1 and "-o decode" in notes[0] and "counts, flags" in notes[0], m.result.stderr
    assert "zlib" in notes[0] and "ncdump" in notes[0], notes[0]
    m = mount(datasets.refs["nc4_local"], "decode")
    assert not [ln for ln in m.result.stderr_lines if "note:" in ln], m.result.stderr
    m = mount(datasets.refs["hand_local"])  # no arrays: nothing to say
    assert m.result.stderr == "", m.result.stderr


@contextlib.contextmanager
def black_hole():
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("foreground", [False, True], ids=["detached", "foreground"])
def test_a_source_that_never_answers_is_refused_within_the_timeout(tmp_path, foreground):
    mnt = tmp_path / "m"
    mnt.mkdir()
    with black_hole() as port:
        t0 = time.monotonic()
        r = run_cli(f"http://127.0.0.1:{port}/refs.json", mnt, "-o", "timeout=2",
                    *(["-f"] if foreground else []))
        took = time.monotonic() - t0
    assert_cli_error(r, mnt, "no answer within 2 s", "timeout")
    assert took < 15, took


def test_a_refused_connection_and_an_unknown_host_are_named(mount_fails):
    mount_fails(f"http://127.0.0.1:{closed_port()}/refs.json", must_mention=("connection refused",))
    mount_fails("http://no-such-host.invalid/refs.json", "timeout=10",
                must_mention=("unknown host",))


def test_a_url_whose_filesystem_is_not_installed_says_how_to_add_it(mount_fails):
    """gcsfs is not installed here: the refusal names the package and how to install it."""
    _, line = mount_fails("gcs://bucket/refs.json", must_mention=("gcsfs", "-m pip install"))
    assert sys.executable in line, line
