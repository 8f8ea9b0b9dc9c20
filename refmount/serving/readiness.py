"""How a serving process (the mount's ``fuse/daemon.py``, the HTTP server's ``http/daemon.py``) says
that it serves, or why not.

``sd_notify``: systemd's notify protocol (``READY=1``, ``STOPPING=1``), a no-op without
``$NOTIFY_SOCKET``. ``run_detached``: the entry of a process the CLI started detached, which
takes its configuration as JSON on stdin (never argv: it may hold credentials) and reports
``READY …`` or ``ERROR <message>`` on the inherited ``--ready-fd`` pipe.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import sys
from collections.abc import Callable

from refmount.base import process
from refmount.base.errors import MountError
from refmount.config import MountConfig
from refmount.refs import IndexFile
from refmount.serving.logsetup import setup_logging

log = logging.getLogger("refmount")


def sd_notify(message: str) -> None:
    """systemd's notify protocol: one datagram to $NOTIFY_SOCKET (no-op without it)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
    except OSError as e:
        log.warning("cannot notify systemd at %s: %s", addr, e.strerror)


def run_detached(what: str, serve_set: Callable[[MountConfig, IndexFile, Callable[[str], None], str], int]
                 ) -> int:
    """The entry of a detached serving process (the mount's or the HTTP server's): its
    configuration on stdin, its readiness on the inherited ``--ready-fd`` pipe. ``serve_set(cfg,
    index_file, report, log_target)`` serves and calls ``report("READY …")`` once it answers;
    a refusal is reported as ``ERROR <message>``."""
    process.without_pandas()
    process.ignore_user_signals()
    ready_fd = int(sys.argv[sys.argv.index("--ready-fd") + 1])
    # A set's core, loaded while the command parses the set (the last argument is the mount
    # point, only there to name the process in ps).
    if "--preload" in sys.argv[:-1]:
        importlib.import_module("refmount.core.setcore")
    text = sys.stdin.read()
    if not text:
        return 0  # the CLI found a problem before handing over: nothing to do
    payload = json.loads(text)
    cfg = MountConfig(**payload["config"])
    index_file = IndexFile(**payload["index"])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.chdir("/")
    ready = os.fdopen(ready_fd, "w")

    def report(message: str) -> None:
        try:
            ready.write(message + "\n")
            ready.close()
        except OSError:
            pass

    try:
        log_target = setup_logging(cfg, detached=True)
        os.dup2(devnull, 2)  # from here on everything goes to the log
        return serve_set(cfg, index_file, report, log_target)
    except MountError as e:
        report(f"ERROR {e}")
        return 1
    except Exception as e:
        log.exception("%s failed", what)
        report(f"ERROR {what} failed: {type(e).__name__}: {e}")
        return 1
