"""Parsing SOURCE in a process of its own, for ``refmount -f``.

With ``-f`` (what ``refmount@.service`` runs) the process that was started is the one that
serves: systemd's ``NotifyAccess=main`` takes READY=1 only from it, and its PID is the
service's main PID. If that process parsed SOURCE itself it would keep the parser's heap for
the life of the mount (hundreds of MiB for a million keys: freed memory stays in the Python
and C heaps). So it hands the parse to a child, a fresh interpreter that reads the
configuration on stdin (never argv: it may hold credentials), writes the index file (under
``cache_dir/index``, or a temporary file) and checks every target, as the CLI does before it
hands over to a detached daemon, then exits. The serving process only memory-maps that file.

The child reports on stdout with one line, ``OK <IndexFile as JSON>`` or ``ERROR <message>``;
its warnings (skipped keys, a re-parse) go to the inherited stderr as ``refmount: WARNING: …``.
It is killed if its parent dies (``PR_SET_PDEATHSIG``), so stopping a service during a long
first parse leaves nothing running.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from refmount.base.errors import ConfigError, MountError
from refmount.base.process import ignore_user_signals, without_pandas
from refmount.base.spawn import child_env, module_command
from refmount.config import MountConfig
from refmount.refs import IndexFile, ReferenceSetError
from refmount.serving.logsetup import stderr_warnings
from refmount.targets.policy import TargetRefused


class IndexerError(RuntimeError):
    """The child could not produce the index; the message is its one-line reason."""


class Indexer:
    """The parent's side: start the child, then :meth:`result` waits for its index."""

    def __init__(self, cfg: MountConfig) -> None:
        env = child_env({k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        self.source = cfg.source
        self.proc = subprocess.Popen(
            module_command("refmount.serving.indexer"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(vars(cfg)).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died early: result() says how

    def result(self) -> IndexFile:
        assert self.proc.stdout is not None
        try:
            out = self.proc.stdout.read()
            self.proc.wait()
        except BaseException:  # interrupted while it parses: it must not outlive us
            self.kill()
            raise
        line = out.decode(errors="replace").strip().splitlines()
        report = line[-1] if line else ""
        if report.startswith("OK "):
            return IndexFile(**json.loads(report[3:]))
        if report.startswith("ERROR "):
            raise IndexerError(report[6:])
        code = self.proc.returncode
        if code < 0:
            name = signal.Signals(-code).name
            why = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        else:
            why = f"exit status {code}"
        raise IndexerError(f"{self.source}: indexing the reference set failed ({why})")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def _index(payload: dict[str, Any]) -> IndexFile:
    from refmount.serving.preparation import (
        advise_on_decoding,
        check_index_targets,
        index_source,
        remove_temporary,
    )

    cfg = MountConfig(**payload)
    index_file = index_source(cfg)
    try:
        check_index_targets(cfg, index_file)
        advise_on_decoding(cfg, index_file)
    except BaseException:
        remove_temporary(index_file)
        raise
    return index_file


def _report(payload: dict[str, Any]) -> tuple[str, int]:
    """Index one set: the report line and the exit status it means."""
    try:
        index_file = _index(payload)
        return "OK " + json.dumps(vars(index_file)), 0
    except (ReferenceSetError, MountError, TargetRefused, ConfigError, RuntimeError) as e:
        message = f"ERROR {e}"
    except MemoryError:
        message = f"ERROR {payload.get('source')}: out of memory while indexing the reference set"
    except KeyboardInterrupt:
        message = "ERROR interrupted"
    except Exception as e:  # one line, never a traceback
        message = f"ERROR unexpected {type(e).__name__}: {e}"
    return " ".join(message.split("\n")), 1


def main() -> int:
    """The child's side: configuration on stdin, one report line on stdout. With
    ``--serve``: one configuration per line, one report line each, until stdin ends."""
    without_pandas()
    serving = "--serve" in sys.argv[1:]
    if serving:
        _exit_with_parent()
    else:
        _die_with_parent()
    ignore_user_signals()
    stderr_warnings()
    report = sys.stdout
    sys.stdout = sys.stderr  # nothing but the reports on the pipe
    if serving:
        for line in sys.stdin:
            message, _ = _report(json.loads(line))
            report.write(message + "\n")
            report.flush()
        return 0
    message, code = _report(json.loads(sys.stdin.read() or "{}"))
    report.write(message + "\n")
    report.flush()
    return code


def _exit_with_parent() -> None:
    """A serving indexer ends when the process that started it does (``PR_SET_PDEATHSIG``
    would end it with the thread that started it)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="refmount-parent-watch").start()


class IndexerProcesses:
    """Indexer processes that stay (``--serve``), for a serving process that indexes many
    sets (a catalogue's, or a set's new versions): each set costs a parse, not an
    interpreter's start. ``index(cfg)`` blocks (call it from a worker thread); each call takes
    an idle process or starts one. A process is replaced after ``jobs`` sets or once it holds
    more than ``max_rss`` bytes (the parser's heap is not given back); one that dies fails
    its set (IndexerError) and the next set gets a new one."""

    def __init__(self, jobs: int = 64, max_rss: int = 1 << 30) -> None:
        self.jobs = jobs
        self.max_rss = max_rss
        self._idle: list[tuple[subprocess.Popen[bytes], int]] = []
        self._lock = threading.Lock()
        self._closed = False

    def _start(self) -> subprocess.Popen[bytes]:
        env = child_env({k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        return subprocess.Popen(module_command("refmount.serving.indexer", "--serve"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def index(self, cfg: MountConfig) -> IndexFile:
        with self._lock:
            proc, done = self._idle.pop() if self._idle else (None, 0)
        if proc is None or proc.poll() is not None:
            proc, done = self._start(), 0
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(vars(cfg)).encode() + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline().decode(errors="replace").strip()
        except (OSError, ValueError):
            line = ""
        if not line:  # it died: say how
            _stop(proc)
            code = proc.returncode
            why = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exit status {code}")
            raise IndexerError(f"{cfg.source}: indexing the reference set failed ({why})")
        if done + 1 < self.jobs and _rss(proc.pid) < self.max_rss:
            with self._lock:
                if not self._closed:
                    self._idle.append((proc, done + 1))
                    proc = None
        if proc is not None:
            _stop(proc)
        if line.startswith("OK "):
            return IndexFile(**json.loads(line[3:]))
        raise IndexerError(line.removeprefix("ERROR "))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for proc, _ in idle:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a serving indexer: its stdin closed, killed if it does not exit."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
