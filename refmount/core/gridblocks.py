"""``GridBlocks``: keys served from the grid blocks that readahead across keys leaves.

``TargetReadahead`` fetches stretches of a target that start and end on its grid (the
block size); each whole grid block of a stretch — ``block_size`` bytes at a multiple of
``block_size`` in the target, the same key as a whole-file block — goes to the disk cache
as one block (``to_disk``) instead of one file per key. A later reader of those keys
loads one block for many keys (``read``: memory, else disk) and, while its keys follow
each other, the next blocks are loaded from disk ahead of it (``GridReadahead``). At open,
``peek`` gives a key's bytes if memory has its grid blocks and keys are being served in
order through them.
"""

from __future__ import annotations

from refmount.cache.blocks import Block
from refmount.core.blockstore import BlockKey, BlockStore
from refmount.core.readahead import GridReadahead


class GridBlocks:
    def __init__(self, store: BlockStore, block_size: int, max_readahead: int) -> None:
        self.store = store
        self.block_size = block_size
        self.readahead = GridReadahead(block_size, max_readahead)

    def to_disk(self, url: str, start: int, data: memoryview) -> None:
        """Keep the grid block of ``url`` at ``start`` on disk (``TargetReadahead.on_block``)."""
        self.store.grid_to_disk(url, start, data, self.block_size)

    async def read(self, url: str, start: int, end: int, *, from_disk: bool = True) -> memoryview | None:
        """Bytes [start, end) of ``url`` from grid blocks in memory or on disk (not on disk
        unless ``from_disk``), if every block they need is there; the disk is then read
        ahead while keys follow in order."""
        bs = self.block_size
        store = self.store
        first, last = start // bs, (end - 1) // bs
        blocks: list[Block] = []
        for k in range(first, last + 1):
            gkey = BlockKey(url, k * bs, bs)
            data = store.cached(gkey)
            if data is not None:
                store.stats.memory_hits += 1
            else:
                if not store.loading(gkey) and (not from_disk or not store.may_be_on_disk(gkey)):
                    return None  # not there: no thread hop
                data = await store.load(gkey, None, upto=True)
                if data is None:
                    return None
            blocks.append(data)
        return self._piece(url, blocks, start, end)

    def peek(self, url: str, start: int, end: int) -> memoryview | None:
        """Bytes [start, end) of ``url`` if keys of ``url`` are being served in order from
        grid blocks and memory has the blocks they need (no I/O, no waiting)."""
        if not self.readahead.in_order(url, start):
            return None
        bs = self.block_size
        blocks = []
        for k in range(start // bs, (end - 1) // bs + 1):
            data = self.store.cached(BlockKey(url, k * bs, bs))
            if data is None:
                return None
            blocks.append(data)
        self.store.stats.memory_hits += 1
        return self._piece(url, blocks, start, end)

    def _piece(self, url: str, blocks: list[Block], start: int, end: int) -> memoryview | None:
        """Bytes [start, end) out of the grid blocks that cover them; the key counts as
        served for ``GridReadahead``."""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        if len(blocks[-1]) < end - last * bs:
            return None  # the target ends before the key does: let the fetch report it
        store = self.store
        self.readahead.note(url, start, end, store.loader if store.disk is not None else None)
        skip = start - first * bs
        if first == last:
            return memoryview(blocks[0])[skip : skip + end - start]
        return memoryview(b"".join(blocks))[skip : skip + end - start]
