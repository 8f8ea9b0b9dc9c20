"""``LRU``: a least-recently-used map bounded by a number of entries and/or a total weight.

The one bounded map of refmount: the memory block cache (weight: bytes), the Parquet
record cache (entries and bytes), and the small per-target state of the read path (where a
target's reads got to, its size, a remembered failure), which must not grow with the
number of targets a long-running mount meets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """``get`` refreshes an entry, ``peek`` does not; ``put`` evicts the least recently
    used entries while more than ``max_items`` are held or their total weight
    (``weigh(value)``) is over ``max_weight``. An entry heavier than ``max_weight`` by
    itself is not stored, unless ``keep_newest``: then the newest entry is always kept."""

    __slots__ = ("_items", "evictions", "keep_newest", "max_items", "max_weight", "peek", "weigh",
                 "weight")

    def __init__(
        self,
        max_items: int | None = None,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
        keep_newest: bool = False,
    ) -> None:
        if max_items is None and max_weight is None:
            raise ValueError("an LRU needs a bound")
        if max_weight is not None and weigh is None:
            raise ValueError("max_weight needs weigh")
        self.max_items = max_items
        self.max_weight = max_weight
        self.weigh = weigh
        self.keep_newest = keep_newest
        self.weight = 0
        self.evictions = 0  # entries dropped to stay within the bounds (the metrics read it)
        self._items: OrderedDict[K, V] = OrderedDict()
        self.peek: Callable[[K], V | None] = self._items.get  # no recency: a plain dict lookup

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        items = self._items
        weigh = self.weigh
        w = 0
        if weigh is not None:
            w = weigh(value)
            if self.max_weight is not None and w > self.max_weight and not self.keep_newest:
                return
        old = items.pop(key, None)
        if old is not None and weigh is not None:
            self.weight -= weigh(old)
        items[key] = value
        self.weight += w
        max_items, max_weight = self.max_items, self.max_weight
        while (max_items is not None and len(items) > max_items) or (
            max_weight is not None and self.weight > max_weight and len(items) > 1
        ):
            _, evicted = items.popitem(last=False)
            self.evictions += 1
            if weigh is not None:
                self.weight -= weigh(evicted)

    def pop(self, key: K) -> V | None:
        value = self._items.pop(key, None)
        if value is not None and self.weigh is not None:
            self.weight -= self.weigh(value)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def values(self) -> Iterator[V]:
        return iter(self._items.values())
