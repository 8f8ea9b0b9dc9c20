"""Reference sets: every format of the spec behind one :class:`Format` interface.

``prepare_index`` runs in the foreground (errors reach the user before any mount): it finds
SOURCE's format and has it parse or validate SOURCE, returning an :class:`IndexFile` that
names the format; the daemon finds the format again by that name (``format_named``) and
opens the tree (for JSON sets it only memory-maps the index). Adding a format is one module
here implementing :class:`Format` plus its line in ``FORMATS``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from refmount.base.urls import is_local
from refmount.refs.deadline import within
from refmount.refs.model import FILE_SUFFIXES, IndexFile, Ref, ReferenceSetError, RefKind

if TYPE_CHECKING:
    from refmount.refs.format import Format, OpenedTree
    from refmount.refs.index import KeyIndex
    from refmount.refs.jsonrefs import build_index
    from refmount.refs.limits import Limits

__all__ = [
    "FILE_SUFFIXES",
    "FORMATS",
    "REVISION_OPTIONS",
    "Format",
    "IndexFile",
    "KeyIndex",
    "OpenedTree",
    "Ref",
    "RefKind",
    "ReferenceSetError",
    "build_index",
    "detect_format",
    "format_named",
    "named_format",
    "prepare_index",
    "revision_identity",
    "revision_of",
]

# Names whose modules need numpy or pyarrow are loaded on first use (PEP 562), so that what
# only handles a reference or an error (the CLI's checks, a catalogue mount before its first
# set opens) does not pay for those imports.
_LAZY = {
    "Format": ".format",
    "OpenedTree": ".format",
    "KeyIndex": ".index",
    "build_index": ".jsonrefs",
    "DEFAULT_LIMITS": ".limits",
    "Limits": ".limits",
}


def __getattr__(name: str) -> Any:
    if name == "FORMATS":
        return _formats()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _formats() -> tuple[Format, ...]:
    """The registry, in the order SOURCE is tried: the first format whose ``detect`` says yes
    reads it. JSON claims whatever is left (its parse says what is wrong), so it comes last."""
    from refmount.refs.icechunk.format import IcechunkFormat
    from refmount.refs.jsonrefs import JsonFormat
    from refmount.refs.parquet import ParquetFormat

    return (IcechunkFormat(), ParquetFormat(), JsonFormat())


def detect_format(source: str, target_options: Mapping[str, Any], named: str | None = None,
                  roots: tuple[str, ...] | None = None) -> Format:
    """SOURCE's format: the one ``named`` (``-o format=``), else the first that detects it
    (``roots``: where a local SOURCE's files are opened, confined; see ``Format.detect``)."""
    if named:
        return format_named(named)
    for fmt in _formats():
        if fmt.detect(source, target_options, roots=roots):
            return fmt
    raise ReferenceSetError(f"{source}: not a reference set of a known format")


def format_named(name: str) -> Format:
    for fmt in _formats():
        if fmt.name == name:
            return fmt
    raise ValueError(f"no reference-set format named {name!r}")


def prepare_index(source: str, target_options: Mapping[str, Any], *, bad_keys: str = "error",
                  limits: Limits | None = None, cache_dir: str | None = None,
                  format: str | None = None, revision: Mapping[str, str] | None = None) -> IndexFile:
    """Parse or validate SOURCE in its format (see Format.prepare): the one ``format`` names,
    else the one that detects it. Asking a remote SOURCE what it is ends within
    ``limits.source_timeout``, as each open and read of it does. ``revision``: which revision
    of SOURCE (``-o branch=``, ``tag=``, ``snapshot=``), for a format that has them."""
    from refmount.refs.limits import DEFAULT_LIMITS

    limits = limits or DEFAULT_LIMITS
    timeout = None if is_local(source) else limits.source_timeout
    fmt = within(timeout, source, detect_format, source, target_options, format, limits.source_roots)
    return fmt.prepare(source, target_options, bad_keys=bad_keys, limits=limits,
                       cache_dir=cache_dir, revision=revision)


def revision_identity(source: str, target_options: Mapping[str, Any], *, timeout: float | None,
                      format: str | None = None, revision: Mapping[str, str] | None = None,
                      roots: tuple[str, ...] | None = None) -> str | None:
    """What names the revision of SOURCE served now, when its format has revisions (an Icechunk
    branch's head), within ``timeout``; None for a format whose files' stamps tell a change.
    ``roots``: a local SOURCE's files are opened beneath them, confined (``Format.detect``)."""
    if format is None and is_local(source):
        import os

        if not os.path.isdir(source if "://" not in source else source.partition("://")[2]):
            return None  # a file: a JSON set, known by its stamps
    if format is None and source.split("?", 1)[0].endswith(FILE_SUFFIXES):
        return None  # a JSON file by its name: no requests asking whether it is a repository
    fmt = within(timeout, source, detect_format, source, target_options, format, roots)
    return within(timeout, source, fmt.identity, source, target_options, revision, roots)


REVISION_OPTIONS = ("branch", "tag", "snapshot")


def named_format(cfg: Any) -> str | None:
    """The format ``-o format=`` states (None: found by SOURCE's layout)."""
    name = getattr(cfg, "format", None)
    return None if name in (None, "auto") else name


def revision_of(cfg: Any) -> dict[str, str]:
    """The revision options a configuration gives (``-o branch=``, ``tag=``, ``snapshot=``)."""
    return {name: value for name in REVISION_OPTIONS if (value := getattr(cfg, name, None))}
