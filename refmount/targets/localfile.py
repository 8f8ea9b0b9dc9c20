"""Reading local targets safely: open exactly what was checked (``base/confinedopen.py``),
read only from that descriptor with ``pread``, and check a pinned version on it.

All functions block: callers run them in worker threads.
"""

from __future__ import annotations

import os
from typing import Any

from refmount.base.confinedopen import open_checked
from refmount.targets.versions import Version, VersionChanged


def _check_version(st: os.stat_result, expect: Version | None, when: str) -> None:
    """``VersionChanged`` unless the descriptor's ``fstat`` shows the pinned size and mtime."""
    if expect is not None:
        why = expect.mismatch(Version(size=st.st_size, mtime_ns=st.st_mtime_ns))
        if why is not None:
            raise VersionChanged(f"{why} ({when} reading)")


def read_range(path: str, start: int, end: int, roots: list[str] | None,
               expect: Version | None = None) -> bytes:
    """Bytes [start, end) of ``path``, fewer if the file ends first; never more. With
    ``expect`` (a pin): the ``fstat`` of the descriptor read from must show its size and
    mtime before and after the reads, else ``VersionChanged`` and no bytes."""
    fd, st = open_checked(path, roots)
    try:
        _check_version(st, expect, "before")
        parts = []
        pos, want = start, max(end - start, 0)
        while want > 0:
            piece = os.pread(fd, min(want, 64 * 2**20), pos)
            if not piece:
                break
            parts.append(piece)
            pos += len(piece)
            want -= len(piece)
        if expect is not None:
            _check_version(os.fstat(fd), expect, "after")
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def version(path: str, roots: list[str] | None) -> Version:
    """The file's size and modification time (ns), from the descriptor it would be read from."""
    fd, st = open_checked(path, roots)
    os.close(fd)
    return Version(size=st.st_size, mtime_ns=st.st_mtime_ns)


def size(path: str, roots: list[str] | None) -> int:
    fd, st = open_checked(path, roots)
    os.close(fd)
    return st.st_size


def call(method: str, roots: list[str] | None, path: str, *args: Any, **kw: Any) -> Any:
    """What the fetcher (targets/filesystems.py) asks of fsspec's local file system, done safely:
    ``cat_file`` and ``info``."""
    if method == "cat_file":
        start = kw.get("start", args[0] if args else None) or 0
        end = kw.get("end", args[1] if len(args) > 1 else None)
        if end is None or start < 0 or end < 0:
            n = size(path, roots)
            end = n if end is None else (n + end if end < 0 else end)
            start = n + start if start < 0 else start
        return read_range(path, start, end, roots, kw.get("expect"))
    if method == "info":
        v = version(path, roots)
        return {"name": path, "size": v.size, "type": "file", "mtime_ns": v.mtime_ns}
    raise NotImplementedError(f"local {method}")
