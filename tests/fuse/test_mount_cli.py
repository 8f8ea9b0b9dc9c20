"""The CLI and the daemon: daemon mode returns with the mount answering, fusermount3 -u and
signals end the daemon, -f stays in the foreground, compressed and http sources, options."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from support.mounts import (
    CLI,
    REPO,
    cli_env,
    daemon_procs,
    fusermount_u,
    is_mounted,
    mount_entry,
    opts_arg,
    run_cli,
    start_foreground,
    stop_foreground,
    unmount_when_free,
    wait_gone,
)

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

CONTRACT_OPTIONS = ["remote_protocol", "remote_options", "target_options", "allow_other",
                    "uid", "gid", "cache_dir", "no_disk_cache", "timeout", "log", "log_level"]


def assert_tree_matches(mnt, ds, refs: dict) -> None:
    files = set()
    for dirpath, _dirnames, filenames in os.walk(mnt):
        rel = os.path.relpath(dirpath, mnt)
        files.update(f if rel == "." else f"{rel}/{f}" for f in filenames)
    assert files == set(refs)
    for key, value in refs.items():
        assert (Path(mnt) / key).read_bytes() == ds.expected_bytes(value), key


def wait_mounted(path, proc: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_mounted(path):
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"refmount -f exited {proc.returncode} before mounting", pytrace=False)
        time.sleep(0.05)
    pytest.fail(f"{path} not mounted after {timeout}s", pytrace=False)


# --- help, version, entry points ------------------------------------------------------------------


def test_help_documents_every_option():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    for opt in [*CONTRACT_OPTIONS, "-f", "-d", "-o"]:
        assert opt in r.stdout, f"--help does not mention {opt}"


def test_version():
    r = run_cli("--version")
    assert r.returncode == 0, r.stderr
    assert any(ch.isdigit() for ch in r.stdout + r.stderr), (r.stdout, r.stderr)


def test_console_script_installed():
    """``pip install`` of the project provides the ``refmount`` console script next to python."""
    import sys

    script = Path(sys.executable).parent / "refmount"
    assert script.exists(), f"{script} missing: is the project installed in the venv?"
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# --- daemon mode ------------------------------------------------------------------------------------


def test_daemon_returns_and_fusermount_ends_it(mount, datasets):
    m = mount(datasets.refs["hand_local"])
    # the CLI has returned 0 and the mount answers right away
    assert (m / "hello.txt").read_bytes() == b"hello world\n"
    entry = mount_entry(m.path)
    assert entry[2].startswith("fuse"), entry
    assert "ro" in entry[3].split(","), entry
    assert m.procs, "no daemon process found with the mountpoint on its command line"
    assert m.log.exists() and m.log.stat().st_size > 0, "log=FILE: the daemon wrote nothing"
    r = fusermount_u(m.path)
    assert r.returncode == 0, r.stderr
    alive = wait_gone(m.procs, 15)
    assert not alive, f"daemon {[p.pid for p in alive]} still running after fusermount3 -u"
    assert not is_mounted(m.path)
    assert not daemon_procs(m.path)


def test_daemon_does_not_hold_callers_pipes(mount, datasets):
    """``out=$(refmount ...)`` must return: the daemon detaches from stdout/stderr."""
    m = mount.track(datasets.refs["hand_local"])
    argv = [*CLI, str(datasets.refs["hand_local"]), str(m.path), *opts_arg(m.opts)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO,
                           env=cli_env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        m.refresh_procs()
        pytest.fail("refmount did not return while its stdout/stderr are pipes: the daemon "
                    "keeps them open", pytrace=False)
    m.refresh_procs()
    assert r.returncode == 0, r.stderr
    assert is_mounted(m.path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_unmounts_and_exits(mount, datasets, sig):
    m = mount(datasets.refs["nc4_local"])
    assert (m / ".zgroup").read_bytes()
    assert m.procs, "no daemon process found"
    for p in m.procs:
        p.send_signal(sig)
    alive = wait_gone(m.procs, 15)
    assert not alive, f"daemon still running 15s after {sig.name}"
    assert not is_mounted(m.path), f"{m.path} still mounted after {sig.name}"


@pytest.mark.parametrize("how", ["fusermount", "SIGTERM", "SIGINT"])
def test_foreground_mode(mount, datasets, how):
    m, proc, err_path = start_foreground(mount, datasets.refs["hand_local"])
    try:
        wait_mounted(m.path, proc)
        assert proc.poll() is None, "refmount -f returned while mounted"
        assert (m / "a/top").read_bytes() == b"top"
        if how == "fusermount":
            assert unmount_when_free(m.path).returncode == 0
        else:
            proc.send_signal(getattr(signal, how))
        rc = proc.wait(timeout=15)
        assert rc == 0, f"exit {rc}: {err_path.read_text(errors='replace')}"
        assert not is_mounted(m.path)
    finally:
        stop_foreground(proc, m.path)


def make_stale(mount, src):
    """Mount, let the kernel cache the root's attributes, SIGKILL the daemon: a stale mount."""
    m = mount(src)
    os.listdir(m.path)
    (m / "hello.txt").read_bytes()
    m.kill_daemons(signal.SIGKILL)
    assert not wait_gone(m.procs, 10)
    with pytest.raises(OSError) as e:
        os.listdir(m.path)
    assert e.value.errno == errno.ENOTCONN
    assert is_mounted(m.path)
    return m


def test_stale_mount_explained(mount, datasets):
    """Mounting on a stale mount (daemon killed) fails with one line that says it is stale."""
    src = datasets.refs["hand_local"]
    m = make_stale(mount, src)
    r = run_cli(src, m.path, *opts_arg([f"log={m.log}", f"cache_dir={mount.base / 'cache'}"]))
    assert r.returncode != 0
    assert len(r.stderr_lines) == 1 and r.stderr_lines[0].startswith("refmount: error:"), r.stderr
    message = r.stderr.replace(str(m.path), "<MNT>")
    assert "stale" in message.lower(), f"stale mount not explained: {message.strip()}"


def test_recover_clears_stale_mount(mount, datasets):
    """``-o recover`` clears a stale mount and mounts; it leaves a live mount alone."""
    src = datasets.refs["hand_local"]
    m = make_stale(mount, src)
    m2 = mount(src, "recover", mnt=m.path)
    assert (m2 / "hello.txt").read_bytes() == b"hello world\n"
    r = run_cli(src, m.path, *opts_arg([f"log={m.log}", "recover",
                                        f"cache_dir={mount.base / 'cache'}"]))
    assert r.returncode != 0
    assert (m2 / "hello.txt").read_bytes() == b"hello world\n"


# --- sources ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nc4_local_gz", "hand_local_zst"])
def test_compressed_source(mount, datasets, name):
    plain = name.rsplit("_", 1)[0]
    m = mount(datasets.refs[name])
    assert_tree_matches(m.path, datasets, datasets.load(plain))


def served_url(ds, nginx, name: str) -> str:
    return f"{nginx.url}/{ds.refs[name].relative_to(ds.root)}"


def test_source_over_http(mount, http_datasets, nginx):
    m = mount(served_url(http_datasets, nginx, "nc4_http"))
    assert_tree_matches(m.path, http_datasets, http_datasets.load("nc4_http"))
    assert any('"GET /nc4_http.json' in line for line in nginx.access_lines())


def test_compressed_source_over_http(mount, http_datasets, nginx):
    m = mount(served_url(http_datasets, nginx, "hand_http_gz"))
    assert_tree_matches(m.path, http_datasets, http_datasets.load("hand_http"))


def test_remote_source_with_local_targets(mount, mount_fails, http_datasets, nginx):
    """A remote SOURCE naming local files: fine for a private mount; for a shared mount
    (allow_other) local targets need allow_local=."""
    url = served_url(http_datasets, nginx, "nc4_local")
    m = mount(url)
    assert_tree_matches(m.path, http_datasets, http_datasets.load("nc4_local"))
    _r, line = mount_fails(url, "allow_other")
    assert "allow_local" in line, line
    m2 = mount(url, "allow_other", f"allow_local={http_datasets.data_dir}")
    assert (m2 / ".zgroup").read_bytes()


# --- options ----------------------------------------------------------------------------------------


def test_storage_options_reach_requests(mount, http_datasets, nginx):
    """target_options go to the request for SOURCE, remote_options to the targets' requests
    (both JSON with commas inside, in one -o)."""
    target = {"headers": {"X-Refmount-Test": "target-opts", "X-Unused": "1"}}
    remote = {"headers": {"X-Refmount-Test": "remote-opts", "X-Unused": "2"}}
    m = mount(served_url(http_datasets, nginx, "hand_http"),
              f"target_options={json.dumps(target)},remote_options={json.dumps(remote)}")
    blob = http_datasets.blob.read_bytes()
    assert (m / "range/first").read_bytes() == blob[:100]
    assert (m / "whole/tiny.bin").read_bytes() == b"!"
    lines = nginx.access_lines()
    src = [ln for ln in lines if "/hand_http.json HTTP" in ln]
    assert src and all('x_refmount_test="target-opts"' in ln for ln in src), src[-5:]
    data = [ln for ln in lines if "/data/" in ln and "remote-opts" in ln]
    assert any("/data/blob.bin" in ln for ln in data), lines[-10:]
    assert any("/data/tiny.bin" in ln for ln in data), lines[-10:]


def test_uid_gid(mount, datasets):
    m = mount(datasets.refs["hand_local"], "uid=12345", "gid=23456")
    for p in (m.path, m / "a", m / "a/b/c/d/e/deep.txt", m / "whole/blob.bin"):
        st_ = os.stat(p)
        assert (st_.st_uid, st_.st_gid) == (12345, 23456), p


def test_allow_other(mount, datasets):
    if os.geteuid() != 0:
        with open("/etc/fuse.conf") as f:
            if not any(ln.strip() == "user_allow_other" for ln in f):
                pytest.fail("allow_other as non-root needs user_allow_other in /etc/fuse.conf",
                            pytrace=False)
    m = mount(datasets.refs["hand_local"], "allow_other")
    assert "allow_other" in mount_entry(m.path)[3].split(",")
    assert (m / "hello.txt").read_bytes() == b"hello world\n"


@pytest.mark.parametrize("opts", [("no_disk_cache", "timeout=20", "log_level=warning"),
                                  ("cache_dir", "log_level=info"),
                                  ("no_disk_cache", "comment=x-gvfs-show", "umask=027")],
                         ids=["no-disk", "cache-dir", "fstab-comment"])
def test_options_accepted(mount, datasets, tmp_path, opts):
    opts = [f"cache_dir={tmp_path / 'my cache dir'}" if o == "cache_dir" else o for o in opts]
    m = mount(datasets.refs["nc4_local"], *opts)
    refs = datasets.load("nc4_local")
    assert (m / "temp/0.0.0").read_bytes() == datasets.expected_bytes(refs["temp/0.0.0"])


def test_remount_same_source_twice(mount, datasets):
    """Two mounts of one reference set side by side (and a shared cache dir) both work."""
    m1 = mount(datasets.refs["nc4_local"])
    m2 = mount(datasets.refs["nc4_local"])
    refs = datasets.load("nc4_local")
    for key in ("temp/1.1.1", "flags/1.2", ".zattrs"):
        expected = datasets.expected_bytes(refs[key])
        assert (m1 / key).read_bytes() == expected
        assert (m2 / key).read_bytes() == expected


def test_index_directory_keeps_the_newest_index_of_each_source(mount, tmp_path):
    """Three versions of one set: one index left for it (another set's stays), and a mount
    of an older version that is still live goes on serving from the index it mapped."""
    cache = tmp_path / "cache"
    src = tmp_path / "refs.json"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"o": "other"}))
    mount(other, f"cache_dir={cache}")
    live = None
    for version in range(3):
        src.write_text(json.dumps({"v": f"version {version}", "pad": "x" * version}))
        os.utime(src, ns=(10**18 + version, 10**18 + version))  # a new mtime for each version
        m = mount(src, f"cache_dir={cache}")
        assert (m / "v").read_text() == f"version {version}"
        if version == 0:
            live = m
    indexes = sorted(p.name for p in (cache / "index").glob("*.arrow"))
    assert len(indexes) == 2, indexes  # the newest of refs.json, and other.json's
    assert (live / "v").read_text() == "version 0"
    assert sorted(os.listdir(live.path)) == ["pad", "v"]
def test_sigusr1_and_sigusr2_keep_the_mount_serving(mount, datasets):
    """SIGUSR1 and SIGUSR2 (``systemctl kill -s USR1`` signals every process of the unit) are
    logged and change nothing: the daemon and its cache writer stay, the mount keeps serving."""
    m = mount(datasets.refs["hand_local"])
    assert (m / "a/top").read_bytes() == b"top"
    [daemon] = m.procs
    deadline = time.monotonic() + 10
    while not daemon.children() and time.monotonic() < deadline:  # the cache writer, after READY
        time.sleep(0.05)
    family = [daemon, *daemon.children(recursive=True)]
    assert len(family) >= 2, "no cache writer to signal"
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1):
        for p in family:
            p.send_signal(sig)
        time.sleep(0.3)
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    assert (m / "a/top").read_bytes() == b"top"
    assert os.listdir(m.path)
    log = m.log_text()
    assert "SIGUSR1" in log and "SIGUSR2" in log, log


def test_sigusr1_during_foreground_start_up_is_harmless(mount, datasets):
    """``refmount -f`` signalled with SIGUSR1/SIGUSR2 right after it starts (before it mounts,
    while the indexer parses) and again while serving: it mounts and serves."""
    m, proc, err_path = start_foreground(mount, datasets.refs["hand_local"])
    try:
        cli = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        while not cli.children() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the CLI runs: its indexer has started
        for p in [cli, *cli.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGUSR1)
                p.send_signal(signal.SIGUSR2)
        wait_mounted(m.path, proc)
        assert (m / "a/top").read_bytes() == b"top"
        proc.send_signal(signal.SIGUSR1)
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.3)
        assert proc.poll() is None, err_path.read_text(errors="replace")
        assert (m / "a/top").read_bytes() == b"top"
    finally:
        stop_foreground(proc, m.path)
