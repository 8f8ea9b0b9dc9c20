"""The index's files: an Arrow IPC file written atomically (the disk cache's, named by the
family of its SOURCE, older ones pruned) or as a temporary file, with its totals."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile

import pyarrow as pa
import pyarrow.compute as pc

from refmount.refs.index import INDEX_FORMAT
from refmount.refs.model import RefKind


def summary_metadata(table: pa.Table) -> dict[str, str]:
    """Totals stored with the index, so the daemon never scans columns to report them."""
    if not table.num_rows:
        return {"keys": "0", "targets": "0", "referenced_bytes": "0", "inline_bytes": "0"}
    kind = table["kind"]
    ranged = pc.equal(kind, int(RefKind.RANGE))
    remote = pc.not_equal(kind, int(RefKind.INLINE))
    used_urls = pc.count_distinct(pc.filter(table["url"].combine_chunks().indices, remote))
    return {
        "keys": str(table.num_rows),
        "targets": str(used_urls.as_py()),
        "referenced_bytes": str(pc.sum(pc.filter(table["length"], ranged)).as_py() or 0),
        "inline_bytes": str(pc.sum(pc.binary_length(table["data"])).as_py() or 0),
    }


def index_family(source: str, variant: str) -> str:
    """What the persisted indexes of every version of one SOURCE (under the same options)
    share: the start of their file names, ``<family>-<identity>.arrow``."""
    return hashlib.sha256(f"{source}\0{variant}".encode()).hexdigest()[:16]


def prune_index_family(keep: str) -> int:
    """Remove the other indexes of ``keep``'s family (older versions of its SOURCE): the index
    directory keeps the newest index of each SOURCE. A live mount that maps one of them goes
    on reading it (the file is unlinked, its mapping stays). Returns how many were removed."""
    directory, name = os.path.split(keep)
    family = name.split("-", 1)[0] + "-"
    removed = 0
    with os.scandir(directory) as entries:
        for e in entries:
            if e.name.startswith(family) and e.name.endswith(".arrow") and e.name != name:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
                    removed += 1
    return removed


def write_index(table: pa.Table, path: str, metadata: dict[str, str]) -> None:
    """Write atomically (temp file + rename), so concurrent mounts never see half a file. The
    directory is the caller's to vouch for (``process.private_dir`` under ``cache_dir``); the
    temporary file is created exclusively under an unpredictable name (``mkstemp``)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)  # the index holds every target URL
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".arrow")
    try:
        _write(fd, table, metadata)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_temporary_index(table: pa.Table, metadata: dict[str, str]) -> str:
    """Write the index to a new file of this user's (0600, created exclusively under an
    unpredictable ``refmount-index-*.arrow`` name in ``$XDG_RUNTIME_DIR`` or the temporary
    directory: nothing another user planted there is written through); returns its path."""
    directory = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(dir=directory, prefix="refmount-index-", suffix=".arrow")
    try:
        _write(fd, table, metadata)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


def _write(fd: int, table: pa.Table, metadata: dict[str, str]) -> None:
    schema = table.schema.with_metadata({"format": INDEX_FORMAT, **metadata})
    with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for batch in table.to_batches(max_chunksize=max(table.num_rows, 1)):
            writer.write_batch(batch)
