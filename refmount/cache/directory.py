"""The cache directory (``cache_dir``) is the mounting user's alone, or refused at mount.

What refmount keeps there decides what a mount serves: a persisted index is the tree it
lists, a block file is bytes it returns (the checksum guards against corruption, not against
whoever wrote the file). A directory another user owns or may write to lets that user swap
either, or plant a symlink where a file is about to be written. So, before the daemon
starts, ``check_cache_dir``:

* checks the directories above ``cache_dir`` (as given and with symlinks resolved): each is
  owned by root or the mounting user, and one that others may write to has the sticky bit
  (``/tmp``), so nobody else can rename what is in it;
* creates ``cache_dir`` if missing (0700) and checks it and every directory refmount uses
  under it (``index/``, ``blocks/``, ``blocks/00``..``ff``, ``log/``) that exists: owned by
  the mounting user, writable by nobody else, not a symlink (``process.directory_problem``);
  one that is open to others' reading only is made private.

Files in these directories are created with ``O_EXCL|O_NOFOLLOW`` under unpredictable names
and read with ``O_NOFOLLOW`` (cache/blocks.py, refs/indexfiles.py, refs/index.py); the writers check
each directory again when they create it (``process.private_dir``).
"""

from __future__ import annotations

import os
import stat

from refmount.base.errors import MountError
from refmount.base.process import UnsafeDirectory, directory_problem, make_private, private_dir

SUBDIRS = ("index", "blocks", "log")
BLOCK_SUBDIRS = tuple(f"{i:02x}" for i in range(256))


def ancestor_problem(path: str, st: os.stat_result) -> UnsafeDirectory | None:
    """Why a directory above the cache directory (or a symlink on the way to it) lets
    another user replace what lies below it, or None."""
    me = os.geteuid()
    if st.st_uid not in (0, me):
        return UnsafeDirectory(path, f"(above the cache directory) is owned by uid {st.st_uid}",
                               "use a cache_dir whose parents belong to root or to you")
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode) and mode & 0o022 and not mode & stat.S_ISVTX:
        return UnsafeDirectory(path, f"(above the cache directory) is writable by others without "
                               f"the sticky bit (mode {mode:04o})", f"chmod go-w {path}")
    return None


def _check_ancestors(path: str) -> None:
    """Every existing directory above ``path``, and ``path`` itself if it is a symlink."""
    parts = path.split(os.sep)
    for i in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.lstat(prefix)
        except FileNotFoundError:
            return  # the rest is created by this user, 0700
        if i == len(parts) and not stat.S_ISLNK(st.st_mode):
            return  # the cache directory itself: checked as one
        problem = ancestor_problem(prefix, st)
        if problem is not None:
            raise problem


def check_cache_dir(cache_dir: str) -> None:
    """Refuse (``MountError``, one line naming the directory and what to do) a cache
    directory another user could change; create it if missing. See the module's doc. A cache
    directory that cannot be used at all (a read-only file system, a file in the way) is not
    refused: the mount then caches in memory only, with one warning when it first writes."""
    path = os.path.abspath(cache_dir)
    try:
        _check_ancestors(path)  # as given: a symlink on the way is root's or ours
        real = os.path.realpath(path)
        _check_ancestors(real)
        private_dir(real)
        for sub in SUBDIRS:
            _check_existing(os.path.join(real, sub))
        blocks = os.path.join(real, "blocks")
        for sub in BLOCK_SUBDIRS:
            _check_existing(os.path.join(blocks, sub))
    except UnsafeDirectory as e:
        raise MountError(str(e)) from None
    except OSError:
        return  # unusable, not unsafe: the writers say so (DiskCache.put_digest)


def _check_existing(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid == os.geteuid() and not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        return  # a file of ours in the way: unusable, not unsafe
    problem = directory_problem(path, st)
    if problem is not None:
        raise problem
    make_private(path, st)
