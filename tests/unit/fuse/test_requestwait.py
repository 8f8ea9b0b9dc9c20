"""``fuse/requestwait.py``: what pyfuse3's request loop waits with, on a real pipe and trio's
real scheduler (no FUSE): a free lock and a queued request cost no turn of the scheduler,
a held lock and an empty descriptor wait, and every ``FAST_LIMIT`` requests the loop
yields once."""

from __future__ import annotations

import os
import types
from collections.abc import Iterator

import pytest
import trio
from trio.testing import assert_checkpoints, assert_no_checkpoints

from refmount.fuse import requestwait
from refmount.fuse.requestwait import ForPyfuse3, Lock, RequestWait


def test_a_free_lock_is_taken_without_yielding() -> None:
    async def main() -> None:
        lock = Lock()

        with assert_no_checkpoints():
            for _ in range(50):
                async with lock:
                    assert lock.locked()
        assert not lock.locked()

    trio.run(main)


def test_a_held_lock_excludes_and_its_release_wakes_a_waiter() -> None:
    async def main() -> None:
        lock = Lock()
        inside, most, order = 0, 0, []

        async def user(name: str) -> None:
            nonlocal inside, most
            async with lock:
                inside += 1
                most = max(most, inside)
                await trio.sleep(0.01)  # holds it across a real wait
                order.append(name)
                inside -= 1

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for name in "abcd":
                    nursery.start_soon(user, name)
        assert most == 1
        assert sorted(order) == list("abcd")
        assert not lock.locked()

    trio.run(main)


def test_a_cancelled_waiter_leaves_the_lock_usable() -> None:
    async def main() -> None:
        lock = Lock()
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await lock.__aenter__()
                with trio.move_on_after(0.05) as scope:
                    async with lock:
                        pytest.fail("taken while held")
                assert scope.cancelled_caught
                await lock.__aexit__(None, None, None)
                got = trio.Event()

                async def later() -> None:
                    async with lock:
                        got.set()

                nursery.start_soon(later)
                await got.wait()

    trio.run(main)


class Pipe:
    """A pipe standing for /dev/fuse: a byte written to ``w`` is a queued request."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self._open = {self.r, self.w}

    def close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            os.close(fd)


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    p = Pipe()
    yield p
    p.close(p.r)
    p.close(p.w)


def test_queued_requests_are_read_without_yielding_up_to_the_limit(pipe: Pipe) -> None:
    async def main() -> None:
        os.write(pipe.w, b"x")  # a request is queued
        wait = RequestWait(limit=4)

        with assert_no_checkpoints():
            for _ in range(4):
                await wait.wait_readable(pipe.r)
        assert (wait.fast_total, wait.waited_total) == (4, 0)

        # the fifth in a row is trio's own wait: a real checkpoint
        with assert_checkpoints():
            await wait.wait_readable(pipe.r)
        assert (wait.fast_total, wait.waited_total) == (4, 1)
        # and the count starts again
        with assert_no_checkpoints():
            await wait.wait_readable(pipe.r)
        assert wait.fast == 1

    trio.run(main)


def test_with_nothing_queued_it_waits_until_a_request_comes(pipe: Pipe) -> None:
    async def main() -> None:
        wait = RequestWait()
        woke = trio.Event()

        async def waiter() -> None:
            await wait.wait_readable(pipe.r)
            woke.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.05)
                assert not woke.is_set()
                os.write(pipe.w, b"x")
                await woke.wait()
        assert wait.waited_total == 1

    trio.run(main)


def test_a_hung_up_descriptor_counts_as_readable(pipe: Pipe) -> None:
    """As /dev/fuse once the file system is unmounted from outside: the read that follows
    finds the end, and pyfuse3's loop ends."""
    async def main() -> None:
        pipe.close(pipe.w)
        wait = RequestWait()
        with assert_no_checkpoints():
            await wait.wait_readable(pipe.r)
        assert wait.fast_total == 1
        assert os.read(pipe.r, 1) == b""

    trio.run(main)


def test_install_replaces_only_a_trio_it_knows() -> None:
    pyfuse3_like = types.SimpleNamespace(trio=trio)
    wait = requestwait.install(pyfuse3_like)
    assert isinstance(wait, RequestWait)
    shim = pyfuse3_like.trio
    assert isinstance(shim, ForPyfuse3)
    assert shim.Lock is Lock and shim.lowlevel.wait_readable == wait.wait_readable
    for name in ("current_task", "current_trio_token", "notify_closing"):
        assert getattr(shim.lowlevel, name) is getattr(trio.lowlevel, name)
    assert shim.ClosedResourceError is trio.ClosedResourceError
    assert shim.open_nursery is trio.open_nursery and shim.from_thread is trio.from_thread
    # already replaced, or something else (pyfuse3's asyncio mode): left alone
    assert requestwait.install(pyfuse3_like) is None
    other = types.SimpleNamespace(trio=object())
    assert requestwait.install(other) is None


def test_pyfuse3_uses_only_what_the_shim_provides() -> None:
    """The names pyfuse3's compiled module looks up on ``trio`` are all in the shim (read
    from its source, shipped with the wheel), so installing it can break no call."""
    import re
    from pathlib import Path

    import pyfuse3

    root = Path(pyfuse3.__file__).parent
    sources = [p for p in root.iterdir() if p.suffix in (".pyx", ".pxi")]
    if not sources:
        pytest.skip("this pyfuse3 ships no Cython sources to read")
    used = set()
    for path in sources:
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            used |= set(re.findall(r"\btrio\.((?:lowlevel\.|from_thread\.)?[A-Za-z_]+)", code))
    used = {u for u in used if u not in ("readthedocs", "run_sync_in_worker_thread")}  # a docstring's words
    shim = ForPyfuse3(RequestWait())
    for name in sorted(used):
        obj = shim
        for part in name.split("."):
            assert hasattr(obj, part), f"pyfuse3 uses trio.{name}, which the shim lacks"
            obj = getattr(obj, part)
    assert {"Lock", "lowlevel.wait_readable"} <= used
