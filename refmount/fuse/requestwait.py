"""How pyfuse3's request loop waits for the next request: without a trip through trio's
scheduler when one is already queued.

pyfuse3's worker tasks take turns at one ``trio.Lock`` and then ``wait_readable(/dev/fuse)``
before each request they read. Both yield to the scheduler every time: the lock's
uncontended acquire is a checkpoint, and ``wait_readable`` registers the descriptor with
epoll and parks the task until trio's next poll. The daemon runs trio as a guest of the
asyncio loop (``base/guestloop.py``), so each of those yields is a turn of the host loop too
(a guest tick, an ``epoll_wait`` of asyncio's and one of trio's): two or three per request,
and a chunk read through a mount is four requests.

pyfuse3 looks these up on its ``trio`` attribute, the hook its asyncio mode replaces
(``pyfuse3.asyncio.enable``). ``install`` puts ``ForPyfuse3`` there: trio itself, except
that

* the lock is taken at once, without yielding, by whichever task finds it free (``Lock``),
  and
* ``wait_readable`` returns at once when a zero-timeout ``poll`` finds a request queued, at
  most ``FAST_LIMIT`` times in a row; then, and whenever nothing is queued, it is trio's own
  wait (a real checkpoint: the asyncio loop's HTTP reads, trio's other tasks and its
  cancellation get their turn at least that often).
"""

from __future__ import annotations

import select
import types
from typing import Any

import trio

FAST_LIMIT = 8  # requests in a row read without yielding to the scheduler


class Lock:
    """``async with`` lock that a task takes at once whenever it is free, without yielding.

    Not first come, first served: a release wakes one waiting task, which takes the lock if
    it is still free when it runs, else waits again. pyfuse3's tasks hold it only while
    waiting for the next request, so the task that has just answered one takes it back
    at once, instead of handing it to a task that runs only after the scheduler's next
    turn (trio's lock hands it over, and its free acquire is a checkpoint)."""

    __slots__ = ("_held", "_lot")

    def __init__(self) -> None:
        self._held = False
        self._lot = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        while self._held:
            await self._lot.park()
        self._held = True

    async def __aexit__(self, *exc: object) -> None:
        self._held = False
        self._lot.unpark()

    def locked(self) -> bool:
        return self._held


class RequestWait:
    """``wait_readable`` that skips the scheduler while requests are queued (see module doc)."""

    def __init__(self, limit: int = FAST_LIMIT) -> None:
        self.limit = limit
        self.fast = 0  # waits in a row answered by ``poll`` alone
        self.fast_total = 0
        self.waited_total = 0
        self._polls: dict[int, select.poll] = {}

    def queued(self, fd: int) -> bool:
        """Whether ``fd`` is readable now (a zero-timeout poll)."""
        p = self._polls.get(fd)
        if p is None:
            p = self._polls[fd] = select.poll()
            p.register(fd, select.POLLIN)
        try:
            return bool(p.poll(0))
        except OSError:
            return False  # let trio's wait report what is wrong with it

    async def wait_readable(self, fd: Any) -> None:
        if self.fast < self.limit and self.queued(fd):
            self.fast += 1
            self.fast_total += 1
            return
        self.fast = 0
        self.waited_total += 1
        await trio.lowlevel.wait_readable(fd)


class ForPyfuse3(types.SimpleNamespace):
    """What pyfuse3 finds as its ``trio``: trio's names, with ``Lock`` and
    ``lowlevel.wait_readable`` from this module."""

    def __init__(self, wait: RequestWait) -> None:
        lowlevel = types.SimpleNamespace(
            current_task=trio.lowlevel.current_task,
            current_trio_token=trio.lowlevel.current_trio_token,
            notify_closing=trio.lowlevel.notify_closing,
            wait_readable=wait.wait_readable,
        )
        super().__init__(Lock=Lock, lowlevel=lowlevel, ClosedResourceError=trio.ClosedResourceError,
                         open_nursery=trio.open_nursery, from_thread=trio.from_thread)
        self.wait = wait


def install(pyfuse3: Any, wait: RequestWait | None = None) -> RequestWait | None:
    """Make ``pyfuse3``'s request loop use ``ForPyfuse3``; None (and nothing changed) when
    this pyfuse3 has no ``trio`` attribute to replace."""
    if getattr(pyfuse3, "trio", None) is not trio:
        return None
    wait = wait or RequestWait()
    pyfuse3.trio = ForPyfuse3(wait)
    return wait
