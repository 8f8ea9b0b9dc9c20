"""The HTTP front end: translate HTTP requests into the core's calls, its errors into statuses.

A request's path is looked up in the set's tree (``core.SetCore``); a file is answered from
the reader (or, for a decoded chunk, the decoder), a directory with a listing
(``http/listing.py``). Range parsing (``http/ranges.py``), validators (``http/validators.py``), listings,
consolidated metadata (``core/consolidated.py``) and CORS (``http/cors.py``) are modules of their own;
nothing here parses, fetches, caches or decodes.

The server is aiohttp's low-level server on the asyncio loop trio runs as a guest of
(``guestloop``): each request is an asyncio task. What needs no I/O (the tree answering from
its index, a size known, bytes in memory) is answered there by the same lookups
(``_plan_now``); the rest calls the core in trio through ``triocall.TrioCaller`` (``_plan``).
Both, and the reads of a body's pieces, are ``PathPlanner``'s (``http/pathplan.py``).

What a response promises (docs/semantics.md, "The HTTP view"):

* sizes (``Content-Length``, ``HEAD``) come from the index, as ``st_size`` does in a mount:
  a ``HEAD`` fetches nothing (a whole-file target not yet measured is measured);
* never wrong bytes: a target that fails before the headers are sent is ``502`` (``504``
  when it timed out); one that fails after is an aborted connection, never a clean short
  body;
* a client that reads nothing for ``client_timeout`` is disconnected: a response is written
  in pieces of ``WRITE_PIECE`` bytes, each waiting for the client to take the previous ones,
  so a slow client holds at most about one piece of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio
from aiohttp import web, web_server
from aiohttp.web_request import BaseRequest

from refmount.base.errors import FetchError, ReadError
from refmount.base.latency import Latency
from refmount.base.triocall import TrioCaller, TrioGone
from refmount.core.setcore import SetCore
from refmount.http import listing, webdav
from refmount.http.cors import cors_headers, preflight_headers
from refmount.http.pathplan import (
    READ_PIECE,
    Found,
    NeedsTrio,
    PathPlanner,
    Plan,
    Unavailable,
    merge_slashes,
    path_names,
)
from refmount.http.validators import last_modified
from refmount.targets.filesystems import await_task

if TYPE_CHECKING:  # the metrics' module (prometheus_client) is imported at the first scrape
    from refmount.serving.metrics import Reading

log = logging.getLogger(__name__)

__all__ = ["INFO_IN_STATS", "METRICS_PATH", "STATS_PATH", "HttpFrontEnd", "ServerStats"]

LISTING_BATCH = 1024  # directory entries taken from the tree at a time
LISTING_THREADS = 4  # pieces of listings made at once (each in a worker thread)
WRITE_PIECE = 1 << 18  # bytes handed to the transport at a time (a slow client holds ~this)
CONDITION_HEADERS = ("Range", "If-Range", "If-None-Match", "If-Modified-Since")
STATS_PATH = "/.refmount/stats"  # the server's counters (JSON); never a key of the set
METRICS_PATH = "/.refmount/metrics"  # the same for Prometheus (serving/metrics.py)
# what the counters say of the set served (its core's info): an Icechunk repository's revision too
INFO_IN_STATS = ("source", "format", "keys", "repository", "format_version", "revision", "snapshot",
                 "snapshot_time")
ALLOWED = "GET, HEAD, OPTIONS, PROPFIND"
UNAVAILABLE = "not served: what it would be made from is past the bounds of the server (see its log)"


# the methods counted by name (the HTTP view's and the S3 dialect's); others are "other"
COUNTED_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PROPFIND", "PUT", "POST", "DELETE", "none"})


@dataclass
class ServerStats:
    """The HTTP server's own counters (the core's are in ``core.stats``)."""

    http_requests: int = 0
    http_bytes_sent: int = 0
    http_status: dict[str, int] = field(default_factory=dict)  # "200" -> count
    http_answers: dict[str, int] = field(default_factory=dict)  # "GET 200" -> count (metrics)
    http_aborted: int = 0  # responses cut off after their headers (target failed, client slow)
    http_connections: int = 0  # open now
    http_refused: int = 0  # connections over max_clients, answered 503
    http_planned_in_trio: int = 0  # requests that needed a call into trio (I/O) before their headers
    http_waited_on_loop: int = 0  # requests that waited for bytes read ahead without one

    def count(self, status: int, method: str = "none") -> None:
        """An answer of ``status`` to a request of ``method`` ("none": a connection refused
        before any request; a method refmount does not answer counts as "other")."""
        key = str(status)
        self.http_status[key] = self.http_status.get(key, 0) + 1
        answer = f"{method if method in COUNTED_METHODS else 'other'} {key}"
        self.http_answers[answer] = self.http_answers.get(answer, 0) + 1



class Router(Protocol):
    """Where requests go when one server serves several sets (``httpsets.SetsRouter``)."""

    async def answer(self, front: HttpFrontEnd, request: BaseRequest, headers: dict[str, str],
                     raw: str) -> web.StreamResponse: ...

    def counters(self, front: HttpFrontEnd) -> dict[str, Any]: ...

    def reading(self, front: HttpFrontEnd) -> Reading: ...


class HttpFrontEnd(PathPlanner):
    """The request handler of one set's HTTP server (``handle``), plus the pieces the
    serving process wires into aiohttp (``server``, ``protocol_factory``)."""

    def __init__(self, core: SetCore | None, caller: TrioCaller, *, cors: str | None, token: str | None,
                 max_clients: int, client_timeout: float, cache_seconds: float,
                 router: Router | None = None) -> None:
        self.core = core
        # with a router (a catalogue, or a set with reload: http/sets.py), each request is
        # answered by the front end of the set version it names; ``core`` is then unused
        self.router = router
        self.caller = caller
        self.cors = cors
        self.token = token
        self.max_clients = max_clients
        self.client_timeout = client_timeout
        visibility = "private" if token else "public"
        self.cache_control = f"{visibility}, max-age={int(cache_seconds)}"
        self.stats = ServerStats()
        self.request_latency = Latency()  # of the requests this front end's handle() answers
        self._collector: Any = None  # the metrics' (made at the first scrape)
        # the set's identity in entity tags (with its time stamp: validators.ref_parts)
        self._identity = core.info.get("source", "") if core is not None else ""
        self._zmetadata: bytes | None = None
        self._zmetadata_refused = False  # past its bounds: never made (kept, not retried)
        self._zmetadata_lock = trio.Lock()  # made once, whatever the requests asking at once
        # every file's time stamp
        self._mtime = core.mtime_ns / 1e9 if core is not None else time.time()
        self._listing_threads = trio.CapacityLimiter(LISTING_THREADS)  # pieces of listings made at once
        self._last_modified = last_modified(self._mtime)
        self._server = web_server.Server(
            self.handle, handler_cancellation=True, access_log=None,
            keepalive_timeout=client_timeout, max_line_size=8190, max_field_size=8190,
            max_headers=64,
        )

    # ---- wiring ------------------------------------------------------------------------------
    def protocol_factory(self) -> asyncio.BaseProtocol:
        """A connection's protocol: aiohttp's, or past ``max_clients`` one that answers 503."""
        if len(self._server.connections) >= self.max_clients:
            self.stats.http_refused += 1
            self.stats.count(503)
            return _Refuse(self._cors_static())
        self.stats.http_connections = len(self._server.connections) + 1
        return self._server()

    async def shutdown(self, timeout: float = 2.0) -> None:
        await self._server.shutdown(timeout)

    def _cors_static(self) -> dict[str, str]:
        return cors_headers(self.cors, None) if self.cors else {}

    # ---- one request -------------------------------------------------------------------------
    async def handle(self, request: BaseRequest) -> web.StreamResponse:
        began = time.perf_counter()
        self.stats.http_requests += 1
        self.stats.http_connections = len(self._server.connections)
        headers: dict[str, str] = {}
        if self.cors:
            headers.update(cors_headers(self.cors, request.headers.get("Origin")))
        try:
            response = await self._answer(request, headers)
        except TrioGone:
            response = self._plain(503, headers, "the server is stopping")
        self.stats.count(response.status, request.method)
        self.request_latency.observe(time.perf_counter() - began)
        return response

    async def _answer(self, request: BaseRequest, headers: dict[str, str]) -> web.StreamResponse:
        method = request.method
        if method == "OPTIONS":
            if self.cors and "Access-Control-Request-Method" in request.headers:
                headers.update(preflight_headers(
                    self.cors, request.headers.get("Origin"),
                    request.headers.get("Access-Control-Request-Method"),
                    request.headers.get("Access-Control-Request-Headers")))
            headers["Allow"] = ALLOWED
            headers.update(webdav.DAV_HEADERS)
            return web.Response(status=204, headers=headers)
        if method not in ("GET", "HEAD", "PROPFIND"):
            headers["Allow"] = ALLOWED
            return self._plain(405, headers, f"{method} is not allowed: the tree is read-only")
        if self.token is not None and not self._authorized(request.headers.get("Authorization")):
            headers["WWW-Authenticate"] = 'Bearer realm="refmount"'
            return self._plain(401, headers, "a bearer token is required")
        raw = merge_slashes(request.rel_url.raw_path)
        if raw == STATS_PATH:
            return self._json(200, headers, self.counters())
        if raw == METRICS_PATH:
            return self._metrics(headers)
        if self.router is not None:
            return await self.router.answer(self, request, headers, raw)
        return await self.answer_path(request, headers, raw)

    async def answer_path(self, request: BaseRequest, headers: dict[str, str], raw: str,
                          prefix: str = "") -> web.StreamResponse:
        """The answer for ``raw``, a path of this core's tree (``prefix`` before it in the
        URL: a catalogue's set)."""
        parts = path_names(raw)
        if parts is None:
            return self._plain(404, headers, "no such key")
        if request.method == "PROPFIND":  # a WebDAV listing (http/webdav.py)
            return await webdav.propfind(self, request, headers, parts, prefix)
        conditions = {name: request.headers.get(name) for name in CONDITION_HEADERS}
        try:
            return await self._answer_parts(request, headers, raw, parts, conditions, prefix)
        except Unavailable:
            return self._plain(503, headers, UNAVAILABLE)
        except Exception as e:  # a defect: answered (CORS headers kept) and counted, not aiohttp's bare 500
            key = b"/".join(parts).decode(errors="replace")
            self.core.stats.failed(key, e)
            log.exception("GET %s raised", key)
            return self._plain(500, headers, "internal error (see the server's log)")

    async def _answer_parts(self, request: BaseRequest, headers: dict[str, str], raw: str,
                            parts: list[bytes], conditions: dict[str, str | None],
                            prefix: str) -> web.StreamResponse:
        method = request.method
        try:  # answered here when no I/O is needed (a HEAD, a 304, a 404, bytes in memory)
            plan = self._plan_now(parts, method, conditions)
        except NeedsTrio as needs:
            try:  # bytes coming in a stretch read ahead: waited for here, then answered here
                if needs.ref is None or not await self._arrived(needs.ref):
                    raise
                plan = self._plan_now(parts, method, conditions)
                self.stats.http_waited_on_loop += 1
            except NeedsTrio:
                self.stats.http_planned_in_trio += 1
                try:  # one call into trio: the lookup and, for a GET, the first piece of the body
                    plan = await self.caller.call(self._plan, parts, method, conditions)
                except ReadError as e:
                    return self._failed(b"/".join(parts).decode(errors="replace"), e, headers)
        if plan is None:
            return self._plain(404, headers, "no such key")
        found = plan.found
        if found.is_dir:
            if parts[-1] != b"":  # relative links in the listing need the trailing slash
                headers["Location"] = prefix + raw + "/"
                return self._plain(301, headers, "a directory")
            return await self._listing(request, found, headers, prefix)
        return await self._file(request, plan, headers)

    def _authorized(self, header: str | None) -> bool:
        assert self.token is not None
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                  self.token.encode())

    # ---- files -------------------------------------------------------------------------------
    async def _file(self, request: BaseRequest, plan: Plan, headers: dict[str, str]) -> web.StreamResponse:
        found, status, start, stop = plan.found, plan.status, plan.start, plan.stop
        if plan.error is not None:  # the size or the first piece failed: a 502/504, no cut
            return self._failed(found.key, plan.error, headers)
        headers.update(plan.headers)
        if status == 304:
            return web.Response(status=304, headers=headers)
        if status == 416:
            return self._plain(416, headers, "range not satisfiable")
        if request.method == "HEAD" or start == stop:
            # headers only, sent by aiohttp in one write (HEAD keeps the Content-Length)
            headers["Content-Length"] = str(stop - start)
            return web.Response(status=status, headers=headers)
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = stop - start
        state = plan.state
        first = plan.first
        assert first is not None
        if not await self._prepare(request, response):
            return response
        pos = start
        data: bytes | memoryview = first
        while True:
            want = min(stop - pos, READ_PIECE)
            if len(data) != want:  # the target is shorter than the index says: never short
                log.error("key %s: %d bytes at %d where %d were expected: response cut off",
                          found.key, len(data), pos, want)
                return self._abort(request, response)
            if not await self._send(request, response, data):
                return response
            pos += want
            if pos >= stop:
                break
            want = min(stop - pos, READ_PIECE)
            try:
                at_hand = self._read_now(found, pos, want)  # a block in memory: no call into trio
                data = at_hand if at_hand is not None else await self.caller.call(
                    self._read, found, pos, want, state)
            except ReadError as e:
                if not e.logged:
                    log.error("key %s: %s: response cut off", found.key, e)
                return self._abort(request, response)
            except Exception as e:  # a defect: counted, logged, the transfer cut short
                self.core.stats.failed(found.key, e)
                log.exception("key %s: response cut off", found.key)
                return self._abort(request, response)
        await response.write_eof()
        return response

    async def _send(self, request: BaseRequest, response: web.StreamResponse,
                    data: bytes | memoryview) -> bool:
        """Write ``data`` in pieces, each waiting (up to ``client_timeout``) until the client
        has taken enough of the previous ones; False if the client was cut off."""
        view = memoryview(data)
        try:
            for at in range(0, len(view), WRITE_PIECE):
                piece = view[at: at + WRITE_PIECE]
                # aiohttp waits in write() while the transport's buffer is over its high-water
                # mark: a client that does not read holds about one piece here.
                async with asyncio.timeout(self.client_timeout):
                    await response.write(piece)
                self.stats.http_bytes_sent += len(piece)
        except TimeoutError:
            log.info("a client read nothing for %g s: disconnected", self.client_timeout)
            self._abort(request, response)
            return False
        except ConnectionError:
            self.stats.http_aborted += 1
            return False
        return True

    async def _prepare(self, request: BaseRequest, response: web.StreamResponse) -> bool:
        """Send the headers; False if the client has gone (its connection closing)."""
        try:
            await response.prepare(request)
        except ConnectionError:
            self.stats.http_aborted += 1
            return False
        return True

    def _abort(self, request: BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
        """Cut the connection: the client sees a transfer shorter than Content-Length."""
        self.stats.http_aborted += 1
        if request.transport is not None:
            request.transport.abort()
        return response

    def _failed(self, key: str, e: ReadError, headers: dict[str, str]) -> web.Response:
        self.core.stats.failed(key, e)  # counted, and the last error `refmount stats URL` shows
        if not e.logged:
            log.error("read failed: key=%s %s", key, e)
        timed_out = isinstance(e, FetchError) and e.timed_out
        if timed_out:
            return self._plain(504, headers, "a target of this key timed out")
        return self._plain(502, headers, "a target of this key could not be read")

    # ---- directories -------------------------------------------------------------------------
    async def _listing(self, request: BaseRequest, found: Found,
                       headers: dict[str, str], prefix: str = "") -> web.StreamResponse:
        """A listing streamed as the tree gives its entries (memory bounded by a batch of
        entries and a piece of the page, whatever the directory's size)."""
        path = prefix + "/" + found.key + ("/" if found.key else "")
        as_json = listing.wants_json(request.headers.get("Accept"), request.rel_url.query_string)
        headers["Cache-Control"] = self.cache_control
        headers["Content-Type"] = "application/json" if as_json else "text/html; charset=utf-8"
        response = web.StreamResponse(status=200, headers=headers)
        if request.version >= (1, 1):
            response.enable_chunked_encoding()
        # HTTP/1.0 has no chunked encoding: the page ends when the connection closes
        if not await self._prepare(request, response):
            return response
        if request.method != "HEAD":
            loop = asyncio.get_running_loop()
            try:
                await self.caller.call(self._render_listing, found, path, as_json, loop, response)
            except (ReadError, ConnectionError, TimeoutError) as e:
                log.error("listing %s: %s: response cut off", path, e)
                return self._abort(request, response)
        await response.write_eof()
        return response

    async def _entries(self, found: Found) -> AsyncIterator[tuple[str, bool, int | None]]:
        """The entries of a directory, the synthesized ``.zmetadata`` among the root's when
        the set has none."""
        assert found.node is not None
        tree = self.core.tree
        synthesize = (not found.key and await tree.lookup(tree.root, b".zmetadata") is None
                      and await self._synthesizes_zmetadata())
        async with aclosing(tree.entries(found.node)) as entries:
            async for name, _ino, is_dir, _next, size in entries:
                if synthesize and name > b".zmetadata":
                    synthesize = False
                    if (data := await self._synthesized_zmetadata()) is not None:
                        yield ".zmetadata", False, len(data)
                yield (name.decode("utf-8", "surrogateescape"), is_dir,
                       None if is_dir or size < 0 else size)
        if synthesize and (data := await self._synthesized_zmetadata()) is not None:
            yield ".zmetadata", False, len(data)

    async def _render_listing(self, found: Found, path: str, as_json: bool,
                              loop: asyncio.AbstractEventLoop, response: web.StreamResponse) -> None:
        """Render a listing piece by piece (``listing.iter_*_index`` are generators over an
        iterable of entries): each piece is made in a worker thread, which takes the entries
        from trio in batches, then handed to the response on the asyncio loop, waiting for
        the client to take it (``client_timeout``). The worker threads of listings are
        bounded (``_listing_threads``) and held only while a piece is made, never while a
        client is waited for: a client that does not read holds its own connection only."""
        entries = self._entries(found)
        timeout = self.client_timeout

        async def next_batch() -> list[tuple[str, bool, int | None]]:
            batch: list[tuple[str, bool, int | None]] = []
            with contextlib.suppress(StopAsyncIteration):
                while len(batch) < LISTING_BATCH:
                    batch.append(await entries.__anext__())
            return batch

        async def send(piece: bytes) -> None:
            async with asyncio.timeout(timeout):
                await response.write(piece)

        def pulled() -> Iterator[tuple[str, bool, int | None]]:
            while batch := trio.from_thread.run(next_batch):
                yield from batch

        pieces = (listing.iter_json_index(path, pulled()) if as_json
                  else listing.iter_html_index(path, pulled(), mtime=self._mtime))
        async with aclosing(entries):
            try:
                while (piece := await trio.to_thread.run_sync(
                        next, pieces, None, limiter=self._listing_threads)) is not None:
                    await await_task(loop, send(piece))
                    self.stats.http_bytes_sent += len(piece)
            finally:
                pieces.close()

    # ---- small answers -----------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        if self.router is not None:
            return self.router.counters(self)
        stats: dict[str, Any] = dict(self.core.stats.as_dict())
        server = vars(self.stats).copy()
        server["http_status"] = dict(self.stats.http_status)
        server["http_connections"] = len(self._server.connections)
        stats.update(server)
        for name in INFO_IN_STATS:
            if name in self.core.info:
                stats[name] = self.core.info[name]
        return stats

    def reading(self) -> Reading:
        """What the metrics read (``serving/metrics.py``)."""
        from refmount.serving.metrics import Reading

        if self.router is not None:
            return self.router.reading(self)
        self.stats.http_connections = len(self._server.connections)
        return Reading("http", cores=[self.core], http=self.stats, http_latency=self.request_latency)

    def _metrics(self, headers: dict[str, str]) -> web.Response:
        from refmount.serving.metrics import CONTENT_TYPE, MetricsCollector, exposition

        if self._collector is None:
            self._collector = MetricsCollector(self.reading)
        headers["Content-Type"] = CONTENT_TYPE
        headers["Cache-Control"] = "no-store"
        return web.Response(status=200, headers=headers, body=exposition(self._collector))

    @staticmethod
    def _plain(status: int, headers: dict[str, str], text: str) -> web.Response:
        headers["Content-Type"] = "text/plain; charset=utf-8"
        headers.setdefault("Cache-Control", "no-store")
        return web.Response(status=status, headers=headers, body=(text + "\n").encode())

    @staticmethod
    def _json(status: int, headers: dict[str, str], obj: Any) -> web.Response:
        headers["Content-Type"] = "application/json"
        headers["Cache-Control"] = "no-store"
        return web.Response(status=status, headers=headers, body=json.dumps(obj).encode())


class _Refuse(asyncio.Protocol):
    """A connection beyond ``max_clients``: one 503 and closed."""

    def __init__(self, cors: dict[str, str]) -> None:
        self.cors = cors

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in self.cors.items())
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
                         f"Connection: close\r\n{extra}\r\n").encode())
        transport.close()
