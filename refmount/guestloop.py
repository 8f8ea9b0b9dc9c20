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


def _host_wait(loop: asyncio.AbstractEventLoop, original: Callable[..., None]) -> Callable[..., None]:
    """A replacement for the helper-thread wait of trio's guest tick (see module doc)."""

    def wait(fn: Callable[[], Any], deliver: Callable[[outcome.Outcome[Any]], None],
             name: str | None = None) -> None:
        try:
            if fn.__name__ != "get_events":
                raise LookupError(fn.__name__)
            cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()),
                             strict=True))
            timeout = float(cells["timeout"])
            io = cells["self"].runner.io_manager
            fd = io._epoll.fileno()
        except Exception:  # not the guest tick's wait we know: keep trio's own behaviour
            original(fn, deliver, name=name)
            return
        handle: asyncio.TimerHandle | None = None

        def ready() -> None:
            loop.remove_reader(fd)
            if handle is not None:
                handle.cancel()
            deliver(outcome.capture(io.get_events, 0))

        loop.add_reader(fd, ready)
        if timeout != float("inf"):
            handle = loop.call_later(max(timeout, 0.0), ready)

    return wait


def run(main: Callable[..., Awaitable[None]], *args: Any,
        on_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None,
        before_close: Callable[[], Awaitable[None]] | None = None) -> None:
    """``trio.run(main, *args)``, as a guest of a new asyncio loop on this thread.
    ``on_loop(loop)`` runs first; ``before_close()`` runs on the loop after ``main``."""
    loop = asyncio.new_event_loop()
    run_module = trio._core._run
    original = getattr(run_module, "start_thread_soon", None)
    patched = original is not None
    if patched:
        run_module.start_thread_soon = _host_wait(loop, original)

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
        if patched:
            run_module.start_thread_soon = original
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
