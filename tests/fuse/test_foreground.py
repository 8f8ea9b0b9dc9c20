"""``refmount -f`` (what refmount@.service runs) serves from a process that never held the parse:
the process started is the serving one, its RSS after READY matches detached mode's daemon for
a set whose parse peaks well above it, and errors before mounting are still one line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from support.mounts import CLI, cli_env, daemon_procs, fusermount_u, is_mounted, wait_gone
from support.scaleset import Layout, generate_v0

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

KEYS = 300_000
SETTLE = 2.0  # seconds after READY before RSS is read (start-up buffers freed)


@pytest.fixture(scope="module")
def big_set(tmp_path_factory) -> Path:
    """A Version 0 set of 300,000 keys over sparse local targets (the scale benchmark's layout):
    20 MB of JSON whose parse peaks far above the serving RSS."""
    base = tmp_path_factory.mktemp("foreground-set")
    layout = Layout(keys=KEYS, arrays=10, targets=50, target_dir=base / "targets")
    path = base / "refs.json"
    generate_v0(layout, path)
    return path


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def wait_answers(mnt: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (is_mounted(mnt) and os.path.exists(mnt / ".zgroup")):
        assert proc.poll() is None, f"refmount -f exited {proc.returncode} before mounting"
        assert time.monotonic() < deadline, f"{mnt} not answering after {timeout}s"
        time.sleep(0.05)


def only_server(mnt: Path, pid: int, timeout: float = 30) -> bool:
    """Whether ``pid`` is, within ``timeout``, the one process naming ``mnt`` and refmount: the
    mount helper libfuse runs (``fusermount3 ... fsname=refmount ... MNT``) names both too, and
    on a loaded machine it may still be exiting when the mount first answers."""
    deadline = time.monotonic() + timeout
    while True:
        others = [p for p in daemon_procs(mnt) if p.pid != pid]
        if not others:
            return True
        if time.monotonic() > deadline:
            for p in others:
                with contextlib.suppress(psutil.Error):
                    print(f"also naming {mnt}: {p.pid} {p.cmdline()}")
            return False
        time.sleep(0.1)


def serve_foreground(src: Path, mnt: Path, opts: list[str]) -> tuple[subprocess.Popen, float]:
    """Start ``refmount -f``; once the mount answers, the RSS of the started process."""
    proc = subprocess.Popen([*CLI, str(src), str(mnt), "-f", "-o", ",".join(opts)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=cli_env())
    try:
        wait_answers(mnt, proc)
        assert only_server(mnt, proc.pid), "another process serves"
        time.sleep(SETTLE)
        return proc, rss_mib(proc.pid)
    except BaseException:
        stop(proc, mnt)
        raise


def stop(proc: subprocess.Popen, mnt: Path) -> None:
    if is_mounted(mnt):
        fusermount_u(mnt)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if is_mounted(mnt):
        fusermount_u(mnt, lazy=True)


def serve_detached(src: Path, mnt: Path, opts: list[str]) -> tuple[float, float]:
    """Mount in daemon mode; (the CLI's peak RSS while it parsed, the daemon's RSS)."""
    proc = subprocess.Popen([*CLI, str(src), str(mnt), "-o", ",".join(opts)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=cli_env())
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, "refmount (detached) failed"
    [daemon] = daemon_procs(mnt)
    time.sleep(SETTLE)
    return usage.ru_maxrss / 1024, rss_mib(daemon.pid)


def test_foreground_serves_without_the_parsers_heap(big_set, tmp_path):
    """RSS of the ``-f`` process after the mount answers is within 20 % of the detached daemon's
    (fresh cache_dir each), for a set whose parse peaks well above that."""
    results = {}
    for mode in ("foreground", "detached"):
        mnt = tmp_path / f"mnt-{mode}"
        mnt.mkdir()
        opts = [f"cache_dir={tmp_path / f'cache-{mode}'}", f"log={tmp_path / f'{mode}.log'}"]
        if mode == "foreground":
            proc, rss = serve_foreground(big_set, mnt, opts)
            try:
                assert os.stat(mnt / "var03/.zarray").st_size > 0
            finally:
                stop(proc, mnt)
            assert proc.returncode == 0, proc.stderr.read().decode(errors="replace")
            results[mode] = rss
        else:
            procs: list[psutil.Process] = []
            try:
                parse_peak, rss = serve_detached(big_set, mnt, opts)
                procs = daemon_procs(mnt)
                results[mode] = rss
            finally:
                fusermount_u(mnt)
                wait_gone(procs, 15)
        assert not is_mounted(mnt)
    fg, detached = results["foreground"], results["detached"]
    assert parse_peak > 1.5 * detached, (
        f"the parse peaks at {parse_peak:.0f} MiB, not well above the daemon's {detached:.0f} MiB: "
        "the set is too small to tell")
    assert fg <= 1.2 * detached, (
        f"-f serves at {fg:.0f} MiB RSS, detached at {detached:.0f} MiB "
        f"(the parse peaks at {parse_peak:.0f} MiB)")


def test_foreground_refusal_is_one_line_and_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": "x", "b": [1, 2')
    outside = tmp_path / "shared" / "refs.json"
    outside.parent.mkdir()
    outside.write_text('{"k": ["/etc/hostname", 0, 4]}')
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for src, opts, want in ((bad, [], str(bad)),
                            (outside, ["allow_other"], "outside the allowed directories")):
        argv = [*CLI, str(src), str(mnt), "-f", "-o", ",".join([f"cache_dir={tmp_path}/c", *opts])]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=cli_env(),
                           stdin=subprocess.DEVNULL)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert lines[0].startswith("refmount: error: ") and want in lines[0], lines[0]
        assert not is_mounted(mnt)
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if "refmount.serving.indexer" in " ".join(p.info["cmdline"] or [])
                 and p.ppid() == os.getpid()]
    assert not leftovers
