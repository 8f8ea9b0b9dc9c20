"""The objects of an Icechunk repository, read through fsspec: each one whole, at most a
given number of bytes, every storage call within ``source_timeout``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsspec.core import url_to_fs

from refmount.base.redact import redact_url
from refmount.base.urls import is_local
from refmount.refs.deadline import SourceTimeout, connection_problem, within
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.model import ReferenceSetError

PIECE = 4 << 20


class Storage:
    """The repository's root: ``read``, ``exists`` and ``listdir`` of paths relative to it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any], timeout: float | None) -> None:
        self.url = url.rstrip("/")
        self.timeout = None if is_local(url) else timeout
        try:
            self.fs, path = url_to_fs(self.url, **dict(storage_options))
        except (ValueError, ImportError, TypeError) as e:
            raise IcechunkError(redact_url(f"{url}: cannot open the repository's storage ({e})")) from None
        self.path = path.rstrip("/")

    def full(self, rel: str) -> str:
        return f"{self.path}/{rel}" if self.path else rel

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def shown(self, rel: str) -> str:
        """``rel``'s URL as messages show it: credentials in the repository's URL masked."""
        return redact_url(self.url_of(rel))

    def read(self, rel: str, max_bytes: int) -> bytes:
        """The whole object ``rel``; IcechunkError if missing or larger than ``max_bytes``."""
        what = self.shown(rel)
        try:
            return within(self.timeout, what, self._read, self.full(rel), max_bytes, what)
        except FileNotFoundError as e:
            problem = connection_problem(e)
            if problem is not None:  # fsspec's HTTP file system reports every failure so
                raise IcechunkError(f"{what}: cannot be read ({problem})") from None
            raise IcechunkError(f"{what}: missing from the repository") from None
        except ReferenceSetError as e:
            raise IcechunkError(str(e)) from None
        except OSError as e:
            problem = connection_problem(e) or e.strerror or str(e) or type(e).__name__
            raise IcechunkError(redact_url(f"{what}: cannot be read ({problem})")) from None

    def head(self, rel: str, n: int) -> bytes:
        """The first ``n`` bytes of the object ``rel`` (fewer if it is shorter)."""
        what = self.shown(rel)

        def first() -> bytes:
            with self.fs.open(self.full(rel), "rb") as f:
                return f.read(n)

        try:
            return within(self.timeout, what, first)
        except FileNotFoundError as e:
            problem = connection_problem(e)
            if problem is not None:  # fsspec's HTTP file system reports every failure so
                raise IcechunkError(f"{what}: cannot be read ({problem})") from None
            raise IcechunkError(f"{what}: missing from the repository") from None
        except SourceTimeout as e:
            raise IcechunkError(str(e)) from None
        except OSError as e:
            problem = connection_problem(e) or str(e) or type(e).__name__
            raise IcechunkError(redact_url(f"{what}: cannot be read ({problem})")) from None

    def _read(self, path: str, max_bytes: int, what: str) -> bytes:
        parts: list[bytes] = []
        got = 0
        with self.fs.open(path, "rb") as f:
            while True:
                piece = f.read(min(PIECE, max_bytes + 1 - got))
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
                if got > max_bytes:
                    raise IcechunkError(f"{what}: larger than {max_bytes:,} bytes (limit max_source)")
        return b"".join(parts)

    def exists(self, rel: str) -> bool:
        try:
            return bool(within(self.timeout, self.shown(rel), self.fs.exists, self.full(rel)))
        except SourceTimeout:
            raise
        except (OSError, ValueError):
            return False

    def listdir(self, rel: str, max_entries: int) -> list[str] | None:
        """The names under the directory ``rel``; None when the storage cannot list it
        (plain HTTP)."""
        what = self.shown(rel)
        try:
            entries = within(self.timeout, what, self.fs.ls, self.full(rel), False)
        except SourceTimeout as e:
            raise IcechunkError(str(e)) from None
        except FileNotFoundError:
            return []
        except (OSError, ValueError, NotImplementedError):
            return None
        if len(entries) > max_entries:
            raise IcechunkError(f"{what}: more than {max_entries:,} entries (limit max_keys)")
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]


def is_repository(url: str, storage_options: Mapping[str, Any], timeout: float | None = 30.0) -> bool:
    """Whether ``url`` looks like an Icechunk repository: a ``repo`` object starting with
    Icechunk's magic bytes, or ``refs/branch.main/ref.json`` (a few small reads, each within
    ``timeout`` seconds for remote storage)."""
    from refmount.refs.icechunk import header

    try:
        storage = Storage(url, storage_options, timeout)
        if storage.exists("repo"):
            return storage.head("repo", len(header.MAGIC)) == header.MAGIC
        return storage.exists("refs/branch.main/ref.json")
    except (IcechunkError, OSError, ValueError):
        return False
