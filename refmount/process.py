"""Process-wide settings of the serving daemon, applied once when it starts (``tune``).

Everything here changes the whole process, not one mount object: the file mode mask, the C
library's allocator, asyncio's socket transport and the interpreter's GIL switch interval.
Nothing else in refmount sets them, so that tools, tests and the Python API (which never
serve) run with the defaults.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import contextlib
import ctypes
import functools
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator

# asyncio receives at most 256 KiB per socket read, and for every read aiohttp's parser and
# stream run a round of Python; reading up to 1 MiB at a time made cold sequential reads
# ~14 % faster.
RECV_SIZE = 2**20


def tune_malloc() -> Callable[[int], int] | None:
    """The daemon allocates many short-lived buffers of 64 KiB - 32 MiB in several threads
    (fsspec's IO loop, trio workers, the FUSE loop).

    * Arenas are capped: with glibc's default (8 per core) such buffers fragment per-thread
      arenas and RSS creeps up by hundreds of MiB under a long load (scripts/soak.py).
    * Buffers up to 32 MiB come from the heap and freed memory is kept (up to 128 MiB):
      glibc's default of mmap-ing every large buffer and unmapping it on free made each
      block cost a fresh mapping whose pages fault in one by one, and on a virtual machine
      first-touching memory is expensive (it was about half of the daemon's CPU time in
      a cold sequential read, measured with perf).
    * What is kept is given back once the mount is idle (``Mount`` in daemon.py).
    Returns the C library's ``malloc_trim``, or None when it is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, 2)  # M_ARENA_MAX
        libc.mallopt(-3, 32 * 2**20 + 4096)  # M_MMAP_THRESHOLD (fixed: no dynamic growth)
        libc.mallopt(-1, 128 * 2**20)  # M_TRIM_THRESHOLD
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc: nothing to tune


def larger_socket_reads(size: int = RECV_SIZE) -> None:
    """Let asyncio's socket transports receive up to ``size`` bytes per read (see RECV_SIZE).
    A class attribute of a private asyncio class: left alone where it does not exist."""
    transport = getattr(asyncio.selector_events, "_SelectorSocketTransport", None)
    if transport is not None and getattr(transport, "max_size", 0) < size:
        transport.max_size = size


# SIGUSR1 and SIGUSR2 end a process by default; ``systemctl kill -s USR1`` sends them to every
# process of a unit. Every refmount process ignores them from its start; the serving process
# then logs each one it receives (daemon.py).
USER_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def ignore_user_signals() -> None:
    """SIGUSR1 and SIGUSR2 do nothing to this process (ignored dispositions also pass to
    the programs it starts)."""
    for sig in USER_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def user_signals_ignored() -> Iterator[None]:
    """SIGUSR1 and SIGUSR2 ignored while the block runs (on the main thread; elsewhere a
    no-op), then their handlers restored: a program started in the block inherits the
    ignored dispositions, so it is not killed by one before it has set its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in USER_SIGNALS]
    try:
        yield
    finally:
        for sig, handler in saved:
            signal.signal(sig, handler)


def private_files() -> None:
    """Whatever the process creates (cache blocks, logs, directories) is the mounting user's
    only."""
    os.umask(0o077)


def private_dir(path: str) -> None:
    """Create ``path`` (and its parents) for the mounting user only: mode 0700, whatever the
    umask. An existing directory of ours that others may enter (made by an older version,
    or under another umask) is made private too; one owned by someone else, or shared on
    purpose (the sticky bit, as on ``/tmp``), is left alone."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path, follow_symlinks=False)
    if _ours_and_open(st) and not st.st_mode & stat.S_ISVTX:  # /tmp and the like stay as they are
        os.chmod(path, 0o700, follow_symlinks=False)


def private_file(fd: int) -> None:
    """The file open as ``fd`` is made the mounting user's only (mode 0600) if it is ours and
    others may read it: a log file made by an older version or under another umask."""
    if _ours_and_open(os.fstat(fd)):
        os.fchmod(fd, 0o600)


def _ours_and_open(st: os.stat_result) -> bool:
    """Owned by this process's user, and group or others may use it."""
    return st.st_uid == os.geteuid() and bool(stat.S_IMODE(st.st_mode) & 0o077)


# Worker threads (decoding with -o decode, local reads, checksums) release the GIL for their
# heavy part, then wait for it again behind the busy FUSE/fetch thread for up to the switch
# interval each time. With 0.5 ms instead of Python's 5 ms, cold decoded reads (zarr, 1 MiB
# shuffle+zlib chunks) measured 218-230 MB/s against 174-190 in paired runs, but 193 in a
# later run: the gain is within this VM's run-to-run spread, not established beyond it
# (docs/performance.md); other read workloads stayed within the same spread.
SWITCH_INTERVAL = 0.0005


def shorter_gil_switch() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL)


@functools.cache
def tune() -> Callable[[int], int] | None:
    """Apply the daemon's process-wide settings, once per process (later calls return the
    first call's result). Returns ``malloc_trim`` (None when the C library is not glibc)."""
    private_files()
    larger_socket_reads()
    shorter_gil_switch()
    return tune_malloc()
