"""What ``TargetReadahead`` (``core/targetreadahead.py``) keeps: a stream of a target's keys read
in order (``Run``: its position and window) and a stretch of a target read ahead (``Stretch``: its
bytes as they arrive, readers waiting for their part).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable

import trio

from refmount.base.background import soon_in_trio


class Run:
    """One stream of a target's keys read in order: its own position and window."""

    __slots__ = ("ahead", "end", "fetched", "inflight", "low", "read", "started", "stopped", "streak",
                 "waited", "window")

    def __init__(self, start: int, end: int) -> None:
        self.end = end  # furthest byte read on demand, from a prefetched stretch, or asked of one in flight
        self.low = start  # where its first ranges begin (before it reads ahead)
        self.read = 0  # bytes of the ranges it took
        self.fetched = 0  # bytes of the stretches it started
        self.inflight = 0  # bytes of its stretches being fetched
        self.streak = 0  # consecutive ranges that followed on
        self.ahead = 0  # prefetched (or being prefetched) up to here
        self.window = 0
        self.started = False  # it has read ahead
        self.stopped = False
        self.waited = False  # a reader waited for a stretch in flight: the window is too small


class Stretch:
    """A stretch of a target read ahead. Its bytes arrive in order, piece by piece, as the
    fetcher streams them (``receive``); they stay in those pieces, which readers take views
    of (``part``). A reader waits only for its own part to arrive (``reach`` in trio,
    ``when_arrived`` elsewhere), not for the whole stretch -- a request of up to
    ``REQUEST_LIMIT`` bytes, many times a chunk. ``done`` is set when the fetch is over."""

    __slots__ = ("_at", "_callbacks", "_pieces", "arrived", "blocks_from", "done", "end", "run", "start")

    def __init__(self, start: int, end: int, blocks_from: int, run: Run | None = None) -> None:
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
