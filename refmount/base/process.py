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
import errno
import functools
import importlib.abc
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
      arenas and RSS creeps up by hundreds of MiB under a long load (bench/diagnostics/soak.py).
    * Buffers up to 32 MiB come from the heap and freed memory is kept (up to 128 MiB):
      glibc's default of mmap-ing every large buffer and unmapping it on free made each
      block cost a fresh mapping whose pages fault in one by one, and on a virtual machine
      first-touching memory is expensive (it was about half of the daemon's CPU time in
      a cold sequential read, measured with perf).
    * What is kept is given back once the mount is idle (``Mount`` in fuse/daemon.py).
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
# then logs each one it receives (fuse/daemon.py).
USER_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def without_pandas() -> None:
    """This process will not import pandas. refmount never uses it, but pyarrow imports it,
    when it is installed, on the first ``pyarrow.array`` of a Python list (to ask whether
    the list is a pandas object): a few tenths of a second of every mount's start in an
    environment with xarray. Only refmount's own processes (the command, the serving daemons,
    the indexer) call this, before any array is made; the Python API never does."""
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas())


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import finder that finds no pandas (see ``without_pandas``)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("refmount's processes do not load pandas", name=name)


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


class UnsafeDirectory(PermissionError):
    """A directory refmount would keep files in (the cache directory and those under it)
    that another user could change. ``str()`` is one line naming the directory, what is
    wrong and what to do."""

    def __init__(self, path: str, why: str, fix: str, *, first: bool = False) -> None:
        # first: choosing another cache_dir is the fix this user can apply (the other needs
        # the directory's owner)
        how = f"choose another cache_dir ({fix})" if first else f"{fix}, or choose another cache_dir"
        super().__init__(errno.EPERM, f"{why}: {how}", path)
        self.message = f"cache directory {path} {why}: {how}"

    def __str__(self) -> str:
        return self.message


def directory_problem(path: str, st: os.stat_result) -> UnsafeDirectory | None:
    """Why ``path`` (``st``: its ``lstat``) may not hold refmount's files, or None: it must
    be a directory (not a symlink) owned by this process's user that neither group nor
    others may write to. Whoever can write to it can replace an index or a block (with a
    valid checksum: the checksum guards against corruption, not against its owner) or
    plant a symlink where a file will be written."""
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        return UnsafeDirectory(path, f"is {kind}", f"remove {path}")
    if st.st_uid != me:
        if me != 0:  # only its owner (or root) can remove or chown it
            return UnsafeDirectory(path, f"is owned by uid {st.st_uid}, not by uid {me} who mounts",
                                   f"or have uid {st.st_uid} remove it or chown -R {me} {path}",
                                   first=True)
        return UnsafeDirectory(path, f"is owned by uid {st.st_uid}, not by uid {me} who mounts",
                               f"remove it or chown -R {me} {path}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return UnsafeDirectory(path, f"is writable by {'others' if mode & 0o002 else 'its group'} "
                               f"(mode {mode:04o})", f"remove it or chmod -R go-w {path}")
    return None


def private_dir(path: str) -> None:
    """Create ``path`` (and missing parents) for the mounting user only, mode 0700 whatever
    the umask, and check it: one that another user owns or may write to (made before the
    first mount by someone else, or a symlink) raises ``UnsafeDirectory`` — an ``OSError``,
    so that best-effort writers (the cache writer, the persisted index) turn it into their
    warning. An existing directory of ours that others may only enter or read is made
    private."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    problem = directory_problem(path, st)
    if problem is not None:
        raise problem
    make_private(path, st)


def make_private(path: str, st: os.stat_result) -> None:
    """Mode 0700 for a directory of ours (``st``: its ``lstat``) that others may enter or
    read; where that fails (a read-only file system) it stays as it is: nobody else can write
    to it, and nothing new gets written there either."""
    if stat.S_IMODE(st.st_mode) & 0o077:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700, follow_symlinks=False)


def private_file(fd: int) -> None:
    """The file open as ``fd`` is made the mounting user's only (mode 0600) if it is ours and
    others may read it: a log file made by an older version or under another umask."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)


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
