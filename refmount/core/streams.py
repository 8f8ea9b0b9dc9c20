"""``Streams``: the sequential streams of reads of each target, found from their positions.

The kernel keeps readahead state per open file: two processes reading one file each have
their own window. Reads across keys have no open file that spans them -- each key is a file
of its own, and over HTTP each key a request of its own -- so a stream is found from where
reads are: a read belongs to the stream whose reads it continues (the caller's rule, in
``readahead.continues``), the nearest one when several would take it, and starts a stream
of its own when none does. Several readers going through one target at different places
(Dask workers, each reading its slab of an array whose chunks lie in one file; HTTP clients
of one server, each reading a slice) then keep one stream each, with its own state, instead
of restarting one another's.

Bounded: at most ``per_target`` streams of a target (the least recently continued one makes
room for a new one) and ``max_streams`` in all (the least recently used target gives up its
oldest stream). A random reader's reads start streams that nothing continues; they are the
first to go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Positioned(Protocol):
    """A stream's state: ``end`` is where its reads got to (in the policy's own unit)."""

    end: int


T = TypeVar("T", bound=Positioned)


class Streams(Generic[T]):
    """Per target (a URL), its streams, most recently continued last."""

    __slots__ = ("_count", "_targets", "max_streams", "per_target")

    def __init__(self, per_target: int = 16, max_streams: int = 16_384) -> None:
        if per_target < 1 or max_streams < 1:
            raise ValueError("streams need a bound of at least one")
        self.per_target = per_target
        self.max_streams = max_streams
        self._targets: OrderedDict[str, list[T]] = OrderedDict()
        self._count = 0

    def find(self, url: str, start: int, takes: Callable[[T], bool]) -> T | None:
        """The stream of ``url`` that a read from ``start`` continues (``takes(stream)``),
        the one whose ``end`` is nearest ``start`` when several do; it becomes the most
        recently used. None when no stream takes it."""
        streams = self._targets.get(url)
        if not streams:
            return None
        best: T | None = None
        best_at, distance = -1, 0
        for i, stream in enumerate(streams):
            if takes(stream):
                d = abs(start - stream.end)
                if best is None or d < distance:
                    best, best_at, distance = stream, i, d
        if best is not None:
            if best_at != len(streams) - 1:
                streams.append(streams.pop(best_at))
            self._targets.move_to_end(url)
        return best

    def add(self, url: str, stream: T) -> None:
        """A new stream of ``url``, the most recently used; the least recently used streams
        go beyond the bounds."""
        streams = self._targets.get(url)
        if streams is None:
            streams = self._targets[url] = []
        else:
            self._targets.move_to_end(url)
        streams.append(stream)
        self._count += 1
        if len(streams) > self.per_target:
            del streams[0]
            self._count -= 1
        while self._count > self.max_streams:
            oldest, theirs = next(iter(self._targets.items()))
            del theirs[0]
            self._count -= 1
            if not theirs:
                del self._targets[oldest]

    def of(self, url: str) -> list[T]:
        """The streams of ``url``, least recently used first (no recency change)."""
        return list(self._targets.get(url, ()))

    def __iter__(self) -> Iterator[T]:
        for streams in self._targets.values():
            yield from streams

    def __len__(self) -> int:
        """All streams held (at most ``max_streams``)."""
        return self._count

    @property
    def targets(self) -> int:
        """The targets with a stream held."""
        return len(self._targets)
