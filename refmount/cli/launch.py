"""Starting what serves a mount or a server and waiting until it answers: this process serving
in the foreground (``-f``), or a detached daemon (``DaemonLauncher``) whose readiness or
failure comes back over a pipe as one line; a failure is one ``refmount: error:`` line."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from types import ModuleType

from refmount.base.errors import MountError
from refmount.base.redact import redact_url
from refmount.base.spawn import child_env, module_command
from refmount.config import MountConfig
from refmount.refs import IndexFile, ReferenceSetError
from refmount.serving.indexer import Indexer, IndexerError
from refmount.serving.logsetup import setup_logging
from refmount.serving.preparation import (
    advise_on_decoding,
    check_index_targets,
    index_source,
    remove_temporary,
)
from refmount.targets.pinhandover import remove_pins_table
from refmount.targets.policy import TargetRefused

log = logging.getLogger("refmount")

READY_TIMEOUT = 120.0


def serve_in_foreground(cfg: MountConfig, checks: Callable[[], None], module: str,
                         run: Callable[[ModuleType, IndexFile, str], int]) -> int:
    """``-f``: this process serves (``run(module, index_file, log_target)``, ``module`` the
    serving process's: ``refmount.fuse.daemon`` or ``refmount.http.daemon``) from an index that a
    child process parsed (see serving/indexer.py), so that it never holds the parser's heap."""
    try:
        return _in_foreground(cfg, checks, module, run)
    finally:
        remove_pins_table(cfg)  # what serves removed it once mapped, unless it failed before


def _in_foreground(cfg: MountConfig, checks: Callable[[], None], module: str,
                   run: Callable[[ModuleType, IndexFile, str], int]) -> int:
    from refmount.sets.setmount import check_catalog

    try:
        checks()
    except MountError as e:
        return fail(str(e))
    catalog = getattr(cfg, "catalog", False)
    indexer = None if catalog else Indexer(cfg)  # a catalogue's sets: by the serving process
    try:
        serving = importlib.import_module(module)  # imported while the child parses
        if indexer is not None:  # and so is the core a set is served from
            importlib.import_module("refmount.core.setcore")
    except BaseException:
        if indexer is not None:
            indexer.kill()
        raise
    try:
        index_file = check_catalog(cfg) if indexer is None else indexer.result()
    except (IndexerError, MountError) as e:
        return fail(str(e))
    log_target = setup_logging(cfg, detached=False)
    try:
        return run(serving, index_file, log_target)
    except MountError as e:
        return fail(str(e))
    finally:
        remove_temporary(index_file)  # serve() removes it once mapped; not if it failed before


def serve_detached(cfg: MountConfig, checks: Callable[[], None],
                    launch: Callable[[], DaemonLauncher],
                    on_ready: Callable[[str], None] | None = None) -> int:
    """The serving process is started first (``launch``: its imports overlap the parse), then
    SOURCE is indexed and checked here and handed over; a refusal leaves nothing behind."""
    launcher = None
    index_file: IndexFile | None = None
    try:
        checks()
        launcher = launch()
        if getattr(cfg, "catalog", False):  # its sets are indexed by the serving process
            from refmount.sets.setmount import check_catalog

            index_file = check_catalog(cfg)
        else:
            index_file = index_source(cfg)
            check_index_targets(cfg, index_file)
            advise_on_decoding(cfg, index_file)
    except BaseException as e:
        if launcher is not None:
            launcher.abort()
        if index_file is not None:
            remove_temporary(index_file)  # it holds every target URL of the refused set
        remove_pins_table(cfg)
        if isinstance(e, ReferenceSetError | MountError | TargetRefused):
            return fail(str(e))
        if isinstance(e, MemoryError):
            return fail(f"{cfg.source}: out of memory while indexing the reference set")
        raise
    return launcher.hand_over(cfg, index_file, on_ready)


def fail(message: str) -> int:
    # Messages name SOURCE or targets, which may carry credentials: never print those.
    print(f"refmount: error: {redact_url(message)}", file=sys.stderr)
    return 1


class DaemonLauncher:
    """Starts the daemon process *before* the references are parsed, so that its imports
    (pyfuse3, trio, fsspec and, with ``preload``, a set's core: pyarrow, numpy, aiohttp; most
    of a second) overlap the parsing. It waits for its configuration on stdin; closing stdin
    without one makes it exit. A catalogue's daemon is not preloaded: nothing is parsed
    before it mounts, and it loads the core once it serves."""

    def __init__(self, mountpoint: str, module: str = "refmount.fuse.daemon", preload: bool = True) -> None:
        self._read_fd, write_fd = os.pipe()
        self._errlog = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _close)
        self.proc = subprocess.Popen(
            module_command(module, "--ready-fd", str(write_fd), *(["--preload"] if preload else []),
                           mountpoint),
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._errlog,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
        os.close(write_fd)

    def abort(self) -> None:
        """Before the hand-over the daemon has only imported: it has no configuration, no
        mount, no child and no file of its own, so it is killed rather than left to finish
        its imports (a refused set returns at once, and the CPU is not spent)."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
        self._errlog.close()

    def hand_over(self, cfg: MountConfig, index_file: IndexFile,
                  on_ready: Callable[[str], None] | None = None) -> int:
        """Send the configuration, wait until the mount answers; 0 or a reported failure.
        ``on_ready`` is given what follows ``READY`` in the daemon's report."""
        assert self.proc.stdin is not None
        payload = {"config": vars(cfg), "index": vars(index_file)}
        try:
            self.proc.stdin.write(json.dumps(payload).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died early; its stderr says why
        message = _read_ready(self._read_fd, READY_TIMEOUT)
        try:
            if message is not None and message.split(" ", 1)[0] == "READY":
                if on_ready is not None:
                    on_ready(message.partition(" ")[2])
                return 0
            remove_pins_table(cfg)  # the daemon removes it once mapped, unless it failed before
            return self._failed(message, index_file)
        finally:
            self._close()

    def _failed(self, message: str | None, index_file: IndexFile) -> int:
        # Make sure the daemon is gone and left nothing behind.
        if message is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        remove_temporary(index_file)
        if message and message.startswith("ERROR "):
            return fail(message[6:])
        self._errlog.seek(0)
        tail = [ln for ln in self._errlog.read().decode(errors="replace").splitlines() if ln.strip()]
        why = tail[-1] if tail else f"exit status {code}"
        if message is None:
            return fail(f"the daemon did not answer within {READY_TIMEOUT:g} s ({why})")
        return fail(f"daemon exited during start-up: {why}")


def _read_ready(fd: int, timeout: float) -> str | None:
    """The daemon's one-line report; '' on EOF without a report; None on timeout."""
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")
