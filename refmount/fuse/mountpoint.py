"""Checks of the mountpoint before mounting: exists, is a directory, not already mounted,
not a stale mount left by a dead daemon (which ``recover`` clears), empty unless ``nonempty``
says its files may be hidden."""

from __future__ import annotations

import errno
import logging
import os
import subprocess

from refmount.base.errors import MountError

log = logging.getLogger("refmount")


def _is_stale(path: str) -> bool:
    """A FUSE mount whose daemon is gone. statfs always reaches the daemon, whereas stat
    may be answered from the kernel's attribute cache long after the daemon died."""
    try:
        os.statvfs(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def check_mountpoint(path: str, nonempty: bool = False) -> None:
    if _is_stale(path):
        raise MountError(
            f"mountpoint {path} is a stale FUSE mount (its daemon died); clear it with "
            f"'fusermount3 -uz {path}' or mount again with -o recover"
        )
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MountError(f"mountpoint {path} does not exist") from None
    except OSError as e:
        raise MountError(f"mountpoint {path}: {e.strerror}") from None
    if not os.path.isdir(path):
        raise MountError(f"mountpoint {path} is not a directory")
    if os.path.ismount(path) and st.st_dev != os.stat(os.path.dirname(path) or "/").st_dev:
        raise MountError(f"mountpoint {path} is already mounted (unmount it first)")
    if not nonempty and _has_entries(path):
        raise MountError(
            f"mountpoint {path} is not empty: the mount would hide its files; use an empty "
            f"directory, or -o nonempty to mount over them"
        )


def _has_entries(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is not None
    except OSError:
        return False  # not listable by us: mounting decides


def recover_stale_mount(path: str) -> None:
    """Clear a mount whose daemon is gone; leave live mounts alone."""
    if not _is_stale(path):
        return
    log.warning("clearing stale mount at %s (its daemon died)", path)
    result = subprocess.run(["fusermount3", "-uz", path], capture_output=True, text=True)
    if result.returncode != 0:
        msg = (result.stderr or result.stdout).strip().splitlines()
        raise MountError(f"cannot clear stale mount at {path}: {msg[-1] if msg else result.returncode}")
