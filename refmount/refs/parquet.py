"""Parquet reference sets (fsspec's LazyReferenceMapper layout): this format's entry in the
registry.

Mounting validates ``.zmetadata`` only (``load_parquet_set``, parquetset.py); the tree served
is a ``ChunkTree`` (chunktree.py) over the set, which reads record files when a lookup,
listing or read needs them. Their targets are checked at read time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping

from refmount.refs.format import Access, Format, IndexFile, OpenedTree, Options
from refmount.refs.index import KeyIndex
from refmount.refs.limits import DEFAULT_LIMITS, Limits
from refmount.refs.model import Ref
from refmount.refs.parquetset import RecordCache, load_parquet_set, parquet_root, references

log = logging.getLogger(__name__)


# ---- the Format ------------------------------------------------------------------------------


class ParquetFormat(Format):
    """fsspec's LazyReferenceMapper layout: ``.zmetadata`` is validated at mount, record files
    are read when a lookup, listing or read needs them (``ChunkTree`` in chunktree.py)."""

    name = "parquet"

    def detect(self, source: str, target_options: Options,
               roots: tuple[str, ...] | None = None) -> bool:
        return parquet_root(source, dict(target_options)) is not None

    def prepare(self, source: str, target_options: Options, *, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS, cache_dir: str | None = None,
                revision: Mapping[str, str] | None = None) -> IndexFile:
        self.check_revision(source, revision)
        pset = load_parquet_set(source, dict(target_options), bad_keys, limits)  # validate .zmetadata now
        if pset.skipped:
            log.warning("skipped %d metadata keys that cannot be paths (bad_keys=skip), e.g. %r",
                        len(pset.skipped), pset.skipped[0])
        return IndexFile("", temporary=False, reused=False, kind=self.name)

    def targets(self, index: IndexFile) -> Iterator[tuple[str, Callable[[], str]]]:
        return iter(())  # record files are read lazily: their targets are checked at read time

    def metadata(self, index: IndexFile, source: str, target_options: Options, *,
                 bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS) -> KeyIndex:
        return load_parquet_set(source, dict(target_options), bad_keys, limits).metadata

    def open_tree(self, index: IndexFile, source: str, target_options: Options, *,
                  bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS,
                  relative: Callable[[str], bool] | None = None,
                  access: Access | None = None) -> OpenedTree:
        options = dict(target_options)
        pset = load_parquet_set(source, options, bad_keys, limits)
        from refmount.refs.chunktree import ChunkTree  # trio: only where the set is served

        tree = ChunkTree(pset, RecordCache(pset, options, max_inline=limits.max_inline,
                                           max_record=limits.max_record, relative=relative,
                                           roots=limits.source_roots))
        info = {"record_size": str(pset.record_size), "arrays": str(len(pset.arrays))}
        return OpenedTree(tree, pset.metadata, time.time_ns(), info)

    def references(self, source: str, target_options: Options,
                   quirks: dict[str, int] | None = None,
                   revision: Mapping[str, str] | None = None,
                   access: Access | None = None) -> Iterator[tuple[str, Ref]]:
        self.check_revision(source, revision)
        options = dict(target_options)
        pset = load_parquet_set(source, options, "error")
        if quirks is not None:
            quirks.update((what, n) for what, n in pset.quirks.items() if n)
        return references(pset, options)
