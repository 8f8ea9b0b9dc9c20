"""Starting refmount's helper processes (daemon, indexer, cache writer): fresh interpreters
that run exactly the refmount package this process runs; and telling when a process has exited.

``-P`` keeps the current directory off ``sys.path`` (a ``refmount/`` directory there would
shadow the package), and the directory this package was imported from goes first on
``PYTHONPATH`` (so a checkout run as ``python -m refmount`` without installing still finds
itself in its children).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# the directory holding the refmount package (this file is refmount/base/spawn.py)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-P", "-m", module, *args]


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *(p for p in paths if p != PACKAGE_ROOT)])
    return env


def has_exited(pid: int) -> bool:
    """Gone, or a zombie whose threads have all exited: it holds no port, file or memory any
    more. A detached daemon or server is an orphan, reaped by PID 1 when PID 1 gets to it (a
    second later on some VMs; never, in a container whose PID 1 does not reap). While its
    other threads are still exiting (closing what they hold), the main thread is a zombie
    already: hence the thread count."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return True
    return fields["State"].split()[0] == "Z" and int(fields["Threads"]) <= 1
