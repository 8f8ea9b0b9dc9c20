"""HTTP requests of a server of several sets (``-o catalog``) or of one set with ``reload``:
the path names the set (``/<name>/...``; with one set, the whole path is the set's), and the
front end of that set's current version (an ``httpserve.HttpFrontEnd`` over its core)
answers the rest. The root of a catalogue lists its sets without opening any. A response
holds its version (``Sets.hold``) until it is sent: a swap meanwhile never mixes versions
in one body."""

from __future__ import annotations

import logging
import urllib.parse
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from refmount.base.stats import Stats
from refmount.base.triocall import TrioCaller
from refmount.http import listing, webdav
from refmount.http.frontend import INFO_IN_STATS, HttpFrontEnd
from refmount.sets.opensets import Sets
from refmount.sets.setslots import SetEvents, SetUnavailable, SetVersion

if TYPE_CHECKING:
    from refmount.serving.metrics import Reading

log = logging.getLogger(__name__)

__all__ = ["SetsRouter"]


class SetsRouter(SetEvents):
    """Routes requests to the sets' front ends (``HttpFrontEnd``'s ``router``)."""

    def __init__(self, sets: Sets, caller: TrioCaller, *, single: bool, settings: dict[str, Any],
                 describe: Any = None) -> None:
        self.sets = sets
        self.caller = caller
        self.single = single
        self.settings = settings  # HttpFrontEnd's keyword arguments for each version's
        self.describe = describe or sets.describe
        self.shared: HttpFrontEnd | None = None  # the server's own front end (its counters)
        sets.events = self

    def made(self, version: SetVersion) -> None:
        front = HttpFrontEnd(version.core, self.caller, **self.settings)
        if self.shared is not None:
            front.stats = self.shared.stats  # one set of HTTP counters for the server
        version.front = front

    # ---- trio side ------------------------------------------------------------------------
    async def _take(self, name: str) -> SetVersion | None:
        slot = self.sets.slot(name)
        if slot is None:
            return None
        version = await self.sets.open(slot)
        self.sets.hold(version)
        return version

    async def _give_back(self, version: SetVersion) -> None:
        self.sets.drop(version)

    # ---- asyncio side: one request --------------------------------------------------------
    async def answer(self, front: HttpFrontEnd, request: BaseRequest, headers: dict[str, str],
                     raw: str) -> web.StreamResponse:
        self.shared = front
        if self.single:
            name, rest, prefix = "", raw, ""
        else:
            if raw == "/":
                if request.method == "PROPFIND":
                    return webdav.propfind_root(front, request, headers, self.sets.names())
                return self._root(front, request, headers)
            first, slash, rest = raw[1:].partition("/")
            name = urllib.parse.unquote(first, errors="surrogateescape")
            prefix = "/" + first
            if not slash:  # /name: the set's directory wants its trailing slash
                if self.sets.slot(name) is None:
                    return front._plain(404, headers, "no such set")
                headers["Location"] = raw + "/"
                return front._plain(301, headers, "a directory")
            rest = "/" + rest
        try:
            version = await self.caller.call(self._take, name)
        except SetUnavailable as e:
            return front._plain(503, headers, f"the set cannot be served: {e}")
        if version is None:
            return front._plain(404, headers, "no such set")
        try:
            return await version.front.answer_path(request, headers, rest, prefix)
        finally:
            await self.caller.call(self._give_back, version)

    def _root(self, front: HttpFrontEnd, request: BaseRequest, headers: dict[str, str]) -> web.Response:
        """The catalogue's listing: one directory per set."""
        entries = [(name, True, None) for name in self.sets.names()]
        as_json = listing.wants_json(request.headers.get("Accept"), request.rel_url.query_string)
        pieces = (listing.iter_json_index("/", entries) if as_json
                  else listing.iter_html_index("/", entries, mtime=front._mtime))
        headers["Cache-Control"] = "no-cache"  # sets come and go
        headers["Content-Type"] = "application/json" if as_json else "text/html; charset=utf-8"
        body = b"" if request.method == "HEAD" else b"".join(pieces)
        return web.Response(status=200, headers=headers, body=body)

    def counters(self, front: HttpFrontEnd) -> dict[str, Any]:
        counters: dict[str, Any] = Stats().as_dict()
        for version in self.sets.open_versions():
            for k, v in version.core.stats.as_dict().items():
                if isinstance(v, int) and isinstance(counters.get(k), int):
                    counters[k] += v
        server = vars(front.stats).copy()
        server["http_status"] = dict(front.stats.http_status)
        counters.update(server)
        counters.update(self.describe())
        slot = self.sets.slot("") if self.single else None
        if slot is not None and slot.current is not None:  # the version served now (reload swaps it)
            info = slot.current.core.info
            counters.update({name: info[name] for name in INFO_IN_STATS if name in info})
        return counters

    def reading(self, front: HttpFrontEnd) -> Reading:
        from refmount.serving.metrics import Reading

        front.stats.http_connections = len(front._server.connections)
        return Reading("http", cores=[v.core for v in self.sets.counted_versions()], http=front.stats,
                       http_latency=front.request_latency, sets=self.describe(),
                       retired=self.sets.retired)
