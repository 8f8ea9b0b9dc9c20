"""STAC documents in a catalogue: whether a document is STAC, which of an object's assets are
kerchunk reference sets, and the set options an asset gives (``sets/catalog.py`` follows the
items and links).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

STAC_REFERENCE_ROLES = frozenset({"references", "index"})
STAC_JSON_TYPES = frozenset({"application/json", "application/x-json", "text/json"})
STAC_PARQUET_TYPES = frozenset({"application/x-parquet", "application/vnd.apache.parquet",
                                "application/parquet"})


def is_stac(doc: dict[str, Any]) -> bool:
    return doc.get("type") in ("Feature", "FeatureCollection", "Collection", "Catalog") and (
        "stac_version" in doc or doc.get("type") == "FeatureCollection")


def reference_assets(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The assets of a STAC object that are kerchunk reference sets, by key."""
    assets = obj.get("assets")
    if not isinstance(assets, dict):
        return
    for key, asset in assets.items():
        if not isinstance(asset, dict) or not isinstance(asset.get("href"), str):
            continue
        roles = asset.get("roles")
        roles = set(roles) if isinstance(roles, list) and all(
            isinstance(r, str) for r in roles) else set()
        media = str(asset.get("type") or "").partition(";")[0].strip().lower()
        if roles & STAC_REFERENCE_ROLES and media in STAC_JSON_TYPES | STAC_PARQUET_TYPES:
            yield str(key), asset


def stac_options(asset: dict[str, Any]) -> dict[str, Any]:
    """Set options from an asset's ``xarray:storage_options`` and ``xarray:open_kwargs``
    (``storage_options``, ``backend_kwargs.storage_options``): the reference file system's
    ``remote_protocol``, ``remote_options`` and ``target_options``."""
    found: list[Any] = [asset.get("xarray:storage_options")]
    kwargs = asset.get("xarray:open_kwargs")
    if isinstance(kwargs, dict):
        found.append(kwargs.get("storage_options"))
        backend = kwargs.get("backend_kwargs")
        if isinstance(backend, dict):
            found.append(backend.get("storage_options"))
    out: dict[str, Any] = {}
    for so in found:
        if isinstance(so, dict):
            for name in ("remote_protocol", "remote_options", "target_options"):
                if so.get(name) is not None:
                    out[name] = so[name]
    return out
