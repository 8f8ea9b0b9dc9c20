"""JSON reference sets (Version 0 here; Version 1 in v1.py) and their Format.

The file is never held in memory: ijson's yajl C backend yields one top-level entry at a
time (faster than parsing the whole document with orjson, at ~1/40 of the memory), and
each entry goes straight into the columnar IndexBuilder. :class:`JsonFormat` writes the
result as an index file (persisted under ``cache_dir/index`` for an unchanged SOURCE) that
the daemon memory-maps and serves through a ``KeyTree``.
"""

from __future__ import annotations

import logging
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import ijson
import zstandard

from refmount.base.process import private_dir
from refmount.refs.format import Access, Format, IndexFile, OpenedTree, Options
from refmount.refs.index import INDEX_FORMAT, KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.indexfiles import (
    index_family,
    prune_index_family,
    summary_metadata,
    write_index,
    write_temporary_index,
)
from refmount.refs.jsonparse import IntegerOverflow, MalformedJSON, Opener, json_error
from refmount.refs.limits import DEFAULT_LIMITS, JsonReader, Limits
from refmount.refs.model import Ref, ReferenceSetError
from refmount.refs.nonfinite import NonFiniteWatch, filtered
from refmount.refs.source import open_source, source_identity, source_mtime_ns
from refmount.refs.tree import KeyTree

log = logging.getLogger(__name__)

V1_FIELDS = frozenset({"version", "templates", "gen", "refs"})
# top-level fields of a zarr metadata document (.zgroup, .zarray, .zmetadata, zarr.json): a
# SOURCE starting with one is zarr's metadata, not a reference set
ZARR_DOCUMENT_FIELDS = frozenset({"zarr_format", "zarr_consolidated_format", "node_type"})
# the other fields such a document may start with (sorted keys): its next keys decide
ZARR_LEADING_FIELDS = frozenset({"attributes", "chunk_grid", "chunk_key_encoding", "chunks", "codecs",
                                 "compressor", "consolidated_metadata", "data_type", "dimension_names",
                                 "dimension_separator", "dtype", "fill_value", "filters", "metadata",
                                 "order", "shape", "storage_transformers"})


class SurrogateEscapes(ReferenceSetError):
    """yajl decodes a lone ``\\uD800``-``\\uDFFF`` escape in a key to ``?`` (silently renaming
    the key) and fails on one in a value; such files are read again with the pure-Python
    parser, which keeps surrogates exactly (a lone one is then refused as not Unicode)."""


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class SurrogateWatch:
    """A binary stream passed through to yajl, raising SurrogateEscapes at the first UTF-16
    surrogate escape (a pair, as for an emoji, too: rare enough to take the slow path)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._tail = b""  # an escape may straddle two reads

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        if data and (b"\\u" in data or b"\\" in self._tail) and _SURROGATE_ESCAPE.search(self._tail + data):
            raise SurrogateEscapes("UTF-16 surrogate escapes")
        self._tail = data[-5:]
        return data

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> SurrogateWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def detect_version(open_stream: Opener, name: str, backend: Any = ijson,
                   limits: Limits = DEFAULT_LIMITS) -> int:
    """0 or 1. Reads only as far as needed: the first top-level key decides unless it is
    one of Version 1's field names, in which case all top-level keys are scanned."""
    with open_stream() as f:
        events = backend.parse(JsonReader(f, name, limits), use_float=True)
        try:
            first = next(events, None)
            if first is None:
                raise ReferenceSetError(f"{name}: empty file, expected a JSON object")
            if first[1] != "start_map":
                kind = {"start_array": "an array"}.get(first[1], f"a {first[1]}")
                raise ReferenceSetError(f"{name}: top level must be a JSON object, got {kind}")
            seen_v1_field = maybe_zarr = False
            for prefix, event, value in events:
                if prefix == "" and event == "map_key":
                    if value == "version":
                        return 1
                    if value in ZARR_DOCUMENT_FIELDS and not seen_v1_field:
                        raise ReferenceSetError(
                            f"{name}: not a reference set: a zarr metadata document ({value!r} at "
                            "the top level, as in .zgroup or .zarray); give the JSON that kerchunk "
                            "wrote, whose keys are like '.zgroup' and 'temp/0.0'")
                    if value in ZARR_LEADING_FIELDS and not seen_v1_field:
                        maybe_zarr = True  # a zarr document's first keys: a later one decides
                        continue
                    if value not in V1_FIELDS and not seen_v1_field:
                        return 0
                    seen_v1_field = True
                elif prefix == "" and event == "end_map":
                    if maybe_zarr and not seen_v1_field:
                        return 0
                    break
        except ijson.JSONError as e:
            raise json_error(name, e) from None
    return 0


def read_v0(open_stream: Opener, name: str, builder: IndexBuilder, backend: Any = ijson,
            limits: Limits = DEFAULT_LIMITS) -> None:
    with open_stream() as f:
        try:
            builder.add_items(backend.kvitems(JsonReader(f, name, limits), "", use_float=True))
        except ijson.JSONError as e:
            raise json_error(name, e) from None


# ---- parsing SOURCE into an IndexBuilder -----------------------------------------------------


def build_index(source: str, target_options: dict, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS) -> IndexBuilder:
    """Parse SOURCE into an IndexBuilder (not yet sorted or validated)."""
    def opener():
        return open_source(source, target_options, limits.max_ratio, limits.source_timeout,
                           limits.max_source, limits.source_roots)

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
        from refmount.refs.v1 import read_v1  # jinja2 (its templates) only when a Version 1 set is parsed

        read_v1(opener, source, builder, backend, limits)
    return builder



# ---- the Format ------------------------------------------------------------------------------


class JsonFormat(Format):
    """Version 0 and Version 1 JSON (plain or compressed): parsed whole into an index file."""

    name = "json"

    def detect(self, source: str, target_options: Options,
               roots: tuple[str, ...] | None = None) -> bool:
        """Anything another format does not claim: the parse names what is wrong with it
        (no such file, not JSON, ...). The registry asks this format last."""
        return True

    def prepare(self, source: str, target_options: Options, *, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS, cache_dir: str | None = None,
                revision: Mapping[str, str] | None = None) -> IndexFile:
        self.check_revision(source, revision)
        options = dict(target_options)
        # The limits are in the identity: a set accepted under other limits is checked again.
        variant = f"{INDEX_FORMAT}|{bad_keys}|{limits}"
        identity = source_identity(source, options, variant, limits.source_timeout)
        cached = None
        if cache_dir is not None and identity:
            index_dir = os.path.join(cache_dir, "index")
            try:
                # The index holds every target URL, and is the tree the mount serves: its
                # directory is ours alone (or refused), so nobody else can swap an index in.
                private_dir(index_dir)
                family = index_family(source, variant)
                cached = os.path.join(index_dir, f"{family}-{identity}.arrow")
            except OSError as e:
                log.warning("cannot keep the index in %s (%s); using a temporary file",
                            index_dir, e.strerror)
        if cached and os.path.exists(cached):
            try:
                KeyIndex.open(cached)
                return IndexFile(cached, temporary=False, reused=True, kind=self.name)
            except Exception as e:  # corrupt or old: rebuild
                log.warning("persisted index %s unusable (%s); rebuilding", cached, e)

        builder = build_index(source, options, bad_keys, limits)
        table = builder.finish()
        if builder.quirks:
            log.info("accepted producer quirks: %s",
                     ", ".join(f"{n} {what}" for what, n in builder.quirks.items()))
        if builder.skipped:
            log.warning("skipped %d keys that cannot be paths (bad_keys=skip), e.g. %r",
                        len(builder.skipped) + builder.skipped_unnamed, builder.skipped[0])
        meta = summary_metadata(table)
        meta["source"] = source
        # The set's time stamp (HTTP Last-Modified, the entity tags' input): SOURCE's own,
        # so that every server of one SOURCE gives the same tags (replicas behind a cache).
        stamp = source_mtime_ns(source, options, limits.source_timeout)
        if stamp is not None:
            meta["source_mtime_ns"] = str(stamp)
        if cached:
            try:
                write_index(table, cached, meta)
                prune_index_family(cached)  # the indexes of older versions of SOURCE
                return IndexFile(cached, temporary=False, reused=False, kind=self.name)
            except OSError as e:
                log.warning("cannot persist the index in %s (%s); using a temporary file",
                            cache_dir, e.strerror)
        return IndexFile(write_temporary_index(table, meta), temporary=True, reused=False,
                         kind=self.name)

    def targets(self, index: IndexFile) -> Iterator[tuple[str, Callable[[], str]]]:
        keys = KeyIndex.open(index.path)
        if not keys.n:
            return
        for url in keys.urls():
            yield url, lambda url=url: keys.key(keys.first_with_url(url)).decode(errors="replace")

    def metadata(self, index: IndexFile, source: str, target_options: Options, *,
                 bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS) -> KeyIndex:
        return KeyIndex.open(index.path)

    def open_tree(self, index: IndexFile, source: str, target_options: Options, *,
                  bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS,
                  relative: Callable[[str], bool] | None = None,
                  access: Access | None = None) -> OpenedTree:
        keys = KeyIndex.open(index.path)
        stamp = keys.metadata.get("source_mtime_ns")
        mtime_ns = int(stamp) if stamp and stamp.isdigit() else os.stat(index.path).st_mtime_ns
        if index.temporary:
            os.unlink(index.path)  # the mapping keeps it alive; nothing left behind
        info = {name: keys.metadata.get(name, "?")
                for name in ("targets", "referenced_bytes", "inline_bytes")}
        return OpenedTree(KeyTree(keys), keys, mtime_ns, info)

    def references(self, source: str, target_options: Options,
                   quirks: dict[str, int] | None = None,
                   revision: Mapping[str, str] | None = None,
                   access: Access | None = None) -> Iterator[tuple[str, Ref]]:
        self.check_revision(source, revision)
        builder = build_index(source, dict(target_options))
        keys = KeyIndex(builder.finish())
        if quirks is not None:
            quirks.update((what, n) for what, n in builder.quirks.items() if n)
        return ((k.decode(), r) for k, r in keys.iter_refs())
