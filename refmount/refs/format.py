"""What every reference-set format provides, so that nothing outside ``refs/`` needs to
know which format a set is in.

A format is found by :meth:`Format.detect` (the registry in ``refs/__init__.py`` asks each in
turn). In the foreground, :meth:`Format.prepare` parses or validates SOURCE and returns an
:class:`IndexFile` (which names the format, so that the daemon can find it again without
asking SOURCE); :meth:`Format.targets` lists the target URLs known by then, for the CLI's
target checks. The daemon calls :meth:`Format.open_tree`. ``refmount expand`` and
``inspect`` read every reference through :meth:`Format.references`.

Arguments are plain values (SOURCE, its storage options, ``bad_keys``, :class:`Limits`,
a cache directory): this package knows nothing of the mount's configuration object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from refmount.refs.index import KeyIndex
from refmount.refs.limits import DEFAULT_LIMITS, Limits
from refmount.refs.model import IndexFile, Ref, ReferenceSetError

if TYPE_CHECKING:
    from refmount.refs.tree import Tree

Options = Mapping[str, Any]  # fsspec storage options for SOURCE (``target_options``)


class Access(Protocol):
    """What a format may ask about targets a set names only on condition of the mount's
    authorisation (an Icechunk repository's virtual chunks; ``targets/virtualaccess.py``)."""

    def problem(self, url: str) -> str | None:
        """Why ``url`` may not be read (None if it may)."""

    def pin(self, url: str, etag: str | None, modified_by: int | None) -> None:
        """The version of ``url`` a reference recorded (an ETag, or a time in seconds since the
        epoch it was not modified after), to be checked when it is read."""

    def declare(self, containers: list[str]) -> None:
        """The virtual chunk containers (URL prefixes) the set declares: a redirect of a
        virtual chunk is followed only under one of them."""

    def left_out(self, container: str, count: int, reason: str) -> None:
        """``count`` targets under ``container`` refused and left out of a set's references
        (``Format.references``), for ``reason``."""


@dataclass
class OpenedTree:
    """What :meth:`Format.open_tree` gives the daemon."""

    tree: Tree  # the directory tree served
    metadata: KeyIndex  # the keys a decoded view reads (``.zarray``, ``.zattrs``, ...)
    mtime_ns: int  # the time stamp of every file and directory
    info: dict[str, str] = field(default_factory=dict)  # summary rows (``user.refmount.*``)
    # the set's own objects read as targets (an Icechunk repository's chunks): their URL prefix
    # and the storage options they are read with (SOURCE's); None for none
    own_objects: tuple[str, dict[str, Any]] | None = None


class Format(ABC):
    """One format of reference set (see the module's docstring for who calls what)."""

    name: ClassVar[str]  # as reported by ``inspect`` and ``user.refmount.format``
    # the revision options (``-o branch=`` ...) the format takes; a format without any
    # refuses a set asked for one (``check_revision``)
    revisions: ClassVar[tuple[str, ...]] = ()

    def check_revision(self, source: str, revision: Mapping[str, str] | None) -> None:
        """ReferenceSetError when ``revision`` names an option this format does not take."""
        for name, value in (revision or {}).items():
            if value and name not in self.revisions:
                raise ReferenceSetError(f"{source}: -o {name}= applies to an Icechunk repository, "
                                        f"not to a {self.name} reference set")

    def describe(self, source: str, target_options: Options,
                 revision: Mapping[str, str] | None = None) -> dict[str, str]:
        """Rows naming what of SOURCE is read (an Icechunk repository's format version, branch
        or tag, snapshot) for ``refmount inspect``; none for a format without revisions."""
        return {}

    def identity(self, source: str, target_options: Options,
                 revision: Mapping[str, str] | None = None,
                 roots: tuple[str, ...] | None = None) -> str | None:
        """What names the revision of SOURCE served now (an Icechunk branch's head snapshot),
        for ``reload`` to tell a change; None: SOURCE's stamps tell (``sets/setidentity.py``).
        ``roots`` as for ``detect``."""
        return None

    @abstractmethod
    def detect(self, source: str, target_options: Options,
               roots: tuple[str, ...] | None = None) -> bool:
        """Whether SOURCE is a set of this format (cheap: at most a few small reads).
        ``roots`` (``Limits.source_roots``): the directories a local SOURCE's files are opened
        beneath, no symlink followed (a set of a shared catalogue)."""

    @abstractmethod
    def prepare(self, source: str, target_options: Options, *, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS, cache_dir: str | None = None,
                revision: Mapping[str, str] | None = None) -> IndexFile:
        """Parse or validate SOURCE before anything is mounted; a malformed set raises
        ReferenceSetError. ``cache_dir``: where an index may persist (None: nowhere).
        ``revision``: which revision of SOURCE (``{"branch": NAME}``, ``tag``, ``snapshot``),
        for a format with revisions; the one resolved is ``IndexFile.revision``."""

    @abstractmethod
    def targets(self, index: IndexFile) -> Iterator[tuple[str, Callable[[], str]]]:
        """The distinct target URLs known once prepared, each with a function that names one
        key using it (called only to explain a refused target: it may scan). A format read
        lazily yields none; its targets are checked when read."""

    @abstractmethod
    def metadata(self, index: IndexFile, source: str, target_options: Options, *,
                 bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS) -> KeyIndex:
        """The metadata keys (all keys, for an indexed format) without opening a tree."""

    @abstractmethod
    def open_tree(self, index: IndexFile, source: str, target_options: Options, *,
                  bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS,
                  relative: Callable[[str], bool] | None = None,
                  access: Access | None = None) -> OpenedTree:
        """The tree to serve (in the daemon). ``relative`` tells which target paths are
        relative local paths (``TargetPolicy.relative``); ``access`` answers for targets a set
        names only on condition of the mount's authorisation (an Icechunk virtual chunk; no
        ``access``: none is read)."""

    @abstractmethod
    def references(self, source: str, target_options: Options,
                   quirks: dict[str, int] | None = None,
                   revision: Mapping[str, str] | None = None,
                   access: Access | None = None) -> Iterator[tuple[str, Ref]]:
        """Every (key, Ref) of SOURCE, read from scratch; ``quirks`` (when given) receives
        the producer quirks accepted (what -> how many) before the first pair; ``revision``
        as for ``prepare``; with ``access``, targets named only on condition of the mount's
        authorisation that it refuses are left out (without: all, as recorded)."""
