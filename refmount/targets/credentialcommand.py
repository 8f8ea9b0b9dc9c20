"""Running a credential process: under the reaper (``targets/reaper.py``), no shell, bounded in
time and output; a run that gives no credential is a ``ProcessFailed`` whose reason is safe to
show (``targets/credentials.py`` decides when to run it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence

import trio

from refmount.base.redact import redact_url
from refmount.targets import reaper

MAX_OUTPUT = 64 * 2**10  # bytes a credential process may print on stdout
MAX_STDERR = 64 * 2**10  # bytes of its stderr kept (the rest is read and dropped)
STDERR_SHOWN = 200  # characters of its stderr's last line shown in the log
DEFAULT_TIMEOUT = 30.0


class ProcessFailed(Exception):
    """One run of the command gave no credential. ``reason`` is safe to show everywhere;
    ``detail`` (the redacted, truncated end of its stderr) only in the log line."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def _last_line(stderr: bytes) -> str:
    """The last non-empty line of a process's stderr, redacted and cut short, for the log."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    last = redact_url("".join(c if c.isprintable() else "?" for c in last))
    return last if len(last) <= STDERR_SHOWN else last[:STDERR_SHOWN] + "…"


def shown_command(argv: Sequence[str]) -> str:
    """The command as messages name it: its arguments (configuration, not secrets, but
    redacted all the same), cut short."""
    text = redact_url(shlex.join(argv))
    return text if len(text) <= 100 else text[:100] + "…"


def command_problem(argv: Sequence[str]) -> str | None:
    """Why ``argv`` cannot be run as a credential process (None: it can be): a relative path
    (the detached daemon runs in ``/``), a command that is not on ``PATH`` or not an
    executable file. Checked when the option is read, so that a typo stops refmount."""
    command = argv[0]
    if "/" in command:
        if not os.path.isabs(command):
            return (f"{command!r} is a relative path: give an absolute path or a command "
                    "name found on PATH")
        if not (os.path.isfile(command) and os.access(command, os.X_OK)):
            return f"{command} is not an executable file"
        return None
    if shutil.which(command) is None:
        return f"no command {command!r} on PATH"
    return None


def _stop(proc: trio.Process) -> None:
    """Ask the reaper (targets/reaper.py) to kill the command and every descendant it has."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()


def _kill_group(proc: trio.Process) -> None:
    """The reaper did not end in time: its process group, and it, killed outright."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _startable(argv: Sequence[str]) -> str | None:
    """Why ``argv[0]`` cannot be started (as ``execvp`` would find it), or None."""
    command = argv[0]
    path = command if "/" in command else shutil.which(command)
    if path is None or not os.path.exists(path):
        return os.strerror(errno.ENOENT)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return os.strerror(errno.EACCES)
    return None


async def run_command(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                      max_output: int = MAX_OUTPUT) -> bytes:
    """What ``argv`` prints on stdout (at most ``max_output`` bytes), run with no shell, the
    environment inherited, stdin from ``/dev/null``, in a session of its own. ProcessFailed
    if it cannot start, runs longer than ``timeout`` or prints more than ``max_output`` (its
    process group is then killed), or exits with a non-zero status (the end of its stderr
    in ``detail``)."""
    name = shown_command(argv)
    if (why := _startable(argv)) is not None:
        raise ProcessFailed(f"cannot run {name}: {why}")
    try:  # under the reaper: the command and every process it starts end together
        proc = await trio.lowlevel.open_process(
            reaper.command(list(argv)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise ProcessFailed(f"cannot run {name}: {e.strerror or type(e).__name__}") from None
    out, err = bytearray(), bytearray()
    too_big = False

    async def read_stdout() -> None:
        nonlocal too_big
        assert proc.stdout is not None
        while chunk := await proc.stdout.receive_some(65536):
            out.extend(chunk)
            if len(out) > max_output:
                too_big = True
                _stop(proc)
                return

    async def read_stderr() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some(65536):
            if len(err) < MAX_STDERR:
                err.extend(chunk[: MAX_STDERR - len(err)])

    try:
        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_stdout)
                nursery.start_soon(read_stderr)
                await proc.wait()
                if too_big:
                    nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None or scope.cancelled_caught or too_big:
            _stop(proc)
        with trio.CancelScope(shield=True):
            with trio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                _kill_group(proc)
                with trio.move_on_after(5):
                    await proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                    await stream.aclose()
    if too_big:
        raise ProcessFailed(f"{name} printed more than {max_output} bytes: killed")
    if scope.cancelled_caught:
        raise ProcessFailed(f"{name} did not finish within {timeout:g} s: killed",
                            _last_line(bytes(err)))
    if proc.returncode != 0:
        status = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                  else f"exit status {proc.returncode}")
        raise ProcessFailed(f"{name} failed ({status})", _last_line(bytes(err)))
    return bytes(out)

