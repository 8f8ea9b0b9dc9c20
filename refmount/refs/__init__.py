"""Reference sets: parsing every format of the spec into one columnar, persisted index.

``prepare_index(cfg)`` runs in the foreground (errors reach the user before any mount),
writes the index file and returns its path; the daemon then only memory-maps it.
"""

from __future__ import annotations

import logging
import lzma
import os
import tempfile
import zlib
from dataclasses import dataclass
from typing import Any

import ijson
import zstandard

from ..config import MountConfig
from .index import INDEX_FORMAT, IndexBuilder, KeyIndex, summary_metadata, write_index
from .jsonrefs import (
    IntegerOverflow,
    MalformedJSON,
    Opener,
    SurrogateEscapes,
    SurrogateWatch,
    detect_version,
    read_v0,
)
from .limits import DEFAULT_LIMITS, Limits
from .model import Ref, ReferenceSetError, RefKind
from .nonfinite import NonFiniteWatch, filtered
from .parquet import load_parquet_set, parquet_root
from .source import open_source, source_identity

__all__ = [
    "IndexFile",
    "KeyIndex",
    "Ref",
    "RefKind",
    "ReferenceSetError",
    "build_index",
    "prepare_index",
]

log = logging.getLogger(__name__)


@dataclass
class IndexFile:
    path: str  # "" for Parquet sets, which are read lazily from SOURCE itself
    temporary: bool  # delete once the daemon has mapped it
    reused: bool  # an unchanged set's persisted index was found
    kind: str = "json"  # "json" (Version 0/1) or "parquet"


def build_index(source: str, target_options: dict, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS) -> IndexBuilder:
    """Parse SOURCE into an IndexBuilder (not yet sorted or validated)."""
    def opener():
        return open_source(source, target_options, limits.max_ratio)

    def watched():
        return SurrogateWatch(opener())

    seen = [False]  # NaN/Infinity bytes went by (NonFiniteWatch)

    def watched_twice():
        return NonFiniteWatch(SurrogateWatch(opener()), seen)

    def watched_nonfinite():
        return NonFiniteWatch(opener(), seen)

    nonfinite = python = False  # each switches on at most once: at most three parses
    try:
        while True:
            backend = ijson.get_backend("python") if python else ijson
            try:
                if not nonfinite:
                    fopen = watched_nonfinite if python else watched_twice
                    return _build(fopen, source, bad_keys, backend, limits)
                fopen, fbackend = filtered(opener if python else watched, backend)
                builder = _build(fopen, source, bad_keys, fbackend, limits)
                builder.quirks["numbers were a bare NaN or Infinity"] += fbackend.count
                return builder
            except MalformedJSON:
                if nonfinite or not seen[0]:
                    raise
                log.info("%s: parsing again with bare NaN and Infinity accepted as numbers", source)
                nonfinite = True
            except IntegerOverflow:
                log.warning("%s has integers beyond 64 bits: parsing again with the slower Python "
                            "parser", source)
                python = True
            except SurrogateEscapes:
                log.info("%s has UTF-16 surrogate escapes: parsing again with the slower Python "
                         "parser, which keeps them exactly", source)
                python = True
    except ReferenceSetError:
        raise
    except (OSError, EOFError, ValueError, zstandard.ZstdError, lzma.LZMAError, zlib.error) as e:
        # Corrupt compressed data (BadGzipFile, ZstdError...) or a read that failed midway.
        what = " ".join(str(e).split())[:120] or type(e).__name__
        raise ReferenceSetError(f"{source}: cannot read ({type(e).__name__}: {what})") from None


def _build(opener: Opener, source: str, bad_keys: str, backend: Any, limits: Limits
           ) -> IndexBuilder:
    version = detect_version(opener, source, backend, limits)
    builder = IndexBuilder(bad_keys, limits)
    if version == 0:
        read_v0(opener, source, builder, backend, limits)
    else:
        from .v1 import read_v1

        read_v1(opener, source, builder, backend, limits)
    return builder


def prepare_index(cfg: MountConfig) -> IndexFile:
    if parquet_root(cfg.source, cfg.target_options):
        pset = load_parquet_set(cfg.source, cfg.target_options, cfg.bad_keys,  # validate .zmetadata now
                                Limits.from_config(cfg))
        if pset.skipped:
            log.warning("skipped %d metadata keys that cannot be paths (bad_keys=skip), e.g. %r",
                        len(pset.skipped), pset.skipped[0])
        return IndexFile("", temporary=False, reused=False, kind="parquet")
    limits = Limits.from_config(cfg)  # in the identity: a set accepted under other limits is checked again
    identity = source_identity(cfg.source, cfg.target_options, f"{INDEX_FORMAT}|{cfg.bad_keys}|{limits}")
    cached = None
    if cfg.disk_cache and identity:
        cached = os.path.join(cfg.cache_dir, "index", identity + ".arrow")
        if os.path.exists(cached):
            try:
                KeyIndex.open(cached)
                return IndexFile(cached, temporary=False, reused=True)
            except Exception as e:  # corrupt or old: rebuild
                log.warning("persisted index %s unusable (%s); rebuilding", cached, e)

    builder = build_index(cfg.source, cfg.target_options, cfg.bad_keys, limits)
    table = builder.finish()
    if builder.quirks:
        log.info("accepted producer quirks: %s",
                 ", ".join(f"{n} {what}" for what, n in builder.quirks.items()))
    if builder.skipped:
        log.warning("skipped %d keys that cannot be paths (bad_keys=skip), e.g. %r",
                    len(builder.skipped), builder.skipped[0])
    meta = summary_metadata(table)
    meta["source"] = cfg.source
    if cached:
        try:
            write_index(table, cached, meta)
            return IndexFile(cached, temporary=False, reused=False)
        except OSError as e:
            log.warning("cannot persist the index in %s (%s); using a temporary file",
                        cfg.cache_dir, e.strerror)
    tmpdir = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = os.path.join(tmpdir, f"refmount-index-{os.getpid()}-{id(table):x}.arrow")
    write_index(table, path, meta)
    return IndexFile(path, temporary=True, reused=False)
