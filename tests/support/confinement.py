"""Shared (``allow_other``) mounts seen by another user: directories every user can traverse,
commands run as ``nobody``, reference sets written readable by all."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

NOBODY = 65534


def mkdir_public(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    return path


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True, timeout=60)


OTHER_USER = "refmount-other"


def other_user() -> int:
    """The uid of a real second user (``refmount-other``, made with useradd if missing):
    someone else on the machine, who prepares things for root's mounts."""
    import pwd

    try:
        return pwd.getpwnam(OTHER_USER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                        "--shell", "/usr/sbin/nologin", OTHER_USER], check=True, timeout=60)
        return pwd.getpwnam(OTHER_USER).pw_uid


def as_user(uid: int, *argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``uid`` (its own group, no others)."""
    import pwd

    gid = pwd.getpwuid(uid).pw_gid
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
                          capture_output=True, timeout=60)


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    path.chmod(0o644)
    return path


def parquet_set(root: Path, rows: list[tuple[str | None, int, int, bytes | None]]) -> None:
    zarray = {"zarr_format": 2, "shape": [len(rows)], "chunks": [1], "dtype": "|u1",
              "compressor": None, "filters": None, "fill_value": 0, "order": "C"}
    write_json(root / ".zmetadata", {"metadata": {".zgroup": {"zarr_format": 2},
                                                 "v/.zarray": zarray}, "record_size": 100})
    mkdir_public(root / "v")
    paths, offs, sizes, raws = zip(*rows, strict=True)
    pq.write_table(pa.table({"path": pa.array(paths, pa.string()),
                             "offset": pa.array(offs, pa.int64()),
                             "size": pa.array(sizes, pa.int64()),
                             "raw": pa.array(raws, pa.binary())}), root / "v" / "refs.0.parq")


@contextlib.contextmanager
def interpreter_for_others() -> Iterator[None]:
    """Make this Python (and the checkout) runnable by other users for the duration: each
    ancestor directory of the interpreter and of the repository that others cannot traverse
    gets o+x, taken back afterwards."""
    changed: list[tuple[Path, int]] = []
    here = Path(__file__).resolve().parents[2]
    try:
        for start in (Path(os.path.realpath(sys.executable)), here / "refmount"):
            for d in start.parents:
                mode = d.stat().st_mode
                if not mode & stat.S_IXOTH:
                    d.chmod(mode | stat.S_IXOTH)
                    changed.append((d, mode))
        yield
    finally:
        for d, mode in reversed(changed):
            d.chmod(stat.S_IMODE(mode))


def refmount_as_nobody(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m refmount ARGS`` run as ``nobody`` (use inside ``interpreter_for_others``)."""
    here = Path(__file__).resolve().parents[2]
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "env", f"PYTHONPATH={here}", "HOME=/nonexistent", sys.executable, "-P", "-m", "refmount",
         *args], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/")
