"""Fetching bytes of reference targets through fsspec, from trio, without blocking it:
``Fetcher``, each target read where its target rule says, with the rule's options
(``targets/filesystems.py``), under one deadline with retries and mirrors
(``targets/retries.py``), neighbouring ranges merged into one request, HTTP ranges checked
(``targets/httpread.py``) and only the pinned version of a target served (``-o pins``). An HTTP
redirect is a new target: followed only where ``targets/redirects.py`` allows, with the options
of the rule that covers its location.

The daemon runs trio as a guest of an asyncio loop and fsspec's async filesystems are bound
to it (``targets/filesystems.py``). Every fetch has a deadline covering its retries; cancellation
propagates into the asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import trio
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from refmount.base.errors import FetchError
from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.base.singleflight import Flight
from refmount.base.stats import Stats
from refmount.base.urls import protocol
from refmount.targets.filesystems import CredentialProvider, FileSystems
from refmount.targets.httpread import http_range, http_version
from refmount.targets.inflight import LinkEstimates
from refmount.targets.pins import Pins, Version, VersionChanged
from refmount.targets.policy import TargetPolicy
from refmount.targets.rangeanswers import RangesIgnored, ShortRead, Sink, past_end
from refmount.targets.redirects import Redirected, RedirectPolicy, RedirectRefused
from refmount.targets.retries import Retries
from refmount.targets.rules import Rule, TargetRules
from refmount.targets.virtualaccess import VirtualAccess

log = logging.getLogger(__name__)


def is_http(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is fsspec's HTTP filesystem, without importing it (and aiohttp, a few
    tenths of a second of every daemon's start) for a set whose targets are not on HTTP: no
    instance exists before fsspec has imported the module."""
    module = sys.modules.get("fsspec.implementations.http")
    return module is not None and isinstance(fs, module.HTTPFileSystem)


class _Wanted(Flight[bytes]):
    """One range waiting for a (possibly merged) request: a flight its reader waits for."""

    __slots__ = ("end", "start")

    def __init__(self, start: int, end: int) -> None:
        super().__init__()
        self.start = start
        self.end = end


def merge_ranges(wanted: list[_Wanted], gap: int, limit: int) -> list[list[_Wanted]]:
    """Group ranges (sorted by start) whose neighbours are at most ``gap`` bytes apart,
    up to ``limit`` bytes per group."""
    groups: list[list[_Wanted]] = []
    for w in wanted:
        if groups:
            g = groups[-1]
            lo, hi = g[0].start, max(x.end for x in g)
            if w.start - hi <= gap and max(hi, w.end) - lo <= limit:
                g.append(w)
                continue
        groups.append([w])
    return groups


class Fetcher(FileSystems, Retries):
    """Byte ranges, sizes and versions of targets, read from trio: its file systems and routes
    are ``FileSystems``', its attempts ``Retries``'; merging and version pins are its own."""

    # With this many requests to one target in flight, new ranges for it wait (at most
    # MERGE_WAIT s, or until one completes) so that neighbours arriving meanwhile merge.
    MERGE_BUSY = 4
    MERGE_WAIT = 0.002

    def __init__(
        self,
        remote_options: dict[str, Any],
        policy: TargetPolicy,
        *,
        timeout: float,
        retries: int,
        max_connections: int,
        stats: Stats,
        merge_gap: int = -1,
        merge_limit: int = 4 * 2**20,
        rules: TargetRules | None = None,
        credentials: CredentialProvider | None = None,
        pins: Pins | None = None,
        virtual: VirtualAccess | None = None,
    ) -> None:
        self.remote_options = remote_options
        self.pins = pins  # -o pins: only the pinned version of each target is served
        self.rules = rules if rules is not None else TargetRules()
        # Which HTTP redirects are followed (``virtual``: the set's virtual chunks, if any).
        self.redirects = RedirectPolicy(self.rules, policy, virtual)
        self._refusals: LRU[str, bool] = LRU(1024)  # refused redirects already logged
        self._credentials = credentials
        # Routes are asked for by every disk-cache key (worker threads too): lru_cache locks.
        self._route = functools.lru_cache(maxsize=1 << 16)(functools.partial(policy.route, self.rules))
        self._static: dict[int, dict[str, Any]] = {}  # rule number (0: none) -> its options
        self._down: dict[tuple[int, int], float] = {}  # (rule, mirror) -> down until (trio time)
        self.policy = policy
        self.timeout = timeout
        self.retries = retries
        self.stats = stats
        self.max_connections = max_connections
        self._host_limiters: dict[str, trio.CapacityLimiter] = {}
        self._threads = trio.CapacityLimiter(max(4, min(max_connections, 32)))
        # One file system per (rule number, credential generation, protocol): targets under
        # different rules may need other credentials or endpoints.
        self._fs: dict[tuple[int, int, str], AbstractFileSystem] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.merge_gap = merge_gap
        self.merge_limit = merge_limit
        self._nursery: trio.Nursery | None = None
        self._queued: dict[str, list[_Wanted]] = {}
        self._busy: dict[str, int] = {}  # requests in flight per target
        self._freed: dict[str, trio.Event] = {}  # set when one of them completes
        self.links = LinkEstimates()  # latency and bandwidth per host, for readahead
        self._rangeless: LRU[str, bool] = LRU(1024)  # hosts named as ignoring Range

    def attach(self, nursery: trio.Nursery) -> None:
        """Where merged requests run (the daemon's nursery); merging is off without one."""
        self._nursery = nursery

    async def cat_range(self, url: str, start: int, end: int, *, upto: bool = False) -> bytes:
        """Bytes [start, end) of the target; raises FetchError (never returns short).
        With ``upto`` (readahead): bytes from ``start`` up to ``end`` or the end of the
        target, whichever comes first, by a request of its own (never merged).

        Ranges of one target asked for in the same scheduling round (many readers of
        neighbouring chunks, a busy daemon with FUSE requests queued) are merged into
        one request when they are at most ``merge_gap`` apart: under load, the per-request
        work of the HTTP client is what limits small reads."""
        if upto or self._nursery is None or self.merge_gap < 0 or end - start >= self.merge_limit:
            data = await self._cat_range(url, start, end, upto)
            assert isinstance(data, bytes)
            return data
        wanted = _Wanted(start, end)
        queue = self._queued.get(url)
        if queue is None:
            queue = self._queued[url] = []
            self._nursery.start_soon(self._dispatch, url)
        queue.append(wanted)
        data = await wanted.wait()  # if we are cancelled the request goes on for the others
        assert data is not None
        return data

    async def stream_range(self, url: str, start: int, end: int, sink: Sink) -> int:
        """``cat_range(url, start, end, upto=True)`` (readahead), the bytes going to ``sink``
        as they arrive instead of being returned; how many there were. HTTP(S) targets read
        on trio's thread stream their body; other backends give it in one piece once it is
        all there. Readers can then take their part of a long request before its end."""
        data = await self._cat_range(url, start, end, True, sink)
        if isinstance(data, int):
            return data
        sink(0, data)
        return len(data)

    async def _dispatch(self, url: str) -> None:
        await trio.lowlevel.checkpoint()  # let the other requests of this round queue up
        if self._busy.get(url, 0) >= self.MERGE_BUSY:
            # Busy target: hold the new ranges until a request completes (briefly at most),
            # so that ranges arriving meanwhile go out together.
            freed = self._freed.get(url)
            if freed is None:
                freed = self._freed[url] = trio.Event()
            with trio.move_on_after(self.MERGE_WAIT):
                await freed.wait()
        wanted = sorted(self._queued.pop(url), key=lambda w: w.start)
        assert self._nursery is not None
        for group in merge_ranges(wanted, self.merge_gap, self.merge_limit):
            self._nursery.start_soon(self._fetch_group, url, group)

    async def _fetch_group(self, url: str, group: list[_Wanted]) -> None:
        lo, hi = group[0].start, max(w.end for w in group)
        self._busy[url] = self._busy.get(url, 0) + 1
        try:
            try:
                data = await self._cat_range(url, lo, hi)
                assert isinstance(data, bytes)
            except Exception as e:
                if len(group) == 1 or (isinstance(e, FetchError) and e.timed_out):
                    raise
                # One bad range (a reference past the end of its target) must not fail
                # the good ones merged with it: each is asked for on its own.
                async with trio.open_nursery() as nursery:
                    for w in group:
                        nursery.start_soon(self._fetch_alone, url, w)
            else:
                if len(group) > 1:
                    self.stats.merged += len(group)
                for w in group:
                    w.result = data[w.start - lo : w.end - lo] if len(group) > 1 else data
        except Exception as e:  # each waiter raises it; the nursery must not see it
            for w in group:
                w.error = e
        finally:
            for w in group:
                if w.result is None and w.error is None:  # cancelled: unmounting
                    w.error = FetchError(url, "request cancelled")
                w.done.set()
            if (busy := self._busy[url] - 1) > 0:
                self._busy[url] = busy
            else:
                del self._busy[url]
            freed = self._freed.pop(url, None)
            if freed is not None:
                freed.set()

    async def _fetch_alone(self, url: str, w: _Wanted) -> None:
        try:
            data = await self._cat_range(url, w.start, w.end)
            assert isinstance(data, bytes)
            w.result = data
        except Exception as e:
            w.error = e

    async def _cat_range(self, url: str, start: int, end: int, upto: bool = False,
                         sink: Sink | None = None) -> bytes | int:
        """The bytes; with ``sink``, the number of bytes where they streamed to it."""
        rule = self.route(url).rule
        want = end - start
        pin = self.pins.check(url) if self.pins is not None else None

        async def op(target: str) -> bytes | int:
            fs, path = await self._open(rule, target)
            if pin is None:
                return await plain_op(target, fs, path)
            try:
                return await pinned_op(target, fs, path, pin)
            except VersionChanged as e:
                assert self.pins is not None
                raise self.pins.refuse(url, str(e)) from None

        async def pinned_op(target: str, fs: AbstractFileSystem, path: str, pin: Version) -> bytes | int:
            """The bytes of the pinned version only: checked on the response (HTTP), the
            descriptor (local files) or the object version (s3 with a version id); other
            stores are asked for the version before and after the read."""
            if is_http(fs) or isinstance(fs, LocalFileSystem):
                return await plain_op(target, fs, path)
            if pin.version_id is not None and protocol(self.policy.full_url(target)) in ("s3", "s3a"):
                return await plain_op(target, fs, path, version_id=pin.version_id)
            await self._same_version(target, fs, path, pin)
            data = await plain_op(target, fs, path)
            await self._same_version(target, fs, path, pin)
            return data

        async def plain_op(target: str, fs: AbstractFileSystem, path: str, **version: Any) -> bytes | int:
            if is_http(fs):
                reason = self.policy.problem(target, resolve=False)
                if reason:
                    raise FetchError(target, reason, errno.EACCES)
                # The body streams to ``sink`` only where it is read on trio's own thread.
                streams = sink is not None and self._loop is not None and getattr(fs, "asynchronous", False)
                data = await self._http(url, rule, target, fs, path, lambda fs, path: http_range(
                    fs, path, start, end, upto, pin, sink if streams else None))
                if isinstance(data, int):  # streamed: checked as it came (http_range)
                    if upto and not data:
                        raise ValueError(f"nothing at {start}: past the end of the target")
                    if data != want and not (upto and data < want):
                        raise ShortRead(f"got {data} bytes, expected {want}")
                    return data
            elif pin is not None and isinstance(fs, LocalFileSystem):
                data = await self._call(target, fs, "cat_file", path, start=start, end=end, expect=pin)
            else:
                try:
                    data = await self._call(target, fs, "cat_file", path, start=start, end=end,
                                            **version)
                except (OSError, ValueError) as e:
                    # s3 (and others) answer a range that starts past the end with an error:
                    # past the end only if the target's size says so.
                    if upto or start == 0 or isinstance(e, FileNotFoundError | PermissionError):
                        raise
                    info = await self._call(target, fs, "info", path)
                    if (past := past_end(url, start, end, info.get("size"), b"")) is None:
                        raise
                    raise past from None
            if not isinstance(data, bytes | bytearray | memoryview):
                raise FetchError(url, f"bytes {start}-{end}: backend returned {type(data)}")
            if upto and not data:
                raise ValueError(f"nothing at {start}: past the end of the target")
            if len(data) < want and not upto and not is_http(fs):
                # Short: past the end of the target, or a short answer (retried)?
                info = await self._call(target, fs, "info", path)
                past = past_end(url, start, end, info.get("size"), bytes(data))
                if past is not None:
                    raise past
            if len(data) != want and not (upto and len(data) < want):
                # A server that ignores Range, or a target shorter than its reference.
                raise ShortRead(f"got {len(data)} bytes, expected {want}")
            return bytes(data)

        began = trio.current_time()
        try:
            data = await self._with_retries(url, f"bytes {start}-{end}", op)
        except RangesIgnored as e:
            host = urlsplit(e.url).netloc.rpartition("@")[2]  # the server asked; never the userinfo
            if self._rangeless.get(host) is None:
                self._rangeless.put(host, True)
                log.warning("the server %s ignores Range requests (it answers 200 with the whole "
                            "file): its targets cannot be read; serve them with a server that "
                            "supports ranges (nginx, Apache, an object store)", host)
            raise
        got = data if isinstance(data, int) else len(data)
        took = trio.current_time() - began
        self.stats.fetched(url, got, took)
        self.links.of(url).observe(got, took)
        if log.isEnabledFor(logging.DEBUG):  # bench/diagnostics/inflight.py draws the timeline from these
            log.debug("request %s bytes %d-%d: %d bytes, began %.6f, took %.6f s",
                      redact_url(url), start, end, got, began, trio.current_time() - began)
        return data

    async def _same_version(self, url: str, fs: AbstractFileSystem, path: str, pin: Version) -> None:
        """``VersionChanged`` unless the store reports the pinned version now."""
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)  # a listing cached by fsspec is no answer
        why = pin.mismatch(Version.from_info(await self._call(url, fs, "info", path)))
        if why is not None:
            raise VersionChanged(why)

    async def size(self, url: str) -> int:
        rule = self.route(url).rule
        pin = self.pins.check(url) if self.pins is not None else None

        async def op(target: str) -> int:
            fs, path = await self._open(rule, target)
            if is_http(fs):  # its HEAD, redirects followed as allowed (never by fsspec's info)
                seen = await self._http_version(url, rule, target, fs, path)
            else:
                seen = Version.from_info(await self._call(target, fs, "info", path))
            if pin is not None and (why := pin.mismatch(seen)) is not None:
                assert self.pins is not None
                raise self.pins.refuse(url, why)
            if seen.size is None:
                raise FetchError(url, "size: the storage does not report a size")
            return seen.size

        return await self._with_retries(url, "size", op)

    async def version(self, url: str) -> Version:
        """The target's version as its store reports it (size, ETag, modification time,
        version id), within ``timeout`` and with retries; a FetchError whose ``errno`` says
        why not (ENOENT missing, EACCES refused by the policy or the store)."""
        rule = self.route(url).rule

        async def op(target: str) -> Version:
            fs, path = await self._open(rule, target)
            if is_http(fs):
                return await self._http_version(url, rule, target, fs, path)
            with contextlib.suppress(Exception):
                fs.invalidate_cache(path)
            return Version.from_info(await self._call(target, fs, "info", path))

        return await self._with_retries(url, "version", op)  # type: ignore[no-any-return]

    async def _http_version(self, url: str, rule: Rule | None, target: str, fs: AbstractFileSystem,
                            path: str) -> Version:
        reason = self.policy.problem(target, resolve=False)
        if reason:
            raise FetchError(target, reason, errno.EACCES)
        return await self._http(url, rule, target, fs, path, http_version)  # type: ignore[no-any-return]

    async def _http(self, url: str, rule: Rule | None, target: str, fs: AbstractFileSystem, path: str,
                    call: Callable[[AbstractFileSystem, str], Coroutine[Any, Any, Any]]) -> Any:
        """``call(fs, path)``, a request of ``targets/httpread.py`` for the target ``url`` read
        from ``target`` under ``rule``; a redirect it answers is followed where
        ``self.redirects`` allows (the next request with the options of the rule that covers
        the location, on that rule's file system), else the read fails with a FetchError that
        names the redirect (logged once as a warning)."""
        chain = [target]
        while True:
            try:
                return await self._run(fs, call(fs, path))
            except Redirected as redirect:
                try:
                    hop = self.redirects.follow(url, rule, chain, redirect)
                except RedirectRefused as e:
                    why = str(e)
                    if self._refusals.get(why) is None:
                        self._refusals.put(why, True)
                        log.warning("target %s: %s", redact_url(url), why)
                    raise FetchError(url, why, errno.EACCES) from None
                chain.append(hop.url)
                fs, path = await self._open(hop.rule, hop.url)
