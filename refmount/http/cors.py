"""Cross-origin resource sharing (the Fetch standard's CORS protocol) for the HTTP front end.

``allowed`` is the ``cors`` option: ``None`` (no CORS headers at all), ``*`` (any origin), or
a list of exact origins (``https://viewer.example.org``) separated by ``|`` or whitespace.
``cors_headers`` gives the headers for every response (``404``s and errors included: browser
viewers probe for keys that may be missing and read the CORS-carrying ``404``);
``preflight_headers`` answers an ``OPTIONS`` preflight for ``GET``/``HEAD`` with the request
headers zarr, GDAL and browser viewers send (``Range``, ``If-None-Match``, ...).

Credentials (cookies) are never allowed (no ``Access-Control-Allow-Credentials``): a bearer
token is sent in ``Authorization``, which the preflight allows as a header; whether it is
right is the server's business.
"""

from __future__ import annotations

import re

__all__ = [
    "ALLOWED_METHODS",
    "ALLOWED_REQUEST_HEADERS",
    "EXPOSED_HEADERS",
    "MAX_AGE",
    "cors_headers",
    "cors_problem",
    "origin_allowed",
    "parse_origins",
    "preflight_headers",
]

EXPOSED_HEADERS = ("Content-Range", "Content-Length", "ETag", "Accept-Ranges")
ALLOWED_METHODS = ("GET", "HEAD")
ALLOWED_REQUEST_HEADERS = ("Range", "If-None-Match", "If-Modified-Since", "If-Range", "Authorization")
MAX_AGE = 7200  # seconds a browser may cache the preflight (Chromium's own cap)

_SEPARATORS = re.compile(r"[|\s]+")
_VISIBLE = re.compile(r"[\x21-\x7e]+")
# scheme://host[:port]: what a browser sends in Origin (no path, query, user or fragment).
_ORIGIN = re.compile(r"https?://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:[0-9]{1,5})?", re.ASCII | re.IGNORECASE)


def cors_problem(allowed: str) -> str | None:
    """What is wrong with a ``cors`` value, in words for a one-line error, or ``None``."""
    parts = [p for p in _SEPARATORS.split(allowed.strip()) if p]
    if not parts:
        return "cors needs * or one or more origins such as https://viewer.example.org"
    for part in parts:
        if part != "*" and not _ORIGIN.fullmatch(part.rstrip("/")):
            return (f"cors: {part!r} is not an origin: give scheme://host[:port] "
                    "(http or https, no path), several separated by '|', or *")
    return None


def parse_origins(allowed: str) -> frozenset[str] | None:
    """The exact origins of a ``cors`` value, or ``None`` for ``*`` (any origin)."""
    parts = [p for p in _SEPARATORS.split(allowed.strip()) if p]
    if "*" in parts:
        return None
    return frozenset(_normal(p) for p in parts)


def _normal(origin: str) -> str:
    # Browsers serialize an origin as lowercase scheme://host[:port], without a path.
    return origin.strip().rstrip("/").lower()


def origin_allowed(allowed: str | None, request_origin: str | None) -> bool:
    """Whether a browser on ``request_origin`` may read the responses."""
    if allowed is None or not allowed.strip():
        return False
    origins = parse_origins(allowed)
    if origins is None:
        return True
    if request_origin is None or not _VISIBLE.fullmatch(request_origin):
        return False  # echoed back when allowed: never whitespace or a control character
    return _normal(request_origin) in origins


def cors_headers(allowed: str | None, request_origin: str | None) -> dict[str, str]:
    """The CORS headers of any response, for a request from ``request_origin``.

    ``*``: ``Access-Control-Allow-Origin: *``. An origin list: the request's own origin when
    it is listed, nothing when not, and ``Vary: Origin`` either way (the answer depends on
    the origin, so shared caches must keep them apart). ``None``: no headers.
    """
    if allowed is None or not allowed.strip():
        return {}
    expose = {"Access-Control-Expose-Headers": ", ".join(EXPOSED_HEADERS)}
    if parse_origins(allowed) is None:
        return {"Access-Control-Allow-Origin": "*", **expose}
    if not origin_allowed(allowed, request_origin):
        return {"Vary": "Origin"}
    assert request_origin is not None
    return {"Access-Control-Allow-Origin": request_origin, "Vary": "Origin", **expose}


def preflight_headers(
    allowed: str | None,
    request_origin: str | None,
    request_method: str | None,
    request_headers: str | None = None,
) -> dict[str, str]:
    """The headers of the ``204`` answering an ``OPTIONS`` preflight.

    ``request_method`` and ``request_headers`` are the request's
    ``Access-Control-Request-Method`` and ``Access-Control-Request-Headers``. When the origin
    is allowed, the method is ``GET`` or ``HEAD`` and every requested header is one of
    ``ALLOWED_REQUEST_HEADERS``, the answer allows them; otherwise it carries only
    ``cors_headers`` and the browser refuses the request.
    """
    headers = cors_headers(allowed, request_origin)
    if "Access-Control-Allow-Origin" not in headers:
        return headers
    if (request_method or "").upper() not in ALLOWED_METHODS:
        return headers
    known = {h.lower() for h in ALLOWED_REQUEST_HEADERS}
    asked = [h.strip() for h in (request_headers or "").split(",") if h.strip()]
    if any(h.lower() not in known for h in asked):
        return headers
    headers.pop("Access-Control-Expose-Headers", None)
    headers["Access-Control-Allow-Methods"] = ", ".join(ALLOWED_METHODS)
    headers["Access-Control-Allow-Headers"] = ", ".join(ALLOWED_REQUEST_HEADERS)
    headers["Access-Control-Max-Age"] = str(MAX_AGE)
    return headers
