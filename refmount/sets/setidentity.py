"""A set's identity: a short string that changes when the reference set at a SOURCE changes (file
stamps; a Parquet set's ``.zmetadata`` and record files), which tells ``reload`` a set changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
from typing import Any

from fsspec.core import url_to_fs

from refmount.base.errors import CatalogError
from refmount.base.redact import redact_url
from refmount.base.urls import is_chained, is_local, local_path, protocol
from refmount.refs import ReferenceSetError, revision_identity
from refmount.refs.deadline import SourceTimeout, within
from refmount.sets.catalog import json_set_name

DIGEST_BYTES = 64 << 20  # read of a file whose storage gives no stamp, to tell a change
# What a storage's ``info`` may say that changes with the content (besides the size).
STAMPS = ("mtime", "ETag", "etag", "Last-Modified", "LastModified", "last_modified", "md5",
          "Content-MD5", "Digest", "generation", "VersionId", "version_id", "created", "ino")


def source_identity(source: str, storage_options: dict[str, Any], *, timeout: float,
                    format: str | None = None, revision: dict[str, str] | None = None,
                    roots: list[str] | None = None) -> str:
    """A short string that changes when the reference set at ``source`` changes: the size
    and modification stamp (mtime, ETag, Last-Modified, version) of its file; for a Parquet
    reference directory, of its ``.zmetadata`` and of the listing of its record files. A file
    whose storage gives no stamp (an HTTP server without ``ETag`` or ``Last-Modified``) is
    known by the digest of its first DIGEST_BYTES. A format with revisions names the one served
    (an Icechunk repository: its branch's head snapshot; ``format`` and ``revision`` as
    ``-o format=``, ``-o branch=``...); ``roots``: where a repository's objects are opened,
    confined (a set of a shared catalogue: ``MountConfig.source_roots``).
    OSError (FileNotFoundError when it is gone) or CatalogError when it cannot be read."""
    try:
        named = revision_identity(source, storage_options, timeout=timeout, format=format,
                                  revision=revision, roots=None if roots is None else tuple(roots))
        if named is not None:
            return hashlib.sha256(named.encode()).hexdigest()[:24]
        if is_local(source):
            parts = _local_identity(local_path(source))
        else:
            parts = within(timeout, redact_url(source), _remote_identity, source,
                           dict(storage_options))
    except SourceTimeout as e:
        raise CatalogError(str(e)) from None
    except ReferenceSetError as e:  # a repository that cannot be read, a branch gone
        raise CatalogError(str(e)) from None
    except (OSError, CatalogError):
        raise
    except Exception as e:  # a backend's own errors (bad URL, missing module, ...)
        raise CatalogError(redact_url(f"{source}: cannot tell whether it changed "
                                      f"({type(e).__name__}: {e})").splitlines()[0]) from None
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _local_stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def _local_identity(path: str) -> list[Any]:
    if path.endswith("/.zmetadata"):
        path = path[: -len("/.zmetadata")]
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return ["file", _local_stamp(st)]
    meta = os.stat(os.path.join(path, ".zmetadata"))
    records = []
    for directory, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(".") and directory == path:
                continue
            full = os.path.join(directory, name)
            try:
                records.append([os.path.relpath(full, path), _local_stamp(os.stat(full))])
            except FileNotFoundError:
                continue  # removed while listed: the next identity sees it gone
    return ["parquet", _local_stamp(meta), records]


def _remote_identity(source: str, options: dict[str, Any]) -> list[Any]:
    fs, path = url_to_fs(source, **options)
    path = path.rstrip("/")
    if path.endswith("/.zmetadata"):
        path = path[: -len("/.zmetadata")]
    fs.invalidate_cache(path)  # a listing cached by the file system would hide a change
    meta: dict[str, Any] | None = None
    if json_set_name(posixpath.basename(path)) is None:
        # Not named as a JSON set: a Parquet directory? (An HTTP "directory" has no info of
        # its own, or an HTML listing's: its .zmetadata says.)
        try:
            meta = fs.info(path + "/.zmetadata")
        except FileNotFoundError:
            meta = None
    if meta is None:
        info = fs.info(path)
        stamp = _stamp(info)
        if set(stamp) <= {"size"}:  # no stamp at all (an HTTP server without validators)
            stamp["sha256"] = _content_digest(fs, path)
        return ["file", stamp]
    records: list[Any] = []
    # HTTP has no listing (a server's HTML index, where there is one, is not a contract):
    # there, the set is known by its .zmetadata alone.
    http = protocol(source) in ("http", "https") and not is_chained(source)
    found = {} if http else fs.find(path, detail=True)
    for name, rinfo in sorted(found.items()):
        rel = name[len(path):].lstrip("/")
        if rel == ".zmetadata":
            continue
        records.append([rel, _stamp(rinfo)])
    return ["parquet", _stamp(meta), records]


def _content_digest(fs: Any, path: str) -> str:
    """The digest of the file's first DIGEST_BYTES (for storage that gives no stamp)."""
    digest = hashlib.sha256()
    with fs.open(path, "rb", block_size=0) if fs.protocol[0] in ("http", "https") \
            else fs.open(path, "rb") as f:
        left = DIGEST_BYTES
        while left > 0 and (piece := f.read(min(left, 1 << 20))):
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def _stamp(info: dict[str, Any]) -> dict[str, str]:
    return {k: str(info[k]) for k in ("size", *STAMPS) if info.get(k) is not None}
