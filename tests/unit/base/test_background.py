"""refmount.base.background: starting the core's background tasks from trio and from the host
loop (trio a guest of asyncio, as in the HTTP server)."""

from __future__ import annotations

import asyncio

import trio

from refmount.base import guestloop
from refmount.base.background import Background


def test_tasks_start_from_a_trio_task_and_from_the_host_loop() -> None:
    ran: list[tuple[str, bool]] = []
    seen: list[bool] = []

    async def task(name: str) -> None:
        ran.append((name, trio.lowlevel.in_trio_task()))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with trio.open_nursery() as nursery:
            background = Background(nursery)
            background.start_soon(task, "from a task")
            await trio.sleep(0.01)

            def on_host_loop() -> None:  # an asyncio callback: outside any trio task
                seen.append(trio.lowlevel.in_trio_task())
                background.start_soon(task, "from the host loop")

            loop.call_soon(on_host_loop)
            await trio.sleep(0.05)
        # The nursery has closed: a start from the host loop is dropped, not an error that
        # ends the run.
        loop.call_soon(background.start_soon, task, "too late")
        await trio.sleep(0.05)

    guestloop.run(main)
    assert seen == [False]
    assert ran == [("from a task", True), ("from the host loop", True)]


def test_made_outside_trio_it_starts_directly() -> None:
    started: list[str] = []

    class Nursery:
        def start_soon(self, fn: object, *args: object) -> None:
            started.append(str(args[0]))

    Background(Nursery()).start_soon(lambda x: None, "direct")  # type: ignore[arg-type]
    assert started == ["direct"]
