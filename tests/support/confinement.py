"""Shared (``allow_other``) mounts seen by another user: directories every user can traverse,
commands run as ``nobody``, reference sets written readable by all."""

from __future__ import annotations

import json
import subprocess
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
