"""Reading a byte range, or the version, of an HTTP target through fsspec's aiohttp session,
checked: the status and Content-Range asked for, the pinned version before any of the body,
and a body never read past the range. A redirect is never followed here: it is raised
(``Redirected``) for the fetcher to decide on (targets/redirects.py)."""

from __future__ import annotations

import errno
import re
from typing import Any

from refmount.targets.pins import Version, VersionChanged
from refmount.targets.rangeanswers import RangesIgnored, ShortRead, Sink, past_end
from refmount.targets.redirects import STATUSES, Redirected

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def request_options(fs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(request keyword arguments, headers) of fsspec's HTTP file system ``fs``, with
    redirects not followed by the client, whatever the storage options say."""
    kw = fs.kwargs.copy()
    kw.pop("allow_redirects", None)
    kw.pop("max_redirects", None)
    kw["allow_redirects"] = False
    return kw, dict(kw.pop("headers", None) or {})


def check_redirect(r: Any) -> None:
    """``Redirected`` if response ``r`` is a redirect (before any of its body is read)."""
    if r.status in STATUSES:
        raise Redirected(r.status, r.headers.get("Location"))


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
    kw, headers = request_options(fs)
    headers["Range"] = f"bytes={start}-{end - 1}"
    if pin is not None and pin.strong_etag is not None:
        headers["If-Match"] = pin.strong_etag
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        check_redirect(r)
        if r.status == 404:
            raise FileNotFoundError(url)
        if r.status == 412 and pin is not None:
            raise VersionChanged(f"the server's version does not match the pinned ETag {pin.etag} "
                                 "(412 Precondition Failed)")
        if r.status == 416:  # starts past the end of the target: retrying cannot help
            got = re.fullmatch(r"bytes\s+\*/(\d+)", r.headers.get("Content-Range", "").strip())
            check_response(pin, r.headers, int(got[1]) if got else None)
            if got and (past := past_end(url, start, end, int(got[1]), b"")) is not None:
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
                past = past_end(url, start, end, int(got[3]), data)
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
    ``GET`` of its first byte where the HEAD tells no size (the total of its Content-Range) or
    is forbidden (``403``: a URL presigned for GET only).
    FileNotFoundError for 404/410, PermissionError for 401/403."""
    kw, headers = request_options(fs)
    headers["Accept-Encoding"] = "identity"
    session = await fs.set_session()
    for method in ("HEAD", "GET"):
        extra = {"Range": "bytes=0-0"} if method == "GET" else {}
        async with session.request(method, fs.encode_url(url), headers={**headers, **extra},
                                   **kw) as r:
            check_redirect(r)
            if r.status in (404, 410):
                raise FileNotFoundError(url)
            if r.status == 403 and method == "HEAD":
                # A URL presigned for GET (an object store's signature covers the method, as
                # where Earthdata redirects to): asked by GET.
                continue
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
