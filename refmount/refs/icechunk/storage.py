"""The objects of an Icechunk repository, read through fsspec: each one whole, at most a
given number of bytes, every storage call within ``source_timeout``.

Confined (``roots``: a repository of a shared catalogue, or of a shared mount): a local
repository's objects, refs and listings are opened beneath those directories with no symlink
followed at any component (``base/confinedopen.py``), as a shared mount's local targets are;
an object reached through a symlink leaving them is refused (:class:`ObjectRefused`), never read.

An object's path is inserted before a URL's query (``https://h/repo?sig=x`` ->
``https://h/repo/refs/...?sig=x``), never appended to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fsspec.core import url_to_fs

from refmount.base.confinedopen import NotARegularFile, listdir_checked, open_checked
from refmount.base.redact import redact_url
from refmount.base.urls import is_local, local_path
from refmount.refs.deadline import SourceTimeout, connection_problem, within
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.model import ReferenceSetError

PIECE = 4 << 20
CONFINED = ("an object of a repository in a shared mount or catalogue must lie beneath its "
            "directory or allow_local, not through a symlink leaving it")


class ObjectRefused(IcechunkError):
    """A confined repository's object that is reached through a symlink, lies outside the
    allowed directories or is not a regular file: refused, not read."""


def join(base: str, rel: str) -> str:
    """``base``/``rel``, ``rel`` inserted before ``base``'s query string, if any."""
    head, sep, query = base.partition("?") if "://" in base and not is_local(base) else (base, "", "")
    head = head.rstrip("/")
    joined = f"{head}/{rel}" if head else rel
    return f"{joined}{sep}{query}"


class Storage:
    """The repository's root: ``read``, ``exists`` and ``listdir`` of paths relative to it.
    ``roots``: the directories a local repository's objects are opened beneath (confined,
    see the module's docstring); None: opened as named."""

    def __init__(self, url: str, storage_options: Mapping[str, Any], timeout: float | None,
                 roots: tuple[str, ...] | list[str] | None = None) -> None:
        local = is_local(url)
        query = "?" in url and not local  # kept at the end: nothing stripped before it
        self.url = url if query else url.rstrip("/")
        self.timeout = None if local else timeout
        self.roots = list(roots) if roots is not None and local else None
        try:
            self.fs, path = url_to_fs(self.url, **dict(storage_options))
        except (ValueError, ImportError, TypeError) as e:
            raise IcechunkError(redact_url(f"{url}: cannot open the repository's storage ({e})")) from None
        self.path = path if query else path.rstrip("/")
        if self.roots is not None:
            self.path = os.path.abspath(local_path(self.url)).rstrip("/")

    def full(self, rel: str) -> str:
        return join(self.path, rel) if self.path else rel

    def url_of(self, rel: str) -> str:
        return join(self.url, rel)

    def _refused(self, rel: str, e: OSError | NotARegularFile) -> ObjectRefused:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return ObjectRefused(f"{self.shown(rel)}: refused: {why} ({CONFINED})")

    def _open_confined(self, rel: str) -> int | None:
        """A descriptor of the confined object ``rel``; None when it does not exist."""
        assert self.roots is not None
        try:
            fd, _ = open_checked(self.full(rel), self.roots)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError:
            raise IcechunkError(f"{self.shown(rel)}: is a directory, not an object") from None
        except (OSError, NotARegularFile) as e:
            raise self._refused(rel, e) from None
        return fd

    def _read_confined(self, rel: str, max_bytes: int, limit_message: bool) -> bytes:
        fd = self._open_confined(rel)
        if fd is None:
            raise IcechunkError(f"{self.shown(rel)}: missing from the repository")
        try:
            parts: list[bytes] = []
            got = 0
            while got <= max_bytes:
                piece = os.read(fd, min(PIECE, max_bytes + 1 - got))
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
        except OSError as e:
            raise IcechunkError(f"{self.shown(rel)}: cannot be read ({e.strerror or e})") from None
        finally:
            os.close(fd)
        data = b"".join(parts)
        if got > max_bytes:
            if not limit_message:
                return data[:max_bytes]
            raise IcechunkError(f"{self.shown(rel)}: larger than {max_bytes:,} bytes (limit max_source)")
        return data

    def shown(self, rel: str) -> str:
        """``rel``'s URL as messages show it: credentials in the repository's URL masked."""
        return redact_url(self.url_of(rel))

    def read(self, rel: str, max_bytes: int) -> bytes:
        """The whole object ``rel``; IcechunkError if missing or larger than ``max_bytes``."""
        what = self.shown(rel)
        if self.roots is not None:
            return self._read_confined(rel, max_bytes, True)
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
        if self.roots is not None:
            return self._read_confined(rel, n, False)

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
        """Whether the object ``rel`` exists (confined: ObjectRefused when it is reached
        through a symlink or is not a regular file)."""
        if self.roots is not None:
            fd = self._open_confined(rel)
            if fd is not None:
                os.close(fd)
            return fd is not None
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
        if self.roots is not None:
            try:
                names = listdir_checked(self.full(rel), self.roots)
            except (FileNotFoundError, NotADirectoryError):
                return []
            except OSError as e:
                raise self._refused(rel, e) from None
            if len(names) > max_entries:
                raise IcechunkError(f"{what}: more than {max_entries:,} entries (limit max_keys)")
            return names
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


ROOTED_ANCHORS = ("/repo", "/refs/branch.main/ref.json")
ROOTED = ("an Icechunk repository at the bucket root whose keys start with '/' (/repo, "
          "/snapshots/..., /chunks/...: the layout icechunk before 2.1 wrote at an empty prefix on "
          "an object store, earth-mover/icechunk#2239) is not read: copy its objects to keys without "
          "the leading '/', under a prefix, and give that as SOURCE")


def rooted_layout(storage: Storage) -> bool:
    """Whether ``storage`` is an object store's bucket root holding icechunk's legacy
    leading-slash keys (``/repo``, ``/refs/...``) rather than the standard ones."""
    scheme = storage.url.split("://", 1)[0].lower() if "://" in storage.url else ""
    if is_local(storage.url) or scheme in ("http", "https") or not storage.path:
        return False
    if "/" in storage.path.split("?", 1)[0].strip("/"):
        return False  # a repository under a prefix: icechunk never rooted its keys there
    return any(storage.exists(anchor) for anchor in ROOTED_ANCHORS)


def is_repository(url: str, storage_options: Mapping[str, Any], timeout: float | None = 30.0,
                  roots: tuple[str, ...] | list[str] | None = None) -> bool:
    """Whether ``url`` looks like an Icechunk repository: a ``repo`` object starting with
    Icechunk's magic bytes, or ``refs/branch.main/ref.json`` (a few small reads, each within
    ``timeout`` seconds for remote storage). Confined (``roots``): ObjectRefused when one of
    those is reached through a symlink leaving them."""
    from refmount.refs.icechunk import header

    try:
        storage = Storage(url, storage_options, timeout, roots)
        if storage.exists("repo"):
            return storage.head("repo", len(header.MAGIC)) == header.MAGIC
        # a rooted repository is one: opening it names why it is not read
        return storage.exists("refs/branch.main/ref.json") or rooted_layout(storage)
    except ObjectRefused:
        raise
    except (IcechunkError, OSError, ValueError):
        return False
