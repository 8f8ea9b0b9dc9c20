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

Bounded: a key whose value is not inline (``None``: a reference to a target, which would have to
be fetched), is not a JSON object, or does not parse, is skipped, and so are keys past
``max_bytes`` of input in all; ``consolidation`` says which were skipped and why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["METADATA_NAMES", "Consolidation", "consolidate", "consolidation", "is_metadata_key"]

METADATA_NAMES = (".zgroup", ".zarray", ".zattrs")
MAX_BYTES = 256 << 20  # input JSON consolidated at most (a set's metadata is far smaller)


def is_metadata_key(key: str) -> bool:
    """Whether ``key`` is a zarr v2 metadata key that consolidated metadata holds."""
    return key.rsplit("/", 1)[-1] in METADATA_NAMES


@dataclass
class Consolidation:
    """The ``.zmetadata`` document and the metadata keys left out of it (key -> reason)."""

    document: bytes
    skipped: dict[str, str] = field(default_factory=dict)


def consolidation(metadata: Mapping[str, bytes | None], *, max_bytes: int = MAX_BYTES) -> Consolidation:
    """Consolidate ``metadata`` (key -> inline bytes, or ``None`` when not inline)."""
    out: dict[str, object] = {}
    skipped: dict[str, str] = {}
    budget = max_bytes
    for key in sorted(metadata):
        if not is_metadata_key(key):
            continue
        data = metadata[key]
        if data is None:
            skipped[key] = "not inline (a reference to a target)"
            continue
        if len(data) > budget:
            skipped[key] = f"over the bound of {max_bytes:,} bytes of metadata"
            continue
        budget -= len(data)
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            skipped[key] = "not valid JSON"
            continue
        if not isinstance(value, dict):
            skipped[key] = "not a JSON object"
            continue
        out[key] = value
    doc = {"metadata": out, "zarr_consolidated_format": 1}
    text = json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": "))
    return Consolidation(text.encode("ascii"), skipped)


def consolidate(metadata: Mapping[str, bytes | None]) -> bytes:
    """The ``.zmetadata`` bytes for ``metadata``; ``consolidation`` also tells what was skipped."""
    return consolidation(metadata).document
