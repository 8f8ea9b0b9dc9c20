"""SingleFlight and the bounded LRU, without FUSE (trio's MockClock)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from refmount.base.lru import LRU
from refmount.base.singleflight import SingleFlight


def run(main) -> None:  # type: ignore[no-untyped-def]
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_concurrent_loads_of_one_key_run_once_and_share_the_result() -> None:
    sf: SingleFlight[str, bytes] = SingleFlight()
    calls = 0
    got: list[bytes] = []

    async def load() -> bytes:
        nonlocal calls
        calls += 1
        await trio.sleep(1)
        return b"block"

    async def reader() -> None:
        got.append(await sf.run("k", load))

    async def main() -> None:
        async with trio.open_nursery() as n:
            for _ in range(20):
                n.start_soon(reader)
            await trio.sleep(0.5)
            assert "k" in sf and len(sf) == 1
        assert len(sf) == 0  # only loads in flight are held

    run(main)
    assert calls == 1
    assert got == [b"block"] * 20


def test_different_keys_load_separately() -> None:
    sf: SingleFlight[int, int] = SingleFlight()
    calls: list[int] = []

    async def main() -> None:
        async def one(k: int) -> None:
            async def load() -> int:
                calls.append(k)
                await trio.sleep(1)
                return k * 10
            assert await sf.run(k, load) == k * 10

        async with trio.open_nursery() as n:
            for k in (1, 2, 1, 2):
                n.start_soon(one, k)

    run(main)
    assert sorted(calls) == [1, 2]


def test_a_failed_load_fails_every_waiter_once() -> None:
    sf: SingleFlight[str, bytes] = SingleFlight()
    calls = 0
    errors: list[BaseException] = []

    async def load() -> bytes:
        nonlocal calls
        calls += 1
        await trio.sleep(1)
        raise OSError("target down")

    async def reader() -> None:
        try:
            await sf.run("k", load)
        except OSError as e:
            errors.append(e)

    async def main() -> None:
        async with trio.open_nursery() as n:
            for _ in range(5):
                n.start_soon(reader)

    run(main)
    assert calls == 1
    assert len(errors) == 5 and all(e is errors[0] for e in errors)


def test_a_cancelled_leader_does_not_fail_the_waiters() -> None:
    sf: SingleFlight[str, bytes] = SingleFlight()
    calls = 0
    got: list[bytes] = []

    async def load() -> bytes:
        nonlocal calls
        calls += 1
        await trio.sleep(1)
        return b"data"

    async def main() -> None:
        leader = trio.CancelScope()

        async def lead() -> None:
            with leader:
                await sf.run("k", load)

        async def follow() -> None:
            got.append(await sf.run("k", load))

        async with trio.open_nursery() as n:
            n.start_soon(lead)
            await trio.sleep(0.1)
            n.start_soon(follow)
            await trio.sleep(0.1)
            leader.cancel()

    run(main)
    assert got == [b"data"]
    assert calls == 2  # the waiter loaded again itself


def test_lru_evicts_the_least_recently_used_entry() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # refreshes a
    lru.put("c", 3)
    assert "b" not in lru and "a" in lru and "c" in lru
    assert lru.peek("a") == 1  # no refresh: a is still the oldest
    lru.put("d", 4)
    assert "a" not in lru and len(lru) == 2


def test_lru_bounded_by_weight() -> None:
    lru: LRU[str, bytes] = LRU(max_weight=10, weigh=len)
    for i in range(10):
        lru.put(str(i), b"xyz")
        assert lru.weight <= 10
    assert len(lru) == 3 and lru.weight == 9
    lru.put("big", b"x" * 11)  # heavier than the bound by itself: not kept
    assert "big" not in lru and lru.weight == 9
    lru.put("9", b"x")  # replacing an entry replaces its weight
    assert lru.weight == 7
    assert lru.pop("9") == b"x" and lru.weight == 6


def test_lru_keep_newest_keeps_one_entry_over_the_weight() -> None:
    lru: LRU[str, bytes] = LRU(4, max_weight=10, weigh=len, keep_newest=True)
    lru.put("a", b"12345")
    lru.put("b", b"x" * 20)
    assert list(lru.values()) == [b"x" * 20]
    lru.put("c", b"1")
    assert "b" not in lru and "c" in lru  # the heavy one goes as soon as it is not the newest


def test_lru_needs_a_bound() -> None:
    with pytest.raises(ValueError):
        LRU()
