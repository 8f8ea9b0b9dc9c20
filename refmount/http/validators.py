"""Validators and conditional requests (RFC 9110, sections 8.8 and 13) for the HTTP front end.

A served file's ``ETag`` is strong and computed without fetching anything: it hashes what
identifies the file's bytes, the reference itself (the target URL, offset and length, or the
inline bytes), the set's identity and time stamp, whether the view is decoded and the size
served (``ref_parts``). The same reference in the same set gives the same tag in every
process; a regenerated set, another reference, or the decoded view gives another. The URL is
hashed, never shown, so a credential in it cannot leak through the tag. Like the mount, this
assumes targets are not rewritten in place: a target changed under an unchanged set keeps its
tag.

``Last-Modified`` is the set's time stamp (the ``mtime`` every file of the mount shows).

``not_modified`` is the weak comparison of ``If-None-Match`` (``*``, lists, ``W/`` tags);
``not_modified_since`` is ``If-Modified-Since``; ``is_not_modified`` applies RFC 9110's
precedence (section 13.2.2): ``If-None-Match`` when present, else ``If-Modified-Since``,
and only for ``GET`` and ``HEAD``. nginx differs in requiring both headers to agree when a
client sends both, and in comparing dates for equality (``if_modified_since exact``); Go's
``http.ServeContent`` (rclone ``serve http``) follows the RFC as this module does.
"""

from __future__ import annotations

import re
from email.utils import formatdate, parsedate_to_datetime

import xxhash

from refmount.refs.model import Ref

__all__ = [
    "etag_for",
    "is_not_modified",
    "last_modified",
    "not_modified",
    "not_modified_since",
    "ref_parts",
]

# One element of an If-None-Match list: an entity tag (optionally weak), then a comma or
# the end. etagc is any visible character but DQUOTE (RFC 9110, 8.8.3).
_TAG = re.compile(r'[ \t]*(?:W/)?("[\x21\x23-\x7e\x80-\xff]*")[ \t]*(?:,|$)')


def etag_for(parts: bytes) -> str:
    """A strong entity tag for a representation identified by ``parts``: quoted xxh3-128 hex."""
    return f'"{xxhash.xxh3_128_hexdigest(parts)}"'


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(8, "little") + value


def ref_parts(ref: Ref, *, set_identity: str, mtime_ns: int, decoded: bool, size: int) -> bytes:
    """What identifies the bytes served for ``ref``: the input of ``etag_for``.

    ``set_identity`` names the set (its SOURCE and version: an index's identity),
    ``mtime_ns`` is its time stamp, ``decoded`` whether ``-o decode`` serves this file
    decoded, ``size`` the size served. Each field is length-prefixed, so no two different
    references give the same parts.
    """
    target = b"" if ref.data is not None else (ref.url or "").encode("utf-8", "surrogatepass")
    inline = b"" if ref.data is None else xxhash.xxh3_128_digest(ref.data)
    return b"".join(
        (
            b"refmount-etag-1",
            _field(set_identity.encode("utf-8", "surrogatepass")),
            _field(mtime_ns.to_bytes(16, "little", signed=True)),
            _field(b"decoded" if decoded else b"stored"),
            _field(int(ref.kind).to_bytes(1, "little")),
            _field(target),
            _field(ref.offset.to_bytes(16, "little", signed=True)),
            _field(ref.length.to_bytes(16, "little", signed=True)),
            _field(inline),
            _field(size.to_bytes(16, "little", signed=True)),
        )
    )


def _tags(header: str) -> list[str] | None:
    """The opaque tags of an entity-tag list (``W/`` dropped), or ``None`` if malformed."""
    tags: list[str] = []
    pos = 0
    while pos < len(header):
        if not header[pos:].strip(" \t,"):
            break
        if header[pos] in " \t,":  # empty list elements
            pos += 1
            continue
        m = _TAG.match(header, pos)
        if m is None:
            return None
        tags.append(m.group(1))
        pos = m.end()
    return tags


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` matches ``etag`` (weak comparison): answer ``304``.

    ``*`` matches any existing file. A malformed header matches nothing (the full answer is
    always correct).
    """
    if if_none_match is None:
        return False
    if if_none_match.strip(" \t") == "*":
        return True
    tags = _tags(if_none_match)
    if not tags:
        return False
    opaque = etag[2:] if etag.startswith("W/") else etag
    return opaque in tags


def last_modified(mtime: float) -> str:
    """``Last-Modified`` for a time stamp in seconds: an IMF-fixdate."""
    return formatdate(int(mtime), usegmt=True)


def not_modified_since(if_modified_since: str | None, mtime: float) -> bool:
    """Whether the file has not changed since ``If-Modified-Since``: answer ``304``.

    Compared at whole seconds, as ``Last-Modified`` is written. An unparseable date is
    ignored (``False``), as RFC 9110 requires.
    """
    if not if_modified_since:
        return False
    try:
        since = parsedate_to_datetime(if_modified_since)
    except (TypeError, ValueError, IndexError, OverflowError):
        return False
    if since.tzinfo is None:
        return False  # not an HTTP-date (those are in GMT)
    return int(mtime) <= since.timestamp()


def is_not_modified(
    method: str, *, if_none_match: str | None, if_modified_since: str | None, etag: str, mtime: float
) -> bool:
    """RFC 9110's answer for a ``GET``/``HEAD``: ``True`` means ``304 Not Modified``."""
    if method not in ("GET", "HEAD"):
        return False
    if if_none_match is not None:
        return not_modified(if_none_match, etag)
    return not_modified_since(if_modified_since, mtime)
