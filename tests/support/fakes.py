"""Fakes for the read path's unit tests (no FUSE, no network): a target answering after a
latency of trio's virtual time, a disk cache whose presence filter is exact, a cache writer
that records, a readahead loader that records, and ``run`` under trio's ``MockClock``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

from refmount.core.blockstore import BlockKey, Fetch
from refmount.targets.inflight import LinkEstimates
from refmount.targets.rangeanswers import PastEnd

KiB, MiB = 2**10, 2**20
URL = "http://example.invalid/data.bin"


_PATTERN = bytes(range(251)) * (65 * MiB // 251 + 1)  # byte i of the target is i % 251


def content(start: int, end: int) -> bytes:
    return _PATTERN[start:end]


class NoPolicy:
    def problem(self, url: str, *, resolve: bool) -> str | None:
        return None


class StreamsWhole:
    """``stream_range`` (what readahead asks of a fetcher) from a fake's ``cat_range``: the
    range in one piece once it is all there, as backends that do not stream give it."""

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        raise NotImplementedError

    async def stream_range(self, url: str, start: int, end: int,
                           sink: Callable[[int, bytes], None]) -> int:
        data = await self.cat_range(url, start, end, upto=True)
        sink(0, data)
        return len(data)


class FakeFetcher(StreamsWhole):
    """A target of ``size`` bytes answering after ``latency`` (virtual) seconds; records
    every request. ``fail`` (an exception) makes every request fail after ``latency``."""

    def __init__(self, size: int = 64 * MiB, latency: float = 0.05) -> None:
        self.size_ = size
        self.latency = latency
        self.requests: list[tuple[int, int]] = []
        self.fail: BaseException | None = None
        self.links = LinkEstimates()  # as the Fetcher's: what readahead sizes its window from
        self.policy = NoPolicy()

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        self.requests.append((start, end))
        await trio.sleep(self.latency)
        if self.fail is not None:
            raise self.fail
        if end > self.size_ and not upto:
            raise PastEnd(url, start, end, self.size_, content(start, self.size_))
        return content(start, min(end, self.size_))

    async def size(self, url: str) -> int:
        await trio.sleep(self.latency)
        return self.size_

    def problem(self, url: str, *, resolve: bool) -> str | None:
        """As the Fetcher's: the policy's verdict on where ``url`` is read."""
        return self.policy.problem(url, resolve=resolve)


class FakeDisk:
    """A disk cache of the blocks in ``blocks``; its presence filter knows them exactly."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[str, int, int], bytes] = {}
        self.false_positives: set[tuple[str, int, int]] = set()
        self.gets: list[tuple[str, int, int]] = []

    def may_contain(self, url: str, start: int, length: int) -> bool:
        return (url, start, length) in self.blocks or (url, start, length) in self.false_positives

    def get(self, url: str, start: int, length: int, *, upto: bool = False) -> bytes | None:
        self.gets.append((url, start, length))
        return self.blocks.get((url, start, length))


class FakeWriter:
    def __init__(self) -> None:
        self.submitted: list[tuple[str, int, int, int | None]] = []

    def submit(self, url: str, start: int, data: Any, key_length: int | None = None) -> None:
        self.submitted.append((url, start, len(data), key_length))


def run(main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


class FakeLoader:
    """A ``readahead.Loader`` that records: ``loads`` the byte ranges asked for (as
    (start, end) of the target), ``fetched`` whether each was to be fetched (else disk
    only). ``on_disk(key)`` says what the disk may have (everything by default)."""

    def __init__(self, background: trio.Nursery | None = None,
                 on_disk: Callable[[BlockKey], bool] = lambda key: True) -> None:
        self._background = background
        self.on_disk = on_disk
        self.keys: set[BlockKey] = set()
        self.loads: list[tuple[int, int]] = []
        self.fetched: list[bool] = []

    @property
    def background(self) -> trio.Nursery | None:
        return self._background

    def busy(self, key: BlockKey) -> bool:
        return key in self.keys

    def may_be_on_disk(self, key: BlockKey) -> bool:
        return self.on_disk(key)

    def fetch_of(self, key: BlockKey) -> Fetch:
        async def fetch() -> bytes:
            return content(key.start, key.start + key.length)
        return fetch

    def prefetch(self, key: BlockKey, fetch: Fetch | None = None, *, upto: bool = False) -> None:
        self.keys.add(key)
        self.loads.append((key.start, key.start + key.length))
        self.fetched.append(fetch is not None)
