"""TargetSizes (refmount.core.targetsizes) without FUSE: a fake target, trio's MockClock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from support.fakes import URL, FakeFetcher, MiB, content, run

from refmount.cache.blocks import MemoryLRU
from refmount.core.blockstore import BlockKey
from refmount.core.targetsizes import TargetSizes
from refmount.refs import Ref, RefKind


class MeasuredTarget(FakeFetcher):
    """Counts the times its size is asked for."""

    def __init__(self, size: int) -> None:
        super().__init__(size=size)
        self.measured = 0

    async def size(self, url: str) -> int:
        self.measured += 1
        return await super().size(url)


def sizes(f: FakeFetcher, *, max_sizes: int = 100) -> TargetSizes:
    return TargetSizes(f, MemoryLRU(64 * MiB), whole_fetch_limit=MiB, max_sizes=max_sizes)  # type: ignore[arg-type]


def test_a_range_is_its_length_until_a_fetch_meets_the_end_of_its_target() -> None:
    t = sizes(FakeFetcher(size=10_000))
    ref = Ref(RefKind.RANGE, URL, 8000, 4000)
    assert t.known_length(ref) == 4000 and t.clipped(ref) is None and t.known(URL) is None

    async def main() -> None:
        assert await t.cat(URL, 8000, 12_000) == content(8000, 10_000)  # the bytes that exist
        assert await t.length(ref) == 2000

    run(main)
    assert t.known(URL) == 10_000
    assert t.clipped(ref) == 2000 and t.known_length(ref) == 2000
    # where reads of the clipped range look for it
    assert t.memory.get(BlockKey(URL, 8000, 2000)) == content(8000, 10_000)
    assert t.clipped(Ref(RefKind.RANGE, URL, 0, 5000)) is None  # inside the target
    assert t.clipped(Ref(RefKind.RANGE, URL, 12_000, 10)) == 0  # past its end
    assert t.clipped(Ref(RefKind.RANGE, "http://example.invalid/other", 8000, 4000)) is None
    assert t.clipped(Ref(RefKind.INLINE, None, 0, 3, b"abc")) is None


def test_a_whole_target_is_measured_once() -> None:
    f = MeasuredTarget(size=10_000)
    t = sizes(f)
    whole = Ref(RefKind.WHOLE, URL, 0, -1)
    assert t.known_length(whole) is None  # not without I/O

    async def main() -> None:
        assert await t.length(whole) == 10_000
        assert await t.length(Ref(RefKind.WHOLE, URL, 3000, -1)) == 7000  # a row: offset to the end
        assert await t.length(Ref(RefKind.WHOLE, URL, 20_000, -1)) == 0

    run(main)
    assert f.measured == 1
    assert t.known_length(whole) == 10_000


def test_settle_reads_a_small_range_first_and_measures_a_large_one_once() -> None:
    f = MeasuredTarget(size=3 * MiB)
    t = sizes(f)
    small = Ref(RefKind.RANGE, URL, 3 * MiB - 100, 1000)
    other = "http://example.invalid/other.bin"
    large = Ref(RefKind.RANGE, other, MiB, 4 * MiB)  # over whole_fetch_limit
    first_reads: list[Ref] = []

    def first_read(ref: Ref) -> Callable[[], Awaitable[bytes]]:
        async def read() -> bytes:
            first_reads.append(ref)
            assert ref.url is not None
            return await t.cat(ref.url, ref.offset, ref.offset + ref.length)
        return read

    async def main() -> None:
        assert await t.settle(small, first_read(small)) == 100
        assert await t.settle(small, first_read(small)) == 100  # known: not read again
        assert await t.settle(large, first_read(large)) == 2 * MiB
        assert await t.settle(large, first_read(large)) == 2 * MiB
        for ref in (Ref(RefKind.INLINE, None, 0, 3, b"abc"), Ref(RefKind.WHOLE, URL, 0, -1),
                    Ref(RefKind.RANGE, URL, 0, 0)):
            assert await t.settle(ref, first_read(ref)) is None

    run(main)
    assert first_reads == [small]
    assert f.measured == 1  # the large range's target, once


def test_sizes_are_bounded() -> None:
    t = sizes(FakeFetcher(size=10_000), max_sizes=10)

    async def main() -> None:
        for i in range(100):
            await t.cat(f"{URL}?{i}", 9000, 11_000)

    run(main)
    assert len(t) == 10
    assert t.known(f"{URL}?99") == 10_000 and t.known(f"{URL}?0") is None
