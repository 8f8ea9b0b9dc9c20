"""Run trio as a guest of an asyncio loop, on one thread.

The daemon's FUSE operations run on trio (pyfuse3) and its HTTP client on asyncio (fsspec,
aiohttp). Running trio as a guest of the asyncio loop (``trio.lowlevel.start_guest_run``)
puts both on one thread, so they never contend for the GIL — with two threads, handing the
GIL back and forth cost more CPU than the work itself (measured with perf).

In guest mode, trio waits for its own I/O in a helper thread whenever it has nothing to
run, and every wake-up then costs two thread switches. That made each lightly loaded
request (an ``open`` served from the page cache) about twice as expensive. So, where the
trio version is one we know, that wait is done by the asyncio loop itself: trio's epoll
file descriptor is readable exactly when trio has I/O events, so asyncio watches it (plus a
timer for trio's next deadline) and no helper thread is involved. With any other trio
version the stock helper-thread wait is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import outcome
import trio

log = logging.getLogger(__name__)


class _HostWait:
    """A replacement for the helper-thread wait of trio's guest tick (see module doc).

    trio's epoll fd stays registered with the asyncio loop, and one timer stays armed, for
    the whole run: adding and removing the reader and a timer for every wait (every request,
    when lightly loaded) cost more than the rest of the wait (perf: epoll_ctl, the timer
    heap full of cancelled handles). A readiness or timer callback while trio is not
    waiting is ignored: trio is then running, and its next guest tick polls epoll itself.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, original: Callable[..., None]) -> None:
        self.loop = loop
        self.original = original
        self.deliver: Callable[[outcome.Outcome[Any]], None] | None = None
        self.io: Any = None
        self.fd = -1
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = float("inf")

    def __call__(self, fn: Callable[[], Any], deliver: Callable[[outcome.Outcome[Any]], None],
                 name: str | None = None) -> None:
        try:
            if fn.__name__ != "get_events" or self.deliver is not None:
                raise LookupError(fn.__name__)
            cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()),
                             strict=True))
            timeout = float(cells["timeout"])
            if self.io is None:
                io = cells["self"].runner.io_manager
                fd = io._epoll.fileno()
                self.loop.add_reader(fd, self._wake)
                self.io, self.fd = io, fd
        except Exception:  # not the guest tick's wait we know: keep trio's own behaviour
            self.original(fn, deliver, name=name)
            return
        self.deliver = deliver
        if timeout != float("inf"):
            when = self.loop.time() + max(timeout, 0.0)
            # An earlier timer already armed only wakes trio early, which is harmless.
            if self.timer is None or self.timer_at > when:
                if self.timer is not None:
                    self.timer.cancel()
                self.timer, self.timer_at = self.loop.call_at(when, self._timer_fired), when

    def _timer_fired(self) -> None:
        self.timer, self.timer_at = None, float("inf")
        self._wake()

    def _wake(self) -> None:
        deliver, self.deliver = self.deliver, None
        if deliver is not None:
            deliver(outcome.capture(self.io.get_events, 0))

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.fd >= 0:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.fd)
            self.fd = -1


def run(main: Callable[..., Awaitable[None]], *args: Any,
        on_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None,
        before_close: Callable[[], Awaitable[None]] | None = None) -> None:
    """``trio.run(main, *args)``, as a guest of a new asyncio loop on this thread.
    ``on_loop(loop)`` runs first; ``before_close()`` runs on the loop after ``main``."""
    loop = asyncio.new_event_loop()
    run_module = trio._core._run
    original = getattr(run_module, "start_thread_soon", None)
    host_wait = _HostWait(loop, original) if original is not None else None
    if host_wait is not None:
        run_module.start_thread_soon = host_wait

    loop_thread = threading.get_ident()

    def soon(fn: Callable[[], object]) -> None:
        # From our own thread (the common case, see _host_wait) without the self-pipe write.
        if threading.get_ident() == loop_thread:
            loop.call_soon(fn)
        else:
            loop.call_soon_threadsafe(fn)

    async def host() -> None:
        done: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
        if on_loop is not None:
            on_loop(loop)
        trio.lowlevel.start_guest_run(
            main, *args,
            run_sync_soon_threadsafe=soon,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=done.set_result,
        )
        result = await done
        if before_close is not None:
            await before_close()
        result.unwrap()

    try:
        loop.run_until_complete(host())
    finally:
        if host_wait is not None:
            run_module.start_thread_soon = original
            host_wait.close()
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
