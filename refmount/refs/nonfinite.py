"""Bare ``NaN``, ``Infinity`` and ``-Infinity`` in JSON, as Python's ``json`` writes them.

yajl (ijson's C backend, and its pure-Python one) refuses these tokens. They are accepted
without giving up streaming:

- ``NonFiniteWatch`` passes the stream through untouched and notes whether ``NaN``/``Infinity``
  bytes went by (a ``memmem``, no tokenizing): files that parse are parsed exactly as before.
- A file that fails to parse after such bytes went by is read again through
  ``NonFiniteFilter``, a tokenizer-level byte filter that rewrites each of the three tokens
  *outside strings* into a JSON string holding a random per-parse marker, and
  ``FixingBackend``, which turns those marker strings back into the float values in everything
  the parser yields. String state is tracked across buffer boundaries (escapes included); a
  token split between two reads is held back until complete.

The marker is 128 random bits drawn for each parse, so no string of the file can be taken
for it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from typing import IO, Any

import ijson

TOKENS = (b"NaN", b"Infinity", b"-Infinity")
VALUES = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

# Outside strings: skip everything up to a '"' that opens a string not closed in this
# buffer, or an 'N', 'I' or '-I' (the only places the three tokens can start). Strings are
# skipped whole. Possessive quantifiers: linear time, no backtracking.
_SKIP = re.compile(rb'(?s:[^"NI\-]++|-(?=[^I])|"(?:[^"\\]++|\\.)*+")*+')
# Inside a string (after its opening quote): up to the closing quote or the buffer's end.
_IN_STRING = re.compile(rb"(?s:[^\"\\]++|\\.)*+")


_MARKED = re.compile(rb'"?[0-9a-f]{0,32}(NaN|-?Infinity)"')


class NonFiniteWatch:
    """A binary stream passed through unchanged, noting in ``seen`` (shared by the streams of
    one parse) whether ``NaN`` or ``Infinity`` bytes went by: inside strings too, as zarr's
    ``"fill_value": "NaN"``, so only a parse that then fails is worth repeating."""

    def __init__(self, stream: IO[bytes], seen: list[bool]) -> None:
        self._stream = stream
        self._seen = seen
        self._tail = b""  # a token may straddle two reads

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        if data and not self._seen[0] and (
            b"NaN" in data or b"Infinity" in data
            or (self._tail and (b"NaN" in self._tail + data[:8] or b"Infinity" in self._tail + data[:8]))
        ):
            self._seen[0] = True
        self._tail = data[-7:]
        return data

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> NonFiniteWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NonFiniteFilter:
    """A binary stream with ``NaN``/``Infinity``/``-Infinity`` outside strings replaced by
    marker strings (``"<marker>NaN"`` ...). ``read`` may return more bytes than asked for, and
    returns ``b""`` only at the end of the stream."""

    def __init__(self, stream: IO[bytes], marker: str) -> None:
        self._stream = stream
        self._subst = {tok: b'"' + marker.encode() + tok + b'"' for tok in TOKENS}
        self._in_string = False
        self._carry = b""  # bytes held back: a partial token, or a trailing backslash in a string
        self._eof = False
        self.replaced = 0

    @property
    def held_back(self) -> int:
        """Bytes read from the stream and not yet returned (at most a token's length)."""
        return len(self._carry)

    def read(self, n: int = -1) -> bytes:
        if n == 0:  # ijson's probe for a binary stream
            return b""
        while True:
            if self._eof:
                out, self._carry = self._carry, b""
                return out
            data = self._stream.read(n if n and n > 0 else 1 << 16)
            if not data:
                self._eof = True
                continue
            out = self._filter(self._carry + data if self._carry else data)
            if out:
                return out

    def _filter(self, data: bytes) -> bytes:
        self._carry = b""
        end = len(data)
        pos = emit = 0
        out: list[bytes] = []
        while pos < end:
            if self._in_string:
                stop = _IN_STRING.match(data, pos).end()  # type: ignore[union-attr]
                if stop == end:
                    pos = end
                elif data[stop] == 0x22:  # the closing quote
                    self._in_string = False
                    pos = stop + 1
                else:  # a backslash as the last byte: keep it with its escaped byte
                    self._carry = data[stop:]
                    end = stop
                    break
                continue
            stop = _SKIP.match(data, pos).end()  # type: ignore[union-attr]
            if stop == end:
                break
            if data[stop] == 0x22:  # a string that goes on in the next read
                self._in_string = True
                pos = stop + 1
                continue
            for tok in TOKENS:
                if data.startswith(tok, stop):
                    out.append(data[emit:stop])
                    out.append(self._subst[tok])
                    self.replaced += 1
                    pos = emit = stop + len(tok)
                    break
            else:
                rest = data[stop:]
                if len(rest) < 9 and any(tok.startswith(rest) for tok in TOKENS):
                    self._carry = rest  # complete it with the next read
                    end = stop
                    break
                pos = stop + 1  # not one of the tokens: invalid JSON, left for the parser to report
        out.append(data[emit:end])
        return b"".join(out)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> NonFiniteFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FixingBackend:
    """An ijson backend whose values have the filter's marker strings turned back into
    ``nan``/``inf``/``-inf`` floats (counted in ``self.count``)."""

    def __init__(self, backend: Any, marker: str) -> None:
        self._backend = backend
        self._marker = marker
        self._subst = {marker + tok.decode(): VALUES[tok.decode()] for tok in TOKENS}
        self.count = 0

    def _fix(self, value: Any) -> Any:
        t = type(value)
        if t is str:
            if value.startswith(self._marker):
                self.count += 1
                return self._subst.get(value, value)
            return value
        if t is list:
            return [self._fix(v) for v in value]
        if t is dict:
            return {k: self._fix(v) for k, v in value.items()}
        return value

    def _errors(self, events: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from events
        except ijson.JSONError as e:  # show the tokens as written, not the markers
            # (the parser quotes a window of the text: a marker may be cut at its start)
            text = _MARKED.sub(rb"\1", str(e).encode()).decode(errors="replace")
            raise ijson.JSONError(text) from None

    def parse(self, f: IO[bytes], **config: Any) -> Iterator[tuple[str, str, Any]]:
        fix = self._fix
        for prefix, event, value in self._errors(self._backend.parse(f, **config)):
            if event == "string" and value.startswith(self._marker):
                yield prefix, "number", fix(value)
            else:
                yield prefix, event, value

    def items(self, f: IO[bytes], prefix: str, **config: Any) -> Iterator[Any]:
        fix = self._fix
        for value in self._errors(self._backend.items(f, prefix, **config)):
            yield fix(value)

    def kvitems(self, f: IO[bytes], prefix: str, **config: Any) -> Iterator[tuple[str, Any]]:
        fix, marker = self._fix, self._marker
        for key, value in self._errors(self._backend.kvitems(f, prefix, **config)):
            if (  # a range reference, nearly every key of a big set: as is
                type(value) is list and len(value) == 3 and type(value[1]) is int
                and type(value[2]) is int and type(value[0]) is str and not value[0].startswith(marker)
            ):
                yield key, value
            else:
                yield key, fix(value)


def filtered(opener: Callable[[], IO[bytes]], backend: Any) -> tuple[Callable[[], IO[bytes]], FixingBackend]:
    """An opener and a backend that read JSON with the three tokens (one marker per call)."""
    marker = secrets.token_hex(16)

    def open_filtered() -> IO[bytes]:
        return NonFiniteFilter(opener(), marker)  # type: ignore[return-value]

    return open_filtered, FixingBackend(backend, marker)
