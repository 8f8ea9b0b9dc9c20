"""A set's tree (``KeyTree``/``ChunkTree``/an Icechunk tree) as served through its decoded view
(decode/view.py): the view's sizes and rewritten metadata, the keys it hides, the suffixed
names of char arrays, and the Zarr v3 nodes shown as v2 (decode/v3tree.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from refmount.decode.codecplan import DecodedArray
from refmount.decode.v3tree import V3Tree, is_synthesized
from refmount.decode.view import DecodedView
from refmount.refs import Ref, RefKind


class DecodedTree:
    """A ``KeyTree`` or ``ChunkTree`` whose sizes and metadata are those of the view."""

    def __init__(self, inner: Any, view: DecodedView) -> None:
        self.inner = inner
        self.view = view
        self.root = inner.root
        self.v3 = V3Tree(inner, view) if view.v3 else None  # Zarr v3 nodes shown as v2

    def node(self, ino: int) -> Any:
        if self.v3 is not None and is_synthesized(ino):
            return self.v3.node(ino)
        return self.inner.node(ino)

    def path(self, node: Any) -> bytes:
        if self.v3 is not None and is_synthesized(node.ino):
            return self.v3.path(node)
        return self.inner.path(node)

    def parent(self, node: Any) -> Any:
        if self.v3 is not None and is_synthesized(node.ino):
            return self.v3.parent(node)
        return self.inner.parent(node)

    def __len__(self) -> int:
        return len(self.inner)

    async def lookup(self, parent: Any, name: bytes) -> Any:
        if self.v3 is not None:
            path = self._str(self.inner.path(parent))
            if self.v3.handles(path):
                answered, node = await self.v3.lookup(parent, path, name)
                if answered:
                    return node
        if name[:1] == b"." and self.view.hidden:
            parent_path = self.inner.path(parent)
            key = (parent_path + b"/" + name) if parent_path else name
            if self.view.is_hidden(self._str(key)):
                return None
        if name.endswith(b".0") and self.view.has_suffixed:
            names = self.view.suffixed(self._str(self.inner.path(parent)))
            if names is not None and names.fullmatch(self._str(name[:-2])):
                return await self.inner.lookup(parent, name[:-2])
        return await self.inner.lookup(parent, name)

    @staticmethod
    def _str(path: bytes) -> str:
        return path.decode("utf-8", "surrogateescape")

    async def entries(self, parent: Any, start: int = 0) -> AsyncIterator[tuple]:
        dir_path = self._str(self.inner.path(parent))
        if self.v3 is not None and self.v3.handles(dir_path):
            async for entry in self.v3.entries(parent, dir_path, start):
                yield entry
            return
        sizer = self.view.entry_sizer(dir_path)
        prefix = dir_path + "/" if dir_path else ""
        hidden = self.view.hidden
        suffixed = self.view.suffixed(dir_path)
        async for name, ino, is_dir, nxt, size in self.inner.entries(parent, start):
            if hidden and name[:1] == b"." and prefix + self._str(name) in hidden:
                continue
            if not is_dir:
                size = sizer(self._str(name), size)
                if suffixed is not None and suffixed.fullmatch(self._str(name)):
                    name += b".0"
            yield name, ino, is_dir, nxt, size

    async def ref(self, node: Any) -> Ref:
        if self.v3 is not None and is_synthesized(node.ino):
            return await self.v3.ref(node)
        ref = await self.inner.ref(node)
        key = self._str(self.inner.path(node))
        self.view.check(key)
        meta = self.view.metadata(key)
        if meta is not None:
            return Ref(RefKind.INLINE, None, 0, len(meta), meta)
        return ref

    async def size(self, node: Any) -> int:
        if self.v3 is not None and is_synthesized(node.ino):
            return self.v3.size(node)
        key = self._str(self.inner.path(node))
        meta = self.view.metadata(key)
        if meta is not None:
            return len(meta)
        array = self.view.array_of(key)
        if array is not None:
            return array.nbytes
        return await self.inner.size(node)

    def array(self, node: Any) -> DecodedArray | None:
        """The decoded array whose chunk ``node`` is (None: served as referenced)."""
        if node.is_dir:
            return None
        if self.v3 is not None and is_synthesized(node.ino):
            return self.v3.array(node)
        return self.view.array_of(self._str(self.inner.path(node)))

    async def resolve(self, key: str) -> tuple[Any, Ref] | None:
        """Node and stored reference of ``key`` (for decoding ahead), None if absent."""
        node = self.root
        for part in key.encode("utf-8", "surrogateescape").split(b"/"):
            node = await self.lookup(node, part)
            if node is None:
                return None
        if node.is_dir:
            return None
        try:
            return node, await self.ref(node)
        except FileNotFoundError:
            return None
