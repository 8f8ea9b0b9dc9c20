"""The XML documents of the S3 dialect (``http/s3dialect.py``): listings, the bucket list, errors.

Each document is made in pieces (``iter_*``: generators of ``bytes``) from a page already
bounded by ``max-keys``. Text is escaped for XML (``& < > " '``); a key holding a character
XML 1.0 cannot carry (a control character other than tab, CR and LF, or bytes that are not
UTF-8) is written percent-encoded only under ``encoding-type=url``, and otherwise left out
of the listing (``xml_safe``): no parser would read the document that held it.
Under ``encoding-type=url`` every key, prefix, delimiter and marker is percent-encoded
(``/`` kept), as S3 does and botocore decodes (``unquote_plus``: ``+`` is ``%2B``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote
from xml.sax.saxutils import escape

from refmount.http.listing import in_pieces

__all__ = [
    "NS",
    "Bucket",
    "ListItem",
    "ListPage",
    "error_xml",
    "iso_time",
    "iter_list_buckets",
    "iter_listing",
    "location_xml",
    "xml_safe",
]

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEAD = b'<?xml version="1.0" encoding="UTF-8"?>\n'
OWNER = "<Owner><ID>refmount</ID><DisplayName>refmount</DisplayName></Owner>"
_ENTITIES = {'"': "&quot;", "'": "&apos;", "\r": "&#13;"}
# what XML 1.0 cannot carry, even as a character reference (and lone surrogates: bytes not UTF-8)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


@dataclass(frozen=True)
class ListItem:
    """One object of a listing: its key (bytes as stored), size and quoted ETag."""

    key: bytes
    size: int
    etag: str


@dataclass
class ListPage:
    """One page of ``ListObjects``/``ListObjectsV2``, in the order given."""

    items: list[ListItem] = field(default_factory=list)
    prefixes: list[bytes] = field(default_factory=list)
    truncated: bool = False
    next_token: str | None = None  # V2: NextContinuationToken
    next_marker: bytes | None = None  # V1: NextMarker (the last key or prefix given)


@dataclass(frozen=True)
class Bucket:
    name: str
    created: float


def iso_time(t: float) -> str:
    """S3's time stamps: ``2009-10-12T17:50:30.000Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


_SPECIAL = re.compile("[&<>\"'\r]")


def _text(value: str) -> str:
    return escape(value, _ENTITIES) if _SPECIAL.search(value) else value


def _name(raw: bytes, url: bool) -> str:
    """A key or prefix as written in the document."""
    if url:
        return quote(raw, safe="/")
    return _text(_NOT_XML.sub("\ufffd", raw.decode("utf-8", "replace")))  # keys listed are xml_safe


def xml_safe(raw: bytes) -> bool:
    """Whether a key can be written in an XML 1.0 document without ``encoding-type=url``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _NOT_XML.search(text) is None


def _element(tag: str, text: str) -> str:
    return f"<{tag}>{text}</{tag}>"


def iter_listing(
    page: ListPage,
    *,
    bucket: str,
    prefix: bytes,
    delimiter: bytes | None,
    max_keys: int,
    url: bool,
    v2: bool,
    modified: str,
    start_after: bytes | None = None,
    token: str | None = None,
    marker: bytes | None = None,
    owner: bool = False,
    chunk: int = 64 << 10,
) -> Iterator[bytes]:
    """A ``ListBucketResult`` (V2 with ``v2``, else V1) in pieces of about ``chunk`` bytes."""

    def parts() -> Iterator[str]:
        yield f'<ListBucketResult xmlns="{NS}">'
        yield _element("Name", _text(bucket))
        yield _element("Prefix", _name(prefix, url))
        if v2:
            yield _element("KeyCount", str(len(page.items) + len(page.prefixes)))
            if token is not None:
                yield _element("ContinuationToken", _text(token))
            if page.next_token is not None:
                yield _element("NextContinuationToken", _text(page.next_token))
            if start_after is not None:
                yield _element("StartAfter", _name(start_after, url))
        else:
            yield _element("Marker", _name(marker or b"", url))
            if page.next_marker is not None:
                yield _element("NextMarker", _name(page.next_marker, url))
        yield _element("MaxKeys", str(max_keys))
        if delimiter is not None:
            yield _element("Delimiter", _name(delimiter, url))
        if url:
            yield _element("EncodingType", "url")
        yield _element("IsTruncated", "true" if page.truncated else "false")
        for item in page.items:
            yield (
                f"<Contents>{_element('Key', _name(item.key, url))}"
                f"{_element('LastModified', modified)}{_element('ETag', _text(item.etag))}"
                f"{_element('Size', str(item.size))}{OWNER if owner else ''}"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        for p in page.prefixes:
            yield f"<CommonPrefixes>{_element('Prefix', _name(p, url))}</CommonPrefixes>"
        yield "</ListBucketResult>"

    yield from in_pieces(parts(), chunk, HEAD, "surrogateescape")


def iter_list_buckets(buckets: Iterable[Bucket], chunk: int = 64 << 10) -> Iterator[bytes]:
    """A ``ListAllMyBucketsResult``."""

    def parts() -> Iterator[str]:
        yield f'<ListAllMyBucketsResult xmlns="{NS}">{OWNER}<Buckets>'
        for b in buckets:
            created = _element("CreationDate", iso_time(b.created))
            yield f"<Bucket>{_element('Name', _text(b.name))}{created}</Bucket>"
        yield "</Buckets></ListAllMyBucketsResult>"

    yield from in_pieces(parts(), chunk, HEAD, "surrogateescape")


def location_xml(region: str) -> bytes:
    """``GetBucketLocation``'s answer (us-east-1 is written as an empty constraint, as S3 does)."""
    shown = "" if region == "us-east-1" else _text(region)
    return HEAD + f'<LocationConstraint xmlns="{NS}">{shown}</LocationConstraint>'.encode()


def error_xml(code: str, message: str, resource: str, request_id: str, **extra: str) -> bytes:
    """S3's error document: ``<Error><Code>NoSuchKey</Code><Message>...``."""
    more = "".join(_element(k, _text(v)) for k, v in extra.items())
    return HEAD + (
        f"<Error>{_element('Code', code)}{_element('Message', _text(message))}"
        f"{_element('Resource', _text(resource))}{more}"
        f"{_element('RequestId', request_id)}</Error>"
    ).encode("utf-8", "surrogateescape")


