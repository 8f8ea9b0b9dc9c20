"""A reference set's decoded view (``-o decode``) written to a plain directory, without FUSE:
what netCDF-C reads through a mount, for checks that need no mount (``ncdump -h`` of many
metadata variants). Metadata keys as the view serves them (hidden ones left out), chunks of
decoded arrays decoded, every other key as referenced (inline values, or ranges of local
files)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from refmount.decode.view import DecodedView


def stored_bytes(value: Any) -> bytes:
    if isinstance(value, list):
        with open(value[0].removeprefix("file://"), "rb") as f:
            if len(value) == 1:
                return f.read()
            f.seek(value[1])
            return f.read(value[2])
    if isinstance(value, str):
        return base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode()
    return json.dumps(value).encode()


def refs_of(refset: dict) -> dict[str, Any]:
    return refset.get("refs", refset)


def render(refset: dict, out: Path) -> DecodedView:
    """Write ``refset``'s decoded view under ``out``; returns the view."""
    refs = refs_of(refset)
    metadata = {k: stored_bytes(v) for k, v in refs.items()
                if k.rsplit("/", 1)[-1] in (".zarray", ".zattrs", ".zmetadata", ".zgroup")}
    view = DecodedView(metadata)
    for key, value in refs.items():
        if view.is_hidden(key):
            continue
        data = view.metadata(key)
        if data is None:
            data = stored_bytes(value)
            array = view.array_of(key)
            if array is not None:
                data = bytes(array.decode(data))
        head, _, name = key.rpartition("/")
        names = view.suffixed(head)
        if names is not None and names.fullmatch(name):
            key += ".0"  # a fixed-width string array shown as char: its string-length dimension
        path = out / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return view
