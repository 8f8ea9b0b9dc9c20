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

Readers found at different places of one target keep a stream each (``Streams``, as the
kernel keeps readahead per open file): ``OrderDetector``, ``GridReadahead`` and
``TargetReadahead`` keep their state per stream, each stream found from the positions its
reads continue. All such state is bounded (streams per target and in all, the least recently
continued forgotten first), and prefetched bytes within a capacity.

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

Several readers going through one target at once (Dask workers each reading its slab, HTTP
clients each reading a slice) keep one stream each: a range belongs to the stream whose
reads it continues (the nearest), and a miss that continues none starts a stream of its own.
Each stream has its own window; the bounds are global: stretches held within ``capacity``
bytes (first-in first-out), bytes in flight within ``max_inflight`` across all streams, and
each stream's window within its share of the capacity while several read ahead.

Only misses count (a reader served by the disk cache starts nothing), a read that continues
no stream starts one (a random reader's reads start streams that never read ahead), and a
failed prefetch stops readahead for that stream (a stretch past the end of the target fails;
the reads themselves are not affected).
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

import trio

from refmount.base.background import Background, soon_in_trio
from refmount.base.stats import Stats
from refmount.cache.blocks import round_up
from refmount.core.blockstore import BlockKey, Fetch, block_of
from refmount.core.streams import Streams
from refmount.targets.fetch import Sink
from refmount.targets.inflight import LinkEstimates

log = logging.getLogger(__name__)


SLACK = 2**20  # a read starting within this of where the last one ended continues it


def continues(start: int, end: int, *, front: int, behind: int, slack: int = SLACK) -> bool:
    """The one rule for "in order": a read starting at ``start`` continues a stream whose
    furthest read ended at ``end`` when it starts at most ``slack`` past ``front`` (``end``,
    or further where readahead has run ahead) and at most ``behind`` before ``end``."""
    return end - behind <= start <= front + slack


class _Position:
    __slots__ = ("end",)

    def __init__(self, end: int) -> None:
        self.end = end


class OrderDetector:
    """Per stream of a target's keys (``Streams``): where its last read of a key for the
    first time ended, and whether the next one starts near there (``continues`` within
    ``SLACK`` either way). Bounded: at most ``per_target`` streams of a target and
    ``max_streams`` in all, the least recently continued forgotten first."""

    __slots__ = ("_streams", "slack")

    def __init__(self, max_streams: int = 16_384, slack: int = SLACK, per_target: int = 16) -> None:
        self._streams: Streams[_Position] = Streams(per_target, max_streams)
        self.slack = slack

    def follows(self, url: str, start: int, end: int) -> bool:
        """Whether [start, end) follows the last read of a stream of ``url``; that stream
        (or a new one) now ends at ``end``."""
        slack = self.slack
        stream = self._streams.find(
            url, start, lambda s: continues(start, s.end, front=s.end, behind=slack, slack=slack))
        if stream is None:
            self._streams.add(url, _Position(end))
            return False
        stream.end = end
        return True

    def __len__(self) -> int:
        """The streams remembered."""
        return len(self._streams)


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


class _GridRun:
    __slots__ = ("ahead", "end")

    def __init__(self, block: int) -> None:
        self.end = block  # the last block served
        self.ahead = block  # loaded up to here


class GridReadahead:
    """Keys served from grid blocks: per stream of a target's keys (``Streams``), while they
    go on in order (``continues`` in blocks: the same block or the next), the following
    blocks on disk are loaded ahead (up to ``max_readahead``), until the first that the disk
    certainly lacks. A key that continues no stream starts one, and loads nothing until keys
    follow on. ``Readahead[str]``: the stream is found from the target's URL and where the
    key lies."""

    SLACK = 1  # blocks: a key in the next block continues
    BEHIND = 0

    def __init__(self, block_size: int, max_readahead: int, max_streams: int = 16_384,
                 per_target: int = 16) -> None:
        self.block_size = block_size
        self.max_readahead = max_readahead
        self._runs: Streams[_GridRun] = Streams(per_target, max_streams)

    def _continues(self, k: int, last: int) -> bool:
        return continues(k, last, front=last, behind=self.BEHIND, slack=self.SLACK)

    def in_order(self, url: str, start: int) -> bool:
        """Whether a key of ``url`` from ``start`` continues a stream of keys served (its
        block is the stream's last one or the next)."""
        k = start // self.block_size
        return any(self._continues(k, run.end) for run in self._runs.of(url))

    def note(self, stream: str, start: int, end: int, loader: Loader | None) -> None:
        """A key [start, end) of the target ``stream`` was served from grid blocks: load the
        next blocks from disk (``loader``: only blocks it may have on disk)."""
        url, k = stream, (end - 1) // self.block_size
        first = start // self.block_size
        run = self._runs.find(url, first, lambda r: self._continues(first, r.end) and k >= r.end)
        if run is None:
            self._runs.add(url, _GridRun(k))
            return
        run.end = k
        if loader is None:
            run.ahead = k
            return
        bs = self.block_size
        stop = k + max(1, self.max_readahead // bs)
        for j in range(max(run.ahead, k) + 1, stop + 1):
            gkey = BlockKey(url, j * bs, bs)
            if loader.busy(gkey):
                continue
            if not loader.may_be_on_disk(gkey):
                stop = j  # the cached part ends here
                break
            loader.prefetch(gkey, None, upto=True)
        run.ahead = max(run.ahead, stop)

    def __len__(self) -> int:
        """The streams remembered."""
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
    """One stream of a target's keys read in order: its own position and window."""

    __slots__ = ("ahead", "end", "fetched", "read", "started", "stopped", "streak", "waited", "window")

    def __init__(self, end: int) -> None:
        self.end = end  # furthest byte read on demand (or from a prefetched stretch)
        self.read = 0  # bytes of the ranges it took
        self.fetched = 0  # bytes of the stretches it started
        self.streak = 0  # consecutive ranges that followed on
        self.ahead = 0  # prefetched (or being prefetched) up to here
        self.window = 0
        self.started = False  # it has read ahead
        self.stopped = False
        self.waited = False  # a reader waited for a stretch in flight: the window is too small


class _Stretch:
    """A stretch of a target read ahead. Its bytes arrive in order, piece by piece, as the
    fetcher streams them (``receive``); they stay in those pieces, which readers take views
    of (``part``). A reader waits only for its own part to arrive (``reach`` in trio,
    ``when_arrived`` elsewhere), not for the whole stretch -- a request of up to
    ``REQUEST_LIMIT`` bytes, many times a chunk. ``done`` is set when the fetch is over."""

    __slots__ = ("_at", "_callbacks", "_pieces", "arrived", "blocks_from", "done", "end", "run", "start")

    def __init__(self, start: int, end: int, blocks_from: int, run: _Run | None = None) -> None:
        self.start = start
        self.end = end
        self.blocks_from = blocks_from  # from here on the stretch is whole grid blocks
        self.run = run  # the stream that fetches it
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
    MIN_STREAK = 3  # ranges in a row before prefetching starts
    CLOSE = 4  # ... each starting within this many ranges of the last one's end
    USED = 8  # a stream reads ahead while its readers read at least 1/USED of what it fetched
    BEHIND = 4 * 2**20  # this far behind the furthest range is "out of order", not a jump
    CONCURRENT = 16  # ... or this many ranges behind it, up to the window: readers fetching at once
    FIRST_WINDOW = 2 * 2**20
    REQUEST_LIMIT = 8 * 2**20
    PER_TARGET = 16  # streams of one target (readers at different places in it)
    MAX_STREAMS = 16_384  # streams of all targets
    ACTIVE = 2.0  # seconds: a stream that read ahead this recently shares the capacity

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
        max_inflight: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetcher = fetcher
        self.stats = stats
        self.capacity = capacity
        self.max_window = max_window
        # Bytes being fetched ahead, all streams together: by default what one stream may
        # have ahead of its reader.
        self.max_inflight = max_window if max_inflight is None else max_inflight
        self.grid = grid
        self.on_block = on_block
        self.clock = clock
        self._runs: Streams[_Run] = Streams(self.PER_TARGET, self.MAX_STREAMS)
        self._active: OrderedDict[_Run, float] = OrderedDict()  # streams reading ahead, by last time
        self._stretches: dict[str, list[_Stretch]] = {}  # per target, sorted by start
        self._fifo: deque[tuple[str, _Stretch]] = deque()
        self._size = 0
        self._inflight = 0
        # Latency and bandwidth per host (the fetcher's, fed by every request): they size
        # the window behind a slow link.
        self.links = links if links is not None else LinkEstimates()

    @property
    def prefetched_bytes(self) -> int:
        """Bytes of the stretches held (arrived or in flight): at most ``capacity`` after
        each extension."""
        return self._size

    @property
    def inflight_bytes(self) -> int:
        """Bytes of the stretches being fetched: at most ``max_inflight``."""
        return self._inflight

    def __len__(self) -> int:
        """The streams remembered (at most ``PER_TARGET`` of a target, ``MAX_STREAMS`` in
        all)."""
        return len(self._runs)

    def streams(self, url: str) -> list[tuple[int, int]]:
        """Each stream of ``url``: (where its reads got to, its window)."""
        return [(run.end, run.window) for run in self._runs.of(url)]

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
                if stretch.run is not None:
                    stretch.run.waited = True
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
                if stretch.run is not None:
                    stretch.run.waited = True
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
        span = end - start
        run = self._runs.find(url, start, lambda r: self._in_run(r, start, span))
        if run is None:
            if miss:  # a new stream starts only where reads go to the network
                self._runs.add(url, _Run(end))
            return
        run.read += span
        if end <= run.end:
            # Behind the furthest range: concurrent readers (zarr fetches several chunks at
            # once) report ranges out of order. Neither progress nor a jump.
            return
        run.end = end
        run.streak += 1
        if run.streak >= self.MIN_STREAK and not run.stopped:
            if not run.started:
                run.started = True
                self.stats.readahead_streams += 1
            self._extend(url, run, nursery, span)

    def _share(self, run: _Run) -> int:
        """The most a stream may keep ahead of its reader: ``max_window`` alone, or its share
        of ``capacity`` when several streams read ahead (half of it split between those that
        did in the last ``ACTIVE`` seconds), so that stretches are read before the capacity
        drops them. Never below ``FIRST_WINDOW``."""
        now = self.clock()
        active = self._active
        active[run] = now
        active.move_to_end(run)
        while active:
            oldest, seen = next(iter(active.items()))
            if now - seen <= self.ACTIVE and len(active) <= self.MAX_STREAMS:
                break
            del active[oldest]
        if len(active) == 1:
            return self.max_window
        return min(self.max_window, max(self.FIRST_WINDOW, self.capacity // (2 * len(active))))

    def _in_run(self, run: _Run, start: int, span: int) -> bool:
        """Whether a range starting at ``start`` belongs to ``run``: it starts at most
        ``SLACK`` past what was read or prefetched so far -- concurrent readers run ahead of
        each other inside the prefetched stretch -- and not further behind the furthest
        range than several ranges' worth (as many as readers fetch at once). A stream that
        has not read ahead yet takes only a range that starts within ``CLOSE`` ranges (and
        ``SLACK``) after its end: with many streams per target, the loose rule would let a
        random reader's ranges continue one stream or another."""
        if not run.started:
            # Behind its end as far as a started stream takes (readers fetching several at once
            # report ranges out of order: neither progress nor another stream), ahead only close.
            behind = max(self.SLACK, min(self.CONCURRENT * span, self.BEHIND))
            return continues(start, run.end, front=run.end, behind=behind,
                             slack=min(self.SLACK, self.CLOSE * span))
        behind = max(self.SLACK, min(self.CONCURRENT * span, max(self.BEHIND, run.window)))
        return continues(start, run.end, front=max(run.end, run.ahead), behind=behind, slack=self.SLACK)

    def _extend(self, url: str, run: _Run, nursery: Background | trio.Nursery, span: int) -> None:
        ahead = max(run.ahead, run.end)
        link = self.links.of(url)
        share = self._share(run)
        # One request (targets/inflight.py: why not smaller ones), within the stream's share.
        piece = min(self.REQUEST_LIMIT, max(self.grid, share))
        lead = ahead - run.end
        if run.window and lead >= run.window // 2 and lead + piece > run.window:
            return  # well ahead of the reader, and a whole request more would pass the window
        if run.fetched > self.USED * run.read + max(self.FIRST_WINDOW, 8 * span):
            return  # its readers use little of what it brings: ranges in order by chance
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
                         share)
        target = run.end + run.window
        alone = share >= self.max_window
        limit = round_up(target, self.grid)
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
            # With other streams, a request ends with the window too: what each holds stays
            # within its share.
            stop = (ahead + piece if alone else min(ahead + piece, limit)) // self.grid * self.grid
            if stop <= ahead:
                stop = round_up(ahead + 1, self.grid)
            if i < len(stretches):
                stop = min(stop, stretches[i].start)  # up to the next one
            if self._inflight and self._inflight + stop - ahead > self.max_inflight:
                break  # all streams together have their most in flight: later
            stretch = _Stretch(ahead, stop, round_up(ahead, self.grid), run)
            bisect.insort(stretches, stretch, key=lambda s: s.start)
            self._fifo.append((url, stretch))
            self._size += stretch.end - stretch.start
            self._inflight += stretch.end - stretch.start
            run.fetched += stretch.end - stretch.start
            nursery.start_soon(self._fetch, url, stretch, run)
            ahead = stretch.end
        run.ahead = ahead
        self._evict()

    async def _fetch(self, url: str, stretch: _Stretch, run: _Run) -> None:
        ok = False
        asked = stretch.end - stretch.start
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
            self._inflight -= asked
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
            run = stretch.run
            if run is not None and run.end < stretch.end and stretch.start < run.ahead:
                # Dropped before its reader got there: the stream fetches it again when it
                # tops up, instead of counting on it until the reader passes it.
                run.ahead = max(run.end, stretch.start)
