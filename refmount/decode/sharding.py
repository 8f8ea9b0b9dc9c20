"""Sharded Zarr v3 arrays (``sharding_indexed``) through the decoded view: one v2 chunk per
inner chunk.

The view's chunk grid of a sharded array is its inner chunk grid; inner chunk ``(i, j)``
lies in the shard at ``(i // a, j // b)`` (``a, b``: inner chunks per shard along each axis),
number ``(i % a) * b + j % b`` of the shard's index. Reading it reads the shard's index --
``16 * n`` bytes (an offset and a length, little-endian ``uint64``, per inner chunk in C
order) through the index codecs (``bytes``, ``crc32c`` checked), at the shard's start or end
(``index_location``) -- then the inner chunk's range of the shard, both through the mount's
reader (memory and disk caches, readahead). Indexes are kept in a bounded cache
(``ShardIndexes``), read once for all readers of a shard and kept per shard *and* per
array's index layout (two arrays may reference the same bytes with different
``index_codecs``: each reads them its own way). An inner chunk the index marks
empty (both ``2**64 - 1``) reads as the fill value; an entry past the shard's end, or longer
than the chunk's codecs can have made it, fails that read (EIO).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio
import xxhash

from refmount.base.lru import LRU
from refmount.base.singleflight import SingleFlight
from refmount.decode.v3codecs import V3Chain
from refmount.decode.zarrv3 import V3Error, codec_config, codec_name

EMPTY = 2**64 - 1
INDEX_CACHE_BYTES = 64 << 20  # shard indexes kept (decoded), across arrays
MAX_INDEX_BYTES = 16 << 20  # the largest shard index read (a million inner chunks a shard)


class ShardError(ValueError):
    """A shard's index that cannot be used (the message says why)."""


@dataclass
class ShardLayout:
    """The geometry and index codecs of one sharded array."""

    per_shard: tuple[int, ...]  # inner chunks per shard along each axis
    inner: tuple[int, ...]  # the inner chunk shape
    at_end: bool  # the index is at the shard's end
    index_chain: V3Chain
    index_nbytes: int  # the encoded index's size
    # what decoding an index depends on (its codecs, where it is, its shape): a cached index
    # is used only by arrays with the same
    index_key: str = ""

    @property
    def count(self) -> int:
        return math.prod(self.per_shard)

    def locate(self, idx: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """(the shard's grid position, the inner chunk's number in it) of inner chunk ``idx``."""
        shard = tuple(i // n for i, n in zip(idx, self.per_shard, strict=True))
        inner = tuple(i % n for i, n in zip(idx, self.per_shard, strict=True))
        return shard, int(np.ravel_multi_index(inner, self.per_shard)) if inner else 0

    def decode_index(self, stored: Any) -> np.ndarray:
        """The index (n x 2 ``uint64``: offset, length) from its stored bytes."""
        try:
            raw = self.index_chain.decode(stored)
        except ValueError as e:
            raise ShardError(f"shard index: {e}") from None
        return np.frombuffer(raw, "<u8").reshape(self.count, 2)


def sharding_layout(shape: list[int], shard_shape: list[int], codec: Any,
                    ) -> tuple[ShardLayout, list[Any]]:
    """The layout of an array whose array-to-bytes codec is ``codec`` (``sharding_indexed``),
    and its inner chunks' codecs. V3Error when it cannot be served."""
    if codec_name(codec) != "sharding_indexed":
        raise V3Error("not sharding_indexed")
    conf = codec_config(codec)
    inner = conf.get("chunk_shape")
    if (not isinstance(inner, list) or len(inner) != len(shape)
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in inner)):
        raise V3Error("sharding_indexed chunk_shape is not a list of positive integers, one per axis")
    if any(s % n for s, n in zip(shard_shape, inner, strict=True)):
        raise V3Error(f"shard shape {shard_shape} is not a multiple of the inner chunk shape {inner}")
    per_shard = tuple(s // n for s, n in zip(shard_shape, inner, strict=True))
    location = conf.get("index_location", "end")
    if location not in ("start", "end"):
        raise V3Error(f"index_location {location!r}")
    index_codecs = conf.get("index_codecs", [{"name": "bytes", "configuration": {"endian": "little"}},
                                            {"name": "crc32c"}])
    if not isinstance(index_codecs, list):
        raise V3Error("index_codecs is not a list")
    n = math.prod(per_shard)
    size = 16 * n
    if size > MAX_INDEX_BYTES:
        raise V3Error(f"a shard's index is {size:,} bytes ({n:,} inner chunks), more than the "
                      f"{MAX_INDEX_BYTES:,} read")
    for c in index_codecs:
        name = codec_name(c)
        if name == "crc32c":
            size += 4
        elif name != "bytes":
            raise V3Error(f"index codec {name!r} (only bytes and crc32c have a fixed size)")
    chain = V3Chain(index_codecs, np.dtype("<u8"), (*per_shard, 2))
    codecs = conf.get("codecs")
    if not isinstance(codecs, list) or not codecs:
        raise V3Error("sharding_indexed codecs is not a list of codecs")
    key = json.dumps([index_codecs, location, per_shard], sort_keys=True, default=str)
    return ShardLayout(per_shard, tuple(inner), location == "end", chain, size, key), codecs


class ShardIndexes:
    """Shard indexes read through the mount's reader and kept decoded, up to ``max_bytes``.

    ``read_range(ref, off, n)`` reads bytes of a stored reference, ``size(ref)`` its length
    (the mount's ``RefReader``)."""

    def __init__(self, read_range: Callable[[Any, int, int], Awaitable[Any]],
                 size: Callable[[Any], Awaitable[int]], max_bytes: int = INDEX_CACHE_BYTES) -> None:
        self.read_range = read_range
        self.size = size
        self._cache: LRU[tuple, tuple[np.ndarray, int]] = LRU(4096, max_weight=max_bytes,
                                                                 weigh=lambda v: v[0].nbytes + 64)
        self._flights: SingleFlight[tuple, tuple[np.ndarray, int]] = SingleFlight()
        self.reads = 0  # indexes read (not found in the cache)

    async def index(self, ref: Any, layout: ShardLayout) -> tuple[np.ndarray, int]:
        """(the index, the shard's length) of the shard at ``ref``."""
        where = ((ref.url, ref.offset, ref.length) if ref.url is not None
                 else xxhash.xxh3_128_digest(ref.data or b""))  # inline: no copy of it
        key = (where, layout.index_key, layout.index_nbytes)
        found = self._cache.get(key)
        if found is not None:
            return found
        return await self._flights.run(key, lambda: self._load(key, ref, layout))

    async def _load(self, key: tuple, ref: Any, layout: ShardLayout) -> tuple[np.ndarray, int]:
        total = await self.size(ref)
        n = layout.index_nbytes
        if total < n:
            raise ShardError(f"shard of {total:,} bytes is shorter than its {n:,}-byte index")
        off = total - n if layout.at_end else 0
        stored = bytes(await self.read_range(ref, off, n))
        if len(stored) != n:
            raise ShardError(f"shard index: read {len(stored):,} bytes of {n:,}")
        self.reads += 1
        if n > 1 << 20:  # a large index's checksum and copy off the event loop
            index = await trio.to_thread.run_sync(layout.decode_index, stored)
        else:
            index = layout.decode_index(stored)
        found = (index, total)
        self._cache.put(key, found)
        return found

    async def inner(self, ref: Any, layout: ShardLayout, number: int, bound: int | None) -> Any:
        """The stored bytes of inner chunk ``number`` of the shard at ``ref``; None when the
        index marks it empty (it reads as the fill value). ``bound``: the most stored bytes
        its codecs can have made (None: not known)."""
        index, total = await self.index(ref, layout)
        off, length = (int(v) for v in index[number])
        if off == EMPTY and length == EMPTY:
            return None
        if off + length > total:
            raise ShardError(f"inner chunk {number} at {off:,}+{length:,} runs past the shard's "
                             f"{total:,} bytes")
        if bound is not None and length > bound:
            raise ShardError(f"inner chunk {number} is {length:,} bytes, more than its codecs "
                             f"make of a chunk ({bound:,})")
        data = await self.read_range(ref, off, length)
        if len(data) != length:
            raise ShardError(f"inner chunk {number}: read {len(data):,} bytes of {length:,}")
        return data
