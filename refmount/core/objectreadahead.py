"""Readahead across objects: chunks stored each as an object of its own (an Icechunk
repository's native chunks), read whole, in the order of their keys.

``TargetReadahead`` follows a reader through the bytes of one target; here every chunk is a
target of its own, so the kernel's readahead and the stretch logic never see the pattern.
What orders the objects is the array: its written chunks in key order (the tree's listing),
so a position is a chunk's index in that order and "the next key" is the next object.

``ObjectReadahead`` is the policy, per stream (``Streams``, as the other policies: several
readers of one array at different places keep one stream each): a chunk read for the first
time continues a stream when it lies at most ``SLACK`` objects past where the stream's
readers got to (zarr asks for several chunks at once, so they come in any order within a
few) and at most ``BEHIND`` objects before it. After ``MIN_STREAK`` such chunks, while they
are at least half the positions the stream went through (``DENSE``), the stream reads
ahead: a window of bytes that starts at ``FIRST_OBJECTS`` objects (of the size of the one
just read: a few chunks in order by chance cost little) and doubles while its readers keep
coming, up to ``max_window``, at most ``MAX_OBJECTS`` objects, never past the end of the
array, topped up a quarter of the window at a time at least. ``note`` says which positions
to load now (those not asked for before); the caller loads them. A chunk that continues no
stream starts one (a random reader's chunks start streams that never read ahead). The bytes
being loaded ahead are bounded globally: ``max_inflight`` (the caller says when loads end:
``done``); a window cut by that bound is topped up at a later chunk.

``NativeReadahead`` applies it to a tree's chunk objects (``ChunkOrder``: the Icechunk tree
tells it of each native chunk opened): it resolves the references of the chunks to load in
one batch (one worker thread, not one per chunk; later lookups of them find them in memory),
loads their objects into the block store in the background, and tells the reader of each
(``RefReader.objects_ahead``: stored in the page cache at its open, so no READ comes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np

from refmount.base.lru import LRU
from refmount.core.blockstore import BlockKey, BlockStore
from refmount.core.readahead import continues
from refmount.core.streams import Streams
from refmount.refs import Ref, RefKind

log = logging.getLogger(__name__)


class _ObjectRun:
    __slots__ = ("ahead", "end", "start", "streak", "window")

    def __init__(self, pos: int) -> None:
        self.start = pos  # the first position its readers read
        self.end = pos  # the furthest position its readers read
        self.ahead = pos  # positions up to here are read or asked for
        self.streak = 1
        self.window = 0  # bytes


class ObjectReadahead:
    SLACK = 16  # objects: a chunk at most this far past where the stream got to continues it
    BEHIND = 16  # ... or at most this far before it (readers asking for several at once)
    MIN_STREAK = 3  # chunks in order before reading ahead
    DENSE = 2  # ... that read at least 1/DENSE of the positions their stream went through
    FIRST_OBJECTS = 8  # the first window: this many objects of the size of the one just read
    MAX_OBJECTS = 256  # objects of one window
    PER_SEQUENCE = 16  # streams of one array
    MAX_STREAMS = 4096

    def __init__(self, max_window: int, max_inflight: int | None = None) -> None:
        self.max_window = max(max_window, 1)
        self.max_inflight = self.max_window if max_inflight is None else max_inflight
        self.inflight = 0  # bytes asked for ahead and not yet loaded (``done``)
        self._runs: Streams[_ObjectRun] = Streams(self.PER_SEQUENCE, self.MAX_STREAMS)

    def note(self, seq: str, pos: int, ends: np.ndarray) -> range:
        """The chunk at position ``pos`` of the sequence ``seq`` (an array's written chunks in
        key order; ``ends``: where each ends, its bytes and those of all before it: the
        cumulative sum of their sizes) was read for the first time: the positions to load
        ahead now (empty when the read continues no stream, or not yet enough of them)."""
        run = self._runs.find(seq, pos, lambda r: continues(pos, r.end, front=r.end, behind=self.BEHIND,
                                                             slack=self.SLACK))
        if run is None:
            self._runs.add(seq, _ObjectRun(pos))
            return range(0)
        run.streak += 1
        run.end = max(run.end, pos)
        run.start = min(run.start, pos)
        if run.streak < self.MIN_STREAK or self.DENSE * run.streak < run.end - run.start + 1:
            return range(0)  # not yet, or chunks here and there (a random reader of a small array)
        first_window = self.FIRST_OBJECTS * (int(ends[pos]) - (int(ends[pos - 1]) if pos else 0))
        run.window = min(max(2 * run.window, first_window, 1), self.max_window)
        first = max(run.ahead, run.end) + 1
        n = len(ends)
        if first >= n:
            return range(0)
        base = int(ends[first - 1])  # the bytes up to ``first``
        budget = min(run.window - (base - int(ends[run.end])), self.max_inflight - self.inflight)
        if budget < min(run.window, self.max_inflight) // 4 and run.ahead > run.end:
            return range(0)  # topped up in batches of a quarter window at least
        last = min(int(np.searchsorted(ends, base + budget, side="right")), n,
                   run.end + 1 + self.MAX_OBJECTS)
        if last <= first:
            return range(0)
        run.ahead = last - 1
        self.inflight += int(ends[last - 1]) - base
        return range(first, last)

    def done(self, nbytes: int) -> None:
        """Bytes asked for ahead (positions ``note`` gave, of ``nbytes``) were loaded, or their
        loads ended otherwise."""
        self.inflight = max(0, self.inflight - nbytes)

    def streams(self, seq: str) -> list[tuple[int, int, int]]:
        """Each stream of ``seq``: (where its readers got to, asked up to, window)."""
        return [(r.end, r.ahead, r.window) for r in self._runs.of(seq)]

    def __len__(self) -> int:
        return len(self._runs)


class ChunkOrder(Protocol):
    """What ``NativeReadahead`` needs of a tree whose chunks are objects of their own."""

    def listing_now(self, aid: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The array's written chunks (numbers in key order, sizes) if known now (no I/O)."""
        ...

    async def listing(self, aid: int) -> tuple[np.ndarray, np.ndarray]: ...

    async def object_refs(self, aid: int, numbers: list[int]) -> list[Ref | None]:
        """The references of those chunks (in one batch), None for a chunk that is no
        object of its own (inline, virtual) or cannot be read."""
        ...


class NativeReadahead:
    """``ObjectReadahead`` applied to a tree's chunk objects (``ChunkOrder``): told of each
    chunk a reader opens (``opened``), it resolves the references of the chunks to load ahead
    in one batch and loads their objects into the block store in the background, as the
    reader's own loads would (memory cache, single flight: a reader getting there first
    joins the load); ``loaded`` is told of each (the reader then stores it in the page cache
    at its open: no READ)."""

    def __init__(self, tree: ChunkOrder, store: BlockStore, max_window: int,
                 loaded: Callable[[BlockKey], None] | None = None) -> None:
        self.tree = tree
        self.store = store
        self.loaded = loaded  # told of each object loaded ahead
        self.policy = ObjectReadahead(max_window)
        self._listing: set[int] = set()  # arrays whose listing is being made
        self._ends: LRU[int, tuple[np.ndarray, np.ndarray]] = LRU(64)  # per array: (sizes, their cumsum)
        self._next: dict[int, int] = {}  # per array: the position after the chunk last opened

    def opened(self, aid: int, number: int) -> None:
        """A reader opened the chunk ``number`` of array ``aid`` (its first read follows)."""
        background = self.store.background
        if background is None:
            return
        known = self.tree.listing_now(aid)
        if known is None:
            if aid not in self._listing:  # the listing, once; chunks opened meanwhile start nothing
                self._listing.add(aid)
                background.start_soon(self._list, aid)
            return
        numbers, sizes = known
        ends = self._ends.get(aid)
        if ends is None or ends[0] is not sizes:  # once per listing: where each chunk ends
            ends = (sizes, np.cumsum(sizes))
            self._ends.put(aid, ends)
        pos = self._next.get(aid, 0)  # in key order the chunk after the last one: no search
        if not (pos < len(numbers) and numbers[pos] == number):
            pos = int(numbers.searchsorted(number))
            if pos >= len(numbers) or numbers[pos] != number:
                return
        self._next[aid] = pos + 1
        ahead = self.policy.note(str(aid), pos, ends[1])
        if ahead:
            wanted = numbers[ahead.start:ahead.stop].tolist()
            nbytes = int(ends[1][ahead.stop - 1] - (ends[1][ahead.start - 1] if ahead.start else 0))
            background.start_soon(self._load, aid, wanted, nbytes)

    async def _list(self, aid: int) -> None:
        try:
            await self.tree.listing(aid)
        except Exception as e:  # the reader sees the error where it reads
            log.debug("listing array %d for readahead failed: %s", aid, e)
        finally:
            self._listing.discard(aid)

    async def _load(self, aid: int, numbers: list[int], nbytes: int) -> None:
        try:
            refs = await self.tree.object_refs(aid, numbers)
        except Exception as e:
            self.policy.done(nbytes)
            log.debug("readahead of %d chunks of array %d failed: %s", len(numbers), aid, e)
            return
        store = self.store
        left = nbytes
        for ref in refs:
            if ref is None or ref.url is None or ref.kind is not RefKind.RANGE:
                continue
            key = BlockKey(ref.url, ref.offset, ref.length)
            if store.busy(key):
                continue
            left -= ref.length
            self._start(key)
        self.policy.done(max(left, 0))  # what is not loaded now: inline, virtual, loaded already

    def _start(self, key: BlockKey) -> None:
        background = self.store.background
        if background is not None:
            background.start_soon(self._one, key)

    async def _one(self, key: BlockKey) -> None:
        try:
            await self.store.load(key, self.store.fetch_of(key))
            if self.loaded is not None:
                self.loaded(key)
        except Exception as e:  # the reader will see (and log) the error if it gets there
            log.debug("readahead of %s failed: %s", key, e)
        finally:
            self.policy.done(key.length)
