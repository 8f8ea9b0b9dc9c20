"""Reading a Parquet set's ``.zmetadata`` within the bounds JSON sets have.

``.zmetadata`` holds every metadata key of the set in one JSON document, parsed whole. So
before it is parsed:

* at most ``max_inline`` bytes are read (after any decompression: by the name's extension,
  under ``max_ratio``, or an HTTP ``Content-Encoding``, read as a stream in bounded pieces);
  a longer one is refused;
* the text is scanned (limits.JsonReader) for nesting deeper than ``max_nesting`` and for
  the number of JSON values, at most MAX_VALUES (the Python objects a parse makes).
"""

from __future__ import annotations

import io
import json
from typing import IO, Any

import orjson

from refmount.base.urls import is_chained, protocol
from refmount.refs.limits import JsonReader, Limits, size_text
from refmount.refs.model import ReferenceSetError
from refmount.refs.source import open_source

MAX_VALUES = 1 << 20  # JSON values in .zmetadata (each becomes a Python object when parsed)
PIECE = 1 << 20


def _read_at_most(f: IO[bytes], limit: int) -> bytes:
    """Up to ``limit`` bytes, in pieces (a stream may return fewer than asked)."""
    parts = []
    got = 0
    while got < limit:
        piece = f.read(min(PIECE, limit - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def _options(name: str, target_options: dict[str, Any]) -> dict[str, Any]:
    # fsspec's HTTP file with a block size asks for the whole body at once when it is read
    # whole (decompressing a Content-Encoding into memory); block_size 0 streams it.
    if not is_chained(name) and protocol(name) in ("http", "https"):
        return {"block_size": 0, **target_options}
    return target_options


def read_zmetadata(name: str, target_options: dict[str, Any], limits: Limits
                   ) -> tuple[Any, int, bytes]:
    """``.zmetadata`` at ``name`` parsed, after the checks in the module's docstring, the
    number of bare NaN or Infinity constants in it (accepted as Python's json writes them),
    and its bytes as read."""
    with open_source(name, _options(name, target_options), limits.max_ratio,
                     limits.source_timeout, limits.max_source, limits.source_roots) as f:
        try:
            raw = _read_at_most(f, limits.max_inline + 1)
        except ReferenceSetError:
            raise
        except Exception as e:  # a read that failed midway, corrupt compressed data
            what = " ".join(str(e).split())[:120] or type(e).__name__
            raise ReferenceSetError(f"{name}: cannot read ({type(e).__name__}: {what})") from None
    if len(raw) > limits.max_inline:
        raise ReferenceSetError(
            f"{name}: larger than max_inline={size_text(limits.max_inline)} (.zmetadata holds the "
            "metadata keys only; raise max_inline if it is really this large)")
    scan = JsonReader(io.BytesIO(raw), name, limits, count_values=True)
    while scan.read(1 << 16):
        if scan.values >= MAX_VALUES:
            raise ReferenceSetError(f"{name}: more than {MAX_VALUES:,} JSON values in .zmetadata "
                                    "(it holds the metadata keys only)")
    nonfinite: list[str] = []
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        try:  # bare NaN/Infinity, as Python's json (LazyReferenceMapper) writes them
            meta = json.loads(raw, parse_constant=lambda c: nonfinite.append(c) or float(c))
        except (ValueError, RecursionError):
            raise ReferenceSetError(f"{name}: malformed JSON: {e}") from None
    return meta, len(nonfinite), raw
