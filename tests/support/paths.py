"""Reading a mounted tree back: its files and directories, the directories keys imply, a file's
bytes or the errno its read failed with."""

from __future__ import annotations

import os


def read_or_errno(path) -> bytes | int:
    """A file's bytes, or the errno its read failed with."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        return e.errno


def walk(mnt) -> tuple[set[str], set[str]]:
    """(files, dirs) under a mount, as paths relative to it."""
    files, dirs = set(), set()
    root = str(mnt)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel + "/"
        dirs.update(prefix + d for d in dirnames)
        files.update(prefix + f for f in filenames)
    return files, dirs


def implied_dirs(keys) -> set[str]:
    """Every directory that keys like "a/b/c" imply ("a", "a/b")."""
    dirs = set()
    for k in keys:
        parts = k.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return dirs
