"""``TrioCaller``: asyncio tasks on the host loop calling trio code (trio as a guest of asyncio,
as in the serving process): results, exceptions, and cancellation both ways."""

from __future__ import annotations

import asyncio

import pytest
import trio

from refmount.base import guestloop
from refmount.base.triocall import TrioCaller


def test_results_exceptions_and_cancellation_cross_both_ways() -> None:
    seen: dict[str, object] = {}

    async def double(x: int) -> int:
        await trio.sleep(0.01)
        return 2 * x

    async def fails() -> None:
        await trio.sleep(0)
        raise KeyError("gone")

    async def forever() -> None:
        try:
            await trio.sleep_forever()
        finally:
            seen["trio side cancelled"] = True

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            caller = TrioCaller(nursery)
            from refmount.targets.filesystems import await_task

            async def asyncio_side() -> None:
                seen["value"] = await caller.call(double, 21)
                with pytest.raises(KeyError):
                    await caller.call(fails)
                task = asyncio.ensure_future(caller.call(forever))
                await asyncio.sleep(0.05)
                task.cancel()  # a client that went away
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.05)
                # trio cancelling its side cancels the asyncio caller
                late = asyncio.ensure_future(caller.call(trio.sleep_forever))
                await asyncio.sleep(0.05)
                nursery.cancel_scope.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await late
                seen["done"] = True

            await await_task(asyncio.get_running_loop(), asyncio_side())

    guestloop.run(main)
    assert seen == {"value": 42, "trio side cancelled": True, "done": True}
