"""Mounting and serving from Python: ``with refmount.mounted(source, mountpoint, **options) as
path:`` and ``with refmount.served(source, **options) as url:``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from refmount.base.errors import MountError
from refmount.base.spawn import has_exited

__all__ = ["MountError", "is_mounted", "mounted", "served", "unmount"]

log = logging.getLogger("refmount")


def _option(name: str, value: Any) -> str | None:
    if value is True:
        return name
    if value is False or value is None:
        return None
    if isinstance(value, dict) or (isinstance(value, list | tuple)
                                   and any(isinstance(v, dict) for v in value)):
        return f"{name}={json.dumps(value, separators=(',', ':'))}"  # JSON: targets=[{...}]
    if isinstance(value, list | tuple):
        return f"{name}={':'.join(map(str, value))}"
    return f"{name}={value}"


def is_mounted(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


def unmount(path: str, timeout: float = 5.0) -> None:
    """Unmount and wait until the mount is gone. While a file in it is still open the mount
    is busy: one warning says so, and after ``timeout`` seconds it is detached lazily (it goes
    once the last file is closed)."""
    if not is_mounted(path):
        return
    deadline = time.monotonic() + timeout
    warned = False
    while is_mounted(path):
        result = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
        if result.returncode == 0:
            break
        if not warned:
            log.warning("%s is busy (a file or directory in it is still open): waiting up to "
                        "%g s, then detaching it lazily", path, timeout)
            warned = True
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
    JSON options (``remote_options={"anon": True}``; ``targets=[{"prefix": ...}]``), lists of
    directories for allow_local.
    Raises :class:`MountError` with refmount's message if mounting fails."""
    tmp = None
    if mountpoint is None:
        tmp = tempfile.mkdtemp(prefix="refmount-")
        mountpoint = tmp
    path = os.path.abspath(os.fspath(mountpoint))
    if tmp and "log" not in options and not os.path.exists("/dev/log"):
        # Without syslog a detached daemon logs to a file named after its mountpoint: one
        # file for all temporary mountpoints, not one per mount.
        from refmount.base.process import private_dir
        from refmount.config import default_cache_dir

        log_dir = os.path.join(os.fspath(options.get("cache_dir") or default_cache_dir()), "log")
        private_dir(log_dir)
        options = {**options, "log": os.path.join(log_dir, "mounted.log")}
    opts = [o for o in (_option(k, v) for k, v in options.items()) if o]
    from refmount.cli.cmdline import configuration_environment  # not on `import refmount`: it needs config

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


def _run_refmount(args: list[str]) -> str:
    """Run the CLI; its stdout, or MountError with its error line."""
    result = subprocess.run([sys.executable, "-m", "refmount", *args], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        message = lines[-1] if lines else f"refmount exited with status {result.returncode}"
        raise MountError(message.removeprefix("refmount: error: "))
    return result.stdout


def _stop(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM, then wait until the process has exited (SIGKILL after ``timeout``)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not has_exited(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline += timeout
        time.sleep(0.02)


@contextlib.contextmanager
def served(source: str | os.PathLike[str], listen: str = "127.0.0.1:0", **options: Any) -> Iterator[str]:
    """Serve ``source`` over HTTP from a detached server (``refmount serve``), yield its base
    URL (``http://127.0.0.1:PORT/``) once it answers, and always stop it on exit. ``listen``
    defaults to a free loopback port; options are as for :func:`mounted`. Raises
    :class:`MountError` with refmount's message if serving fails."""
    opts = [o for o in (_option(k, v) for k, v in options.items()) if o]
    args = ["serve", os.fspath(source), "--listen", listen]
    if opts:
        args += ["-o", ",".join(opts)]
    out = _run_refmount(args).split()
    url, pid = out[0], int(out[1])
    try:
        yield url
    finally:
        _stop(pid)
