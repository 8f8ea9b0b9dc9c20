"""Opening SOURCE (any fsspec URL, plain or compressed) and telling whether it changed."""

from __future__ import annotations

import hashlib
import json
from typing import IO, Any

import fsspec
from fsspec.compression import compr
from fsspec.core import url_to_fs

from ..urlenv import environment_identity
from .limits import CountingReader, ExpansionGuard, Limits
from .model import ReferenceSetError


def open_source(source: str, target_options: dict[str, Any], max_ratio: int = Limits.max_ratio
                ) -> IO[bytes]:
    """A binary stream of the refs file, decompressed when the name says .gz/.zst/...;
    a compressed one may expand at most ``max_ratio`` times (see ExpansionGuard)."""
    try:
        of = fsspec.open(source, "rb", compression="infer", **target_options)
        if of.compression is None:
            return of.open()
        raw = of.fs.open(of.path, mode="rb")
        counter = CountingReader(raw)
        stream = compr[of.compression](counter, mode="r")

        def close() -> None:
            try:
                stream.close()
            finally:
                raw.close()

        return ExpansionGuard(stream, counter, source, max_ratio, close)  # type: ignore[return-value]
    except FileNotFoundError:
        raise ReferenceSetError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ReferenceSetError(f"{source}: is a directory, not a reference file") from None
    except PermissionError:
        raise ReferenceSetError(f"{source}: permission denied") from None
    except ValueError as e:  # unknown protocol, bad URL
        raise ReferenceSetError(f"{source}: {e}") from None
    except ImportError as e:
        raise ReferenceSetError(f"{source}: missing support for this URL ({e})") from None
    except OSError as e:
        raise ReferenceSetError(f"{source}: cannot open ({e})") from None


def source_identity(source: str, target_options: dict[str, Any], salt: str) -> str | None:
    """A stable digest of SOURCE's name + size + modification stamp, or None when the
    storage gives no stamp (then a persisted index could be stale, so none is used)."""
    try:
        fs, path = url_to_fs(source, **target_options)
        info = fs.info(path)
    except Exception:
        return None
    stamp = {
        k: str(info[k])
        for k in ("size", "mtime", "ETag", "etag", "LastModified", "last_modified", "md5",
                  "generation", "created")
        if info.get(k) is not None
    }
    if not any(k != "size" for k in stamp):
        return None
    # The environment may change what SOURCE names (AWS_ENDPOINT_URL, ...): see urlenv.py.
    blob = json.dumps([fs.unstrip_protocol(path), stamp, salt, environment_identity()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]
