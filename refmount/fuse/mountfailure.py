"""Why a FUSE mount failed, in one line with the next step.

``pyfuse3.init`` raises ``RuntimeError('fuse_session_mount failed')`` whatever went wrong; the
reason is what libfuse and ``fusermount3`` print on file descriptor 2, which a detached daemon
has pointed at ``/dev/null``. ``captured_stderr`` points fd 2 at a temporary file while the
mount is attempted (fusermount3, a child process, inherits it), and ``explain`` turns what was
printed into the reason and, for the common cases, what to do.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator

# (what libfuse/fusermount3 print, what to do): the first match wins.
HINTS: tuple[tuple[str, str], ...] = (
    ("user_allow_other",
     "add a line 'user_allow_other' to /etc/fuse.conf (as root), or mount without allow_other"),
    ("failed to open /dev/fuse: Permission denied",
     "this user may not open /dev/fuse: mount as root, or give the user read/write access to "
     "/dev/fuse (e.g. its group)"),
    ("failed to open /dev/fuse: No such file",
     "no /dev/fuse here: load the fuse module (modprobe fuse), or in a container pass the "
     "device (--device /dev/fuse)"),
    ("device not found",
     "the kernel has no FUSE: load the fuse module (modprobe fuse)"),
    ("failed to exec fusermount3",
     "fusermount3 is not installed: install the fuse3 package"),
    ("user has no write access to mountpoint",
     "mount on a directory this user owns or may write to"),
    ("Operation not permitted",
     "this process may not mount (in a container: needs CAP_SYS_ADMIN or a setuid fusermount3)"),
)

MAX_CAPTURED = 64 * 1024


@contextlib.contextmanager
def captured_stderr() -> Iterator[Callable[[], str]]:
    """Point fd 2 at a temporary file for the duration; the yielded function returns what was
    written so far (at most MAX_CAPTURED bytes). fd 2 is restored on exit."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)

            def text() -> str:
                return os.pread(f.fileno(), MAX_CAPTURED, 0).decode(errors="replace")

            yield text
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def explain(mountpoint: str, error: str, printed: str) -> str:
    """One line: why mounting on ``mountpoint`` failed (``printed`` by libfuse/fusermount3,
    else pyfuse3's ``error``) and, where it is a known case, what to do."""
    lines = [ln.strip() for ln in printed.splitlines() if ln.strip()]
    reason = "; ".join(lines[-3:]) if lines else error
    for needle, hint in HINTS:
        if needle in printed:
            return f"cannot mount on {mountpoint}: {reason} -- {hint}"
    return f"cannot mount on {mountpoint}: {reason}"
