"""Calling trio code from asyncio code on the same thread: the reverse of ``fetch.await_task``.

The HTTP front end's handlers run as asyncio tasks (aiohttp's server on the loop trio is a
guest of, ``guestloop``), while the core (tree, reader, decoder) runs on trio. ``TrioCaller``
runs one coroutine function as a trio task in a nursery and gives its outcome to the asyncio
task awaiting it; cancelling the asyncio task (a client that went away) cancels the trio
task, and a trio task cancelled from its side (trio shutting down) cancels the asyncio
caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")

__all__ = ["TrioCaller", "TrioGone"]


class TrioGone(RuntimeError):
    """trio has finished (the server is stopping): nothing can be called any more."""


class TrioCaller:
    """Made in trio (``TrioCaller(nursery)``), used from asyncio tasks of the host loop."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` in trio, awaited from asyncio."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        scope = trio.CancelScope()

        async def job() -> None:
            with scope:
                try:
                    value = await fn(*args)
                except Exception as e:
                    if not future.done():
                        future.set_exception(e)
                else:
                    if not future.done():
                        future.set_result(value)
            if not future.done():  # cancelled in trio: the caller is cancelled too
                future.cancel()

        def spawn() -> None:  # in trio: an exception here would end the whole run
            try:
                self._nursery.start_soon(job)
            except RuntimeError:  # the nursery is closed: trio is stopping
                if not future.done():
                    future.cancel()

        try:
            self._token.run_sync_soon(spawn)
        except trio.RunFinishedError:
            raise TrioGone("the server is stopping") from None
        try:
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(scope.cancel)
            raise
