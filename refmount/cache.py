"""Byte caches. ``MemoryLRU``: a bounded in-memory LRU of immutable byte blocks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class MemoryLRU:
    """Least-recently-used map of key -> bytes, bounded by total byte size."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()

    def get(self, key: Hashable) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def put(self, key: Hashable, data: bytes) -> None:
        if len(data) > self.capacity:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= len(old)
        self._items[key] = data
        self.size += len(data)
        while self.size > self.capacity:
            _, evicted = self._items.popitem(last=False)
            self.size -= len(evicted)

    def __len__(self) -> int:
        return len(self._items)
