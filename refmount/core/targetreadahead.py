"""Readahead across references: ``TargetReadahead`` fetches the stretch of a target that follows
a reader going through its keys front to back; ``AcrossKeys`` puts it behind the ``Readahead``
interface (``core/readahead.py``).

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
Each stream has its own window, kept from where its readers ask (a reader waiting for bytes
still coming moves its stream there), not from where bytes have arrived. The bounds are
global: stretches held within ``capacity`` bytes (first-in first-out); bytes in flight (asked
for, not yet arrived) ahead of where each stream's readers ask within ``max_inflight`` across
all streams, and all bytes in flight -- the keys readers have asked for and wait on too --
within ``capacity + max_inflight``. While several read ahead, each stream's window stays
within its share of the capacity and its bytes in flight ahead of its readers within its
share of ``max_inflight`` (more while the others leave room), a request that does not fit cut
to what does. The keys readers wait on count in neither share: they would be fetched on demand
all the same, and Dask workers each keeping six to ten 1 MiB keys asked would otherwise take
most of a stream's share and leave it less than a request to read ahead with.

Only misses count (a reader served by the disk cache starts nothing), a read that continues
no stream starts one (a random reader's reads start streams that never read ahead), and a
failed prefetch stops readahead for that stream (a stretch past the end of the target fails;
the reads themselves are not affected).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple, Protocol

import trio

from refmount.base.background import Background
from refmount.base.stats import Stats
from refmount.cache.blocks import round_up
from refmount.core.readahead import SLACK, Loader, continues
from refmount.core.streams import Streams
from refmount.core.stretches import Run, Stretch
from refmount.targets.fetch import Sink
from refmount.targets.inflight import LinkEstimates

log = logging.getLogger(__name__)


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


class RangeFetcher(Protocol):
    """What TargetReadahead needs of the fetcher (a fake one in tests)."""

    async def stream_range(self, url: str, start: int, end: int, sink: Sink) -> int: ...


class TargetReadahead:
    SLACK = SLACK  # a range within this of the last one's end continues the run
    MIN_STREAK = 3  # ranges in a row before prefetching starts
    CLOSE = 4  # ... each starting within this many ranges of the last one's end
    DENSE = 2  # ... and together covering at least 1/DENSE of the stretch they lie in
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
        # Bytes being fetched ahead of the readers, all streams together: by default what
        # one stream may have ahead of its reader.
        self.max_inflight = max_window if max_inflight is None else max_inflight
        self.grid = grid
        self.on_block = on_block
        self.clock = clock
        self._runs: Streams[Run] = Streams(self.PER_TARGET, self.MAX_STREAMS)
        self._active: OrderedDict[Run, float] = OrderedDict()  # streams reading ahead, by last time
        self._stretches: dict[str, list[Stretch]] = {}  # per target, sorted by start
        self._fifo: deque[tuple[str, Stretch]] = deque()
        self._size = 0
        self._inflight = 0
        self._fetching: set[Run] = set()  # streams with bytes in flight
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
        """Bytes of the stretches being fetched, the keys readers wait for included: at
        most ``capacity + max_inflight``."""
        return self._inflight

    @property
    def ahead_inflight_bytes(self) -> int:
        """Bytes being fetched ahead of where each stream's readers ask: at most
        ``max_inflight``."""
        return sum(self._ahead_of_readers(run, run.ahead) for run in self._fetching)

    @staticmethod
    def _ahead_of_readers(run: Run, ahead: int) -> int:
        """A stream's bytes in flight past where its readers ask (``run.end``), its stretches
        reaching ``ahead``: at most its bytes in flight, and at most its lead (the bytes in
        flight below ``run.end`` are keys its readers have asked for)."""
        return min(run.inflight, max(0, ahead - run.end))

    def __len__(self) -> int:
        """The streams remembered (at most ``PER_TARGET`` of a target, ``MAX_STREAMS`` in
        all)."""
        return len(self._runs)

    def streams(self, url: str) -> list[tuple[int, int]]:
        """Each stream of ``url``: (where its reads got to, its window)."""
        return [(run.end, run.window) for run in self._runs.of(url)]

    async def lookup(self, url: str, start: int, end: int, nursery: Background | trio.Nursery | None = None
                     ) -> tuple[memoryview | bytes, bool] | None:
        """Bytes [start, end) of ``url`` from prefetched stretches, if they cover them (waiting
        for stretches in flight), and whether those bytes lie in grid blocks handed to
        ``on_block``. A reader that waits is where its stream is (``_asked``: the window
        is topped up from ``nursery`` now, not once the bytes are in)."""
        cover = self._covering(url, start, end)
        if cover is None:
            return None
        asked = False
        for stretch in cover:
            need = min(end, stretch.end)
            if not stretch.done.is_set() and stretch.start + stretch.arrived < need:
                if stretch.run is not None:
                    stretch.run.waited = True
                if not asked:
                    asked = True
                    self._asked(url, start, end, nursery)
                await stretch.reach(need)  # its part of the stretch, not all of it
        return self._join(cover, start, end)

    def when_arrived(self, url: str, start: int, end: int, call: Callable[[], None],
                     nursery: Background | trio.Nursery | None = None) -> bool:
        """For a reader that does not wait in trio (the HTTP front end's handlers on the host
        loop): when stretches in flight cover [start, end) but its bytes have not all
        arrived, ``call()`` once they have (or the stretch is over) and True (the reader is
        where its stream is, as in ``lookup``); else False (look with ``peek``, or fetch)."""
        cover = self._covering(url, start, end)
        if cover is None:
            return False
        for stretch in cover:
            if stretch.when_arrived(min(end, stretch.end), call):
                if stretch.run is not None:
                    stretch.run.waited = True
                self._asked(url, start, end, nursery)
                return True
        return False

    def _asked(self, url: str, start: int, end: int, nursery: Background | trio.Nursery | None) -> None:
        """A reader asks for [start, end) from stretches whose bytes are still coming. Its
        stream's position is where its readers ask, not where bytes have arrived: readers
        that keep several keys in flight (zarr: up to ten) ask well past the last key
        served, and a window topped up only from the keys served falls behind them and
        they miss. The stream moves to ``end`` and tops up now; the read is counted
        (``note``) once its bytes are there."""
        if nursery is None or self.max_window <= 0:
            return
        span = end - start
        run = self._runs.find(url, start, lambda r: self._in_run(r, start, span))
        if run is None or not run.started or run.stopped or end <= run.end:
            return
        run.end = end
        self._extend(url, run, nursery, span)

    def peek(self, url: str, start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
        """``lookup`` without waiting: only bytes that have arrived."""
        cover = self._covering(url, start, end)
        return None if cover is None else self._join(cover, start, end)

    def _covering(self, url: str, start: int, end: int) -> list[Stretch] | None:
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
    def _join(cover: list[Stretch], start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
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
                self._runs.add(url, Run(start, end))
            return
        run.read += span
        if end <= run.end:
            # Behind the furthest range: concurrent readers (zarr fetches several chunks at
            # once) report ranges out of order. Neither progress nor a jump -- but before
            # the stream reads ahead, a range that ends right before its first one (less
            # than a range apart) is its reader's too: the first keys a reader asks for at
            # once arrive in any order (trio runs a batch of tasks in either order), and a
            # streak counted only upward would not start.
            if run.started or not run.low - span < end <= run.low:
                return
            run.low = start
        else:
            run.end = end
        run.streak += 1
        if not run.started and run.end - run.low > self.DENSE * (run.streak + 1) * span:
            # Its ranges are scattered over more than twice what they cover: a random
            # reader's, landing near one another now and then. Start again from this one.
            run.low, run.end, run.streak = start, end, 0
            return
        if run.streak >= self.MIN_STREAK and not run.stopped:
            if not run.started:
                run.started = True
                self.stats.readahead_streams += 1
                log.debug("readahead of %s: a stream starts at bytes %d-%d (%d streams of it)",
                          url, run.low, run.end, len(self._runs.of(url)))
            self._extend(url, run, nursery, span)

    def _share(self, run: Run) -> tuple[int, int]:
        """The most a stream may keep ahead of its reader, and the most it may have in flight
        ahead of its readers: ``max_window`` and ``max_inflight`` alone. When several streams
        read ahead (those that did in the last ``ACTIVE`` seconds), each gets its share: of
        ``capacity`` (half of it split between them, so that stretches are read before the
        capacity drops them; never below ``FIRST_WINDOW``) and of ``max_inflight`` (never
        below a grid block), so that streams that top up often do not take all the requests
        in flight and leave the others' readers to miss."""
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
            return self.max_window, self.max_inflight
        return (min(self.max_window, max(self.FIRST_WINDOW, self.capacity // (2 * len(active)))),
                max(self.grid, self.max_inflight // len(active)))

    def _in_run(self, run: Run, start: int, span: int) -> bool:
        """Whether a range starting at ``start`` belongs to ``run``: it lies within several
        ranges' worth (as many as readers fetch at once: ``CONCURRENT`` ranges of a MiB or
        more, smaller ones up to the stream's window) behind the furthest range or past what
        was read or prefetched so far -- concurrent readers run ahead of each other inside
        the prefetched stretch, and a reader keeping six to ten keys asked runs past a stream
        that fell behind it (its asks for the keys past the stream's stretches are misses;
        they move the stream there instead of starting another one, which would take several
        keys more to start, and another after it). A stream that
        has not read ahead yet takes only a range that starts within ``CLOSE`` ranges (and
        ``SLACK``) after its end: with many streams per target, the loose rule would let a
        random reader's ranges continue one stream or another."""
        if not run.started:
            # Behind its end as far as a started stream takes (readers fetching several at once
            # report ranges out of order: neither progress nor another stream), ahead only close.
            behind = max(self.SLACK, min(self.CONCURRENT * span, self.BEHIND))
            return continues(start, run.end, front=run.end, behind=behind,
                             slack=min(self.SLACK, self.CLOSE * span))
        near = max(self.SLACK, self.CONCURRENT * span if span >= self.SLACK
                   else min(self.CONCURRENT * span, max(self.BEHIND, run.window)))
        return continues(start, run.end, front=max(run.end, run.ahead), behind=near, slack=near)

    def _extend(self, url: str, run: Run, nursery: Background | trio.Nursery, span: int) -> None:
        ahead = max(run.ahead, run.end)
        link = self.links.of(url)
        share, inflight_share = self._share(run)
        alone = share >= self.max_window
        # One request (targets/inflight.py: why not smaller ones), within the stream's share;
        # beside other streams, half its share of the bytes in flight at most: it tops up
        # with a request while another is still coming.
        piece = min(self.REQUEST_LIMIT, max(self.grid, share if alone else min(share, inflight_share // 2)))
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
        limit = round_up(target, self.grid)
        stretches = self._stretches.setdefault(url, [])
        others = sum(self._ahead_of_readers(r, r.ahead) for r in self._fetching if r is not run)
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
            # Within the bytes in flight ahead of the readers of all streams together, and of
            # this stream's share unless the others have room to spare: a shorter request
            # (down to a grid block) when a whole one does not fit, or none for now. The keys
            # its readers have asked for and wait on count in neither (they would be fetched
            # on demand all the same): eight readers keeping ten 1 MiB keys each asked would
            # otherwise fill 80 MiB of the bound, and leave less than a request to each stream.
            # All bytes in flight, theirs included, within ``capacity + max_inflight``.
            size = allowed = stop - ahead
            if self._inflight:
                allowed = min(allowed, self.capacity + self.max_inflight - self._inflight)
            mine = self._ahead_of_readers(run, ahead)
            ahead_all = others + mine
            if ahead_all:
                allowed = min(allowed, self.max_inflight - ahead_all)
            if mine and ahead_all + size > self.max_inflight - inflight_share:
                allowed = min(allowed, inflight_share - mine)
            if allowed < size:
                stop = (ahead + max(allowed, 0)) // self.grid * self.grid
                if stop <= ahead:
                    break  # later: when bytes in flight have arrived
            stretch = Stretch(ahead, stop, round_up(ahead, self.grid), run)
            bisect.insort(stretches, stretch, key=lambda s: s.start)
            self._fifo.append((url, stretch))
            self._size += stretch.end - stretch.start
            self._inflight += stretch.end - stretch.start
            run.inflight += stretch.end - stretch.start
            run.fetched += stretch.end - stretch.start
            self._fetching.add(run)
            nursery.start_soon(self._fetch, url, stretch, run)
            ahead = stretch.end
        run.ahead = ahead
        self._evict()

    async def _fetch(self, url: str, stretch: Stretch, run: Run) -> None:
        ok = False
        pending = stretch.end - stretch.start  # bytes asked for that have not arrived

        def receive(at: int, piece: bytes) -> None:
            # Bytes that have arrived are no longer in flight: a stream tops up as its
            # stretch comes in, not only once the whole request (up to 8 MiB) is over.
            nonlocal pending
            stretch.receive(at, piece)
            left = stretch.end - stretch.start - stretch.arrived  # a retry starts again at 0
            self._inflight += left - pending
            run.inflight += left - pending
            pending = left

        try:
            got = await self.fetcher.stream_range(url, stretch.start, stretch.end, receive)
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
            self._inflight -= pending
            run.inflight -= pending
            if run.inflight <= 0:
                self._fetching.discard(run)
            stretch.settle(ok)

    def _drop(self, url: str, stretch: Stretch) -> None:
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
