"""One set's core: what serves the bytes of a reference set, knowing no front end.

``build_core(cfg, index_file)`` wires the counters, the fetcher with its target policy, the
disk cache and its writer, the memory cache, the reader, the tree (seen through the decoded
view with ``-o decode``) and the decoder, and returns a ``SetCore`` with nothing running yet.
The FUSE front end (``fuse/operations.py``, wired by ``fuse/daemon.py``) and the HTTP front end
(``http/frontend.py``) both take a core and translate their requests into the same calls:
``tree.lookup``/``entries``/``size``/``ref``, then ``reader.read`` or, for a decoded chunk,
``decoder.read``; both map the same exceptions (``errors.ReadError``) to their errors.

Its lifecycle, driven by whichever process serves it:

1. ``bind_loop(loop)``: fsspec's async file systems live on the asyncio loop trio runs as a
   guest of (``guestloop``);
2. ``start(nursery)``: the reader, the decoder and the fetcher run their background work
   (readahead, merged requests) in the server's nursery, the target rules' credential
   processes run (``targets/credentials.py``: the first credentials now, each refreshed before it
   expires), and the idle-time heap trim starts;
3. the front end answers (READY);
4. ``warm()``: the disk cache's writer process starts and the cache directory is listed;
5. ``aclose()`` on the loop once trio is done (HTTP sessions), then ``close()``: the
   decoder's threads stop, the cache writer finishes its queued blocks and exits.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import trio

from refmount.base.redact import redact_url
from refmount.base.stats import Stats
from refmount.base.urlenv import environment_identity
from refmount.base.urls import is_local
from refmount.cache.blocks import Block, DiskCache, MemoryLRU
from refmount.cache.writer import CacheWriter
from refmount.config import MountConfig
from refmount.core.objectreadahead import NativeReadahead
from refmount.core.reader import RefReader
from refmount.decode.codecplan import DecodedArray
from refmount.decode.codecworker import CodecWorkers
from refmount.decode.decodedtree import DecodedTree
from refmount.decode.decoder import ChunkDecoder
from refmount.decode.sharding import ShardIndexes
from refmount.decode.view import DecodedView
from refmount.refs import IndexFile, Ref, format_named
from refmount.refs.chunktree import ChunkTree
from refmount.refs.index import KeyIndex
from refmount.refs.limits import Limits
from refmount.refs.tree import KeyTree, Tree
from refmount.targets.credentials import RuleCredentials
from refmount.targets.fetch import Fetcher
from refmount.targets.pinhandover import serving_pins
from refmount.targets.pins import Pins
from refmount.targets.policy import target_policy
from refmount.targets.rules import Rule, TargetRules, with_own_objects
from refmount.targets.virtualaccess import VirtualAccess

__all__ = ["SetCore", "build_core"]

log = logging.getLogger(__name__)


class SetCore:
    """The parts that serve one reference set (see the module's docstring)."""

    def __init__(self, *, stats: Stats, fetcher: Fetcher, reader: RefReader, tree: Tree,
                 disk: DiskCache | None, writer: CacheWriter | None,
                 decoder: ChunkDecoder | None, view: DecodedView | None, metadata: KeyIndex,
                 mtime_ns: int, info: dict[str, str],
                 credentials: RuleCredentials | None = None) -> None:
        self.stats = stats
        self.fetcher = fetcher
        self.reader = reader
        self.tree = tree
        self.disk = disk
        self.writer = writer
        self.decoder = decoder
        self.view = view  # the decoded view (-o decode), else None
        self.metadata = metadata  # the keys the decoded view and .zmetadata are made from
        self.mtime_ns = mtime_ns
        self.info = info
        self.credentials = credentials  # the target rules' credential processes, if any
        self._nursery: trio.Nursery | None = None

    # ---- what a front end asks -----------------------------------------------------------
    @property
    def key_tree(self) -> KeyTree | None:
        """The tree when it answers every lookup, reference and size from the mapped index,
        without I/O (``find``, ``ref_now``, ``size_now``): a set's own ``KeyTree``, not seen
        through the decoded view; None for a tree that may load (Parquet) or decode."""
        return self.tree if isinstance(self.tree, KeyTree) else None

    @property
    def records_bound(self) -> int:
        """The bytes of decoded Parquet record files the set may keep (its record cache's
        bound; 0 for a set that has none)."""
        tree = self.tree.inner if isinstance(self.tree, DecodedTree) else self.tree
        return tree.records.max_bytes if isinstance(tree, ChunkTree) else 0

    def array(self, node: Any) -> DecodedArray | None:
        """The decoded array whose chunk ``node`` is (None: served as referenced)."""
        if isinstance(self.tree, DecodedTree):
            return self.tree.array(node)
        return None

    def metadata_keys(self, names: tuple[str, ...] = (".zarray", ".zattrs", ".zgroup"),
                      ) -> dict[str, bytes | None]:
        """Every metadata key of the set (``names``) with its bytes as zarr clients read them
        (``DecodedView.zarr_metadata`` under ``-o decode``), None for one that is not inline."""
        return dict(self.metadata_pairs(names))

    def metadata_pairs(self, names: tuple[str, ...] = (".zarray", ".zattrs", ".zgroup"), *,
                       max_keys: int | None = None, max_bytes: int | None = None,
                       ) -> Iterator[tuple[str, bytes | None]]:
        """``metadata_keys`` as pairs in sorted key order, each value read from the index as
        its pair is taken. ``ConsolidationRefused`` (before any pair) when there are more than
        ``max_keys`` such keys or their names hold more than ``max_bytes``."""
        import numpy as np
        import pyarrow.compute as pc

        from refmount.core.consolidated import ConsolidationRefused
        from refmount.refs import RefKind

        if self.view is not None and self.view.refused is not None:
            raise ConsolidationRefused(f"its decoded metadata is past its bounds ({self.view.refused})")
        keys = self.metadata.table["key"]
        hits = None
        for name in names:
            hit = pc.ends_with(keys, pattern=name)
            hits = hit if hits is None else pc.or_(hits, hit)
        if hits is None:
            return
        rows = np.flatnonzero(hits.to_numpy(zero_copy_only=False)).tolist()
        # Zarr v3 nodes under -o decode: the v2 documents shown for them (no stored key)
        shown = [k for k in (self.view.v3.docs if self.view is not None else ())
                 if k.rpartition("/")[2] in names]
        rows += [-1 - n for n in range(len(shown))]
        if max_keys is not None and len(rows) > max_keys:
            raise ConsolidationRefused(f"it has more than {max_keys:,} metadata keys")
        found: list[tuple[str, int]] = []
        total = 0
        for i in rows:
            key = shown[-1 - i] if i < 0 else self.metadata.key(i).decode("utf-8", "surrogateescape")
            if key.rpartition("/")[2] not in names:
                continue
            total += len(key)
            if max_bytes is not None and total > max_bytes:
                raise ConsolidationRefused(f"its metadata keys' names hold more than {max_bytes:,} bytes")
            found.append((key, i))
        found.sort()
        last = None
        for key, i in found:
            if key == last:
                continue  # a stored key that is also shown for a v3 node: the view's
            last = key
            served = self.view.zarr_metadata(key) if self.view is not None else None
            if served is not None:
                yield key, served
                continue
            if i < 0:  # a v3 array's, left out of the netCDF side: as converted
                assert self.view is not None
                yield key, self.view.v3.docs[key]
                continue
            ref = self.metadata.ref(i)
            yield key, ref.data if ref.kind is RefKind.INLINE else None

    # ---- lifecycle -----------------------------------------------------------------------
    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fetcher.bind_loop(loop)

    def start(self, nursery: trio.Nursery, trim: Callable[[int], int] | None = None) -> None:
        """Background work of every part runs in ``nursery`` from now on; with ``trim``
        (``malloc_trim``), freed heap memory is given back after a few idle seconds."""
        self._nursery = nursery
        self.reader.attach(nursery)
        if self.decoder is not None:
            self.decoder.attach(nursery)
        self.fetcher.attach(nursery)
        if self.credentials:
            nursery.start_soon(self.credentials.run)  # first credentials now, then refreshed
        if trim is not None:
            nursery.start_soon(self._trim_when_idle, trim)

    async def warm(self) -> None:
        """Start the disk cache's writer process and learn which blocks are on disk (a
        worker thread); the writer's log lines are relayed in the nursery until it exits.
        Meanwhile another worker thread imports the file systems the targets are read
        through (``_load_backends``)."""
        assert self._nursery is not None, "start() first"
        self._nursery.start_soon(self._load_backends)
        if self.writer is not None and (child_log := self.writer.start()) is not None:
            self._nursery.start_soon(self.writer.relay_logs, child_log)
        if self.disk is not None:
            await trio.to_thread.run_sync(self.disk.scan, abandon_on_cancel=True)

    async def _load_backends(self) -> None:
        """The file systems the set's targets are read through, imported in a worker thread
        (``Fetcher.load_backends``) rather than by the first fetch."""
        try:
            loaded = await trio.to_thread.run_sync(self.fetcher.load_backends, self.metadata.urls(),
                                                   abandon_on_cancel=True)
        except Exception as e:  # the first fetch imports them, and reports what fails
            log.debug("loading the targets' file systems ahead: %s", e)
            return
        if loaded:
            log.debug("loaded the file systems of %s ahead of the first fetch", ", ".join(loaded))

    async def _trim_when_idle(self, trim: Callable[[int], int]) -> None:
        """Give freed heap memory back to the system after a few seconds without reads."""
        last, trimmed = -1, True
        while True:
            await trio.sleep(5.0)
            activity = self.stats.reads + self.stats.requests
            if activity != last:
                last, trimmed = activity, False
            elif not trimmed:
                trim(0)  # a few milliseconds, once per idle period
                trimmed = True

    async def aclose(self) -> None:
        """Close the HTTP sessions of the fetcher's file systems (on the asyncio loop)."""
        await self.fetcher.aclose()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the decoder's threads and the cache writer once it has written its queued
        blocks (up to ``timeout``). Idempotent, and safe whether or not it was started."""
        if self.decoder is not None:
            self.decoder.close()
        if self.writer is not None:
            self.writer.close(timeout=timeout)
        self._nursery = None


def disk_cache_key(fetcher: Fetcher) -> Callable[[str], str]:
    """What names a target's blocks in the disk cache: where it is read (its URL after the
    target rules, resolved like the fetcher does: SOURCE's directory, remote_protocol, the
    confinement) and with which options — the rule's storage options over remote_options
    (an endpoint names another object), its rewrites and its credential command, and the
    environment the backends read endpoints from (AWS_ENDPOINT_URL, ...: base/urlenv.py). A
    target no rule matches keeps the key it had without rules. With ``-o pins``, the pinned
    version too (a mount without pins never hands a pinned one a block of another version)."""
    environment = environment_identity()
    tags: dict[int, str] = {}

    def tag(rule: Rule | None) -> str:
        number = rule.number if rule is not None else 0
        known = tags.get(number)
        if known is None:
            what: list[Any] = [fetcher.static_options(rule), environment]
            if rule is not None:
                what += [list(rule.rewrite), rule.credentials]
            digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode())
            known = tags[number] = digest.hexdigest()[:16]
        return known

    identity = fetcher.policy.cache_identity
    pins = fetcher.pins

    def key(url: str) -> str:
        route = fetcher.route(url)
        if pins is not None and pins.keyed(url):  # a pinned target's blocks: its pinned version's
            return f"{tag(route.rule)}\0{identity(route.urls[0])}\0pin:{pins.token(url)}"
        return f"{tag(route.rule)}\0{identity(route.urls[0])}"

    return key


def build_core(cfg: MountConfig, index_file: IndexFile) -> SetCore:
    """The core of one set from its configuration and prepared index, not yet running."""
    stats = Stats(shared=bool(cfg.allow_other or cfg.allow_root or cfg.serving))  # last_error: fixed texts
    pins = Pins(serving_pins(cfg), cfg.pins, stats) if cfg.pins else None
    if pins is None and cfg.virtual_pins:  # versions recorded with references (Icechunk)
        pins = Pins({}, "the reference", stats, required=False)
    policy = target_policy(cfg)
    user_rules = TargetRules.from_json(cfg.targets)
    fmt = format_named(index_file.kind)
    access = VirtualAccess(user_rules, cfg.allow_local, pins if cfg.virtual_pins else None)
    opened = fmt.open_tree(index_file, cfg.source, cfg.target_options, bad_keys=cfg.bad_keys,
                           limits=Limits.from_config(cfg), relative=policy.relative,
                           access=access)
    own = opened.own_objects
    if own is not None and is_local(own[0]):  # read beneath SOURCE's directory, not by a rule
        policy = target_policy(cfg, own[0])
        own = None
    rules = with_own_objects(user_rules, own)
    credentials = RuleCredentials(rules.rules, shown=stats.credentials)  # their processes
    fetcher = Fetcher(
        cfg.remote_options,
        policy,
        timeout=cfg.timeout,
        retries=cfg.retries,
        max_connections=cfg.max_connections,
        stats=stats,
        merge_gap=cfg.merge_gap,
        merge_limit=cfg.block_size,
        rules=rules,
        credentials=credentials if credentials else None,
        pins=pins,
        virtual=access,
    )
    disk = writer = None
    if cfg.disk_cache:
        disk = DiskCache(cfg.cache_dir, cfg.cache_size, target_key=disk_cache_key(fetcher))
        writer = CacheWriter(disk, stats)
    reader = RefReader(
        fetcher,
        MemoryLRU(cfg.memory_cache_size),
        disk,
        disk_writer=writer,
        whole_fetch_limit=cfg.whole_fetch_limit,
        block_size=cfg.block_size,
        max_readahead=cfg.max_readahead,
        stats=stats,
    )
    tree: Tree = opened.tree
    from refmount.refs.icechunk.tree import IcechunkTree  # imported when needed, like its format

    if isinstance(tree, IcechunkTree):  # its native chunks: an object each, read ahead in key order
        tree.on_open = NativeReadahead(tree, reader.store, cfg.max_readahead,
                                       loaded=lambda key: reader.objects_ahead.put(key, True)).opened
    info = {"source": redact_url(cfg.source), "format": fmt.name, **opened.info}
    info["keys"] = str(len(tree))
    decoder = view = None
    if cfg.decode:
        view = DecodedView.from_index(opened.metadata, cfg.max_chunk_bytes)
        view.warn()
        info.update(view.describe())
        decoded = DecodedTree(tree, view)
        tree = decoded

        async def read_stored(ref: Ref) -> Block:
            return await reader.read(ref, 0, await reader.size(ref))

        decoder = ChunkDecoder(
            view, reader.memory, read_stored, resolve=decoded.resolve,
            # decoded bytes in flight: a quarter of the memory cache, the chunks decoded
            # ahead of a reader included (they land there)
            max_bytes=max(cfg.memory_cache_size // 4, 16 * 2**20), stats=stats,
            # codecs off the allow-list: in worker processes, one per decode thread at most,
            # each allowed its chunk's steps and decoded bytes twice over
            workers=CodecWorkers(memory=2 * cfg.max_chunk_bytes + 256 * 2**20,
                                 label=cfg.mountpoint or f"serve-{cfg.listen}"),
            # sharded Zarr v3 arrays: shard indexes and inner chunks through the reader
            shards=ShardIndexes(reader.read, reader.size),
        )
    return SetCore(stats=stats, fetcher=fetcher, reader=reader, tree=tree, disk=disk,
                   writer=writer, decoder=decoder, view=view, metadata=opened.metadata,
                   mtime_ns=opened.mtime_ns, info=info,
                   credentials=credentials if credentials else None)
