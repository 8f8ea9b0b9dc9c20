"""GridBlocks (refmount.core.gridblocks) without FUSE: a BlockStore over a fake disk and a fake
cache writer, trio's MockClock."""

from __future__ import annotations

import trio
from support.fakes import URL, FakeDisk, FakeFetcher, FakeWriter, KiB, MiB, content, run

from refmount.base.stats import Stats
from refmount.cache.blocks import MemoryLRU
from refmount.core.blockstore import BlockKey, BlockStore
from refmount.core.gridblocks import GridBlocks


def grid(*, disk: FakeDisk | None = None, writer: FakeWriter | None = None,
         max_readahead: int = 4 * MiB) -> GridBlocks:
    store = BlockStore(FakeFetcher(), MemoryLRU(64 * MiB), disk, disk_writer=writer,  # type: ignore[arg-type]
                       stats=Stats())
    return GridBlocks(store, MiB, max_readahead)


def in_memory(g: GridBlocks, *blocks: int, size: int = 64 * MiB) -> None:
    """Grid blocks in the memory cache, of a target ``size`` bytes long."""
    for k in blocks:
        g.store.memory.put(BlockKey(URL, k * MiB, MiB), content(k * MiB, min((k + 1) * MiB, size)))


def test_grid_blocks_go_to_disk_under_the_grids_length() -> None:
    w = FakeWriter()
    g = grid(writer=w)
    g.to_disk(URL, 3 * MiB, memoryview(content(3 * MiB, 4 * MiB)))
    g.to_disk(URL, 4 * MiB, memoryview(b"tail"))  # the last block of the target: shorter
    assert w.submitted == [(URL, 3 * MiB, MiB, MiB), (URL, 4 * MiB, 4, MiB)]


def test_a_key_across_two_blocks_in_memory_is_joined_without_the_disk() -> None:
    d = FakeDisk()
    g = grid(disk=d)
    in_memory(g, 0, 1)

    async def main() -> None:
        piece = await g.read(URL, MiB - 100, MiB + 100)
        assert piece is not None and bytes(piece) == content(MiB - 100, MiB + 100)

    run(main)
    assert d.gets == []
    assert g.store.stats.memory_hits == 2


def test_the_disk_is_read_only_if_asked_and_if_its_filter_says_maybe() -> None:
    d = FakeDisk()
    d.blocks[(URL, 0, MiB)] = content(0, MiB)
    g = grid(disk=d)

    async def main() -> None:
        assert await g.read(URL, 10, 1000, from_disk=False) is None
        assert await g.read(URL, MiB + 10, MiB + 1000) is None  # block 1: certainly not there
        assert d.gets == []  # neither cost a lookup
        piece = await g.read(URL, 10, 1000)
        assert piece is not None and bytes(piece) == content(10, 1000)
        piece = await g.read(URL, 2000, 3000, from_disk=False)  # in memory now
        assert piece is not None and bytes(piece) == content(2000, 3000)

    run(main)
    assert d.gets == [(URL, 0, MiB)]
    assert g.store.stats.disk_hits == 1 and g.store.stats.memory_hits == 1


def test_a_key_running_past_the_end_of_the_target_is_left_to_the_fetch() -> None:
    g = grid()
    in_memory(g, 0, size=5000)

    async def main() -> None:
        assert await g.read(URL, 4000, 6000) is None
        piece = await g.read(URL, 1000, 5000)
        assert piece is not None and bytes(piece) == content(1000, 5000)

    run(main)


def test_peek_serves_keys_in_order_from_memory_only() -> None:
    g = grid()
    in_memory(g, 0, 1, 2, 5)
    assert g.peek(URL, 10, 1000) is None  # no key served from grid blocks yet: not in order

    async def first() -> None:
        assert await g.read(URL, 10, 1000) is not None

    run(first)
    piece = g.peek(URL, 1000, 2000)  # the same block
    assert piece is not None and bytes(piece) == content(1000, 2000)
    piece = g.peek(URL, MiB + 10, MiB + 20)  # the next one
    assert piece is not None and bytes(piece) == content(MiB + 10, MiB + 20)
    assert g.peek(URL, 5 * MiB, 5 * MiB + 10) is None  # in memory, but a jump
    assert g.peek(URL, 2 * MiB + 10, 3 * MiB + 10) is None  # in order, block 3 not in memory


def test_keys_in_order_read_the_next_blocks_from_disk_ahead_within_the_bound() -> None:
    d = FakeDisk()
    for k in range(8):
        d.blocks[(URL, k * MiB, MiB)] = content(k * MiB, (k + 1) * MiB)
    g = grid(disk=d, max_readahead=2 * MiB)
    chunk = 64 * KiB

    async def main() -> None:
        async with trio.open_nursery() as n:
            g.store.attach(n)
            for i in range(4):  # keys of block 0
                piece = await g.read(URL, i * chunk, (i + 1) * chunk)
                assert piece is not None and bytes(piece) == content(i * chunk, (i + 1) * chunk)
                await trio.sleep(0.01)
            await trio.sleep(1)
            n.cancel_scope.cancel()

    run(main)
    # block 0 for the first key; blocks 1 and 2 ahead once the second key followed it
    assert sorted(d.gets) == [(URL, k * MiB, MiB) for k in range(3)]
