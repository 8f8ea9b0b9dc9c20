"""Run a command so that every process it starts ends with it: ``python targets/reaper.py ARGV...``.

A credential process (targets/credentialcommand.py) runs in a session and process group of its own, and
killing that group is not enough: a child that calls ``setsid()`` (a daemonizing helper, an
agent) leaves both and would outlive the server. This script, run as a plain file by the
serving process's interpreter (``-I -S``: no refmount import, no site, a few milliseconds),
becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): every orphaned descendant of the
command, setsid'd or not, is re-parented to it instead of to init. It starts the command
with its own standard streams, waits for it, then kills and reaps whatever descendants are
left, and exits as the command did (the same status, or the same signal).

``SIGTERM`` or ``SIGHUP`` (the server's timeout, its output bound, its shutdown) kills the
command and all its descendants, then this script. ``PR_SET_PDEATHSIG`` sends it ``SIGTERM``
when the serving process dies, so a run in progress never outlives it.

Standard library only, and nothing here runs in the serving process: ``command(argv)`` is
the command line that runs ``argv`` this way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def command(argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` under this script."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *argv]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(name))
    return out


def _kill_descendants() -> None:
    """SIGKILL every descendant until none is left (killed ones' children come to us)."""
    me = os.getpid()
    for _ in range(1000):
        children = _children(me)
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while True:  # reap what died (and anything re-parented meanwhile, next round)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def main(argv: list[str]) -> int:
    if not argv:
        print("reaper: no command", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the server is already gone
        return 1

    def stop(signum: int, _frame: object) -> None:
        _kill_descendants()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        child = subprocess.Popen(argv)
    except OSError as e:
        print(f"cannot run {argv[0]}: {e.strerror or type(e).__name__}", file=sys.stderr)
        return 127
    status = child.wait()
    _kill_descendants()
    if status < 0:  # killed by a signal: end the same way
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
