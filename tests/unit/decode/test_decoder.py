"""The decoder without FUSE: one decode shared by concurrent readers, decoded bytes in flight
bounded, chunks decoded ahead of a reader going in order."""

from __future__ import annotations

import numpy as np
import trio
from support.zarrchunks import SHUFFLE_ZLIB, encode, view_of, zarray

from refmount.cache.blocks import MemoryLRU
from refmount.decode.decoder import ChunkDecoder
from refmount.refs import Ref, RefKind


def test_decoder_shares_caches_and_bounds_bytes_in_flight():
    meta = zarray(">f4", shape=(2, 30), chunks=(2, 3), **SHUFFLE_ZLIB)
    view = view_of({"v": meta})
    array = view.arrays["v"]
    chunks = {f"v/0.{i}": encode(meta, np.full((2, 3), i, "f4")) for i in range(10)}
    stored_reads: list[bytes] = []
    peak = 0

    async def read_stored(ref: Ref) -> bytes:
        stored_reads.append(ref.data)
        await trio.sleep(0.001)
        return ref.data

    async def resolve(key: str):
        return (None, Ref(RefKind.INLINE, data=chunks[key])) if key in chunks else None

    async def main() -> None:
        nonlocal peak
        dec = ChunkDecoder(view, MemoryLRU(1 << 20), read_stored, resolve=resolve, threads=2,
                           max_bytes=2 * array.nbytes, ahead=3)
        orig_acquire = dec.budget.acquire

        async def acquire(n: int) -> None:
            nonlocal peak
            await orig_acquire(n)
            peak = max(peak, dec.budget.used)

        dec.budget.acquire = acquire
        async with trio.open_nursery() as nursery:
            dec.attach(nursery)
            ref0 = Ref(RefKind.INLINE, data=chunks["v/0.0"])
            got = await asyncio_gather(*[dec.read("v/0.0", array, ref0, 0, 1000) for _ in range(5)])
            assert all(bytes(g) == np.zeros(6, "<f4").tobytes() for g in got)
            assert len(stored_reads) == 1  # one decode for five concurrent readers
            ref1 = Ref(RefKind.INLINE, data=chunks["v/0.1"])
            part = await dec.read("v/0.1", array, ref1, 0, 8)
            assert bytes(part) == np.ones(2, "<f4").tobytes()
            tail = await dec.read("v/0.1", array, ref1, 20, 100)  # short at the end
            assert bytes(tail) == np.ones(1, "<f4").tobytes()
        # in order: the next chunks were decoded ahead, into the memory cache
        assert dec.decoded_ahead == 3
        for i in (2, 3, 4):
            assert bytes(dec.ready(f"v/0.{i}")) == np.full(6, i, "<f4").tobytes()
        assert dec.ready("v/0.5") is None
        assert 0 < peak <= 2 * array.nbytes
        dec.close()

    trio.run(main)


async def asyncio_gather(*coros):
    results = [None] * len(coros)

    async def run(i, c):
        results[i] = await c

    async with trio.open_nursery() as n:
        for i, c in enumerate(coros):
            n.start_soon(run, i, c)
    return results
