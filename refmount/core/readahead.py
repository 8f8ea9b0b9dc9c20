"""Readahead: what to load before a reader asks for it, and when to stop.

One rule says whether reads go on in order (``continues``: a read starting at most a slack
past where the stream's reads got to, and at most some distance behind them); each policy
applies it with its own slack, and ``OrderDetector`` applies it to the first reads of each
target's keys. Three policies decide what to load next, all behind one interface
(``Readahead``: ``note(stream, start, end, loader)``, a read happened there), and ask the
block store for it (the ``Loader`` interface: is a block there or coming, may it be on disk,
how to fetch it, load it in the background):

* ``HandleReadahead`` — per open file of a large range or a whole target, read in blocks:
  a window that doubles while each read starts exactly where the last ended (up to
  ``max_readahead``) and stops at the first seek.
* ``GridReadahead`` — keys served from grid blocks on disk: while they follow on (the same
  block or the next), the next grid blocks are loaded from disk (never fetched), up to the
  end of what the disk has.
* ``TargetReadahead`` — across keys: a reader going through a target front to back (below);
  it fetches stretches itself, and ``AcrossKeys`` puts it behind the interface.

All per-target state is in bounded maps (``LRU``), and prefetched bytes within a capacity.

Readahead across references. Zarr readers read chunks in order, and kerchunk sets usually
lay chunks out in that order inside their target (an HDF5/netCDF file, a GRIB message after
another). Each chunk is a key of its own, so the kernel's readahead — per file — never sees
the pattern, and each chunk would cost a round trip. ``TargetReadahead`` watches the ranges
of each target fetched on demand; once consecutive ones follow each other (each within
``SLACK`` after the furthest one read so far, or a few ranges behind it when readers fetch
several at once), it fetches the stretch of the target that follows, in requests of up to
``REQUEST_LIMIT``, with a window that doubles while the reader keeps up (up to
``max_window``). Later ranges inside a prefetched stretch are served from it instead of
being requested one by one; its bytes arrive as the fetcher streams them
(``Fetcher.stream_range``), and a range waits only for its own bytes, not for the rest of a
stretch in flight.

Stretches after the first start and end on the target's ``grid`` (the block size), and
each whole grid block of a stretch is handed to ``on_block`` (``GridBlocks`` writes it to the
disk cache as one block instead of one file per key, and later serves keys from it).

Only misses count (a reader served by the disk cache starts nothing), a run that jumps
elsewhere starts over, and a failed prefetch stops readahead for that run (a stretch
past the end of the target fails; the reads themselves are not affected). Prefetched
stretches are kept first-in first-out within ``capacity`` bytes.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

import trio

from refmount.base.background import Background, soon_in_trio
from refmount.base.lru import LRU
from refmount.base.stats import Stats
from refmount.cache.blocks import round_up
from refmount.core.blockstore import BlockKey, Fetch, block_of
from refmount.targets.inflight import LinkEstimates
from refmount.targets.rangeanswers import Sink

log = logging.getLogger(__name__)


SLACK = 2**20  # a read starting within this of where the last one ended continues it


def continues(start: int, end: int, *, front: int, behind: int, slack: int = SLACK) -> bool:
    """The one rule for "in order": a read starting at ``start`` continues a stream whose
    furthest read ended at ``end`` when it starts at most ``slack`` past ``front`` (``end``,
    or further where readahead has run ahead) and at most ``behind`` before ``end``."""
    return end - behind <= start <= front + slack


class OrderDetector:
    """Per target: where the last read of a key for the first time ended, and whether the
    next one starts near there (``continues`` within ``SLACK`` either way). Bounded: the
    least recently read targets are forgotten beyond ``max_targets``."""

    __slots__ = ("_ends", "slack")

    def __init__(self, max_targets: int = 10_000, slack: int = SLACK) -> None:
        self._ends: LRU[str, int] = LRU(max_targets)
        self.slack = slack

    def follows(self, url: str, start: int, end: int) -> bool:
        """Whether [start, end) follows the last read of ``url``; notes where it ends."""
        last = self._ends.get(url)
        self._ends.put(url, end)
        return last is not None and continues(start, last, front=last, behind=self.slack, slack=self.slack)

    def __len__(self) -> int:
        return len(self._ends)


class Loader(Protocol):
    """What a readahead policy may ask of the block store (``BlockStore.loader``)."""

    @property
    def background(self) -> Background | None:
        """Where loads ahead run (started from trio or from the host loop)."""
        ...

    def busy(self, key: BlockKey) -> bool:
        """In memory, or being loaded."""
        ...

    def may_be_on_disk(self, key: BlockKey) -> bool: ...

    def fetch_of(self, key: BlockKey) -> Fetch:
        """How to fetch the block from its target."""
        ...

    def prefetch(self, key: BlockKey, fetch: Fetch | None = None, *, upto: bool = False) -> None:
        """Load in the background (without ``fetch``: from disk only)."""
        ...


S = TypeVar("S", contravariant=True)


class Readahead(Protocol[S]):
    """A readahead policy: told of each read, it loads what should follow.

    ``note(stream, start, end, loader)``: bytes [start, end) of ``stream`` were read. What a
    stream is depends on the policy: an open file (``OpenFile``), a target's keys served from
    grid blocks (the target's URL), a target's keys read one by one (``TargetRead``). While
    reads continue each other (``continues``, with the policy's own slack) the policy asks
    ``loader`` for what follows, never more than its bound ahead of the reader; after a seek
    it loads nothing until reads continue again. With ``loader`` None it only follows the
    reads (there is no background to load in). It never waits: loads run in the loader's
    background."""

    def note(self, stream: S, start: int, end: int, loader: Loader | None) -> None: ...


class ReadState:
    """Per open file: where the last read ended and how far ahead to prefetch."""

    __slots__ = ("last_end", "window")

    def __init__(self) -> None:
        self.last_end = -1
        self.window = 0


class OpenFile(NamedTuple):
    """An open file read in blocks: its ``ReadState``, and the bytes of the target it is
    (``total`` bytes of ``url`` from ``base``)."""

    state: ReadState
    url: str
    base: int
    total: int


class HandleReadahead:
    """Per open file read in blocks: the window grows (doubling from two blocks, up to
    ``max_readahead``) while reads follow each other exactly (``continues`` with no slack
    either way), and is dropped at a seek (a read elsewhere than where the last ended, other
    than a read from the start). ``Readahead[OpenFile]``."""

    __slots__ = ("block_size", "max_readahead")

    SLACK = 0  # a read continues only where the last one ended
    BEHIND = 0

    def __init__(self, block_size: int, max_readahead: int) -> None:
        self.block_size = block_size
        self.max_readahead = max_readahead

    def note(self, stream: OpenFile, start: int, end: int, loader: Loader | None) -> None:
        """A read of [start, end) of an open file: its next blocks start loading."""
        state, url, base, total = stream
        ahead = self.advance(state, start, end, total)
        if ahead and loader is not None:
            for b in ahead:
                key = block_of(url, base, total, self.block_size, b)
                if not loader.busy(key):
                    loader.prefetch(key, loader.fetch_of(key))

    def advance(self, state: ReadState, off: int, end: int, total: int) -> range:
        """A read of [off, end) of a file of ``total`` bytes: the blocks to load ahead."""
        bs = self.block_size
        last_end = state.last_end
        if continues(off, last_end, front=last_end, behind=self.BEHIND, slack=self.SLACK):
            state.window = min(max(state.window * 2, 2 * bs), self.max_readahead)
        elif off != 0:
            state.window = 0  # a seek: stop prefetching until the reader streams again
        state.last_end = end
        if not state.window:
            return range(0)
        last = min((end + state.window - 1) // bs, (total - 1) // bs)
        return range((end - 1) // bs + 1, last + 1)


class GridReadahead:
    """Keys served from grid blocks: while they go on in order (``continues`` in blocks: the
    same block or the next), the following blocks on disk are loaded ahead (up to
    ``max_readahead``), until the first that the disk certainly lacks. A jump stops it until
    keys follow on again. ``Readahead[str]``: the stream is the target's URL."""

    SLACK = 1  # blocks: a key in the next block continues
    BEHIND = 0

    def __init__(self, block_size: int, max_readahead: int, max_targets: int = 10_000) -> None:
        self.block_size = block_size
        self.max_readahead = max_readahead
        self._runs: LRU[str, list[int]] = LRU(max_targets)  # [last block served, loaded up to]

    def _continues(self, k: int, last: int) -> bool:
        return continues(k, last, front=last, behind=self.BEHIND, slack=self.SLACK)

    def in_order(self, url: str, start: int) -> bool:
        """Whether a key of ``url`` from ``start`` continues the keys served (its block is
        the last one served or the next)."""
        run = self._runs.peek(url)
        return run is not None and self._continues(start // self.block_size, run[0])

    def note(self, stream: str, start: int, end: int, loader: Loader | None) -> None:
        """A key [start, end) of the target ``stream`` was served from grid blocks: load the
        next blocks from disk (``loader``: only blocks it may have on disk)."""
        url, k = stream, (end - 1) // self.block_size
        run = self._runs.get(url)
        if run is None:
            self._runs.put(url, [k, k])
            return
        last, ahead = run
        run[0] = k
        if not self._continues(k, last) or loader is None:
            run[1] = k  # a jump: no readahead until keys follow on again
            return
        bs = self.block_size
        stop = k + max(1, self.max_readahead // bs)
        for j in range(max(ahead, k) + 1, stop + 1):
            gkey = BlockKey(url, j * bs, bs)
            if loader.busy(gkey):
                continue
            if not loader.may_be_on_disk(gkey):
                stop = j  # the cached part ends here
                break
            loader.prefetch(gkey, None, upto=True)
        run[1] = max(ahead, stop)

    def __len__(self) -> int:
        return len(self._runs)


class TargetRead(NamedTuple):
    """A key of ``url`` read: fetched on demand (``miss``; only these start a run), or served
    from a prefetched stretch."""

    url: str
    miss: bool


class AcrossKeys:
    """``TargetReadahead`` as a ``Readahead[TargetRead]``: it fetches stretches itself (the
    loader gives it the background to run them in)."""

    __slots__ = ("target",)

    def __init__(self, target: TargetReadahead) -> None:
        self.target = target

    def note(self, stream: TargetRead, start: int, end: int, loader: Loader | None) -> None:
        background = loader.background if loader is not None else None
        self.target.note(stream.url, start, end, background, miss=stream.miss)


class _Run:
    __slots__ = ("ahead", "end", "stopped", "streak", "waited", "window")

    def __init__(self, end: int) -> None:
        self.end = end  # furthest byte read on demand (or from a prefetched stretch)
        self.streak = 0  # consecutive ranges that followed on
        self.ahead = 0  # prefetched (or being prefetched) up to here
        self.window = 0
        self.stopped = False
        self.waited = False  # a reader waited for a stretch in flight: the window is too small


class _Stretch:
    """A stretch of a target read ahead. Its bytes arrive in order, piece by piece, as the
    fetcher streams them (``receive``); they stay in those pieces, which readers take views
    of (``part``). A reader waits only for its own part to arrive (``reach`` in trio,
    ``when_arrived`` elsewhere), not for the whole stretch -- a request of up to
    ``REQUEST_LIMIT`` bytes, many times a chunk. ``done`` is set when the fetch is over."""

    __slots__ = ("_at", "_callbacks", "_pieces", "arrived", "blocks_from", "done", "end", "start")

    def __init__(self, start: int, end: int, blocks_from: int) -> None:
        self.start = start
        self.end = end
        self.blocks_from = blocks_from  # from here on the stretch is whole grid blocks
        self.done = trio.Event()
        self.arrived = 0  # bytes from ``start`` that have arrived
        self._pieces: list[bytes] = []
        self._at: list[int] = []  # where each piece starts, from ``start``
        self._callbacks: list[tuple[int, Callable[[], None]]] = []  # (bytes needed, call)

    def receive(self, at: int, piece: bytes) -> None:
        """Bytes [at, at + len(piece)) of the stretch arrived (the fetcher's ``Sink``). A
        request retried starts again at 0: what an earlier attempt brought is dropped, never
        mixed with the new one's (readers already served keep theirs)."""
        if at == 0 and self.arrived:
            self._pieces, self._at, self.arrived = [], [], 0
        if at != self.arrived or self.done.is_set() or not piece:
            return
        self._pieces.append(piece)
        self._at.append(at)
        self.arrived += len(piece)
        if self._callbacks:
            self._call_back()

    def settle(self, ok: bool) -> None:
        """The fetch is over: with every byte (``ok``; ``end`` is where they end), or failed
        (what arrived is dropped)."""
        if not ok:
            self._pieces, self._at, self.arrived = [], [], 0
        self.done.set()
        if self._callbacks:
            self._call_back()

    def when_arrived(self, end: int, call: Callable[[], None]) -> bool:
        """``call()`` (on this thread, from the host loop or trio) once the bytes up to
        ``end`` have arrived or the stretch is over -- unless that is already so (False)."""
        if self.done.is_set() or self.start + self.arrived >= end:
            return False
        self._callbacks.append((end - self.start, call))
        return True

    def _call_back(self) -> None:
        ready = [call for need, call in self._callbacks if need <= self.arrived or self.done.is_set()]
        if ready:
            self._callbacks = [(need, call) for need, call in self._callbacks
                               if need > self.arrived and not self.done.is_set()]
            for call in ready:
                call()

    async def reach(self, end: int) -> None:
        """In trio: wait until the bytes of the stretch up to ``end`` have arrived, or it is
        over. Woken directly from trio, through trio's token from the host loop (where the
        fetcher's sink runs)."""
        moved = trio.Event()
        if self.when_arrived(end, functools.partial(soon_in_trio, trio.lowlevel.current_trio_token(),
                                                    moved.set)):
            await moved.wait()

    def part(self, start: int, end: int) -> memoryview | bytes | None:
        """Bytes [start, end) of the target (inside the stretch) if they have arrived: a view
        where one piece holds them (most chunks), else joined."""
        lo, hi = start - self.start, end - self.start
        if hi > self.arrived or hi <= lo:
            return None if hi > lo else b""
        at, pieces = self._at, self._pieces
        i = bisect.bisect_right(at, lo) - 1
        if hi <= at[i] + len(pieces[i]):
            return memoryview(pieces[i])[lo - at[i] : hi - at[i]]
        parts = []
        while lo < hi:
            parts.append(memoryview(pieces[i])[lo - at[i] : min(hi - at[i], len(pieces[i]))])
            lo = at[i] + len(pieces[i])
            i += 1
        return b"".join(parts)


class RangeFetcher(Protocol):
    """What TargetReadahead needs of the fetcher (a fake one in tests)."""

    async def stream_range(self, url: str, start: int, end: int, sink: Sink) -> int: ...


class TargetReadahead:
    SLACK = SLACK  # a range within this of the last one's end continues the run
    MIN_STREAK = 2  # ranges in a row before prefetching starts
    BEHIND = 4 * 2**20  # this far behind the furthest range is "out of order", not a jump
    CONCURRENT = 16  # ... or this many ranges behind it, up to the window: readers fetching at once
    FIRST_WINDOW = 2 * 2**20
    REQUEST_LIMIT = 8 * 2**20
    MAX_RUNS = 10_000

    def __init__(
        self,
        fetcher: RangeFetcher,
        stats: Stats,
        *,
        capacity: int,
        max_window: int,
        grid: int,
        on_block: Callable[[str, int, memoryview], None] | None = None,
        links: LinkEstimates | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.stats = stats
        self.capacity = capacity
        self.max_window = max_window
        self.grid = grid
        self.on_block = on_block
        self._runs: LRU[str, _Run] = LRU(self.MAX_RUNS)
        self._stretches: dict[str, list[_Stretch]] = {}  # per target, sorted by start
        self._fifo: deque[tuple[str, _Stretch]] = deque()
        self._size = 0
        # Latency and bandwidth per host (the fetcher's, fed by every request): they size
        # the window behind a slow link.
        self.links = links if links is not None else LinkEstimates()

    @property
    def prefetched_bytes(self) -> int:
        """Bytes of the stretches held (arrived or in flight): at most ``capacity`` after
        each extension."""
        return self._size

    def __len__(self) -> int:
        """The targets whose runs are remembered (at most ``MAX_RUNS``)."""
        return len(self._runs)

    async def lookup(self, url: str, start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
        """Bytes [start, end) of ``url`` from prefetched stretches, if they cover them (waiting
        for stretches in flight), and whether those bytes lie in grid blocks handed to
        ``on_block``."""
        cover = self._covering(url, start, end)
        if cover is None:
            return None
        for stretch in cover:
            need = min(end, stretch.end)
            if not stretch.done.is_set() and stretch.start + stretch.arrived < need:
                if (run := self._runs.get(url)) is not None:
                    run.waited = True
                await stretch.reach(need)  # its part of the stretch, not all of it
        return self._join(cover, start, end)

    def when_arrived(self, url: str, start: int, end: int, call: Callable[[], None]) -> bool:
        """For a reader that does not wait in trio (the HTTP front end's handlers on the host
        loop): when stretches in flight cover [start, end) but its bytes have not all
        arrived, ``call()`` once they have (or the stretch is over) and True; else False
        (look with ``peek``, or fetch)."""
        cover = self._covering(url, start, end)
        if cover is None:
            return False
        for stretch in cover:
            if stretch.when_arrived(min(end, stretch.end), call):
                if (run := self._runs.get(url)) is not None:
                    run.waited = True
                return True
        return False

    def peek(self, url: str, start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
        """``lookup`` without waiting: only bytes that have arrived."""
        cover = self._covering(url, start, end)
        return None if cover is None else self._join(cover, start, end)

    def _covering(self, url: str, start: int, end: int) -> list[_Stretch] | None:
        """The stretch, arrived or in flight, that covers [start, end), or two adjacent ones:
        chunk offsets rarely fall on the grid, and a range across the boundary of two
        stretches is joined from them rather than fetched on its own."""
        stretches = self._stretches.get(url)
        if not stretches:
            return None
        i = bisect.bisect_right(stretches, start, key=lambda s: s.start) - 1
        if i < 0 or stretches[i].end <= start:
            return None
        first = stretches[i]
        if first.end >= end:
            return [first]
        if i + 1 < len(stretches) and stretches[i + 1].start == first.end and stretches[i + 1].end >= end:
            return [first, stretches[i + 1]]
        return None

    @staticmethod
    def _join(cover: list[_Stretch], start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
        pieces = []
        for stretch in cover:
            piece = stretch.part(max(start, stretch.start), min(end, stretch.end))
            if piece is None:
                return None  # not arrived yet, or it failed: fetch on our own
            pieces.append(piece)
        if sum(len(p) for p in pieces) < end - start:
            return None  # the target ended early
        return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), cover[0].blocks_from <= start

    def note(self, url: str, start: int, end: int, nursery: Background | trio.Nursery | None, *,
             miss: bool) -> None:
        """A range of ``url`` was read: a fetch on demand (``miss``) or from a stretch."""
        if nursery is None or self.max_window <= 0:
            return
        run = self._runs.get(url)
        if run is None or not self._in_run(run, start, end - start):
            if miss:  # a new run starts only where reads go to the network
                self._runs.put(url, _Run(end))
            return
        if end <= run.end:
            # Behind the furthest range: concurrent readers (zarr fetches several chunks at
            # once) report ranges out of order. Neither progress nor a jump.
            return
        run.end = end
        run.streak += 1
        if run.streak >= self.MIN_STREAK and not run.stopped:
            self._extend(url, run, nursery, end - start)

    def _in_run(self, run: _Run, start: int, span: int) -> bool:
        """Whether a range starting at ``start`` belongs to ``run``: it starts at most
        ``SLACK`` past what was read or prefetched so far -- concurrent readers run ahead of
        each other inside the prefetched stretch -- and not further behind the furthest
        range than several ranges' worth (as many as readers fetch at once)."""
        behind = max(self.SLACK, min(self.CONCURRENT * span, max(self.BEHIND, run.window)))
        return continues(start, run.end, front=max(run.end, run.ahead), behind=behind, slack=self.SLACK)

    def _extend(self, url: str, run: _Run, nursery: Background | trio.Nursery, span: int) -> None:
        ahead = max(run.ahead, run.end)
        link = self.links.of(url)
        piece = self.REQUEST_LIMIT  # one request (targets/inflight.py: why not smaller ones)
        lead = ahead - run.end
        if run.window and lead >= run.window // 2 and lead + piece > run.window:
            return  # well ahead of the reader, and a whole request more would pass the window
        # Big chunks start with a bigger window: readers (zarr) fetch several at once, and a
        # window of a chunk or two would fall behind them at once. Behind latency, the window
        # covers several requests in flight, each about a bandwidth-delay product.
        # The window doubles while the reader catches up (within half of it) or waits for
        # bytes in flight; otherwise a request only tops it up.
        grow = lead < run.window // 2 or run.waited
        run.waited = False
        # The first window is the chunk-sized one: a few keys in order by chance (a random
        # reader) cost no more than before; from the second on it covers the link.
        run.window = min(max(run.window * 2 if grow else run.window, self.FIRST_WINDOW, 8 * span,
                             link.window(piece, 0, self.max_window) if run.window else 0),
                         self.max_window)
        target = run.end + run.window
        stretches = self._stretches.setdefault(url, [])
        while ahead < target:
            # What a stretch already holds (or is fetching) is not fetched again: several
            # readers going through one target (a zarr client each, over one server) run
            # into each other's stretches.
            i = bisect.bisect_right(stretches, ahead, key=lambda s: s.start)
            if i > 0 and stretches[i - 1].end > ahead:
                ahead = stretches[i - 1].end
                continue
            # End on the grid: every stretch after the first is whole grid blocks.
            stop = (ahead + piece) // self.grid * self.grid
            if stop <= ahead:
                stop = round_up(ahead + 1, self.grid)
            if i < len(stretches):
                stop = min(stop, stretches[i].start)  # up to the next one
            stretch = _Stretch(ahead, stop, round_up(ahead, self.grid))
            bisect.insort(stretches, stretch, key=lambda s: s.start)
            self._fifo.append((url, stretch))
            self._size += stretch.end - stretch.start
            nursery.start_soon(self._fetch, url, stretch, run)
            ahead = stretch.end
        run.ahead = ahead
        self._evict()

    async def _fetch(self, url: str, stretch: _Stretch, run: _Run) -> None:
        ok = False
        try:
            got = await self.fetcher.stream_range(url, stretch.start, stretch.end, stretch.receive)
            ended = got < stretch.end - stretch.start
            if ended:  # the target ends here
                run.stopped = True
                if stretch in self._stretches.get(url, ()):
                    self._size -= stretch.end - stretch.start - got
                stretch.end = stretch.start + got
            self.stats.prefetched += got
            ok = True
            if self.on_block is not None:
                for pos in range(stretch.blocks_from, stretch.end, self.grid):
                    # Whole blocks only; the last one may end at the end of the target.
                    stop = min(pos + self.grid, stretch.end)
                    if stop - pos == self.grid or ended:
                        block = stretch.part(pos, stop)
                        assert block is not None
                        self.on_block(url, pos, memoryview(block))
        except Exception as e:  # failing (or starting past the end of the target): stop
            run.stopped = True
            self._drop(url, stretch)
            log.debug("readahead of %s bytes %d-%d stopped: %s", url, stretch.start, stretch.end, e)
        finally:
            stretch.settle(ok)

    def _drop(self, url: str, stretch: _Stretch) -> None:
        stretches = self._stretches.get(url)
        if stretches is not None and stretch in stretches:
            stretches.remove(stretch)
            self._size -= stretch.end - stretch.start
            if not stretches:
                del self._stretches[url]

    def _evict(self) -> None:
        while self._size > self.capacity and self._fifo:
            url, stretch = self._fifo.popleft()
            self._drop(url, stretch)  # readers waiting on it keep their reference
