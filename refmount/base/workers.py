"""Work done in other threads, awaited from trio.

``await_future`` waits in trio for a ``concurrent.futures.Future`` (a fetch run on another
event loop, a job of a thread pool). ``WorkerPool`` is a fixed set of threads that take jobs
from one queue themselves: a thread that finishes a job starts the next one at once, without
a round trip through the trio loop in between (with ``trio.to_thread`` and a
``CapacityLimiter`` the next job starts only once the loop has run the finished job's
completion and handed its token on, which leaves a thread idle whenever the loop is busy).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def await_future(fut: concurrent.futures.Future) -> Any:
    """Wait in trio for a future completed by another thread; cancel it if we are."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    fut.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        fut.cancel()  # a job not started yet never runs
        raise
    return fut.result()


class WorkerPool:
    """``threads`` worker threads (started on first use) running jobs in the order given."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a worker thread; waits (in trio) until it has run."""
        return await await_future(self._pool.submit(fn))

    def close(self) -> None:
        """Drop the jobs not started; threads finish the one they run and exit."""
        self._pool.shutdown(wait=False, cancel_futures=True)
