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
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from aiohttp import web, web_server
from aiohttp.web_request import BaseRequest

from refmount.base.errors import FetchError, ReadError
from refmount.base.triocall import TrioCaller, TrioGone
from refmount.core.consolidated import (
    MAX_BYTES,
    MAX_VALUES,
    METADATA_NAMES,
    ConsolidationRefused,
    consolidation,
)
from refmount.core.reader import ReadState
from refmount.core.setcore import SetCore
from refmount.decode.codecplan import DecodedArray
from refmount.http import listing
from refmount.http.cors import cors_headers, preflight_headers
from refmount.http.ranges import (
    RangeNotSatisfiable,
    content_range,
    if_range_matches,
    parse_range,
    unsatisfied_range,
)
from refmount.http.validators import etag_for, is_not_modified, last_modified, ref_parts
from refmount.refs import Ref, RefKind
from refmount.refs.tree import Node
from refmount.targets.filesystems import await_task

log = logging.getLogger(__name__)

__all__ = ["STATS_PATH", "HttpFrontEnd", "ServerStats"]

LISTING_BATCH = 1024  # directory entries taken from the tree at a time
READ_PIECE = 1 << 20  # bytes asked of the reader at a time
WRITE_PIECE = 1 << 18  # bytes handed to the transport at a time (a slow client holds ~this)
CONDITION_HEADERS = ("Range", "If-Range", "If-None-Match", "If-Modified-Since")
STATS_PATH = "/.refmount/stats"  # the server's counters (JSON); never a key of the set
ALLOWED = "GET, HEAD, OPTIONS"
UNAVAILABLE = "not served: what it would be made from is past the bounds of the server (see its log)"


@dataclass
class ServerStats:
    """The HTTP server's own counters (the core's are in ``core.stats``)."""

    http_requests: int = 0
    http_bytes_sent: int = 0
    http_status: dict[str, int] = field(default_factory=dict)  # "200" -> count
    http_aborted: int = 0  # responses cut off after their headers (target failed, client slow)
    http_connections: int = 0  # open now
    http_refused: int = 0  # connections over max_clients, answered 503
    http_planned_in_trio: int = 0  # requests that needed a call into trio (I/O) before their headers
    http_waited_on_loop: int = 0  # requests that waited for bytes read ahead without one

    def count(self, status: int) -> None:
        key = str(status)
        self.http_status[key] = self.http_status.get(key, 0) + 1


@dataclass
class _Found:
    """What a path names: a directory, or a file with its served size."""

    key: str
    node: Node | None  # None: the synthesized .zmetadata
    is_dir: bool
    size: int = 0
    ref: Ref | None = None
    array: DecodedArray | None = None
    data: bytes | None = None  # served as is (the synthesized .zmetadata)


@dataclass
class _Plan:
    """The answer to a request for a path, decided in trio (``HttpFrontEnd._plan``)."""

    found: _Found
    status: int
    headers: dict[str, str]
    start: int = 0
    stop: int = 0
    first: bytes | memoryview | None = None  # the first piece of a GET's body
    error: ReadError | None = None  # the first piece (or the size) could not be had
    state: ReadState = field(default_factory=ReadState)


class _Unavailable(Exception):
    """What the server would synthesize for this path is past its bounds: a 503."""


class _BadPath(Exception):
    pass


class Router(Protocol):
    """Where requests go when one server serves several sets (``httpsets.SetsRouter``)."""

    async def answer(self, front: HttpFrontEnd, request: BaseRequest, headers: dict[str, str],
                     raw: str) -> web.StreamResponse: ...

    def counters(self, front: HttpFrontEnd) -> dict[str, Any]: ...


class _NeedsTrio(Exception):
    """The answer needs I/O or waiting (a lookup that may load, a size to measure, bytes
    not in memory, a decoded chunk): it is planned in trio. ``ref``: a key whose bytes may
    be coming in a stretch read ahead (waited for on the loop first)."""

    def __init__(self, ref: Ref | None = None) -> None:
        super().__init__()
        self.ref = ref


def _split_path(raw: str) -> list[bytes]:
    """A request's path (still %-encoded) -> the names of its components; a trailing ``/``
    leaves an empty last name. ``.``, ``..`` and empty components name nothing."""
    path = urllib.parse.unquote_to_bytes(raw)
    if not path.startswith(b"/"):
        raise _BadPath(raw)
    parts = path[1:].split(b"/")
    for i, part in enumerate(parts):
        if part in (b".", b"..") or (not part and i != len(parts) - 1) or b"\0" in part:
            raise _BadPath(raw)
    return parts


def _content_type(key: str) -> str:
    name = key.rpartition("/")[2]
    if name in (*METADATA_NAMES, ".zmetadata") or name.endswith(".json"):
        return "application/json"
    return "application/octet-stream"


class HttpFrontEnd:
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
        # the set's identity in entity tags (with its time stamp: validators.ref_parts)
        self._identity = core.info.get("source", "") if core is not None else ""
        self._zmetadata: bytes | None = None
        self._zmetadata_refused = False  # past its bounds: never made (kept, not retried)
        self._zmetadata_lock = trio.Lock()  # made once, whatever the requests asking at once
        # every file's time stamp
        self._mtime = core.mtime_ns / 1e9 if core is not None else time.time()
        self._listing_threads = trio.CapacityLimiter(4)  # pieces of listings made at once
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
        self.stats.http_requests += 1
        self.stats.http_connections = len(self._server.connections)
        headers: dict[str, str] = {}
        if self.cors:
            headers.update(cors_headers(self.cors, request.headers.get("Origin")))
        try:
            response = await self._answer(request, headers)
        except TrioGone:
            response = self._plain(503, headers, "the server is stopping")
        self.stats.count(response.status)
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
            return web.Response(status=204, headers=headers)
        if method not in ("GET", "HEAD"):
            headers["Allow"] = ALLOWED
            return self._plain(405, headers, f"{method} is not allowed: the tree is read-only")
        if self.token is not None and not self._authorized(request.headers.get("Authorization")):
            headers["WWW-Authenticate"] = 'Bearer realm="refmount"'
            return self._plain(401, headers, "a bearer token is required")
        raw = request.rel_url.raw_path
        if raw == STATS_PATH:
            return self._json(200, headers, self.counters())
        if self.router is not None:
            return await self.router.answer(self, request, headers, raw)
        return await self.answer_path(request, headers, raw)

    async def answer_path(self, request: BaseRequest, headers: dict[str, str], raw: str,
                          prefix: str = "") -> web.StreamResponse:
        """The answer for ``raw``, a path of this core's tree (``prefix`` before it in the
        URL: a catalogue's set)."""
        try:
            parts = _split_path(raw)
        except _BadPath:
            return self._plain(404, headers, "no such key")
        conditions = {name: request.headers.get(name) for name in CONDITION_HEADERS}
        try:
            return await self._answer_parts(request, headers, raw, parts, conditions, prefix)
        except _Unavailable:
            return self._plain(503, headers, UNAVAILABLE)

    async def _answer_parts(self, request: BaseRequest, headers: dict[str, str], raw: str,
                            parts: list[bytes], conditions: dict[str, str | None],
                            prefix: str) -> web.StreamResponse:
        method = request.method
        try:  # answered here when no I/O is needed (a HEAD, a 304, a 404, bytes in memory)
            plan = self._plan_now(parts, method, conditions)
        except _NeedsTrio as needs:
            try:  # bytes coming in a stretch read ahead: waited for here, then answered here
                if needs.ref is None or not await self._arrived(needs.ref):
                    raise
                plan = self._plan_now(parts, method, conditions)
                self.stats.http_waited_on_loop += 1
            except _NeedsTrio:
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
    def _decide(self, found: _Found, method: str, conditions: dict[str, str | None]) -> _Plan:
        """Status, headers and byte range of the answer for a file whose size is known."""
        size = found.size
        if found.ref is not None:
            etag = etag_for(ref_parts(found.ref, set_identity=self._identity, mtime_ns=self.core.mtime_ns,
                                      decoded=found.array is not None, size=size))
        else:  # the synthesized .zmetadata: its bytes
            etag = etag_for(b"refmount-zmetadata\0" + self._identity.encode() + b"\0" + (found.data or b""))
        headers = {"ETag": etag, "Last-Modified": self._last_modified, "Accept-Ranges": "bytes",
                   "Cache-Control": self.cache_control, "Content-Type": _content_type(found.key)}
        if is_not_modified(method, if_none_match=conditions["If-None-Match"],
                           if_modified_since=conditions["If-Modified-Since"], etag=etag, mtime=self._mtime):
            return _Plan(found, 304, headers)
        status, start, stop = 200, 0, size
        if if_range_matches(conditions["If-Range"], etag):
            try:
                wanted = parse_range(conditions["Range"], size)
            except RangeNotSatisfiable:
                headers["Content-Range"] = unsatisfied_range(size)
                return _Plan(found, 416, headers)
            if wanted is not None:
                status, start, stop = 206, wanted.start, wanted.stop
                headers["Content-Range"] = content_range(wanted, size)
        return _Plan(found, status, headers, start, stop)

    async def _file(self, request: BaseRequest, plan: _Plan, headers: dict[str, str]) -> web.StreamResponse:
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
    async def _listing(self, request: BaseRequest, found: _Found,
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

    # ---- trio side: the core's calls ---------------------------------------------------------
    async def _find(self, parts: list[bytes]) -> _Found | None:
        tree = self.core.tree
        node: Node | None = tree.root
        names = parts[:-1] if parts[-1] == b"" else parts
        for name in names:
            assert node is not None
            if not node.is_dir:
                return None
            node = await tree.lookup(node, name)
            if node is None:
                if names == [b".zmetadata"]:
                    data = await self._synthesized_zmetadata()
                    if data is None:
                        raise _Unavailable
                    return _Found(".zmetadata", None, False, len(data), data=data)
                return None
        assert node is not None
        key = tree.path(node).decode("utf-8", "surrogateescape")
        if node.is_dir:
            return _Found(key, node, True)
        if parts[-1] == b"":
            return None  # a file named as a directory
        ref = await tree.ref(node)
        size = await tree.size(node)
        array = self.core.array(node)
        if array is None and size < 0:  # a whole-file target not yet measured: its size (no bytes fetched)
            size = await self.core.reader.size(ref)
        return self._file_found(key, node, ref, size, array)

    def _find_now(self, parts: list[bytes]) -> _Found | None:
        """``_find`` without I/O, for a tree that answers from its index (``core.key_tree``);
        ``_NeedsTrio`` when the answer needs more."""
        tree = self.core.key_tree
        if tree is None:
            raise _NeedsTrio
        node: Node | None = tree.root
        names = parts[:-1] if parts[-1] == b"" else parts
        for name in names:
            assert node is not None
            if not node.is_dir:
                return None
            node = tree.find(node, name)
            if node is None:
                if names == [b".zmetadata"]:
                    if self._zmetadata_refused:
                        raise _Unavailable
                    if self._zmetadata is None:
                        raise _NeedsTrio  # made once, in a worker thread
                    return _Found(".zmetadata", None, False, len(self._zmetadata), data=self._zmetadata)
                return None
        assert node is not None
        key = tree.path(node).decode("utf-8", "surrogateescape")
        if node.is_dir:
            return _Found(key, node, True)
        if parts[-1] == b"":
            return None  # a file named as a directory
        size = tree.size_now(node)
        if size < 0:
            raise _NeedsTrio  # a whole-file target to measure
        return self._file_found(key, node, tree.ref_now(node), size, None)

    def _file_found(self, key: str, node: Node, ref: Ref, size: int, array: DecodedArray | None) -> _Found:
        """A file with its served size: a range running past the end of its target (when
        that is known) serves the bytes that exist."""
        if array is None and ref.kind is RefKind.RANGE:
            clipped = self.core.reader.clipped(ref)
            size = size if clipped is None else clipped
        return _Found(key, node, False, size, ref, array)

    async def _plan(self, parts: list[bytes], method: str, conditions: dict[str, str | None]) -> _Plan | None:
        """In trio: the node of ``parts`` and, for a file, the answer; for a GET, the size
        settled and the first piece of the body read (a failure there is the plan's
        ``error``: the headers are not sent yet)."""
        found = await self._find(parts)
        if found is None or found.is_dir:
            return None if found is None else _Plan(found, 200, {})
        get = method == "GET"
        if get and found.ref is not None and found.array is None and found.ref.kind is RefKind.RANGE:
            # A range running past the end of its target is served as the bytes that exist
            # (as st_size in a mount): found out before the headers, which carry the size.
            try:
                found.size = await self._settle(found.ref)
            except ReadError as e:
                plan = self._decide(found, method, conditions)
                plan.error = e
                return plan
        plan = self._decide(found, method, conditions)
        if get and plan.status in (200, 206) and plan.start < plan.stop:
            # The first piece before the headers: a target that fails now is a 502, not a cut.
            try:
                plan.first = await self._read(found, plan.start, min(plan.stop - plan.start, READ_PIECE),
                                              plan.state)
            except ReadError as e:
                plan.error = e
        return plan

    def _plan_now(self, parts: list[bytes], method: str, conditions: dict[str, str | None]) -> _Plan | None:
        """``_plan`` answered on the asyncio loop, with no call into trio, when it needs no
        I/O: the tree answers from its index, the size is known and, for a GET, the first
        piece of the body is in memory; ``_NeedsTrio`` otherwise."""
        found = self._find_now(parts)
        if found is None or found.is_dir:
            return None if found is None else _Plan(found, 200, {})
        get = method == "GET"
        if get and found.ref is not None and found.ref.kind is RefKind.RANGE:
            if not self.core.reader.settled(found.ref):
                raise _NeedsTrio(found.ref)
            found.size = self._settled_size(found.ref)
        plan = self._decide(found, method, conditions)
        if get and plan.status in (200, 206) and plan.start < plan.stop:
            first = self._read_now(found, plan.start, min(plan.stop - plan.start, READ_PIECE))
            if first is None:
                raise _NeedsTrio(found.ref if found.array is None else None)
            plan.first = first
        return plan

    async def _arrived(self, ref: Ref) -> bool:
        """Wait on the loop for the bytes of ``ref`` that a stretch read ahead is bringing
        (True once they are in, or the stretch is over); False at once when none is."""
        arrived = asyncio.get_running_loop().create_future()

        def call() -> None:
            if not arrived.done():
                arrived.set_result(None)

        if not self.core.reader.when_arrived(ref, call):
            return False
        await arrived
        return True

    async def _settle(self, ref: Ref) -> int:
        await self.core.reader.settle(ref)
        return self._settled_size(ref)

    def _settled_size(self, ref: Ref) -> int:
        clipped = self.core.reader.clipped(ref)
        return ref.length if clipped is None else clipped

    async def _read(self, found: _Found, off: int, size: int, state: ReadState) -> bytes | memoryview:
        data = self._read_now(found, off, size)
        if data is not None:
            return data
        stats = self.core.stats
        stats.reads += 1
        if found.array is not None:
            assert self.core.decoder is not None and found.ref is not None
            data = await self.core.decoder.read(found.key, found.array, found.ref, off, size)
        else:
            assert found.ref is not None
            data = await self.core.reader.read(found.ref, off, size, state)
        stats.bytes_read += len(data)
        return data

    def _read_now(self, found: _Found, off: int, size: int) -> bytes | memoryview | None:
        """The bytes when they are at hand (the synthesized ``.zmetadata``, inline bytes, a
        block in memory), with no I/O; None otherwise."""
        if found.data is not None:
            data: bytes | memoryview | None = found.data[off: off + size]
        elif found.array is not None:
            return None
        else:
            assert found.ref is not None
            data = self.core.reader.read_now(found.ref, off, size)
            if data is None:
                return None
        stats = self.core.stats
        stats.reads += 1
        stats.bytes_read += len(data)
        return data

    async def _entries(self, found: _Found) -> AsyncIterator[tuple[str, bool, int | None]]:
        """The entries of a directory, the synthesized ``.zmetadata`` among the root's when
        the set has none."""
        assert found.node is not None
        tree = self.core.tree
        synthesize = not found.key and await tree.lookup(tree.root, b".zmetadata") is None
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

    async def _render_listing(self, found: _Found, path: str, as_json: bool,
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

    async def _synthesized_zmetadata(self) -> bytes | None:
        """The consolidated metadata of a set that has none, made once (in a worker thread,
        key by key within ``consolidated``'s bounds), or None when the set is past them
        (then never made again: one log line)."""
        async with self._zmetadata_lock:
            if self._zmetadata is None and not self._zmetadata_refused:
                def make() -> Any:
                    pairs = self.core.metadata_pairs(METADATA_NAMES, max_keys=MAX_VALUES, max_bytes=MAX_BYTES)
                    return consolidation(pairs)

                try:
                    made = await trio.to_thread.run_sync(make)
                except ConsolidationRefused as e:
                    log.error("no consolidated metadata (.zmetadata) is served for this set: %s", e)
                    self._zmetadata_refused = True
                    return None
                for key, why in sorted(made.skipped.items()):
                    log.warning("the synthesized .zmetadata leaves out %s: %s", key, why)
                self._zmetadata = made.document
        return self._zmetadata

    # ---- small answers -----------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        if self.router is not None:
            return self.router.counters(self)
        stats: dict[str, Any] = dict(self.core.stats.as_dict())
        server = vars(self.stats).copy()
        server["http_status"] = dict(self.stats.http_status)
        server["http_connections"] = len(self._server.connections)
        stats.update(server)
        for name in ("source", "format", "keys"):
            if name in self.core.info:
                stats[name] = self.core.info[name]
        return stats

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
