"""The S3 dialect of ``refmount serve`` (``--s3-listen HOST:PORT``): read-only, path-style.

A single set is one bucket (``s3_bucket``), a catalogue's sets are buckets (named as its
directories). What a request asks is translated into what the HTTP view asks of the same
front end (``HttpFrontEnd``/``PathPlanner``: lookups, sizes, validators, ranges, bodies), and its
answer rendered as S3 answers: ``ListBuckets`` (``GET /``), ``ListObjectsV2``
(``?list-type=2``) and ``ListObjects`` V1 (pages from ``http/s3listing.py``, XML from
``http/s3xml.py``), ``HeadBucket``, ``GetBucketLocation``, ``HeadObject`` and ``GetObject``
(the HTTP view's ETag, Last-Modified, Range and conditional headers, plus ``If-Match`` and
``If-Unmodified-Since``). Errors are S3's XML (``NoSuchKey``, ``NoSuchBucket``,
``InvalidRange``, ``AccessDenied``...); every write and every other operation is ``501
NotImplemented``. Access is anonymous, or SigV4 with one key pair (``http/s3auth.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import trio
from aiohttp import web, web_server
from aiohttp.web_request import BaseRequest

from refmount.base.errors import FetchError, ReadError
from refmount.base.triocall import TrioGone
from refmount.http.cors import cors_headers, preflight_headers
from refmount.http.fileinfo import file_info, zmetadata_info
from refmount.http.frontend import HttpFrontEnd
from refmount.http.pathplan import NeedsTrio, Plan, Unavailable, path_names
from refmount.http.s3auth import Denied, SigV4Checker
from refmount.http.s3listing import BadToken, Cursor, decode_token, encode_token, list_page
from refmount.http.s3request import (
    MAX_KEY_BYTES,
    MAX_KEYS,
    RESPONSE_OVERRIDES,
    SUBRESOURCES,
    S3Error,
    query_pairs,
    query_value,
)
from refmount.http.s3xml import (
    Bucket,
    ListItem,
    ListPage,
    error_xml,
    iso_time,
    iter_list_buckets,
    iter_listing,
    location_xml,
)
from refmount.http.validators import not_modified, not_modified_since
from refmount.sets.setslots import SetUnavailable

log = logging.getLogger(__name__)

__all__ = ["S3Dialect"]

MARKERS_KEPT = 1024  # V1 markers this server gave, with where their listing resumes
V1_ROUNDS = 100  # pages of nothing looked through for a V1 page before it is given empty
LISTING_SLOTS = 4  # pages made at once


class S3Dialect:
    """The request handler of the S3 listener, over the HTTP view's front end ``front`` (a
    set's, or the router's of a catalogue or a reloaded set)."""

    def __init__(
        self,
        front: HttpFrontEnd,
        *,
        bucket: str,
        region: str = "us-east-1",
        checker: SigV4Checker | None = None,
    ) -> None:
        self.front = front
        self.bucket = bucket
        self.region = region
        self.checker = checker
        self._markers: OrderedDict[tuple[bytes, bytes], Cursor] = OrderedDict()
        self._slots = trio.CapacityLimiter(LISTING_SLOTS)
        self._id_prefix = os.urandom(3).hex().upper()  # request ids: this prefix and a count
        self._requests = 0
        self._server = web_server.Server(
            self.handle,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=front.client_timeout,
            max_line_size=8190,
            max_field_size=8190,
            max_headers=64,
        )

    # ---- wiring ------------------------------------------------------------------------------
    def protocol_factory(self) -> asyncio.BaseProtocol:
        """Connections count against the same ``max_clients`` as the HTTP view's."""
        front = self.front
        if len(self._server.connections) + len(front._server.connections) >= front.max_clients:
            front.stats.http_refused += 1
            front.stats.count(503)
            return _Refuse()
        return self._server()

    async def shutdown(self, timeout: float = 2.0) -> None:
        await self._server.shutdown(timeout)

    # ---- one request -------------------------------------------------------------------------
    async def handle(self, request: BaseRequest) -> web.StreamResponse:
        front = self.front
        front.stats.http_requests += 1
        self._requests += 1
        headers = {"x-amz-request-id": f"{self._id_prefix}{self._requests:010X}"}
        if front.cors:
            headers.update(cors_headers(front.cors, request.headers.get("Origin")))
        try:
            response = await self._answer(request, headers)
        except S3Error as e:
            response = self._error(request, headers, e)
        except Denied as e:
            response = self._error(request, headers, S3Error(403, e.code, e.message))
        except TrioGone:
            response = self._error(
                request, headers, S3Error(503, "ServiceUnavailable", "the server is stopping")
            )
        if request.method not in ("GET", "HEAD", "OPTIONS") or request.body_exists:
            # its body is never read (a client expecting 100-continue never sends it): not kept alive,
            # or what it sends next would be taken for that body
            response.force_close()
        front.stats.count(response.status, request.method)
        return response

    async def _answer(self, request: BaseRequest, headers: dict[str, str]) -> web.StreamResponse:
        raw = request.rel_url.raw_path
        cors = self.front.cors
        if request.method == "OPTIONS" and cors and "Access-Control-Request-Method" in request.headers:
            # a browser's preflight (never signed): as the HTTP view answers it
            get = request.headers.get
            headers.update(
                preflight_headers(
                    cors,
                    get("Origin"),
                    get("Access-Control-Request-Method"),
                    get("Access-Control-Request-Headers"),
                )
            )
            return web.Response(status=204, headers=headers)
        query = query_pairs(request.rel_url.raw_query_string)
        if self.checker is not None:
            self.checker.check(request.method, raw, query, {k.lower(): v for k, v in request.headers.items()})
        if request.method not in ("GET", "HEAD"):
            raise S3Error(
                501, "NotImplemented", f"{request.method} is not implemented: the buckets are read-only"
            )
        names = {urllib.parse.unquote(k) for k, _ in query} if query else _NO_NAMES
        if names and names & SUBRESOURCES:
            raise S3Error(
                501, "NotImplemented", "this operation is not implemented: the buckets are read-only"
            )
        first, _, rest = raw[1:].partition("/")
        if not first:
            if request.method == "HEAD":
                raise S3Error(501, "NotImplemented", "HEAD of the service is not implemented")
            return await self._list_buckets(request, headers)
        bucket = urllib.parse.unquote(first, errors="surrogateescape")
        if not self._exists(bucket):
            raise S3Error(404, "NoSuchBucket", "the specified bucket does not exist", BucketName=bucket)
        async with _Held(self, bucket) as front:
            if not rest:
                return await self._bucket(request, headers, front, bucket, query, names)
            given = dict(query) if query else _NO_QUERY
            return await self._object(request, headers, front, "/" + rest, given)

    # ---- buckets -----------------------------------------------------------------------------
    def _names(self) -> list[str]:
        router = self.front.router
        if router is not None and not router.single:
            return router.sets.names()
        return [self.bucket]

    def _exists(self, bucket: str) -> bool:
        router = self.front.router
        if router is not None and not router.single:
            return router.sets.slot(bucket) is not None
        return bucket == self.bucket

    async def _list_buckets(self, request: BaseRequest, headers: dict[str, str]) -> web.StreamResponse:
        created = self.front._mtime
        headers["Content-Type"] = "application/xml"
        headers["Cache-Control"] = "no-cache"  # a catalogue's sets come and go
        return await self._stream(
            request, headers, iter_list_buckets(Bucket(n, created) for n in self._names())
        )

    async def _bucket(
        self,
        request: BaseRequest,
        headers: dict[str, str],
        front: HttpFrontEnd,
        bucket: str,
        query: list[tuple[str, str]],
        names: set[str] | frozenset[str],
    ) -> web.StreamResponse:
        headers["x-amz-bucket-region"] = self.region
        if request.method == "HEAD":
            return web.Response(status=200, headers=headers)
        if "location" in names:
            return self._xml(200, headers, location_xml(self.region))
        params: dict[str, bytes] = {}
        for k, v in query:
            params[urllib.parse.unquote(k)] = query_value(v)
        return await self._listing(request, headers, front, bucket, params)

    async def _listing(
        self,
        request: BaseRequest,
        headers: dict[str, str],
        front: HttpFrontEnd,
        bucket: str,
        params: dict[str, bytes],
    ) -> web.StreamResponse:
        v2 = params.get("list-type") == b"2"
        for name in ("prefix", "start-after", "marker", "delimiter", "continuation-token"):
            if len(params.get(name, b"")) > (8192 if name == "continuation-token" else MAX_KEY_BYTES):
                raise S3Error(400, "InvalidArgument", f"{name} is longer than {MAX_KEY_BYTES} bytes")
        encoding = params.get("encoding-type")
        if encoding not in (None, b"url"):
            raise S3Error(400, "InvalidArgument", "encoding-type must be url")
        try:
            max_keys = min(int(params.get("max-keys", b"1000")), MAX_KEYS)
        except ValueError:
            max_keys = -1
        if max_keys < 0:
            raise S3Error(400, "InvalidArgument", "max-keys must be a number from 0")
        prefix = params.get("prefix", b"")
        delimiter = params.get("delimiter") or None
        scope = b"\0".join(
            (
                bucket.encode("utf-8", "surrogateescape"),
                front._identity.encode("utf-8", "surrogateescape"),
                str(front.core.mtime_ns).encode(),
                prefix,
                delimiter or b"",
            )
        )
        token = params.get("continuation-token") if v2 else None
        cursor: Cursor | None = None
        after: bytes | None = None
        if token is not None:
            try:
                cursor = decode_token(token.decode("ascii", "replace"), scope)
            except BadToken:
                raise S3Error(
                    400, "InvalidArgument", "the continuation token provided is incorrect"
                ) from None
        elif v2:
            after = params.get("start-after") or None
        else:
            marker = params.get("marker") or None
            cursor = self._markers.get((scope, marker)) if marker else None
            after = marker if cursor is None else None
        url = encoding == b"url"
        listed = await self.front.caller.call(
            self._page, front, prefix, delimiter, max_keys, cursor, after, url, not v2
        )
        page = ListPage(listed.items, listed.prefixes, listed.truncated)
        if listed.truncated and listed.cursor is not None:
            if v2:
                page.next_token = encode_token(listed.cursor, scope)
            else:
                page.next_marker = listed.last
                if listed.last is not None:
                    self._remember((scope, listed.last), listed.cursor)
        headers["Content-Type"] = "application/xml"
        pieces = iter_listing(
            page,
            bucket=bucket,
            prefix=prefix,
            delimiter=delimiter,
            max_keys=max_keys,
            url=url,
            v2=v2,
            modified=iso_time(front._mtime),
            start_after=after if v2 else None,
            token=token.decode("ascii", "replace") if token is not None else None,
            marker=params.get("marker"),
            owner=not v2 or params.get("fetch-owner") == b"true",
        )
        return await self._stream(request, headers, pieces)

    def _remember(self, key: tuple[bytes, bytes], cursor: Cursor) -> None:
        self._markers[key] = cursor
        self._markers.move_to_end(key)
        while len(self._markers) > MARKERS_KEPT:
            self._markers.popitem(last=False)

    async def _page(
        self,
        front: HttpFrontEnd,
        prefix: bytes,
        delimiter: bytes | None,
        max_keys: int,
        cursor: Cursor | None,
        after: bytes | None,
        url: bool,
        v1: bool,
    ) -> Any:
        """In trio: one page (a V1 page goes on through pages of nothing: a V1 client resumes
        from the last key given only)."""
        core = front.core

        async def describe(node: Any, key: bytes, size: int) -> ListItem | None:
            return await file_info(front, node, key, size)

        extra = None
        if b".zmetadata".startswith(prefix) and (cursor is None or not cursor.extra_done):
            extra = await zmetadata_info(front)
        async with self._slots:
            for _ in range(V1_ROUNDS if v1 else 1):
                listed = await list_page(
                    core.tree,
                    prefix=prefix,
                    delimiter=delimiter,
                    max_keys=max_keys,
                    describe=describe,
                    cursor=cursor,
                    after=after,
                    sorted_tree=core.key_tree,
                    extra=extra,
                    url=url,
                )
                if listed.items or listed.prefixes or not listed.truncated:
                    break
                cursor, after, extra = listed.cursor, None, None
        return listed

    # ---- objects -----------------------------------------------------------------------------
    async def _object(
        self,
        request: BaseRequest,
        headers: dict[str, str],
        front: HttpFrontEnd,
        raw: str,
        query: dict[str, str],
    ) -> web.StreamResponse:
        # an S3 key is literal: one with an empty component (``a//b``) is no key of the tree
        parts = None if b"//" in urllib.parse.unquote_to_bytes(raw) else path_names(raw)
        if parts is None:
            raise _no_such_key(raw)
        if parts[-1] == b"":
            raise _no_such_key(raw)
        conditions = {
            name: request.headers.get(name)
            for name in ("Range", "If-Range", "If-None-Match", "If-Modified-Since")
        }
        try:
            plan = await self._plan(front, parts, request.method, conditions)
        except Unavailable:
            raise S3Error(
                503, "ServiceUnavailable", "not served: past the bounds of the server (see its log)"
            ) from None
        except ReadError as e:
            raise self._failed(front, _key(raw), e) from None
        if plan is None or plan.found.is_dir:
            raise _no_such_key(raw)
        if plan.error is not None:
            raise self._failed(front, _key(raw), plan.error)
        etag = plan.headers["ETag"]
        if_match = request.headers.get("If-Match")
        if if_match is not None and not (if_match.strip() == "*" or not_modified(if_match, etag)):
            raise S3Error(
                412, "PreconditionFailed", "At least one of the preconditions you specified did not hold"
            )
        since = request.headers.get("If-Unmodified-Since")
        if (
            if_match is None
            and since is not None
            and not_modified_since(since, 0)
            and not not_modified_since(since, front._mtime)
        ):  # a date it has changed since
            raise S3Error(
                412, "PreconditionFailed", "At least one of the preconditions you specified did not hold"
            )
        if plan.status == 416:
            raise S3Error(
                416,
                "InvalidRange",
                "the requested range is not satisfiable",
                ActualObjectSize=str(plan.found.size),
            )
        if query:
            for name, header in RESPONSE_OVERRIDES.items():
                if name in query:
                    plan.headers[header] = urllib.parse.unquote(query[name])
        return await front._file(request, plan, headers)

    async def _plan(
        self, front: HttpFrontEnd, parts: list[bytes], method: str, conditions: dict[str, str | None]
    ) -> Plan | None:
        """The HTTP view's plan of the answer (``HttpFrontEnd._answer_parts``' first half)."""
        try:
            return front._plan_now(parts, method, conditions)
        except NeedsTrio as needs:
            if needs.ref is not None and await front._arrived(needs.ref):
                try:
                    return front._plan_now(parts, method, conditions)
                except NeedsTrio:
                    pass
            front.stats.http_planned_in_trio += 1
            return await front.caller.call(front._plan, parts, method, conditions)

    @staticmethod
    def _failed(front: HttpFrontEnd, key: str, e: ReadError) -> S3Error:
        front.core.stats.failed(key, e)
        if not e.logged:
            log.error("read failed: key=%s %s", key, e)
        if isinstance(e, FetchError) and e.timed_out:
            return S3Error(504, "GatewayTimeout", "a target of this key timed out")
        return S3Error(502, "BadGateway", "a target of this key could not be read")

    # ---- answers -----------------------------------------------------------------------------
    async def _stream(
        self, request: BaseRequest, headers: dict[str, str], pieces: Iterator[bytes]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        if request.version >= (1, 1):
            response.enable_chunked_encoding()
        if not await self.front._prepare(request, response):
            return response
        if request.method != "HEAD":
            for piece in pieces:
                if not await self.front._send(request, response, piece):
                    return response
        await response.write_eof()
        return response

    @staticmethod
    def _xml(status: int, headers: dict[str, str], body: bytes) -> web.Response:
        headers["Content-Type"] = "application/xml"
        return web.Response(status=status, headers=headers, body=body)

    def _error(self, request: BaseRequest, headers: dict[str, str], e: S3Error) -> web.Response:
        headers.setdefault("Cache-Control", "no-store")
        if request.method == "HEAD":
            return web.Response(status=e.status, headers=headers)
        resource = urllib.parse.unquote(request.rel_url.raw_path, errors="surrogateescape")
        return self._xml(
            e.status, headers, error_xml(e.code, e.message, resource, headers["x-amz-request-id"], **e.extra)
        )


_NO_NAMES: frozenset[str] = frozenset()
_NO_QUERY: dict[str, str] = {}  # never written


def _key(raw: str) -> str:
    return urllib.parse.unquote(raw[1:], errors="surrogateescape")


def _no_such_key(raw: str) -> S3Error:
    return S3Error(404, "NoSuchKey", "the specified key does not exist", Key=_key(raw))


class _Held:
    """The front end of a bucket for one request: a routed set's version is held until the
    answer is sent (a reload meanwhile never mixes versions in one body)."""

    def __init__(self, dialect: S3Dialect, bucket: str) -> None:
        self.dialect = dialect
        self.bucket = bucket
        self.version: Any = None

    async def __aenter__(self) -> HttpFrontEnd:
        front = self.dialect.front
        router = front.router
        if router is None:
            return front
        name = "" if router.single else self.bucket
        try:
            self.version = await front.caller.call(router._take, name)
        except SetUnavailable as e:
            raise S3Error(503, "ServiceUnavailable", f"the set cannot be served: {e}") from None
        if self.version is None:
            raise S3Error(404, "NoSuchBucket", "the specified bucket does not exist", BucketName=self.bucket)
        return self.version.front

    async def __aexit__(self, *exc: object) -> None:
        if self.version is not None:
            router = self.dialect.front.router
            await self.dialect.front.caller.call(router._give_back, self.version)


class _Refuse(asyncio.Protocol):
    """A connection beyond ``max_clients``: one 503 and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
            b"Connection: close\r\n\r\n"
        )
        transport.close()
