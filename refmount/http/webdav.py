"""WebDAV listings (RFC 4918, class 1, read-only) on the HTTP view: ``PROPFIND`` with ``Depth: 0``
or ``1``, answered ``207 Multi-Status``, for the clients that list a plain HTTP server that way
(obstore's ``HTTPStore``, rclone's webdav backend, davfs2, desktop file managers).

Each response carries ``displayname``, ``resourcetype`` (``<D:collection/>`` for a directory),
``getcontentlength``, ``getlastmodified`` and ``getetag`` (a file's, equal to its ``HEAD``'s:
``http/fileinfo.py``), whatever properties the request body names (request bodies are never
read). ``Depth: infinity`` (also an absent ``Depth``, which means it) is refused ``403`` with
``<D:propfind-finite-depth/>``, as RFC 4918 allows: a client walks a tree one level at a time.
A directory's entries are streamed in batches taken from the tree with its resume tokens, so
the memory of a listing does not grow with the directory.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from contextlib import aclosing
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_request import BaseRequest

from refmount.base.errors import ReadError
from refmount.http.fileinfo import Planner, file_info, zmetadata_info
from refmount.http.pathplan import Found, Unavailable
from refmount.http.s3xml import ListItem
from refmount.http.validators import last_modified


class DavFront(Planner, Protocol):
    """What a listing asks of the HTTP front end (``http/frontend.py``'s ``HttpFrontEnd``, which
    calls this module: a protocol, not an import, so that neither imports the other)."""

    caller: Any  # its TrioCaller
    _mtime: float
    _last_modified: str

    async def _find(self, parts: list[bytes]) -> Found | None: ...

    async def _send(self, request: BaseRequest, response: web.StreamResponse, data: bytes) -> bool: ...

    async def _prepare(self, request: BaseRequest, response: web.StreamResponse) -> bool: ...

    def _abort(self, request: BaseRequest, response: web.StreamResponse) -> web.StreamResponse: ...

    @staticmethod
    def _plain(status: int, headers: dict[str, str], text: str) -> web.Response: ...

__all__ = ["DAV_HEADERS", "FINITE_DEPTH", "multistatus_entry", "propfind", "propfind_root"]

DAV_HEADERS = {"DAV": "1", "MS-Author-Via": "DAV"}
BATCH = 512  # entries taken from the tree (and described) per call into trio
HEAD = '<?xml version="1.0" encoding="utf-8"?>\n<D:multistatus xmlns:D="DAV:">'
TAIL = "</D:multistatus>\n"
FINITE_DEPTH = (
    b'<?xml version="1.0" encoding="utf-8"?>\n<D:error xmlns:D="DAV:"><D:propfind-finite-depth/></D:error>\n'
)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def multistatus_entry(
    href: str, name: str, is_dir: bool, size: int | None, modified: str, etag: str | None
) -> str:
    """One ``<D:response>``: ``href`` already %-encoded, ``name`` the display name."""
    props = [
        f"<D:displayname>{_escape(name)}</D:displayname>",
        "<D:resourcetype><D:collection/></D:resourcetype>" if is_dir else "<D:resourcetype/>",
        f"<D:getlastmodified>{modified}</D:getlastmodified>",
    ]
    if not is_dir and size is not None:
        props.append(f"<D:getcontentlength>{size}</D:getcontentlength>")
    if etag is not None:
        props.append(f"<D:getetag>{_escape(etag)}</D:getetag>")
    return (
        f"<D:response><D:href>{_escape(href)}</D:href><D:propstat><D:prop>{''.join(props)}</D:prop>"
        "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
    )


def _href(raw: bytes) -> str:
    return urllib.parse.quote(raw, safe="/")


def _name(raw: bytes) -> str:
    return raw.rstrip(b"/").rpartition(b"/")[2].decode("utf-8", "replace")


def _depth(request: BaseRequest) -> str | None:
    depth = request.headers.get("Depth", "infinity").strip().lower()
    return depth if depth in ("0", "1") else None


async def propfind(
    front: DavFront, request: BaseRequest, headers: dict[str, str], parts: list[bytes], prefix: str = ""
) -> web.StreamResponse:
    """The answer to a ``PROPFIND`` of ``parts`` (``prefix``: a catalogue's set before it)."""
    depth = _depth(request)
    if depth is None:
        headers["Content-Type"] = "application/xml; charset=utf-8"
        return web.Response(status=403, headers=headers, body=FINITE_DEPTH)
    try:
        found = await front.caller.call(front._find, parts)
    except Unavailable:
        return front._plain(503, headers, "not served: past the bounds of the server (see its log)")
    except ReadError:
        return front._plain(502, headers, "a target of this key could not be read")
    if found is None:
        return front._plain(404, headers, "no such key")
    modified = front._last_modified
    base = prefix.encode("utf-8", "surrogateescape") + b"/" + found.key.encode("utf-8", "surrogateescape")
    if not found.is_dir:
        info = await front.caller.call(_file, front, found)
        size, etag = (info.size, info.etag) if info is not None else (found.size, None)
        body = HEAD + multistatus_entry(_href(base), _name(base), False, size, modified, etag) + TAIL
        return _multistatus(headers, body.encode("utf-8", "surrogateescape"))
    base = base if base.endswith(b"/") else base + b"/"
    first = multistatus_entry(_href(base), _name(base) or "/", True, None, modified, None)
    response = web.StreamResponse(status=207, headers=headers)
    response.headers["Content-Type"] = "application/xml; charset=utf-8"
    if request.version >= (1, 1):
        response.enable_chunked_encoding()
    if not await front._prepare(request, response):
        return response
    if not await front._send(request, response, (HEAD + first).encode()):
        return response
    if depth == "1":
        token: int | None = 0
        while token is not None:
            try:
                entries, token = await front.caller.call(_batch, front, found, token)
            except (TimeoutError, ReadError, ConnectionError):
                return front._abort(request, response)
            piece = "".join(
                multistatus_entry(
                    _href(base + name + (b"/" if is_dir else b"")),
                    _name(name),
                    is_dir,
                    None if info is None else info.size,
                    modified,
                    None if info is None else info.etag,
                )
                for name, is_dir, info in entries
            )
            if piece and not await front._send(request, response, piece.encode("utf-8", "surrogateescape")):
                return response
    if not await front._send(request, response, TAIL.encode()):
        return response
    await response.write_eof()
    return response


def propfind_root(
    front: DavFront, request: BaseRequest, headers: dict[str, str], names: Iterable[str]
) -> web.Response:
    """A catalogue's root: one collection per set (none opened)."""
    if _depth(request) is None:
        headers["Content-Type"] = "application/xml; charset=utf-8"
        return web.Response(status=403, headers=headers, body=FINITE_DEPTH)
    modified = last_modified(front._mtime)
    parts = [HEAD, multistatus_entry("/", "/", True, None, modified, None)]
    if _depth(request) == "1":
        parts += [
            multistatus_entry(
                "/" + _href(n.encode("utf-8", "surrogateescape")) + "/", n, True, None, modified, None
            )
            for n in names
        ]
    parts.append(TAIL)
    return _multistatus(headers, "".join(parts).encode("utf-8", "surrogateescape"))


def _multistatus(headers: dict[str, str], body: bytes) -> web.Response:
    headers["Content-Type"] = "application/xml; charset=utf-8"
    return web.Response(status=207, headers=headers, body=body)


async def _file(front: DavFront, found: Found) -> ListItem | None:
    if found.node is None:  # the synthesized .zmetadata
        return await zmetadata_info(front)
    return await file_info(front, found.node, found.key.encode("utf-8", "surrogateescape"), found.size)


async def _batch(
    front: DavFront, found: Found, token: int
) -> tuple[list[tuple[bytes, bool, Any]], int | None]:
    """In trio: up to ``BATCH`` entries of a directory from the resume token ``token`` (0 at
    first: then the synthesized ``.zmetadata`` first at the root), and the next token (None:
    the end)."""
    tree = front.core.tree
    out: list[tuple[bytes, bool, Any]] = []
    if token == 0 and not found.key:
        extra = await zmetadata_info(front)
        if extra is not None:
            out.append((b".zmetadata", False, extra))
    dir_path = found.key.encode("utf-8", "surrogateescape")
    nxt: int | None = None
    async with aclosing(tree.entries(found.node, token)) as entries:
        async for name, ino, is_dir, after, size in entries:
            if is_dir:
                out.append((name, True, None))
            else:
                key = dir_path + b"/" + name if dir_path else name
                out.append((name, False, await file_info(front, tree.node(ino), key, size)))
            nxt = after
            if len(out) >= BATCH:
                return out, nxt
    return out, None
