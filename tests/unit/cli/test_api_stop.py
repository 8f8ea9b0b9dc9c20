"""``refmount.served`` stops its detached server with ``_stop``: SIGTERM, then wait until it has
exited. The server is an orphan that PID 1 reaps when it gets to it (never, in a container
whose PID 1 does not reap), so a zombie counts as exited; a process that ignores SIGTERM is
killed after the timeout."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from refmount.cli.api import _exited, _stop


def test_a_zombie_has_exited_and_stop_does_not_wait_for_its_reaping():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        t = time.monotonic()
        _stop(child.pid, timeout=30)  # this process is its parent and does not reap it yet
        assert time.monotonic() - t < 10
        assert _exited(child.pid)
        with open(f"/proc/{child.pid}/stat") as f:
            assert f.read().rpartition(")")[2].split()[0] == "Z"  # not reaped: still a zombie
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGTERM
    assert _exited(child.pid)  # reaped: gone


def test_a_process_ignoring_sigterm_is_killed_after_the_timeout():
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                              " print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert not _exited(child.pid)
        t = time.monotonic()
        _stop(child.pid, timeout=0.5)
        assert 0.5 <= time.monotonic() - t < 10
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL


def test_no_such_process_has_exited():
    assert _exited(2**22 + 1)  # above the kernel's ceiling of pid_max: never a process
