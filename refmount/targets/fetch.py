"""Fetching bytes of reference targets through fsspec, from trio, without blocking it.

The daemon runs trio as a guest of an asyncio loop (``daemon.serve``), and fsspec's async
filesystems (http, s3, gcs, ...) are bound to that same loop: a fetch is an asyncio task
created on the thread trio runs on, and its completion wakes the trio task through the
trio token. One thread runs all the Python of the read path, so the FUSE side and the
HTTP side never fight over the GIL (with fsspec's own loop thread, that contention cost
more CPU than the work itself). Without a bound loop (tools, tests) coroutines go to
fsspec's loop thread with ``run_coroutine_threadsafe``. Synchronous filesystems (local
files, chained URLs) run on trio worker threads under a capacity limiter. Every fetch
has a deadline covering its retries; cancellation propagates into the asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import random
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from urllib.parse import urlsplit

import fsspec
import trio
from fsspec.core import url_to_fs
from fsspec.implementations.http import HTTPFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from refmount.base.errors import FetchError
from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.base.singleflight import Flight
from refmount.base.stats import Stats
from refmount.base.urls import is_chained, protocol
from refmount.base.workers import await_future
from refmount.targets import localfile
from refmount.targets.credentials import merge_options
from refmount.targets.inflight import LinkEstimates
from refmount.targets.pins import Pins, Version, VersionChanged
from refmount.targets.policy import TargetPolicy
from refmount.targets.rules import Route, Rule, TargetRules, options_for

log = logging.getLogger(__name__)

# Errors that retrying cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
              ValueError, TypeError, NotImplementedError)


# A credential provider (targets/credentials.py): the storage options a rule's credential process
# gives now, with their generation (a new one after each refresh).
CredentialProvider = Callable[[Rule], Awaitable[tuple[int, dict[str, Any]]]]

# Where the bytes of a range go as they arrive (``Fetcher.stream_range``): ``sink(at, piece)``
# is bytes [at, at + len(piece)) from the start of the range, in order; a retry starts again
# at 0. Called on trio's thread (from the host loop or from trio), never from another.
Sink = Callable[[int, bytes], None]


def mirror_down(e: BaseException) -> bool:
    """Whether a failed attempt says the mirror is down — no connection, a time-out, a 5xx,
    408 or 429 — so that the next mirror is tried, rather than answering: a 404 or 403
    (raised as permanent errors before this is asked), another 4xx, a short or shifted
    range (retried on the same mirror)."""
    if isinstance(e, ShortRead):
        return False
    status = getattr(e, "status", None)  # aiohttp's ClientResponseError
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    return True


class ShortRead(OSError):
    """The target answered with fewer/more bytes than asked: retried, never served."""


class PastEnd(FetchError):
    """The range runs past the end of its target, whose size the storage told us (a
    Content-Range total, a 416, or the size of the target after a short answer): ``data``
    is what exists of the range (up to the end of the target; empty when the range starts
    at or after it). Permanent: never retried. Any other short answer stays a ShortRead."""

    def __init__(self, url: str, start: int, end: int, size: int, data: bytes) -> None:
        super().__init__(url, f"bytes {start}-{end}: the target ends at {size}")
        self.size = size
        self.data = data


def _past_end(url: str, start: int, end: int, size: int | None, data: bytes) -> PastEnd | None:
    """A PastEnd if ``data`` (the answer to bytes [start, end)) is short only because the
    target of ``size`` bytes ends inside the range; None for any other short answer."""
    if size is None or end <= size or len(data) != max(size - start, 0):
        return None
    return PastEnd(url, start, end, size, data)


class RangesIgnored(FetchError):
    """The server answered a Range request with the whole object and does not announce
    ``Accept-Ranges: bytes``: it does not serve ranges (``python -m http.server`` does not).
    Permanent: retrying asks the same server again."""

    def __init__(self, url: str, start: int, end: int) -> None:
        super().__init__(url, f"bytes {start}-{end - 1}: the server ignores Range requests "
                              "(it answered 200 with the whole file)")


def describe(exc: BaseException) -> str:
    """One line for a backend exception, with any URL in it redacted."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_url(f"{type(exc).__name__}: {text[:200]}")


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def check_response(pin: Version | None, headers: Any, size: int | None) -> None:
    """``VersionChanged`` if the response that carries the bytes is not the pinned version."""
    if pin is not None and (why := pin.mismatch(Version.from_headers(headers, size))) is not None:
        raise VersionChanged(why)


async def http_range(fs: Any, url: str, start: int, end: int, upto: bool = False,
                     pin: Version | None = None, sink: Sink | None = None) -> bytes | int:
    """GET bytes [start, end) through fsspec's HTTP session, like its ``_cat_file``, but
    checking what came back: a 206 must carry exactly the Content-Range asked for (a
    proxy or server bug that shifts the range must never be served, or cached, as data),
    and a 200 is accepted only when it is the whole object we asked for. With ``upto``,
    a range that ends early because the object does (Content-Range ``a-b/total`` with
    ``b = total - 1``) is accepted too.

    With ``pin``, the response must be that version of the target (its ETag, Last-Modified
    and the total size in its Content-Range), checked before any of its body is read; a
    strong pinned ETag is also sent as ``If-Match`` (a server answers 412 for another
    version). Otherwise ``VersionChanged``.

    With ``sink``, the body goes to it as it arrives, once the headers have been checked
    (never past the range asked for), and the number of its bytes is returned instead."""
    kw = fs.kwargs.copy()
    headers = kw.pop("headers", {}).copy()
    headers["Range"] = f"bytes={start}-{end - 1}"
    if pin is not None and pin.strong_etag is not None:
        headers["If-Match"] = pin.strong_etag
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status == 404:
            raise FileNotFoundError(url)
        if r.status == 412 and pin is not None:
            raise VersionChanged(f"the server's version does not match the pinned ETag {pin.etag} "
                                 "(412 Precondition Failed)")
        if r.status == 416:  # starts past the end of the target: retrying cannot help
            got = re.fullmatch(r"bytes\s+\*/(\d+)", r.headers.get("Content-Range", "").strip())
            check_response(pin, r.headers, int(got[1]) if got else None)
            if got and (past := _past_end(url, start, end, int(got[1]), b"")) is not None:
                raise past
            raise ValueError(f"range {start}-{end - 1} not satisfiable")
        r.raise_for_status()
        if r.status == 206:
            got = _CONTENT_RANGE.fullmatch(r.headers.get("Content-Range", "").strip())
            check_response(pin, r.headers, int(got[3]) if got and got[3] != "*" else None)
            at_eof = upto and got is not None and got[3] != "*" and int(got[2]) == int(got[3]) - 1
            if got and int(got[1]) == start and got[3] != "*" and int(got[2]) == int(got[3]) - 1 < end - 1 \
                    and not upto:
                # The range runs past the end of the target: what exists of it, if the
                # body is all of that (else it is a short answer like any other), and never
                # more of a body than that.
                data = await read_bounded(r, int(got[3]) - start)
                past = _past_end(url, start, end, int(got[3]), data)
                if past is None:
                    raise ShortRead(f"asked for bytes {start}-{end - 1}, got {len(data)} bytes "
                                    f"for Content-Range {r.headers.get('Content-Range')!r}")
                raise past
            if not got or int(got[1]) != start or (int(got[2]) != end - 1 and not at_eof):
                raise ShortRead(f"asked for bytes {start}-{end - 1}, server sent Content-Range "
                                f"{r.headers.get('Content-Range')!r}")
        elif r.status == 200:
            check_response(pin, r.headers, r.content_length)
            if start != 0 or r.content_length not in (None, end):
                if r.headers.get("Accept-Ranges", "").strip().lower() != "bytes":
                    raise RangesIgnored(url, start, end)  # a server without ranges: permanent
                # Retried: a proxy or cache may answer so once.
                raise ShortRead(f"server ignored the Range request (200 for bytes {start}-{end - 1})")
            if r.content_length is None:
                # No length given (chunked): read no more than asked for, plus one byte to
                # tell a longer body — never the whole object into memory.
                body = bytearray()
                while len(body) <= end and (piece := await r.content.read(end + 1 - len(body))):
                    body += piece
                if len(body) > end:
                    raise ShortRead(f"server ignored the Range request (200 for bytes 0-{end - 1})")
                return bytes(body)
        else:
            raise ShortRead(f"unexpected HTTP status {r.status} for a range request")
        # Never more than the range: an endless body (no length, or a lying one) is cut off.
        return await read_bounded(r, int(got[2]) - start + 1 if r.status == 206 else end - start, sink)


async def http_version(fs: Any, url: str) -> Version:
    """The version of an HTTP target: a ``HEAD`` (its Content-Length, ETag, Last-Modified); a
    ``GET`` of its first byte where the HEAD tells no size (the total of its Content-Range).
    FileNotFoundError for 404/410, PermissionError for 401/403."""
    kw = fs.kwargs.copy()
    headers = {**kw.pop("headers", {}), "Accept-Encoding": "identity"}
    session = await fs.set_session()
    for method in ("HEAD", "GET"):
        extra = {"Range": "bytes=0-0"} if method == "GET" else {}
        async with session.request(method, fs.encode_url(url), headers={**headers, **extra},
                                   **kw) as r:
            if r.status in (404, 410):
                raise FileNotFoundError(url)
            if r.status in (401, 403):
                raise PermissionError(errno.EACCES, f"HTTP {r.status} {r.reason or ''}".strip())
            if method == "GET" and r.status == 416:  # empty: bytes */0
                got = re.fullmatch(r"bytes\s+\*/(\d+)", r.headers.get("Content-Range", "").strip())
                if got:
                    return Version.from_headers(r.headers, int(got[1]))
            r.raise_for_status()
            size: int | None = None
            encoded = r.headers.get("Content-Encoding", "identity") not in ("identity", "")
            if method == "HEAD" and r.content_length is not None and not encoded:
                size = r.content_length
            elif method == "GET":
                got = _CONTENT_RANGE.fullmatch(r.headers.get("Content-Range", "").strip())
                if r.status == 206 and got and got[3] != "*":
                    size = int(got[3])
                elif r.status == 200 and r.content_length is not None and not encoded:
                    size = r.content_length
            if size is not None:
                return Version.from_headers(r.headers, size)
    raise ValueError("the server tells no size for it (no Content-Length, no Content-Range)")


async def read_bounded(r: Any, limit: int, sink: Sink | None = None) -> bytes | int:
    """The body of response ``r``, read piece by piece; ShortRead as soon as it is known to
    be longer than ``limit`` bytes (at most ``limit + 1`` bytes are ever held). With
    ``sink``, each piece goes there as it arrives (never past ``limit``) instead of being
    joined, and the number of bytes is returned."""
    if r.content_length is not None and r.content_length > limit:
        raise ShortRead(f"response body of {r.content_length} bytes for a range of {limit}")
    pieces, got = [], 0
    while got <= limit and (piece := await r.content.read(min(limit + 1 - got, 2**22))):
        if sink is not None:
            if got < limit:
                sink(got, piece if got + len(piece) <= limit else piece[: limit - got])
        else:
            pieces.append(piece)
        got += len(piece)
    if got > limit:
        raise ShortRead(f"response body longer than the {limit} bytes asked for: cut off")
    if sink is not None:
        return got
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def await_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` as a task of ``loop`` — the loop trio is a guest of, on this thread —
    and wait for it in trio; cancel it if we are cancelled."""
    task = loop.create_task(coro)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    task.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except BaseException:
        task.cancel()
        raise
    return task.result()


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


class Fetcher:
    # A mirror that failed (no connection, 5xx, time-out) is tried last for this long.
    MIRROR_DOWN = 30.0
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
    ) -> None:
        self.remote_options = remote_options
        self.pins = pins  # -o pins: only the pinned version of each target is served
        self.rules = rules if rules is not None else TargetRules()
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

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create async filesystems on ``loop``, the loop trio runs as a guest of."""
        self._loop = loop

    async def aclose(self) -> None:
        """Close the HTTP sessions of filesystems bound to our loop (on that loop)."""
        for fs in self._fs.values():
            session = getattr(fs, "_session", None)
            if getattr(fs, "asynchronous", False) and session is not None:
                with contextlib.suppress(Exception):
                    await session.close()

    async def _run(self, fs: AbstractFileSystem, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is not None and getattr(fs, "asynchronous", False):
            # Created by resolve() for our loop (asynchronous instances use the running loop).
            return await await_task(self._loop, coro)
        return await await_future(asyncio.run_coroutine_threadsafe(coro, fs.loop))

    # ---- where a target is read, and with which options ---------------------------------
    def route(self, url: str) -> Route:
        """Where the target ``url`` is read: resolved by the policy, rewritten by the target
        rule with the longest matching prefix (``targets/rules.py``), each mirror's URL."""
        return self._route(url)

    def problem(self, url: str, *, resolve: bool) -> str | None:
        """Why the target ``url`` may not be read (None if it may): the policy's verdict on
        every URL it is read from (after the target rules). ``resolve``: see
        ``TargetPolicy.problem``."""
        for target in self.route(url).urls:
            reason = self.policy.problem(target, resolve=resolve)
            if reason:
                return reason
        return None

    def static_options(self, rule: Rule | None) -> dict[str, Any]:
        """The storage options of targets under ``rule`` (None: no rule) as configured:
        ``remote_options`` with the rule's merged over them (not a credential process's)."""
        number = rule.number if rule is not None else 0
        options = self._static.get(number)
        if options is None:
            options = self._static[number] = options_for(rule, self.remote_options)
        return options

    def describe(self, url: str) -> dict[str, str]:
        """With target rules: the URL(s) ``url`` is read from (mirrors one per line) and the
        rule that applied ("none"), redacted, for xattrs. Without rules: nothing."""
        if not self.rules:
            return {}
        route = self.route(url)
        return {"resolved": "\n".join(redact_url(u) for u in route.urls),
                "rule": route.rule.describe() if route.rule is not None else "none"}

    async def _options_for(self, rule: Rule | None) -> tuple[int, dict[str, Any]]:
        """(generation, storage options) for targets under ``rule``. The one place options
        are computed for a fetch: a rule with a credential process gets that process's
        current options over its own, and a new generation when they are refreshed — a new
        file system instance then, while reads in flight finish on the old one."""
        options = self.static_options(rule)
        if rule is None or rule.credentials is None:
            return 0, options
        if self._credentials is None:
            raise FetchError(rule.prefix, f"target rule {rule.describe()}: credential processes "
                                          "are not supported by this version of refmount")
        generation, fresh = await self._credentials(rule)
        return generation, merge_options(options, fresh)

    async def _open(self, rule: Rule | None, url: str) -> tuple[AbstractFileSystem, str]:
        """The file system that reads ``url`` (a URL from a route) under ``rule``, and the
        path in it."""
        generation, options = await self._options_for(rule)
        if is_chained(url):  # chained URL: let fsspec build the chain each time (cached inside)
            return url_to_fs(url, **options)
        name = protocol(url)
        key = (rule.number if rule is not None else 0, generation, name)
        fs = self._fs.get(key)
        if fs is None:
            cls = fsspec.get_filesystem_class(name)
            options = dict(options)
            if rule is not None and rule.credentials is not None:
                # Refreshed credentials make new instances: none kept in fsspec's cache.
                options["skip_instance_cache"] = True
            if getattr(cls, "async_impl", False):
                if self._loop is not None:
                    options["asynchronous"] = True
                    # Our own instance: ``aclose`` closes its session, and fsspec's cache
                    # would hand the same one to every fetcher on this thread (each set of a
                    # catalogue, each version of a set being reloaded).
                    options["skip_instance_cache"] = True
                else:
                    options.setdefault("asynchronous", False)
            fs = self._fs[key] = cls(**options)
            self._retire_older(key, fs)
        return fs, fs._strip_protocol(url)

    def _retire_older(self, key: tuple[int, int, str], fs: AbstractFileSystem) -> None:
        """Forget the instances of older credential generations of ``key``'s rule and
        protocol; their sessions close once reads still using them are done (their
        deadline: ``timeout``)."""
        number, generation, name = key
        old = [k for k in self._fs if k[0] == number and k[2] == name and k[1] < generation]
        for k in old:
            previous = self._fs.pop(k)
            if previous is not fs and self._nursery is not None:
                self._nursery.start_soon(self._close_later, previous)

    async def _close_later(self, fs: AbstractFileSystem) -> None:
        await trio.sleep(2 * self.timeout)
        session = getattr(fs, "_session", None)
        if getattr(fs, "asynchronous", False) and session is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                await await_task(self._loop, session.close())

    def _mirror_order(self, route: Route) -> list[int]:
        """The mirrors of ``route`` in the order to try them: those not known to be down in
        the rule's order, then those that failed within ``MIRROR_DOWN`` s."""
        if len(route.urls) == 1 or route.rule is None:
            return [0]
        now = trio.current_time()
        number = route.rule.number
        up = [i for i in range(len(route.urls)) if self._down.get((number, i), 0.0) <= now]
        return up + [i for i in range(len(route.urls)) if i not in up]

    def _mark_down(self, route: Route, mirror: int, why: str, then: int | None) -> None:
        """Remember that a mirror failed (``why``); one log line when it was not known to be
        down (``then``: the mirror read next)."""
        assert route.rule is not None
        key = (route.rule.number, mirror)
        now = trio.current_time()
        was_up = self._down.get(key, 0.0) <= now
        self._down[key] = now + self.MIRROR_DOWN
        if was_up:
            rewrite = route.rule.rewrite
            log.warning("target rule %s: mirror %s failed (%s); %s for %g s",
                        route.rule.describe(), redact_url(rewrite[mirror]), why,
                        f"reading from mirror {redact_url(rewrite[then])}" if then is not None
                        else "no other mirror left to read from", self.MIRROR_DOWN)

    # ---- the bridge ---------------------------------------------------------------------
    # ``url`` is the URL read (a route's: after the target rules), for the policy.
    async def _call(self, url: str, fs: AbstractFileSystem, method: str, *args: Any, **kw: Any) -> Any:
        if getattr(fs, "async_impl", False) and (
            getattr(fs, "asynchronous", False) or getattr(fs, "loop", None) is not None
        ):
            reason = self.policy.problem(url, resolve=False)  # remote: no local I/O to do
            if reason:
                raise FetchError(url, reason, errno.EACCES)
            return await self._run(fs, getattr(fs, "_" + method)(*args, **kw))
        fn: Callable[..., Any] = getattr(fs, method)
        if isinstance(fs, LocalFileSystem):  # opened beneath the allowed directories, no symlinks
            fn = functools.partial(localfile.call, method, self.policy.roots)

        def checked() -> Any:
            # Local (or chained) target: resolve symlinks right before opening, in the thread.
            reason = self.policy.problem(url, resolve=True)
            if reason:
                raise FetchError(url, reason, errno.EACCES)
            return fn(*args, **kw)

        return await trio.to_thread.run_sync(checked, limiter=self._threads, abandon_on_cancel=True)

    def _limiter(self, url: str) -> trio.CapacityLimiter:
        """One bound per host, so a stalled server cannot take every slot from the others."""
        host = urlsplit(self.policy.full_url(url)).netloc.rpartition("@")[2] or "local"
        limiter = self._host_limiters.get(host)
        if limiter is None:
            limiter = self._host_limiters[host] = trio.CapacityLimiter(self.max_connections)
        return limiter

    async def _with_retries(self, url: str, what: str, op: Callable[[str], Awaitable[Any]]) -> Any:
        """Run ``op(target)`` with retries and exponential backoff, all within
        ``self.timeout``. ``target`` is the URL ``url`` is read from (``route``). With
        mirrors, each attempt reads from one mirror (never bytes of two in one answer): the
        first not known to be down; a mirror that is down (``mirror_down``; an attempt gets
        ``timeout / mirrors`` s) is remembered as such and the next one is tried at once,
        without using up a retry; an answer (404, 403, a bad range) is retried on the same
        mirror or is final."""
        route = self.route(url)
        urls = route.urls
        order = self._mirror_order(route)
        per_try = self.timeout / len(urls)
        attempt = pos = 0
        target = urls[order[0]]

        def via() -> str:
            return f" from {redact_url(target)}" if route.rewritten else ""

        with trio.move_on_after(self.timeout) as scope:
            while True:
                mirror = order[pos]
                target = urls[mirror]
                try:
                    async with self._limiter(target):
                        if len(urls) == 1:
                            return await op(target)
                        with trio.fail_after(per_try):
                            return await op(target)
                except _PERMANENT as e:
                    code = (errno.ENOENT if isinstance(e, FileNotFoundError)
                            else errno.EACCES if isinstance(e, PermissionError) else errno.EIO)
                    raise FetchError(url, f"{what}{via()}: {describe(e)}", code) from None
                except FetchError:
                    raise
                except Exception as e:
                    down = len(urls) > 1 and mirror_down(e)
                    why = (f"no answer within {per_try:g} s" if isinstance(e, trio.TooSlowError)
                           else describe(e))
                    if down:
                        then = order[pos + 1] if pos + 1 < len(order) else None
                        self._mark_down(route, mirror, why, then)
                        if then is not None:  # the next mirror, at once
                            pos += 1
                            continue
                    if attempt >= self.retries:
                        raise FetchError(
                            url, f"{what}{via()}: {why} (after {attempt + 1} attempts)"
                        ) from None
                    attempt += 1
                    self.stats.retries += 1
                    if down:  # every mirror failed: start again from the best one
                        order, pos = self._mirror_order(route), 0
                    delay = min(0.1 * 2 ** (attempt - 1), 2.0) * (0.5 + random.random())
                    log.debug("retry %d of %s for %s: %s", attempt, what, redact_url(target), why)
                    await trio.sleep(delay)
        assert scope.cancelled_caught
        raise FetchError(url, f"{what}{via()}: timed out after {self.timeout:g} s", errno.EIO,
                         timed_out=True)

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
            if isinstance(fs, HTTPFileSystem | LocalFileSystem):
                return await plain_op(target, fs, path)
            if pin.version_id is not None and protocol(self.policy.full_url(target)) in ("s3", "s3a"):
                return await plain_op(target, fs, path, version_id=pin.version_id)
            await self._same_version(target, fs, path, pin)
            data = await plain_op(target, fs, path)
            await self._same_version(target, fs, path, pin)
            return data

        async def plain_op(target: str, fs: AbstractFileSystem, path: str, **version: Any) -> bytes | int:
            if isinstance(fs, HTTPFileSystem):
                reason = self.policy.problem(target, resolve=False)
                if reason:
                    raise FetchError(target, reason, errno.EACCES)
                # The body streams to ``sink`` only where it is read on trio's own thread.
                streams = sink is not None and self._loop is not None and getattr(fs, "asynchronous", False)
                data = await self._run(fs, http_range(fs, path, start, end, upto, pin,
                                                      sink if streams else None))
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
                    if (past := _past_end(url, start, end, info.get("size"), b"")) is None:
                        raise
                    raise past from None
            if not isinstance(data, bytes | bytearray | memoryview):
                raise FetchError(url, f"bytes {start}-{end}: backend returned {type(data)}")
            if upto and not data:
                raise ValueError(f"nothing at {start}: past the end of the target")
            if len(data) < want and not upto and not isinstance(fs, HTTPFileSystem):
                # Short: past the end of the target, or a short answer (retried)?
                info = await self._call(target, fs, "info", path)
                past = _past_end(url, start, end, info.get("size"), bytes(data))
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
        self.stats.requests += 1
        self.stats.bytes_fetched += got
        self.links.of(url).observe(got, trio.current_time() - began)
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
            info = await self._call(target, fs, "info", path)
            size = info.get("size")
            if pin is not None and (why := pin.mismatch(Version.from_info(info))) is not None:
                assert self.pins is not None
                raise self.pins.refuse(url, why)
            if size is None:
                raise FetchError(url, "size: the storage does not report a size")
            return int(size)

        return await self._with_retries(url, "size", op)

    async def version(self, url: str) -> Version:
        """The target's version as its store reports it (size, ETag, modification time,
        version id), within ``timeout`` and with retries; a FetchError whose ``errno`` says
        why not (ENOENT missing, EACCES refused by the policy or the store)."""
        rule = self.route(url).rule

        async def op(target: str) -> Version:
            fs, path = await self._open(rule, target)
            if isinstance(fs, HTTPFileSystem):
                reason = self.policy.problem(target, resolve=False)
                if reason:
                    raise FetchError(target, reason, errno.EACCES)
                return await self._run(fs, http_version(fs, path))  # type: ignore[no-any-return]
            with contextlib.suppress(Exception):
                fs.invalidate_cache(path)
            return Version.from_info(await self._call(target, fs, "info", path))

        return await self._with_retries(url, "version", op)  # type: ignore[no-any-return]
