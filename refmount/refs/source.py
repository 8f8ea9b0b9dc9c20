"""Opening SOURCE (any fsspec URL, plain or compressed) and telling whether it changed."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import IO, Any

import fsspec
from fsspec.compression import compr
from fsspec.core import url_to_fs

from ..urlenv import environment_identity
from ..urls import is_local
from .deadline import SourceTimeout, TimedStream, connection_problem, within
from .limits import CountingReader, ExpansionGuard, Limits
from .model import ReferenceSetError


def open_source(source: str, target_options: dict[str, Any], max_ratio: int = Limits.max_ratio,
                timeout: float | None = None) -> IO[bytes]:
    """A binary stream of the refs file, decompressed when the name says .gz/.zst/...;
    a compressed one may expand at most ``max_ratio`` times (see ExpansionGuard). For a
    SOURCE that is not a local file, opening it and each read end within ``timeout``."""
    if is_local(source):
        timeout = None
    try:
        of = fsspec.open(source, "rb", compression="infer", **target_options)
        if of.compression is None:
            f = within(timeout, source, of.open)
            return f if timeout is None else TimedStream(f, timeout, source)  # type: ignore[return-value]
        raw = within(timeout, source, of.fs.open, of.path, "rb")
        if timeout is not None:
            raw = TimedStream(raw, timeout, source)
        counter = CountingReader(raw)
        stream = compr[of.compression](counter, mode="r")

        def close() -> None:
            try:
                stream.close()
            finally:
                raw.close()

        return ExpansionGuard(stream, counter, source, max_ratio, close)  # type: ignore[return-value]
    except FileNotFoundError as e:
        problem = connection_problem(e)
        raise ReferenceSetError(f"{source}: {problem or 'no such file'}") from None
    except IsADirectoryError:
        raise ReferenceSetError(f"{source}: is a directory, not a reference file") from None
    except PermissionError:
        raise ReferenceSetError(f"{source}: permission denied") from None
    except ValueError as e:  # unknown protocol, bad URL
        raise ReferenceSetError(f"{source}: {e}") from None
    except ImportError as e:
        raise ReferenceSetError(
            f"{source}: missing support for this URL ({e}); install it into refmount's Python "
            f"environment: {sys.executable} -m pip install PACKAGE") from None
    except OSError as e:
        problem = connection_problem(e)
        raise ReferenceSetError(f"{source}: {problem or f'cannot open ({e})'}") from None


def source_identity(source: str, target_options: dict[str, Any], salt: str,
                    timeout: float | None = None) -> str | None:
    """A stable digest of SOURCE's name + size + modification stamp, or None when the
    storage gives no stamp (then a persisted index could be stale, so none is used).
    SourceTimeout if the storage does not answer within ``timeout``."""
    try:
        fs, path = url_to_fs(source, **target_options)
        info = within(None if is_local(source) else timeout, source, fs.info, path)
    except SourceTimeout:
        raise
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
