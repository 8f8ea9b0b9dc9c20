"""The chunk keys of a Zarr v3 array: its chunk grid and chunk key encoding, from ``zarr.json``.

``default`` encoding: ``c`` then the chunk coordinates, joined by the separator (``/`` or
``.``): ``c/0/1``, ``c.0.1``; a zero-dimensional array's one chunk is ``c``. ``v2``: the
coordinates alone (separator ``.`` unless given): ``0.1``, ``0/1``; a zero-dimensional
array's chunk is ``0``. With ``/`` each component but the last is a directory.

Chunks are numbered in C order over the grid (``ravel_multi_index``), the order the
repository's manifests list them in. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_CHUNKS = 1 << 40  # chunks of one array's grid (the tree's inode numbers keep 40 bits)
MAX_NDIM = 62  # dimensions (the tree's inode numbers keep 6 bits of directory level)
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


class UnsupportedArray(ValueError):
    """An array whose chunk keys cannot be served (its grid or encoding); ``str`` is the reason."""


def _decimal(text: str, bound: int) -> int | None:
    if not _DECIMAL.fullmatch(text):
        return None
    value = int(text)
    return value if value < bound else None


@dataclass(frozen=True)
class ChunkKeys:
    """One array's chunk keys: ``dims`` chunks along each dimension, the encoding's
    ``separator`` and ``prefix`` (``"c"`` for ``default``, ``""`` for ``v2``)."""

    dims: tuple[int, ...]
    separator: str = "/"
    prefix: str = "c"

    @classmethod
    def from_zarr_json(cls, document: bytes | dict[str, Any]) -> ChunkKeys:
        """From an array's ``zarr.json``; UnsupportedArray naming what is not served."""
        doc = json.loads(document) if isinstance(document, bytes | str) else document
        if not isinstance(doc, dict):
            raise UnsupportedArray("zarr.json is not an object")
        shape = doc.get("shape")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise UnsupportedArray("its shape is not a list of sizes")
        grid = doc.get("chunk_grid")
        if not isinstance(grid, dict) or grid.get("name") != "regular":
            name = grid.get("name") if isinstance(grid, dict) else grid
            raise UnsupportedArray(f"chunk grid {name!r} (only 'regular' is served)")
        chunk_shape = (grid.get("configuration") or {}).get("chunk_shape")
        if (not isinstance(chunk_shape, list) or len(chunk_shape) != len(shape)
                or not all(isinstance(n, int) and n > 0 for n in chunk_shape)):
            raise UnsupportedArray("its chunk_shape does not match its shape")
        if len(shape) > MAX_NDIM:
            raise UnsupportedArray(f"more than {MAX_NDIM} dimensions")
        dims = tuple(-(-n // c) for n, c in zip(shape, chunk_shape, strict=True))
        if math.prod(dims) > MAX_CHUNKS:
            raise UnsupportedArray(f"more than {MAX_CHUNKS} chunks in its grid")
        encoding = doc.get("chunk_key_encoding", {"name": "default"})
        if not isinstance(encoding, dict):
            raise UnsupportedArray("chunk_key_encoding is not an object")
        name = encoding.get("name")
        config = encoding.get("configuration") or {}
        if name not in ("default", "v2") or not isinstance(config, dict):
            raise UnsupportedArray(f"chunk key encoding {name!r} (served: 'default', 'v2')")
        separator = config.get("separator", "/" if name == "default" else ".")
        if separator not in ("/", "."):
            raise UnsupportedArray(f"chunk key separator {separator!r}")
        return cls(dims, separator, "c" if name == "default" else "")

    # ---- the grid --------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def count(self) -> int:
        """Chunks in the grid (1 for a zero-dimensional array)."""
        return math.prod(self.dims)

    def in_grid(self, coords: tuple[int, ...]) -> bool:
        """Whether ``coords`` name a chunk of the grid (a manifest may hold chunks outside it,
        written before the array shrank: they are no keys)."""
        if len(coords) != len(self.dims):
            return False
        return all(0 <= c < d for c, d in zip(coords, self.dims, strict=True))

    def number(self, coords: tuple[int, ...]) -> int:
        n = 0
        for i, d in zip(coords, self.dims, strict=True):
            n = n * d + i
        return n

    def coords(self, number: int) -> tuple[int, ...]:
        out = []
        for d in reversed(self.dims):
            number, i = divmod(number, d)
            out.append(i)
        return tuple(reversed(out))

    # ---- names -----------------------------------------------------------------------------
    @property
    def nested(self) -> bool:
        """Whether keys have directories (``/``-separated components)."""
        return self.separator == "/" and self.levels > 0

    @property
    def levels(self) -> int:
        """Directory levels below the array's directory: the components of a key but its last."""
        if self.separator != "/":
            return 0
        return max((1 if self.prefix else 0) + self.ndim - 1, 0)

    def fixed(self, level: int) -> int:
        """Coordinates fixed by a directory at ``level`` (1 ... levels)."""
        return level - (1 if self.prefix else 0)

    def key(self, number: int) -> str:
        """The key of chunk ``number`` below the array's directory."""
        parts = [str(i) for i in self.coords(number)]
        if self.prefix:
            parts.insert(0, self.prefix)
        return self.separator.join(parts) if parts else "0"

    def leaf(self, number: int) -> str:
        """The last component of chunk ``number``'s key (its file name)."""
        return self.key(number).rsplit("/", 1)[-1] if self.nested else self.key(number)

    def parse(self, name: str) -> int | None:
        """The chunk a file name in the array's directory names (keys without directories)."""
        if self.nested:
            return None
        if self.ndim == 0:
            return 0 if name == (self.prefix or "0") else None
        parts = name.split(self.separator) if self.separator == "." else [name]
        if self.prefix:
            if not parts or parts[0] != self.prefix:
                return None
            parts = parts[1:]
        if len(parts) != self.ndim:
            return None
        idx = [_decimal(p, d) for p, d in zip(parts, self.dims, strict=True)]
        if any(i is None for i in idx):
            return None
        return self.number(tuple(i for i in idx if i is not None))

    def child(self, level: int, p: int, name: str) -> tuple[int, int] | None:
        """In nested keys, the child ``name`` of the directory at ``level`` (0: the array's
        own) whose fixed coordinates flatten to ``p``: ``(level + 1, q)``; at the last level a
        file, ``(0, chunk number)``. None if ``name`` is no such child."""
        if level == 0 and self.prefix:
            return (1, 0) if name == self.prefix else None
        k = self.fixed(level)
        i = _decimal(name, self.dims[k])
        if i is None:
            return None
        q = p * self.dims[k] + i
        return (0, q) if k + 1 == self.ndim else (level + 1, q)

    def span(self, level: int) -> int:
        """Chunks below one directory at ``level`` (0: the array's own)."""
        return math.prod(self.dims[max(self.fixed(level), 0):]) if level else self.count

    def dir_path(self, level: int, p: int) -> str:
        """The path of a directory at ``level`` below the array's directory."""
        k = self.fixed(level)
        parts = [self.prefix] if self.prefix else []
        rest = []
        for d in reversed(self.dims[:k]):
            p, i = divmod(p, d)
            rest.append(str(i))
        return "/".join(parts + rest[::-1])
