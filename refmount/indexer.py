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
from typing import Any

from .config import MountConfig
from .errors import ConfigError, MountError
from .logsetup import stderr_warnings
from .policy import TargetRefused
from .preparation import advise_on_decoding, check_index_targets, index_source, remove_temporary
from .process import ignore_user_signals
from .refs import IndexFile, ReferenceSetError
from .spawn import child_env, module_command


class IndexerError(RuntimeError):
    """The child could not produce the index; the message is its one-line reason."""


class Indexer:
    """The parent's side: start the child, then :meth:`result` waits for its index."""

    def __init__(self, cfg: MountConfig) -> None:
        env = child_env({k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        self.source = cfg.source
        self.proc = subprocess.Popen(
            module_command("refmount.indexer"),
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
    cfg = MountConfig(**payload)
    index_file = index_source(cfg)
    try:
        check_index_targets(cfg, index_file)
        advise_on_decoding(cfg, index_file)
    except BaseException:
        remove_temporary(index_file)
        raise
    return index_file


def main() -> int:
    """The child's side: configuration on stdin, one report line on stdout."""
    _die_with_parent()
    ignore_user_signals()
    stderr_warnings()
    report = sys.stdout
    sys.stdout = sys.stderr  # nothing but the report on the pipe
    code = 1
    payload = json.loads(sys.stdin.read() or "{}")
    try:
        index_file = _index(payload)
        message, code = "OK " + json.dumps(vars(index_file)), 0
    except (ReferenceSetError, MountError, TargetRefused, ConfigError, RuntimeError) as e:
        message = f"ERROR {e}"
    except MemoryError:
        message = f"ERROR {payload.get('source')}: out of memory while indexing the reference set"
    except KeyboardInterrupt:
        message = "ERROR interrupted"
    except Exception as e:  # one line, never a traceback
        message = f"ERROR unexpected {type(e).__name__}: {e}"
    report.write(" ".join(message.split("\n")) + "\n")
    report.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
