"""Zarr v2 consolidated metadata (``.zmetadata``) from a reference set's metadata keys.

Zarr clients over plain HTTP have no listing: a consolidated ``.zmetadata`` at the root is what
makes a dataset openable (``xr.open_zarr(url, consolidated=True)``, netCDF-C's
``#mode=zarr,s3,consolidated``, browser viewers). ``consolidate`` writes what zarr-python 2's
``consolidate_metadata`` writes for a store holding the same keys::

    {"metadata": {key: <the key's JSON, parsed>, ...}, "zarr_consolidated_format": 1}

serialized as zarr 2 does (``indent=4``, sorted keys, ASCII, bare ``NaN`` kept as Python's
``json`` writes it). The keys are every ``.zgroup``, ``.zarray`` and ``.zattrs`` at any depth
(a whole path component, where zarr 2 matched any key ending so); a ``.zmetadata`` is never
one of them. zarr-python 3, writing a v2 store, re-serializes its own model instead: it adds a
``consolidated_metadata`` member to the ``.zgroup`` of every nested group, which the store's
``.zgroup`` does not hold. That member is not written here.

A key whose value is not inline (``None``: a reference to a target, which would have to be
fetched), is not a JSON object, or does not parse, is skipped; ``consolidation`` says which
and why. The document is built key by key, in sorted order (one key parsed at a time, its
text appended), within the bounds a Parquet set's own ``.zmetadata`` is read under
(refs/zmetadata.py): at most ``max_bytes`` of metadata read and of document written, and at
most ``max_values`` JSON values (each key counting one, and every ``{``, ``[`` and ``,`` of its
text one more: an upper bound on the Python objects a parse makes). A set past a bound has no
consolidated metadata: ``ConsolidationRefused`` says which bound, found as soon as it is
passed (the keys after it are neither read nor parsed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_BYTES", "MAX_VALUES", "METADATA_NAMES", "Consolidation", "ConsolidationRefused",
           "consolidate", "consolidation", "is_metadata_key"]

METADATA_NAMES = (".zgroup", ".zarray", ".zattrs")
MAX_BYTES = 64 << 20  # metadata read, and document written, at most (max_inline's default)
MAX_VALUES = 1 << 20  # JSON values at most (as in a Parquet set's .zmetadata)
_INDENT = "\n" + " " * 8  # a key's document inside {"metadata": {...}}


class ConsolidationRefused(Exception):
    """The set's metadata is past a bound of consolidated metadata (the message says which)."""


def is_metadata_key(key: str) -> bool:
    """Whether ``key`` is a zarr v2 metadata key that consolidated metadata holds."""
    return key.rsplit("/", 1)[-1] in METADATA_NAMES


@dataclass
class Consolidation:
    """The ``.zmetadata`` document and the metadata keys left out of it (key -> reason)."""

    document: bytes
    skipped: dict[str, str] = field(default_factory=dict)


def _values(data: bytes) -> int:
    """An upper bound on the JSON values in ``data``: one, plus one per container opened or
    comma (those inside strings counted too)."""
    return 1 + data.count(b"{") + data.count(b"[") + data.count(b",")


def consolidation(metadata: Mapping[str, bytes | None] | Iterable[tuple[str, bytes | None]], *,
                  max_bytes: int = MAX_BYTES, max_values: int = MAX_VALUES) -> Consolidation:
    """Consolidate ``metadata`` (key -> inline bytes, or ``None`` when not inline; a mapping or
    pairs in sorted key order); ``ConsolidationRefused`` past a bound."""
    pairs = sorted(metadata.items()) if isinstance(metadata, Mapping) else metadata
    pieces: list[str] = ['{\n    "metadata": {']
    written = len(pieces[0])
    read = 0
    values = 0
    skipped: dict[str, str] = {}
    first = True
    for key, data in pairs:
        if not is_metadata_key(key):
            continue
        if data is None:
            skipped[key] = "not inline (a reference to a target)"
            continue
        data = bytes(data)
        read += len(data)
        if read > max_bytes:
            raise ConsolidationRefused(f"its metadata keys hold more than {max_bytes:,} bytes")
        values += _values(data)
        if values > max_values:
            raise ConsolidationRefused(f"its metadata keys hold more than {max_values:,} JSON values")
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            skipped[key] = "not valid JSON"
            continue
        if not isinstance(value, dict):
            skipped[key] = "not a JSON object"
            continue
        text = json.dumps(value, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": "))
        del value
        # json.dumps escapes newlines inside strings: each "\n" is a line of the document
        piece = ("" if first else ",") + _INDENT + json.dumps(key, ensure_ascii=True) + ": " + \
            text.replace("\n", _INDENT)
        first = False
        written += len(piece)
        if written > max_bytes:
            raise ConsolidationRefused(f"its consolidated metadata is over {max_bytes:,} bytes")
        pieces.append(piece)
    pieces.append('}' if first else "\n    }")
    pieces.append(',\n    "zarr_consolidated_format": 1\n}')
    return Consolidation("".join(pieces).encode("ascii"), skipped)


def consolidate(metadata: Mapping[str, bytes | None]) -> bytes:
    """The ``.zmetadata`` bytes for ``metadata``; ``consolidation`` also tells what was skipped."""
    return consolidation(metadata).document
