"""Streaming reader for JSON reference sets (Version 0; Version 1 in v1.py).

The file is never held in memory: ijson's yajl C backend yields one top-level entry at a
time (faster than parsing the whole document with orjson, at ~1/40 of the memory), and
each entry goes straight into the columnar IndexBuilder.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import IO, Any

import ijson

from .index import IndexBuilder
from .limits import DEFAULT_LIMITS, JsonReader, Limits
from .model import ReferenceSetError

V1_FIELDS = frozenset({"version", "templates", "gen", "refs"})

Opener = Callable[[], IO[bytes]]


class IntegerOverflow(ReferenceSetError):
    """yajl (the C parser) stops at integers beyond 64 bits; such files are valid JSON and
    are read again with ijson's pure-Python parser."""


class SurrogateEscapes(ReferenceSetError):
    """yajl decodes a lone ``\\uD800``-``\\uDFFF`` escape in a key to ``?`` (silently renaming
    the key) and fails on one in a value; such files are read again with the pure-Python
    parser, which keeps surrogates exactly (a lone one is then refused as not Unicode)."""


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class SurrogateWatch:
    """A binary stream passed through to yajl, raising SurrogateEscapes at the first UTF-16
    surrogate escape (a pair, as for an emoji, too: rare enough to take the slow path)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._tail = b""  # an escape may straddle two reads

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        if data and (b"\\u" in data or b"\\" in self._tail) and _SURROGATE_ESCAPE.search(self._tail + data):
            raise SurrogateEscapes("UTF-16 surrogate escapes")
        self._tail = data[-5:]
        return data

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> SurrogateWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MalformedJSON(ReferenceSetError):
    """The text is not JSON (as yajl reads it)."""


def _json_error(name: str, err: Exception) -> ReferenceSetError:
    # yajl's message is "parse error: <what>" + the text around the error + a "^" marker
    # on further lines: keep the first line and quote the context, on one line.
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if any("integer overflow" in ln for ln in lines):
        return IntegerOverflow(f"{name}: integer beyond 64 bits")
    msg = lines[0] if lines else type(err).__name__
    context = [ln for ln in lines[1:] if "(right here)" not in ln]
    if context:
        msg += f" near {context[0][:60]!r}"
    if len(msg) > 160:
        msg = msg[:157] + "..."
    return MalformedJSON(f"{name}: malformed JSON: {msg}")


def detect_version(open_stream: Opener, name: str, backend: Any = ijson,
                   limits: Limits = DEFAULT_LIMITS) -> int:
    """0 or 1. Reads only as far as needed: the first top-level key decides unless it is
    one of Version 1's field names, in which case all top-level keys are scanned."""
    with open_stream() as f:
        events = backend.parse(JsonReader(f, name, limits), use_float=True)
        try:
            first = next(events, None)
            if first is None:
                raise ReferenceSetError(f"{name}: empty file, expected a JSON object")
            if first[1] != "start_map":
                kind = {"start_array": "an array"}.get(first[1], f"a {first[1]}")
                raise ReferenceSetError(f"{name}: top level must be a JSON object, got {kind}")
            seen_v1_field = False
            for prefix, event, value in events:
                if prefix == "" and event == "map_key":
                    if value == "version":
                        return 1
                    if value not in V1_FIELDS and not seen_v1_field:
                        return 0
                    seen_v1_field = True
                elif prefix == "" and event == "end_map":
                    break
        except ijson.JSONError as e:
            raise _json_error(name, e) from None
    return 0


def read_v0(open_stream: Opener, name: str, builder: IndexBuilder, backend: Any = ijson,
            limits: Limits = DEFAULT_LIMITS) -> None:
    with open_stream() as f:
        try:
            builder.add_items(backend.kvitems(JsonReader(f, name, limits), "", use_float=True))
        except ijson.JSONError as e:
            raise _json_error(name, e) from None
