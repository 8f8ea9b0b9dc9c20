"""Opening a local file exactly as checked: beneath an allowed directory, no symlink followed.

Checking a path (``realpath``, then "is it under an allowed directory?") and opening it
afterwards are two lookups, and whoever can write in an allowed directory can swap a file
for a symlink between them. So the path is resolved once, then opened *beneath* the allowed
directory's descriptor with no symlink followed on the way (``openat2`` with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``; on kernels without it, a walk of ``openat`` calls
with ``O_NOFOLLOW`` component by component). A symlink appearing anywhere on the way fails the
open instead of being followed.

The first open is an ``O_PATH`` one: it does not open the file for reading, so a FIFO (which
would block the worker in ``open()`` until a writer appears) or a device (whose open may
act) is refused after ``fstat``, before anything reads it. Only a regular file is then
reopened for reading through ``/proc/self/fd`` (with ``O_NONBLOCK``), checked to be the
same inode. Where ``/proc`` is missing, the file is opened with ``O_NONBLOCK | O_NOFOLLOW``
directly and checked the same way. ``listdir_checked`` lists a directory opened the same way.
Used for local targets (``targets/localfile.py``), for the set files of a shared catalogue
(``refs/source.py``) and for every object of an Icechunk repository in one
(``refs/icechunk/storage.py``). Blocking: run it in worker threads.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from typing import Any

_SYS_OPENAT2 = 437  # the same number on every architecture that has it
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_O_PATH = getattr(os, "O_PATH", 0o10000000)


class NotARegularFile(ValueError):
    """The target is a FIFO, a device, a socket or a directory: never opened for reading."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """``openat2(2)`` through ``syscall(2)``; ``available`` is False once the kernel said ENOSYS."""

    def __init__(self) -> None:
        self.available = os.uname().sysname == "Linux"
        self._syscall: Any = None
        if self.available:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                self._syscall = libc.syscall
                self._syscall.restype = ctypes.c_long
            except (OSError, AttributeError):
                self.available = False

    def __call__(self, dirfd: int, path: str, flags: int, resolve: int) -> int:
        how = _OpenHow(flags, 0, resolve)
        fd = self._syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd),
                           ctypes.c_char_p(os.fsencode(path)), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM) and self.available:  # EPERM: seccomp filters
                self.available = False
                raise NotImplementedError
            raise OSError(err, os.strerror(err), path)
        return int(fd)


_openat2 = _Openat2()


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def _refuse_symlink(path: str, e: OSError) -> OSError:
    if e.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        # A symlink (or something that is no longer a directory) appeared on the way.
        return PermissionError(errno.EACCES, "a symlink or a non-directory appeared in the "
                               "path while it was opened: refused", path)
    return e


def _walk(root_fd: int, rel: str, last_flags: int) -> int:
    """``openat`` component by component, never following a symlink."""
    parts = [p for p in rel.split("/") if p]
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            if part in (".", ".."):
                raise PermissionError(errno.EACCES, "'.' or '..' in a resolved path", rel)
            last = i == len(parts) - 1
            flags = last_flags if last else (_O_PATH | os.O_DIRECTORY)
            nxt = os.open(part, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if not parts:
            raise IsADirectoryError(errno.EISDIR, "is a directory", rel)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_beneath(root: str, rel: str, flags: int) -> int:
    root_fd = os.open(root, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _openat2.available:
            try:
                return _openat2(root_fd, rel, flags | os.O_NOFOLLOW | os.O_CLOEXEC,
                                _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
            except NotImplementedError:
                pass
        return _walk(root_fd, rel, flags)
    finally:
        os.close(root_fd)


def _check_regular(st: os.stat_result, path: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    mode = st.st_mode
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a symlink" if stat.S_ISLNK(mode) else "not a file")
    raise NotARegularFile(f"{path}: {kind}, not a regular file: refused")


def open_checked(path: str, roots: list[str] | None) -> tuple[int, os.stat_result]:
    """A descriptor open for reading on the regular file ``path`` (absolute), and its stat.

    ``roots``: the allowed directories (symlinks resolved), or None for no confinement (a
    private mount: symlinks are followed, but FIFOs and devices are still refused)."""
    if not os.path.isabs(path):
        raise PermissionError(errno.EACCES, "not an absolute path", path)
    if roots is None:
        first = os.open(path, _O_PATH | os.O_CLOEXEC)
        root = "/"
    else:
        real = os.path.realpath(path)
        root = next((r for r in roots if _under(real, r)), "")
        if not root:
            raise PermissionError(errno.EACCES, "outside the allowed directories", path)
        rel = os.path.relpath(real, root) if real != root else ""
        try:
            first = _open_beneath(root, rel, _O_PATH)
        except OSError as e:
            raise _refuse_symlink(path, e) from None
    try:
        st = os.fstat(first)
        _check_regular(st, path)
        proc = f"/proc/self/fd/{first}"
        try:
            where = os.readlink(proc)
        except OSError:
            where = None
        if where is not None and not _under(where, root):
            raise PermissionError(errno.EACCES, f"opened {where}, outside the allowed directories", path)
        try:
            fd = os.open(proc, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:  # no /proc: open the checked path once more, as strictly
            if roots is None:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            else:
                try:
                    fd = _open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
                except OSError as e:
                    raise _refuse_symlink(path, e) from None
    finally:
        os.close(first)
    try:
        st2 = os.fstat(fd)
        _check_regular(st2, path)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            raise PermissionError(errno.EACCES, "the file changed while it was opened", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st2


def listdir_checked(path: str, roots: list[str]) -> list[str]:
    """The names in the directory ``path`` (absolute), opened beneath one of ``roots`` as
    :func:`open_checked` opens a file: symlinks resolved once, none followed while opening."""
    if not os.path.isabs(path):
        raise PermissionError(errno.EACCES, "not an absolute path", path)
    real = os.path.realpath(path)
    root = next((r for r in roots if _under(real, r)), "")
    if not root:
        raise PermissionError(errno.EACCES, "outside the allowed directories", path)
    rel = os.path.relpath(real, root) if real != root else ""
    flags = os.O_RDONLY | os.O_DIRECTORY
    try:
        fd = (os.open(root, flags | os.O_CLOEXEC) if not rel
              else _open_beneath(root, rel, flags))
    except OSError as e:
        raise _refuse_symlink(path, e) from None
    try:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = None
        if where is not None and not _under(where, root):
            raise PermissionError(errno.EACCES, f"opened {where}, outside the allowed directories", path)
        return os.listdir(fd)
    finally:
        os.close(fd)
