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
import time

from refmount.base import process
from refmount.base.errors import MountError
from refmount.base.redact import RedactingFormatter
from refmount.config import MountConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class MalformedRequests(logging.Filter):
    """aiohttp logs every request it cannot parse at ERROR with a traceback and the request's
    text: a client could fill the log with them. On ``aiohttp.server`` this filter lets one
    line through per ``interval`` seconds, without the traceback or the request, counting
    those it held back; every other record passes unchanged."""

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self.held = 0
        self.last = -interval

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not any(c.__name__ == "BadHttpMessage" for c in type(exc).__mro__):
            return True
        self.held += 1
        now = time.monotonic()
        if now - self.last < self.interval:
            return False
        record.msg = "refused %d malformed HTTP request%s (400) in the last %g s"
        record.args = (self.held, "" if self.held == 1 else "s", self.interval)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self.held, self.last = 0, now
        return True


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
    server_log = logging.getLogger("aiohttp.server")
    for f in [f for f in server_log.filters if isinstance(f, MalformedRequests)]:
        server_log.removeFilter(f)
    server_log.addFilter(MalformedRequests())
    return target
