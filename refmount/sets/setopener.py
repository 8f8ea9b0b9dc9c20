"""The concrete opener of a catalogue's set: its configuration (the mount's, with the entry's
SOURCE and per-set options), indexed by the indexer process and mapped into a core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import TYPE_CHECKING, Any

from refmount.sets.opensets import Identify
from refmount.sets.setslots import Opened

if TYPE_CHECKING:
    from refmount.serving.indexer import IndexerProcesses

MIN_SET_MEMORY = 8 * 2**20  # the least memory cache an open set of a catalogue gets


def set_config(cfg: Any, entry: Any) -> Any:
    """The configuration of one set: the mount's, with the entry's SOURCE and its options
    (only those ``setoptions.PER_SET_OPTIONS`` names) over it. ConfigError for another."""
    from refmount.base.errors import ConfigError
    from refmount.base.urls import is_local, local_path
    from refmount.config import OPTIONS_BY_NAME, Flag, apply_options
    from refmount.sets.setoptions import PER_SET_OPTIONS

    source = entry.source
    if is_local(source):
        source = os.path.abspath(local_path(source))
    changes: dict[str, Any] = {"source": source}
    for name in ("catalog", "reload"):  # the set itself is one plain set
        option = OPTIONS_BY_NAME.get(name)
        if option is not None:
            changes[option.attr] = option.default() if callable(option.default) else option.default
    if getattr(cfg, "catalog", False):  # the memory cache, shared out among the open sets
        share = cfg.memory_cache_size // max(1, cfg.max_open_sets)
        changes["memory_cache_size"] = min(cfg.memory_cache_size, max(share, MIN_SET_MEMORY))
    out = dataclasses.replace(cfg, **changes)
    if out.allow_local is None and is_local(cfg.source) and (out.allow_other or out.allow_root
                                                             or out.serving):
        # A shared mount's local targets: beneath the catalogue's directory (its default).
        out.allow_local = cfg.local_roots()
    if getattr(cfg, "catalog", False) and is_local(source) and out.local_roots() != ["/"]:
        # A shared catalogue's set files are confined as its targets are: a set file (or a
        # Parquet set's .zmetadata) is opened beneath those directories, no symlink followed.
        out.source_roots = out.local_roots()
    options = []
    for name, value in dict(entry.options).items():
        option = OPTIONS_BY_NAME.get(name)
        if option is None or name not in PER_SET_OPTIONS:
            raise ConfigError(f"set {entry.name!r}: option {name!r} cannot be set per set "
                              f"(allowed: {', '.join(sorted(PER_SET_OPTIONS))})")
        options.append(name if isinstance(option.kind, Flag) else f"{name}={value}")
    apply_options(out, options)
    return out


def memory_held(index_bytes: int, memory_cache: int, core: Any) -> int:
    """What an open set is charged against ``max_open_memory``: its mapped index (a Parquet
    set has none), its memory cache and, for a Parquet set, the bound of its cache of
    decoded record files (``SetCore.records_bound``)."""
    return index_bytes + memory_cache + core.records_bound


def index_and_build(cfg: Any, entry: Any, identify: Identify, indexer: IndexerProcesses) -> Opened:
    """Open one set (blocking): identify its SOURCE, index it in an indexer process (its
    persisted index reused when SOURCE is unchanged), map the index into a core."""
    from refmount.core.setcore import build_core

    set_cfg = set_config(cfg, entry)
    identity = identify(entry)
    index_file = indexer.index(set_cfg)
    try:
        index_bytes = os.path.getsize(index_file.path) if index_file.path else 0  # (a temporary
        core = build_core(set_cfg, index_file)  # index is gone once mapped)
        size = memory_held(index_bytes, set_cfg.memory_cache_size, core)
    finally:
        if index_file.temporary:  # mapped: the file can go
            with contextlib.suppress(OSError):
                os.unlink(index_file.path)
    key = "" if index_file.temporary else f"{index_file.kind}:{index_file.path}:{identity}"
    return Opened(core, identity, key or f"temporary:{id(core)}", size)
