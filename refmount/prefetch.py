"""Readahead across references: a reader going through a target front to back.

Zarr readers read chunks in order, and kerchunk sets usually lay chunks out in that order
inside their target (an HDF5/netCDF file, a GRIB message after another). Each chunk is a key
of its own, so the kernel's readahead — per file — never sees the pattern, and each chunk
would cost a round trip. ``TargetReadahead`` watches the ranges of each target fetched on
demand; once consecutive ones follow each other (each within ``SLACK`` after the furthest
one read so far, or a few ranges behind it when readers fetch several at once), it fetches
the stretch of the target that follows, in requests of up to ``REQUEST_LIMIT``, with a
window that doubles while the reader keeps up (up to ``max_window``). Later ranges inside
a prefetched stretch are served from it — or wait for it while it is in flight — instead
of being requested one by one.

Stretches after the first start and end on the target's ``grid`` (the block size), and
each whole grid block of a stretch is handed to ``on_block`` (the reader writes it to the
disk cache as one block instead of one file per key, and later serves keys from it).

Only misses count (a reader served by the disk cache starts nothing), a run that jumps
elsewhere starts over, and a failed prefetch stops readahead for that run (a stretch
past the end of the target fails; the reads themselves are not affected). Prefetched
stretches are kept first-in first-out within ``capacity`` bytes.
"""

from __future__ import annotations

import bisect
import logging
from collections import deque
from collections.abc import Callable

import trio

from .cache import round_up
from .fetch import Fetcher
from .inflight import LinkEstimates
from .stats import Stats

log = logging.getLogger(__name__)


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
    __slots__ = ("blocks_from", "data", "done", "end", "start")

    def __init__(self, start: int, end: int, blocks_from: int) -> None:
        self.start = start
        self.end = end
        self.blocks_from = blocks_from  # from here on the stretch is whole grid blocks
        self.data: bytes | None = None  # None while in flight, or after a failure
        self.done = trio.Event()


class TargetReadahead:
    SLACK = 2**20  # a range within this of the last one's end continues the run
    MIN_STREAK = 2  # ranges in a row before prefetching starts
    BEHIND = 4 * 2**20  # this far behind the furthest range is "out of order", not a jump
    CONCURRENT = 16  # ... or this many ranges behind it, up to the window: readers fetching at once
    FIRST_WINDOW = 2 * 2**20
    REQUEST_LIMIT = 8 * 2**20
    MAX_RUNS = 10_000

    def __init__(
        self,
        fetcher: Fetcher,
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
        self._runs: dict[str, _Run] = {}
        self._stretches: dict[str, list[_Stretch]] = {}  # per target, sorted by start
        self._fifo: deque[tuple[str, _Stretch]] = deque()
        self._size = 0
        # Latency and bandwidth per host (the fetcher's, fed by every request): they size
        # the window behind a slow link.
        self.links = links if links is not None else LinkEstimates()

    async def lookup(self, url: str, start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
        """Bytes [start, end) of ``url`` from prefetched stretches, if they cover them (waiting
        for stretches in flight), and whether those bytes lie in grid blocks handed to
        ``on_block``."""
        cover = self._covering(url, start, end)
        if cover is None:
            return None
        for stretch in cover:
            if stretch.data is None:
                if (run := self._runs.get(url)) is not None:
                    run.waited = True
                await stretch.done.wait()
        return self._join(cover, start, end)

    def peek(self, url: str, start: int, end: int) -> tuple[memoryview | bytes, bool] | None:
        """``lookup`` without waiting: only stretches that have arrived."""
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
            if stretch.data is None:
                return None  # in flight, or it failed: fetch on our own
            pieces.append(memoryview(stretch.data)[max(start, stretch.start) - stretch.start :
                                                   min(end, stretch.end) - stretch.start])
        if sum(len(p) for p in pieces) < end - start:
            return None  # the target ended early
        return (pieces[0] if len(pieces) == 1 else b"".join(pieces)), cover[0].blocks_from <= start

    def note(self, url: str, start: int, end: int, nursery: trio.Nursery | None, *, miss: bool) -> None:
        """A range of ``url`` was read: a fetch on demand (``miss``) or from a stretch."""
        if nursery is None or self.max_window <= 0:
            return
        run = self._runs.get(url)
        if run is None or not self._in_run(run, start, end - start):
            if miss:  # a new run starts only where reads go to the network
                if len(self._runs) >= self.MAX_RUNS:
                    self._runs.clear()
                self._runs[url] = _Run(end)
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
        front = max(run.end, run.ahead)
        behind = max(self.SLACK, min(self.CONCURRENT * span, max(self.BEHIND, run.window)))
        return run.end - behind <= start <= front + self.SLACK

    def _extend(self, url: str, run: _Run, nursery: trio.Nursery, span: int) -> None:
        ahead = max(run.ahead, run.end)
        link = self.links.of(url)
        piece = min(self.grid, self.REQUEST_LIMIT)  # small requests, many in flight (inflight.py)
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
            # End on the grid: every stretch after the first is whole grid blocks.
            stop = (ahead + piece) // self.grid * self.grid
            if stop <= ahead:
                stop = round_up(ahead + 1, self.grid)
            stretch = _Stretch(ahead, stop, round_up(ahead, self.grid))
            bisect.insort(stretches, stretch, key=lambda s: s.start)
            self._fifo.append((url, stretch))
            self._size += stretch.end - stretch.start
            nursery.start_soon(self._fetch, url, stretch, run)
            ahead = stretch.end
        run.ahead = ahead
        self._evict()

    async def _fetch(self, url: str, stretch: _Stretch, run: _Run) -> None:
        try:
            data = await self.fetcher.cat_range(url, stretch.start, stretch.end, upto=True)
            ended = len(data) < stretch.end - stretch.start
            if ended:  # the target ends here
                run.stopped = True
                if stretch in self._stretches.get(url, ()):
                    self._size -= stretch.end - stretch.start - len(data)
                stretch.end = stretch.start + len(data)
            stretch.data = data
            self.stats.prefetched += len(data)
            if self.on_block is not None:
                view = memoryview(data)
                for pos in range(stretch.blocks_from, stretch.end, self.grid):
                    # Whole blocks only; the last one may end at the end of the target.
                    piece = view[pos - stretch.start : pos - stretch.start + self.grid]
                    if len(piece) == self.grid or ended:
                        self.on_block(url, pos, piece)
        except Exception as e:  # failing (or starting past the end of the target): stop
            run.stopped = True
            self._drop(url, stretch)
            log.debug("readahead of %s bytes %d-%d stopped: %s", url, stretch.start, stretch.end, e)
        finally:
            stretch.done.set()

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
