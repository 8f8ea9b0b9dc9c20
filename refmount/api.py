"""Mounting from Python: ``with refmount.mounted(source, mountpoint, **options) as path:``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from .errors import MountError

__all__ = ["MountError", "is_mounted", "mounted", "unmount"]


def _option(name: str, value: Any) -> str | None:
    if value is True:
        return name
    if value is False or value is None:
        return None
    if isinstance(value, dict):
        return f"{name}={json.dumps(value, separators=(',', ':'))}"
    if isinstance(value, list | tuple):
        return f"{name}={':'.join(map(str, value))}"
    return f"{name}={value}"


def is_mounted(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


def unmount(path: str, timeout: float = 30.0) -> None:
    """Unmount (lazily if busy past ``timeout``) and wait until the mount is gone."""
    if not is_mounted(path):
        return
    deadline = time.monotonic() + timeout
    while is_mounted(path):
        result = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
        if result.returncode == 0:
            break
        if time.monotonic() > deadline:
            subprocess.run(["fusermount3", "-uz", path], capture_output=True)
            break
        time.sleep(0.2)
    while is_mounted(path) and time.monotonic() < deadline + 5:
        time.sleep(0.05)


@contextlib.contextmanager
def mounted(source: str | os.PathLike[str], mountpoint: str | os.PathLike[str] | None = None,
            **options: Any) -> Iterator[str]:
    """Mount ``source`` in a child daemon, yield the mount path once it answers, and always
    unmount on exit. Options are refmount's ``-o`` options: ``True`` for flags, dicts for
    JSON options (``remote_options={"anon": True}``), lists of directories for allow_local.
    Raises :class:`MountError` with refmount's message if mounting fails."""
    tmp = None
    if mountpoint is None:
        tmp = tempfile.mkdtemp(prefix="refmount-")
        mountpoint = tmp
    path = os.path.abspath(os.fspath(mountpoint))
    opts = [o for o in (_option(k, v) for k, v in options.items()) if o]
    from .cmdline import configuration_environment  # not on `import refmount`: it needs config

    # SOURCE and the options through the environment: credentials never on a command line.
    result = subprocess.run([sys.executable, "-m", "refmount", "--env", path],
                            env=configuration_environment(os.fspath(source), opts),
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        if tmp:
            os.rmdir(tmp)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        message = lines[-1] if lines else f"refmount exited with status {result.returncode}"
        raise MountError(message.removeprefix("refmount: error: "))
    try:
        yield path
    finally:
        unmount(path)
        if tmp:
            with contextlib.suppress(OSError):
                os.rmdir(tmp)
