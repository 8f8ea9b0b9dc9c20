"""Opening SOURCE (any fsspec URL, plain or compressed) and telling whether it changed."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import hashlib
import json
import sys
import zlib
from typing import IO, Any

import fsspec
from fsspec.compression import compr
from fsspec.core import url_to_fs

from refmount.base.urlenv import environment_identity
from refmount.base.urls import is_chained, is_local, protocol
from refmount.refs.deadline import SourceTimeout, TimedStream, connection_problem, within
from refmount.refs.limits import CountingReader, ExpansionGuard, Limits
from refmount.refs.model import ReferenceSetError

# An HTTP(S) SOURCE is read with aiohttp's transparent decoding off: a body sent with
# ``Content-Encoding`` is decoded here, under the same ExpansionGuard as a compressed name, with
# the bytes on the wire as the measure of its ratio.
HTTP_PROTOCOLS = frozenset({"http", "https"})
ACCEPT_ENCODING = "gzip, deflate"


def open_source(source: str, target_options: dict[str, Any], max_ratio: int = Limits.max_ratio,
                timeout: float | None = None, max_bytes: int = Limits.max_source,
                roots: tuple[str, ...] | None = None) -> IO[bytes]:
    """A binary stream of the refs file, decompressed when the name says .gz/.zst/... or an
    HTTP answer says ``Content-Encoding``: a compressed one may expand at most ``max_ratio``
    times the bytes read from the storage, and any yields at most ``max_bytes`` (see
    ExpansionGuard). For a SOURCE that is not a local file, opening it and each read end
    within ``timeout``. With ``roots`` (a catalogue's set in a shared mount), a local SOURCE is
    opened as a confined mount opens local targets (``base/confinedopen.py``): beneath one
    of those directories, symlinks resolved once and none followed while opening, a regular
    file only."""
    if is_local(source):
        timeout = None
    try:
        http = protocol(source) in HTTP_PROTOCOLS and not is_chained(source)
        options = _http_options(target_options) if http else target_options
        of = fsspec.open(source, "rb", compression="infer", **options)
        if roots is not None and is_local(source):
            opened = _open_confined(source, list(roots))
        else:
            opened = within(timeout, source, of.fs.open, of.path, "rb")
        raw = opened if timeout is None else TimedStream(opened, timeout, source)
        counter = CountingReader(raw)
        stream: IO[bytes] = counter  # type: ignore[assignment]
        encoding = _content_encoding(opened) if http else "identity"
        if encoding != "identity":
            stream = _decoder(source, encoding, stream)
        if of.compression is not None:
            stream = compr[of.compression](stream, mode="r")
        compressed = encoding != "identity" or of.compression is not None

        def close() -> None:
            try:
                stream.close()
            finally:
                raw.close()

        return ExpansionGuard(stream, counter, source, max_ratio if compressed else 0, close,  # type: ignore[return-value]
                              max_bytes)
    except ReferenceSetError:
        raise
    except FileNotFoundError as e:
        problem = connection_problem(e)
        raise ReferenceSetError(f"{source}: {problem or 'no such file'}") from None
    except IsADirectoryError:
        raise ReferenceSetError(f"{source}: is a directory, not a reference file"
                                f"{directory_hint(source)}") from None
    except PermissionError as e:
        why = f" ({e.strerror})" if roots is not None and e.strerror else ""
        raise ReferenceSetError(f"{source}: permission denied{why}") from None
    except ValueError as e:  # unknown protocol, bad URL (a special file, for a confined one)
        raise ReferenceSetError(f"{source}: {e}") from None
    except ImportError as e:
        raise ReferenceSetError(
            f"{source}: missing support for this URL ({e}); install it into refmount's Python "
            f"environment: {sys.executable} -m pip install PACKAGE") from None
    except OSError as e:
        problem = connection_problem(e)
        raise ReferenceSetError(f"{source}: {problem or f'cannot open ({e})'}") from None


ICECHUNK_MARKS = ("repo", "refs/branch.main/ref.json")


def directory_hint(source: str) -> str:
    """What a local directory given as SOURCE is, when that tells what to give instead: a
    part of an Icechunk repository (its root), a Zarr store (a reference set of its files)."""
    import os

    from refmount.base.urls import local_path

    if not is_local(source):
        return ""
    path = os.path.abspath(local_path(source))
    up = path
    for _ in range(3):  # refs/, refs/branch.main/, snapshots/ ... of a repository
        up = os.path.dirname(up)
        if any(os.path.isfile(os.path.join(up, m)) for m in ICECHUNK_MARKS):
            return f" (it is inside the Icechunk repository {up}: give the repository's root as SOURCE)"
        if up == "/":
            break
    if os.path.isfile(os.path.join(path, "zarr.json")):
        return (" (a Zarr v3 store, not a reference set: refmount serves reference sets and Icechunk "
                "repositories; write a reference set of the store's files, see 'A Zarr store as "
                "a reference set' in docs/semantics.md)")
    if any(os.path.isfile(os.path.join(path, m)) for m in (".zgroup", ".zarray")):
        return (" (a Zarr v2 store, not a reference set: refmount serves reference sets; write a "
                "reference set of the store's files, see 'A Zarr store as a reference set' in "
                "docs/semantics.md)")
    return " (nor an Icechunk repository, nor a Parquet reference directory with .zmetadata)"


def _open_confined(source: str, roots: list[str]) -> IO[bytes]:
    """A local SOURCE opened beneath ``roots`` with no symlink followed (targets/localfile.py)."""
    import os

    from refmount.base.confinedopen import open_checked
    from refmount.base.urls import local_path

    fd, _ = open_checked(os.path.abspath(local_path(source)), roots)
    return os.fdopen(fd, "rb")


def _http_options(target_options: dict[str, Any]) -> dict[str, Any]:
    """fsspec's HTTP options for reading SOURCE: one streaming GET (no ranges), aiohttp's
    decoding off, and the encodings refmount decodes itself asked for (unless the user's
    ``headers`` name their own)."""
    options = dict(target_options)
    options["client_kwargs"] = {**(options.get("client_kwargs") or {}), "auto_decompress": False}
    headers = dict(options.get("headers") or {})
    if not any(k.lower() == "accept-encoding" for k in headers):
        headers["Accept-Encoding"] = ACCEPT_ENCODING
    options["headers"] = headers
    options["block_size"] = 0  # a stream: the parse reads SOURCE once, in order
    return options


def _content_encoding(raw: Any) -> str:
    """The ``Content-Encoding`` of the answer behind fsspec's HTTP stream (``identity`` when
    there is none), lower case."""
    response = getattr(raw, "r", None)
    headers = getattr(response, "headers", None) or {}
    return (headers.get("Content-Encoding") or "identity").strip().lower() or "identity"


def _decoder(source: str, encoding: str, stream: IO[bytes]) -> IO[bytes]:
    if encoding in ("gzip", "x-gzip"):
        return compr["gzip"](stream, mode="r")
    if encoding == "zstd":
        return compr["zstd"](stream, mode="r")
    if encoding == "deflate":
        return Inflating(stream)  # type: ignore[return-value]
    raise ReferenceSetError(
        f"{source}: the server answered with Content-Encoding {encoding!r}, which refmount "
        f"does not decode (it asks for {ACCEPT_ENCODING} or none)")


class Inflating:
    """HTTP ``deflate``: a zlib stream (or, from servers that get it wrong, raw deflate),
    inflated at most ``n`` bytes per ``read(n)``."""

    PIECE = 64 << 10

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._inflate: Any = None
        self._tail = b""  # input not inflated yet (the last read's output was full)
        self._ended = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        while n and not self._ended:
            data, self._tail = self._tail or self._stream.read(self.PIECE), b""
            if not data:
                self._ended = True
                return self._inflate.flush() if self._inflate is not None else b""
            if self._inflate is None:  # a zlib header: method 8, header a multiple of 31
                zlib_header = len(data) < 2 or (data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0)
                self._inflate = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
            out = self._inflate.decompress(data, n)
            self._tail = self._inflate.unconsumed_tail
            if out:
                return out
            self._ended = self._inflate.eof
        return b""

    def close(self) -> None:
        self._stream.close()


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
    # The environment may change what SOURCE names (AWS_ENDPOINT_URL, ...): see base/urlenv.py.
    blob = json.dumps([fs.unstrip_protocol(path), stamp, salt, environment_identity()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


def source_mtime_ns(source: str, target_options: dict[str, Any], timeout: float | None = None) -> int | None:
    """SOURCE's modification time as the storage reports it (a file's mtime, an object's
    ``LastModified``), in nanoseconds; None when it reports none or does not answer. The
    same SOURCE gives the same time to every process that reads it (replicas of a server)."""
    try:
        fs, path = url_to_fs(source, **target_options)
        info = within(None if is_local(source) else timeout, source, fs.info, path)
    except Exception:
        return None
    for k in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(k)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value * 1_000_000_000)
        if isinstance(value, datetime.datetime):
            return int(value.timestamp() * 1_000_000_000)
        if isinstance(value, str):
            with contextlib.suppress(ValueError, TypeError):
                return int(email.utils.parsedate_to_datetime(value).timestamp() * 1_000_000_000)
            with contextlib.suppress(ValueError):
                return int(datetime.datetime.fromisoformat(value).timestamp() * 1_000_000_000)
    return None

