"""The ``Range`` request header (RFC 9110, section 14) for the HTTP front end.

``parse_range(header, size)`` turns a request's ``Range`` header into the one byte range to
serve, ``None`` for the whole body (``200``), or raises ``RangeNotSatisfiable`` (``416`` with
``Content-Range: bytes */size``). Where RFC 9110 leaves the server a choice, the answers are
nginx's (its static module, measured against Debian's nginx), with multipart responses
replaced by the whole body:

* ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n``: ``b`` is clamped to ``size - 1``; a suffix
  longer than the body is the whole body (as a ``206``); ``a >= size`` and ``-0`` are
  unsatisfiable. The unit is case-insensitive and whitespace around numbers and commas is
  accepted, as nginx does.
* A unit other than ``bytes`` is ignored (RFC 9110 requires it; nginx does the same).
* A syntactically invalid header (``bytes=abc``, ``bytes=5-2``, ``bytes=``) is ignored: the
  whole body is served. RFC 9110 lets a server ignore or reject it; nginx rejects with a
  ``416``, as does Go's ``http.ServeContent`` (rclone ``serve http`` over its VFS), and rclone's
  own ``serve.Object`` with a ``400``. Ignoring serves correct bytes to a confused client and
  never a wrong ``206``.
* Several ranges (``bytes=0-9,20-29``): nginx and Go answer ``multipart/byteranges`` (Go
  serves the whole body when the ranges add up to more than it), rclone's ``serve.Object``
  answers ``400``. Here, as nginx answers with ``max_ranges 1``: when exactly one of them is
  satisfiable it is served as a ``206``, when none is the answer is ``416``, when more than
  one is the whole body is served with ``200`` (RFC 9110 allows ignoring ``Range``; zarr,
  GDAL, fsspec and browsers send a single range; many small ranges never cost more than one
  body). Empty list elements are skipped (RFC 9110, section 5.6.1).
* An empty body (``size == 0``): a ``206`` cannot be written (there is no last byte), so a
  range that nginx would accept, one starting at ``0`` or a suffix, is served as the whole
  (empty) body with ``200``; any other range (``bytes=5-``) is ``416`` with ``bytes */0``.

``If-Range`` (section 13.1.5) is honoured for strong entity tags only: a date or a weak tag
never matches, so the whole body is served, which is always correct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ByteRange",
    "RangeNotSatisfiable",
    "content_range",
    "if_range_matches",
    "parse_range",
    "unsatisfied_range",
]

# One range-spec: "a-b", "a-" or "-n", with the optional whitespace nginx tolerates.
_SPEC = re.compile(r"[ \t]*(?:([0-9]+)[ \t]*-[ \t]*([0-9]*)|-[ \t]*([0-9]+))[ \t]*", re.ASCII)
_MAX_DIGITS = 30  # far beyond any body; int() refuses strings of over 4300 digits
_UNIT = re.compile(r"[ \t]*bytes[ \t]*=", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``[start, stop)`` of a body: ``stop`` is exclusive, ``len()`` is the count."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(f"not a non-empty byte range: [{self.start}, {self.stop})")

    def __len__(self) -> int:
        return self.stop - self.start


class RangeNotSatisfiable(Exception):
    """No range of the header lies within the body: answer ``416`` with ``unsatisfied_range``."""

    def __init__(self, size: int):
        super().__init__(f"no requested range lies within {size} bytes")
        self.size = size


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The one range of a body of ``size`` bytes to serve, or ``None`` for the whole body.

    Raises ``RangeNotSatisfiable`` when the header is valid but none of its ranges lies
    within the body (see the module's docstring for every case).
    """
    if size < 0:
        raise ValueError(f"negative size {size}")
    if header is None:
        return None
    unit = _UNIT.match(header)
    if unit is None:
        return None  # no header, another unit, or not a range header at all: ignored
    satisfiable: list[ByteRange] = []
    whole = False  # a range nginx accepts on an empty body
    seen = 0
    for element in header[unit.end():].split(","):
        if not element.strip(" \t"):
            continue  # empty list element
        spec = _SPEC.fullmatch(element)
        if spec is None:
            return None  # syntactically invalid: ignored
        first, last, suffix = spec.groups()
        seen += 1
        if suffix is not None:
            n = _number(suffix)
            if size == 0:
                whole = True  # nginx: any suffix of an empty body is the whole body
            elif n > 0:
                satisfiable.append(ByteRange(max(0, size - n), size))
            continue
        start = _number(first)
        if last and _number(last) < start:
            return None  # "5-2": invalid, ignored
        if start >= size:
            whole = whole or (size == 0 and start == 0)
            continue
        stop = size if not last else min(_number(last) + 1, size)
        satisfiable.append(ByteRange(start, stop))
    if seen == 0:
        return None  # "bytes=" or "bytes=,": no range at all
    if len(satisfiable) == 1:
        return satisfiable[0]
    if satisfiable or whole:
        return None
    raise RangeNotSatisfiable(size)


def _number(digits: str) -> int:
    """A decimal position; one too long for ``int()`` is past the end of any body."""
    digits = digits.lstrip("0")
    return int(digits or "0") if len(digits) <= _MAX_DIGITS else 10**_MAX_DIGITS


def content_range(r: ByteRange, size: int) -> str:
    """The ``Content-Range`` of a ``206`` serving ``r`` of a body of ``size`` bytes."""
    if r.stop > size:
        raise ValueError(f"range [{r.start}, {r.stop}) runs past {size} bytes")
    return f"bytes {r.start}-{r.stop - 1}/{size}"


def unsatisfied_range(size: int) -> str:
    """The ``Content-Range`` of a ``416``: ``bytes */size``."""
    return f"bytes */{size}"


def if_range_matches(if_range: str | None, etag: str) -> bool:
    """Whether a ``Range`` may be honoured under the request's ``If-Range`` header.

    ``True`` when there is no ``If-Range``; otherwise only when it is a strong entity tag
    equal to ``etag`` (the strong comparison of RFC 9110, section 8.8.3.2). A date or a weak
    tag is ``False``: serve the whole body.
    """
    if if_range is None:
        return True
    value = if_range.strip(" \t")
    return value.startswith('"') and not etag.startswith("W/") and value == etag
