"""Readahead: what to load before a reader asks for it, and when to stop.

One rule says whether reads go on in order (``continues``: a read starting at most a slack
past where the stream's reads got to, and at most some distance behind them); each policy
applies it with its own slack, and ``OrderDetector`` applies it to the first reads of each
target's keys. Three policies decide what to load next, all behind one interface
(``Readahead``: ``note(stream, start, end, loader)``, a read happened there), and ask the
block store for it (the ``Loader`` interface: is a block there or coming, may it be on disk,
how to fetch it, load it in the background):

* ``HandleReadahead`` — per open file of a large range or a whole target, read in blocks:
  a window that doubles while each read starts exactly where the last ended (up to
  ``max_readahead``) and stops at the first seek.
* ``GridReadahead`` — keys served from grid blocks on disk: while they follow on (the same
  block or the next), the next grid blocks are loaded from disk (never fetched), up to the
  end of what the disk has.
* ``TargetReadahead`` — across keys: a reader going through a target front to back
  (``core/targetreadahead.py``);
  it fetches stretches itself, and ``AcrossKeys`` puts it behind the interface.

Readers found at different places of one target keep a stream each (``Streams``, as the
kernel keeps readahead per open file): ``OrderDetector``, ``GridReadahead`` and
``TargetReadahead`` keep their state per stream, each stream found from the positions its
reads continue. All such state is bounded (streams per target and in all, the least recently
continued forgotten first), and prefetched bytes within a capacity.

Readahead across references (``TargetReadahead``, behind ``AcrossKeys``) is
``core/targetreadahead.py``; the stretches it holds are ``core/stretches.py``.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Protocol, TypeVar

from refmount.base.background import Background
from refmount.core.blockstore import BlockKey, Fetch, block_of
from refmount.core.streams import Streams

log = logging.getLogger(__name__)


SLACK = 2**20  # a read starting within this of where the last one ended continues it


def continues(start: int, end: int, *, front: int, behind: int, slack: int = SLACK) -> bool:
    """The one rule for "in order": a read starting at ``start`` continues a stream whose
    furthest read ended at ``end`` when it starts at most ``slack`` past ``front`` (``end``,
    or further where readahead has run ahead) and at most ``behind`` before ``end``."""
    return end - behind <= start <= front + slack


class _Position:
    __slots__ = ("end",)

    def __init__(self, end: int) -> None:
        self.end = end


class OrderDetector:
    """Per stream of a target's keys (``Streams``): where its last read of a key for the
    first time ended, and whether the next one starts near there (``continues`` within
    ``SLACK`` either way). Bounded: at most ``per_target`` streams of a target and
    ``max_streams`` in all, the least recently continued forgotten first."""

    __slots__ = ("_streams", "slack")

    def __init__(self, max_streams: int = 16_384, slack: int = SLACK, per_target: int = 16) -> None:
        self._streams: Streams[_Position] = Streams(per_target, max_streams)
        self.slack = slack

    def follows(self, url: str, start: int, end: int) -> bool:
        """Whether [start, end) follows the last read of a stream of ``url``; that stream
        (or a new one) now ends at ``end``."""
        slack = self.slack
        stream = self._streams.find(
            url, start, lambda s: continues(start, s.end, front=s.end, behind=slack, slack=slack))
        if stream is None:
            self._streams.add(url, _Position(end))
            return False
        stream.end = end
        return True

    def __len__(self) -> int:
        """The streams remembered."""
        return len(self._streams)


class Loader(Protocol):
    """What a readahead policy may ask of the block store (``BlockStore.loader``)."""

    @property
    def background(self) -> Background | None:
        """Where loads ahead run (started from trio or from the host loop)."""
        ...

    def busy(self, key: BlockKey) -> bool:
        """In memory, or being loaded."""
        ...

    def may_be_on_disk(self, key: BlockKey) -> bool: ...

    def fetch_of(self, key: BlockKey) -> Fetch:
        """How to fetch the block from its target."""
        ...

    def prefetch(self, key: BlockKey, fetch: Fetch | None = None, *, upto: bool = False) -> None:
        """Load in the background (without ``fetch``: from disk only)."""
        ...


S = TypeVar("S", contravariant=True)


class Readahead(Protocol[S]):
    """A readahead policy: told of each read, it loads what should follow.

    ``note(stream, start, end, loader)``: bytes [start, end) of ``stream`` were read. What a
    stream is depends on the policy: an open file (``OpenFile``), a target's keys served from
    grid blocks (the target's URL), a target's keys read one by one (``TargetRead``). While
    reads continue each other (``continues``, with the policy's own slack) the policy asks
    ``loader`` for what follows, never more than its bound ahead of the reader; after a seek
    it loads nothing until reads continue again. With ``loader`` None it only follows the
    reads (there is no background to load in). It never waits: loads run in the loader's
    background."""

    def note(self, stream: S, start: int, end: int, loader: Loader | None) -> None: ...


class ReadState:
    """Per open file: where the last read ended and how far ahead to prefetch."""

    __slots__ = ("last_end", "window")

    def __init__(self) -> None:
        self.last_end = -1
        self.window = 0


class OpenFile(NamedTuple):
    """An open file read in blocks: its ``ReadState``, and the bytes of the target it is
    (``total`` bytes of ``url`` from ``base``)."""

    state: ReadState
    url: str
    base: int
    total: int


class HandleReadahead:
    """Per open file read in blocks: the window grows (doubling from two blocks, up to
    ``max_readahead``) while reads follow each other exactly (``continues`` with no slack
    either way), and is dropped at a seek (a read elsewhere than where the last ended, other
    than a read from the start). ``Readahead[OpenFile]``."""

    __slots__ = ("block_size", "max_readahead")

    SLACK = 0  # a read continues only where the last one ended
    BEHIND = 0

    def __init__(self, block_size: int, max_readahead: int) -> None:
        self.block_size = block_size
        self.max_readahead = max_readahead

    def note(self, stream: OpenFile, start: int, end: int, loader: Loader | None) -> None:
        """A read of [start, end) of an open file: its next blocks start loading."""
        state, url, base, total = stream
        ahead = self.advance(state, start, end, total)
        if ahead and loader is not None:
            for b in ahead:
                key = block_of(url, base, total, self.block_size, b)
                if not loader.busy(key):
                    loader.prefetch(key, loader.fetch_of(key))

    def advance(self, state: ReadState, off: int, end: int, total: int) -> range:
        """A read of [off, end) of a file of ``total`` bytes: the blocks to load ahead."""
        bs = self.block_size
        last_end = state.last_end
        if continues(off, last_end, front=last_end, behind=self.BEHIND, slack=self.SLACK):
            state.window = min(max(state.window * 2, 2 * bs), self.max_readahead)
        elif off != 0:
            state.window = 0  # a seek: stop prefetching until the reader streams again
        state.last_end = end
        if not state.window:
            return range(0)
        last = min((end + state.window - 1) // bs, (total - 1) // bs)
        return range((end - 1) // bs + 1, last + 1)


class _GridRun:
    __slots__ = ("ahead", "end")

    def __init__(self, block: int) -> None:
        self.end = block  # the last block served
        self.ahead = block  # loaded up to here


class GridReadahead:
    """Keys served from grid blocks: per stream of a target's keys (``Streams``), while they
    go on in order (``continues`` in blocks: the same block or the next), the following
    blocks on disk are loaded ahead (up to ``max_readahead``), until the first that the disk
    certainly lacks. A key that continues no stream starts one, and loads nothing until keys
    follow on. ``Readahead[str]``: the stream is found from the target's URL and where the
    key lies."""

    SLACK = 1  # blocks: a key in the next block continues
    BEHIND = 0

    def __init__(self, block_size: int, max_readahead: int, max_streams: int = 16_384,
                 per_target: int = 16) -> None:
        self.block_size = block_size
        self.max_readahead = max_readahead
        self._runs: Streams[_GridRun] = Streams(per_target, max_streams)

    def _continues(self, k: int, last: int) -> bool:
        return continues(k, last, front=last, behind=self.BEHIND, slack=self.SLACK)

    def in_order(self, url: str, start: int) -> bool:
        """Whether a key of ``url`` from ``start`` continues a stream of keys served (its
        block is the stream's last one or the next)."""
        k = start // self.block_size
        return any(self._continues(k, run.end) for run in self._runs.of(url))

    def note(self, stream: str, start: int, end: int, loader: Loader | None) -> None:
        """A key [start, end) of the target ``stream`` was served from grid blocks: load the
        next blocks from disk (``loader``: only blocks it may have on disk)."""
        url, k = stream, (end - 1) // self.block_size
        first = start // self.block_size
        run = self._runs.find(url, first, lambda r: self._continues(first, r.end) and k >= r.end)
        if run is None:
            self._runs.add(url, _GridRun(k))
            return
        run.end = k
        if loader is None:
            run.ahead = k
            return
        bs = self.block_size
        stop = k + max(1, self.max_readahead // bs)
        for j in range(max(run.ahead, k) + 1, stop + 1):
            gkey = BlockKey(url, j * bs, bs)
            if loader.busy(gkey):
                continue
            if not loader.may_be_on_disk(gkey):
                stop = j  # the cached part ends here
                break
            loader.prefetch(gkey, None, upto=True)
        run.ahead = max(run.ahead, stop)

    def __len__(self) -> int:
        """The streams remembered."""
        return len(self._runs)
