"""Where the core's background work runs, started from trio or from the host loop.

Readahead and disk-cache loads run as tasks in the core's nursery. A read that the core
answers without I/O may come from an asyncio callback on the same thread (the HTTP front end
answers such requests on the host loop, ``guestloop``). ``nursery.start_soon`` is for trio's
own tasks: called from there, the task would inherit the asyncio handler's context and
depend on what guest mode happens to allow; trio's token (``run_sync_soon``) is its way in
from outside, and wakes it. ``Background.start_soon`` starts a task directly inside a trio
task and through the token otherwise, so the code that decides to load ahead does not need
to know which loop called it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import trio

__all__ = ["Background", "soon_in_trio"]


def soon_in_trio(token: trio.lowlevel.TrioToken | None, fn: Callable[..., object], *args: Any) -> None:
    """``fn(*args)`` in trio: at once from a trio task (or without a token: outside trio),
    otherwise through ``token`` from the host loop's thread; dropped once trio has finished."""
    if token is None or trio.lowlevel.in_trio_task():
        fn(*args)
        return
    with contextlib.suppress(trio.RunFinishedError):  # stopping: nothing more runs
        token.run_sync_soon(fn, *args)


class Background:
    """A nursery's ``start_soon``, callable from trio tasks and from the host loop's thread."""

    __slots__ = ("_nursery", "_token")

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        try:
            self._token: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:  # made outside trio (tests): every start is direct
            self._token = None

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        if self._token is None or trio.lowlevel.in_trio_task():
            self._nursery.start_soon(fn, *args)
        else:
            soon_in_trio(self._token, self._start, fn, args)

    def _start(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        # In trio, outside any task: an exception here would end the whole run.
        with contextlib.suppress(RuntimeError):  # the nursery has closed: trio is stopping
            self._nursery.start_soon(fn, *args)
