"""WorkerPool and await_future: jobs in threads of their own, awaited from trio."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import trio

from refmount.base.workers import WorkerPool


def test_at_most_threads_jobs_run_at_once_and_each_result_comes_back() -> None:
    pool = WorkerPool(2, "test-pool")
    lock = threading.Lock()
    running = peak = 0
    names: set[str] = set()

    def job(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            names.add(threading.current_thread().name)
        time.sleep(0.02)
        with lock:
            running -= 1
        return i * i

    async def main() -> list[int]:
        results: list[int] = [0] * 8

        async def one(i: int) -> None:
            results[i] = await pool.run(lambda: job(i))

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
        return results

    try:
        assert trio.run(main) == [i * i for i in range(8)]
    finally:
        pool.close()
    assert peak == 2
    assert len(names) == 2 and all(n.startswith("test-pool") for n in names)


def test_an_exception_reaches_the_caller() -> None:
    pool = WorkerPool(1, "test-pool")

    def boom() -> None:
        raise ValueError("bad chunk")

    async def main() -> None:
        with pytest.raises(ValueError, match="bad chunk"):
            await pool.run(boom)

    try:
        trio.run(main)
    finally:
        pool.close()


def test_a_cancelled_caller_drops_a_job_not_started() -> None:
    pool = WorkerPool(1, "test-pool")
    release = threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        release.wait(10)
        ran.append("blocker")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run, blocker)
            await trio.sleep(0.05)  # the one thread is busy with blocker
            with trio.move_on_after(0.05) as scope:
                await pool.run(lambda: ran.append("queued"))
            assert scope.cancelled_caught
            release.set()
        await pool.run(lambda: ran.append("after"))

    try:
        trio.run(main)
    finally:
        pool.close()
    assert ran == ["blocker", "after"]  # the cancelled job never ran


def test_close_drops_queued_jobs() -> None:
    pool = WorkerPool(1, "test-pool")
    release = threading.Event()
    ran: list[str] = []
    outcome: list[str] = []

    async def queued() -> None:
        try:
            await pool.run(lambda: ran.append("queued"))
            outcome.append("ran")
        except concurrent.futures.CancelledError:
            outcome.append("dropped")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pool.run, lambda: release.wait(10))
            await trio.sleep(0.05)  # the one thread is busy
            nursery.start_soon(queued)
            await trio.sleep(0.05)
            pool.close()
            release.set()

    trio.run(main)
    assert ran == [] and outcome == ["dropped"]
