"""The serving side of a mount or server of several sets (``-o catalog``) or of one set with
``reload``: the catalogue read, ``sets.Sets`` over it with the indexer as opener, the reload
checks (``sets/reload.py``) and the lifecycle the serving processes drive (``bind_loop``,
``start``, ``warm``, ``aclose``, ``close``, as ``daemon.Mount`` has)."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from refmount.base.errors import MountError
from refmount.base.redact import redact_url
from refmount.base.stats import Stats
from refmount.config import MountConfig
from refmount.refs import IndexFile
from refmount.serving.indexer import IndexerProcesses
from refmount.sets.opensets import Sets
from refmount.sets.reload import Reloader, watch_signals
from refmount.sets.setopener import index_and_build
from refmount.sets.setslots import Opened

log = logging.getLogger("refmount")

__all__ = ["CATALOG_INDEX", "SetMount", "build_sets", "check_catalog", "serves_sets"]

# What the CLI hands a serving process of a catalogue in place of an index: each set is
# indexed by the serving process when it is first used.
CATALOG_INDEX = IndexFile(path="", temporary=False, reused=False, kind="catalog")


@dataclass(frozen=True)
class _OneSet:
    """A single set served with ``reload``: one slot named ``""``."""

    name: str
    source: str
    options: dict[str, str] = field(default_factory=dict)


def serves_sets(cfg: MountConfig) -> bool:
    """Whether ``cfg`` is served through ``Sets``: a catalogue, or ``reload``."""
    return bool(getattr(cfg, "catalog", False) or getattr(cfg, "reload", 0))


def _read_catalog(cfg: MountConfig) -> dict[str, Any]:
    from refmount.sets.catalog import read_catalog

    return read_catalog(cfg.source, cfg.target_options, max_sets=cfg.max_sets,
                        max_bytes=cfg.max_source or 2**62, timeout=cfg.timeout)


def check_catalog(cfg: MountConfig) -> IndexFile:
    """The CLI's check of a catalogue before it hands over: MountError naming the problem."""
    from refmount.base.errors import CatalogError

    try:
        entries = _read_catalog(cfg)
    except CatalogError as e:
        raise MountError(str(e)) from None
    log.debug("catalogue %s: %d sets", redact_url(cfg.source), len(entries))
    return CATALOG_INDEX


def _identify(cfg: MountConfig) -> Callable[[Any], str]:
    from refmount.refs import REVISION_OPTIONS, named_format, revision_of
    from refmount.sets.setidentity import source_identity
    from refmount.sets.setopener import set_config

    def identify(entry: Any) -> str:
        own = getattr(entry, "options", None) or {}
        revision = revision_of(cfg)  # a set's own revision options replace the mount's
        if any(own.get(k) for k in REVISION_OPTIONS):
            revision = {k: own[k] for k in REVISION_OPTIONS if own.get(k)}
        roots = (set_config(cfg, entry) if getattr(cfg, "catalog", False) else cfg).object_roots()
        return source_identity(entry.source, cfg.target_options, timeout=cfg.timeout,
                               format=named_format(cfg) if own.get("format") in (None, "", "auto")
                               else own["format"], revision=revision, roots=roots)

    return identify


class SetMount:
    """The sets of one mount or server and their reload checks (see the module's docstring).
    ``front`` is the front end over ``sets`` (``catalogfs.CatalogFS`` for a mount)."""

    user_signals = True  # SIGUSR1 checks for changes (SIGUSR2 is ignored)

    def __init__(self, cfg: MountConfig, sets: Sets, reloader: Reloader, info: dict[str, str],
                 indexer: IndexerProcesses) -> None:
        self.cfg = cfg
        self.indexer = indexer
        self.sets = sets
        self.reloader = reloader
        self.info = info
        self.stats = Stats()
        self.front: Any = None  # the front end over the sets
        self.fs: Any = None  # the same, for a mount (pyfuse3.init)
        self._loop: asyncio.AbstractEventLoop | None = None

    def describe(self) -> dict[str, Any]:
        return {**self.sets.describe(), **self.reloader.describe()}

    @property
    def summary(self) -> str:
        return f"{len(self.sets.slots)} sets" if getattr(self.cfg, "catalog", False) else "1 set"

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def start(self, nursery: trio.Nursery, trim: Callable[[int], int] | None = None) -> None:
        self.sets.attach(nursery, self._loop)
        if self.front is not None and hasattr(self.front, "attach"):
            self.front.attach(nursery)
        nursery.start_soon(self.reloader.run)
        nursery.start_soon(watch_signals, self.reloader)

    async def warm(self) -> None:
        """Once serving: load the read path's modules (fsspec's HTTP, numpy, pyarrow: a few
        tenths of a second) in a worker thread, so that the mount answered without waiting
        for them and the first set opened does not wait for them either."""
        await trio.to_thread.run_sync(importlib.import_module, "refmount.core.setcore")

    async def aclose(self) -> None:
        pass  # each version's sessions are closed as it closes (Sets)

    def close(self, timeout: float = 5.0) -> None:
        self.indexer.close()  # each version's core was closed as it closed (Sets)


def build_sets(cfg: MountConfig, index_file: IndexFile) -> SetMount:
    """The sets of ``cfg``, nothing opened yet; for a single set, ``index_file`` (indexed
    by the CLI or the indexer) becomes its first version when it is first used."""
    identify = _identify(cfg)
    reload_every = float(getattr(cfg, "reload", 0) or 0) or None
    initial: dict[str, Opened] = {}
    if getattr(cfg, "catalog", False):
        from refmount.base.errors import CatalogError

        try:
            entries = _read_catalog(cfg)
        except CatalogError as e:
            raise MountError(str(e)) from None
        read_again: Callable[[], dict[str, Any]] | None = lambda: _read_catalog(cfg)  # noqa: E731
        info = {"source": redact_url(cfg.source), "format": "catalog", "sets": str(len(entries))}
    else:
        from refmount.core.setcore import build_core

        entry = _OneSet("", cfg.source)
        entries = {"": entry}
        read_again = None
        identity = ""
        try:
            identity = identify(entry)
        except Exception as e:
            log.warning("cannot identify %s: %s", redact_url(cfg.source), e)
        core = build_core(cfg, index_file)
        if index_file.temporary:
            import contextlib
            import os

            with contextlib.suppress(OSError):
                os.unlink(index_file.path)
        initial[""] = Opened(core, identity, f"{index_file.kind}:{index_file.path}")
        info = dict(core.info)

    def open_set(name: str, entry: Any) -> Opened:
        ready = initial.pop(name, None)
        if ready is not None:
            return ready
        return index_and_build(cfg, entry, identify, indexer)

    indexer = IndexerProcesses()
    sets = Sets(entries, open_set=open_set, identify=identify, max_open=cfg.max_open_sets,
                max_bytes=cfg.max_open_memory if getattr(cfg, "catalog", False) else 0)
    return SetMount(cfg, sets, Reloader(sets, interval=reload_every, read_catalog=read_again), info,
                    indexer)
