"""``refmount.served`` stops its detached server with ``_stop``: SIGTERM, then wait until it has
exited. The server is an orphan that PID 1 reaps when it gets to it (never, in a container
whose PID 1 does not reap), so a zombie counts as exited; a process that ignores SIGTERM is
killed after the timeout. (``has_exited`` is ``refmount.base.spawn``'s.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from refmount.base.spawn import has_exited
from refmount.cli.api import _stop


def test_a_zombie_has_exited_and_stop_does_not_wait_for_its_reaping():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        t = time.monotonic()
        _stop(child.pid, timeout=30)  # this process is its parent and does not reap it yet
        assert time.monotonic() - t < 10
        assert has_exited(child.pid)
        with open(f"/proc/{child.pid}/stat") as f:
            assert f.read().rpartition(")")[2].split()[0] == "Z"  # not reaped: still a zombie
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGTERM
    assert has_exited(child.pid)  # reaped: gone


def test_a_process_ignoring_sigterm_is_killed_after_the_timeout():
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                              " print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert not has_exited(child.pid)
        t = time.monotonic()
        _stop(child.pid, timeout=0.5)
        assert 0.5 <= time.monotonic() - t < 10
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL


def test_no_such_process_hashas_exited():
    assert has_exited(2**22 + 1)  # above the kernel's ceiling of pid_max: never a process


def test_a_zombie_main_thread_with_a_thread_still_running_has_not_exited():
    # The main thread leaves (pthread_exit) while another thread runs on: the process shows as
    # a zombie, and still holds what that thread holds.
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, sys, threading, time\n"
                              "threading.Thread(target=time.sleep, args=(2,)).start()\n"
                              "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
                              "ctypes.CDLL(None).pthread_exit(None)\n"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        seen = set()
        deadline = time.monotonic() + 20
        while not has_exited(child.pid) and time.monotonic() < deadline:
            with open(f"/proc/{child.pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            seen.add((status["State"].split()[0], int(status["Threads"])))
            time.sleep(0.01)
        assert ("Z", 2) in seen  # a zombie main thread that has not exited
        assert has_exited(child.pid)  # once the other thread has ended
    finally:
        child.kill()
        child.wait()
