"""Where refmount's log lines go.

``stderr_warnings``: until a serving process takes over, warnings (skipped keys, stale
mounts, a re-parse) go to stderr as ``refmount: WARNING: …`` — in the CLI and in the indexer
child. ``setup_logging``: a serving process's (the mount's or the HTTP server's) log, to
``log=`` (stderr, syslog, or a file of the mounting user's only). Every handler formats
through ``RedactingFormatter``: no credential in a log line.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys

from refmount.base import process
from refmount.base.errors import MountError
from refmount.base.redact import RedactingFormatter
from refmount.config import MountConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def stderr_warnings() -> None:
    """Until a daemon takes over, warnings (skipped keys, stale mounts) go to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("refmount: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def setup_logging(cfg: MountConfig, detached: bool) -> str:
    """Configure the root logger; returns a description of where logs go."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    target = cfg.log or ("syslog" if detached else "stderr")
    handler: logging.Handler
    nofollow = 0
    if target == "syslog" and not os.path.exists("/dev/log"):
        try:
            process.private_dir(os.path.join(cfg.cache_dir, "log"))
        except process.UnsafeDirectory as e:
            raise MountError(str(e)) from None
        where = cfg.mountpoint or f"serve-{cfg.listen}"  # refmount serve has no mountpoint
        name = where.strip("/").replace("/", "_").replace(":", "_") or "root"
        target = os.path.join(cfg.cache_dir, "log", f"{name}.log")
        nofollow = os.O_NOFOLLOW
    if target == "stderr":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    elif target == "syslog":
        handler = logging.handlers.SysLogHandler(address="/dev/log")
        handler.setFormatter(RedactingFormatter(f"refmount[{os.getpid()}]: %(levelname)s %(message)s"))
    else:
        # The log file is the mounting user's only: it names targets and keys.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | nofollow, 0o600)
        try:
            process.private_file(fd)
        finally:
            os.close(fd)
        handler = logging.FileHandler(target)
        handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(cfg.log_level.upper())
    # Third-party chatter stays at warning unless we debug.
    for noisy in ("fsspec", "aiohttp", "botocore", "s3fs", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if cfg.debug else logging.WARNING)
    return target
