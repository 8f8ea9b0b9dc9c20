"""The Zarr v3 part of the decoded view: which ``zarr.json`` documents become which v2 keys,
and each v3 array's plan (``V3Array``).

``V3Layout`` reads every ``zarr.json`` of a set (``decode/zarrv3.py`` parses one) and makes
the v2 metadata documents the view serves in their place (``docs``: ``.zgroup`` and
``.zattrs`` of each group, ``.zarray`` and ``.zattrs`` of each array), which the view then
treats as any v2 array's (netCDF-C's side, attribute types, what is left out). A directory
holding v3 arrays or groups without a ``zarr.json`` of its own (an implicit group, the root
of a set of arrays) is shown as a group too.

``plan_v3_array``: an array's chunks decoded (``V3Array``, a ``DecodedArray`` whose chain is a
``V3Chain``; for a sharded array the chain of its inner chunks and its ``ShardLayout``), or
the reason it cannot be (served as referenced: its ``zarr.json`` and chunks as stored).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from refmount.decode.codecplan import DecodedArray
from refmount.decode.metadatabound import MetadataBudget
from refmount.decode.sharding import ShardLayout, sharding_layout
from refmount.decode.v3codecs import V3Chain
from refmount.decode.zarrv3 import (
    ZARR_JSON,
    V3ArrayMeta,
    V3Error,
    V3Group,
    codec_name,
    fill_scalar,
    parse_node,
    v2_array,
    v2_attrs,
)

MAX_ZARR_JSON_BYTES = 1 << 20
MAX_CHUNKS = 1 << 40  # chunks of one array's grid (decode/v3tree.py numbers them in 40 bits)
MAX_NODES = 1 << 21  # v3 groups and decoded arrays of a set (decode/v3tree.py numbers them in 21 bits)


@dataclass
class V3Array(DecodedArray):
    """A v3 array served as v2: chunk ``i.j`` of the view is the stored chunk (or the inner
    chunk of a shard) at grid position ``(i, j)``."""

    meta: V3ArrayMeta | None = None
    shard: ShardLayout | None = None

    def index_of(self, rel: str) -> tuple[int, ...] | None:
        """The grid position of a chunk name (``i.j``, ``0`` for a 0-d array), None if none."""
        if self.ndim == 0:
            return () if rel == "0" else None
        if not self.is_chunk_name(rel):
            return None
        idx = tuple(int(p) for p in rel.split("."))
        return idx if all(i < g for i, g in zip(idx, self.grid, strict=True)) else None

    def stored_location(self, idx: tuple[int, ...]) -> tuple[str, int | None]:
        """(the stored key relative to the array, the inner chunk's number in its shard or
        None) of grid position ``idx``."""
        assert self.meta is not None
        if self.shard is None:
            return self.meta.stored_key(idx), None
        shard, number = self.shard.locate(idx)
        return self.meta.stored_key(shard), number

    def fill_chunk(self) -> memoryview:
        """A served chunk of the fill value (an inner chunk its shard does not hold)."""
        assert self.meta is not None
        shape = self.cut or self.stored_chunks or tuple(self.grid_chunks)
        one = fill_scalar(self.meta.fill_value, self.out_dtype)
        # flat before the byte view: a 0-d array's view cannot change its item size
        return memoryview(np.full(shape, one[0], self.out_dtype).reshape(-1).view(np.uint8)).cast("B")

    @property
    def grid_chunks(self) -> tuple[int, ...]:
        assert self.chain is not None
        return tuple(self.chain.shape)  # type: ignore[attr-defined]

    @property
    def stored_bound(self) -> int | None:
        return getattr(self.chain, "stored_bound", None)


def plan_v3_array(meta: V3ArrayMeta, max_chunk_bytes: int) -> tuple[V3Array | None, str | None]:
    """How a v3 array is served: ``(array, None)`` decoded, ``(None, reason)`` as referenced."""
    codecs = meta.codecs
    shard = None
    try:
        names = [codec_name(c) for c in codecs]
        if "sharding_indexed" in names:
            if len(codecs) != 1:
                raise V3Error("codecs besides sharding_indexed outside the shard")
            shard, codecs = sharding_layout(meta.shape, meta.chunk_shape, codecs[0])
            chunks = list(shard.inner)
            names = ["sharding_indexed"] + [codec_name(c) for c in codecs]
        else:
            chunks = list(meta.chunk_shape)
        if meta.dtype.hasobject or meta.dtype.itemsize == 0:
            raise V3Error(f"dtype {meta.dtype} has no fixed size")
        nbytes = math.prod(chunks) * meta.dtype.itemsize
        if nbytes > max_chunk_bytes:
            return None, (f"a decoded chunk is {nbytes:,} bytes, more than max_chunk_bytes="
                          f"{max_chunk_bytes:,}")
        chain = V3Chain(codecs, meta.dtype, tuple(chunks), ceiling=2 * max_chunk_bytes)
    except V3Error as e:
        return None, str(e)
    if chain.peak > 2 * max_chunk_bytes:
        return None, (f"a step of decoding a chunk may produce {chain.peak:,} bytes, more than "
                      f"twice max_chunk_bytes={max_chunk_bytes:,}")
    grid = tuple(-(-s // c) for s, c in zip(meta.shape, chunks, strict=True))
    if math.prod(grid) > MAX_CHUNKS:
        return None, f"{math.prod(grid):,} chunks, more than the {MAX_CHUNKS:,} the view numbers"
    served = chain.out_dtype
    ids = [names[0], *reversed(names[1:])] if shard is not None else list(reversed(names))
    return V3Array(meta.path, len(chunks), ".", served, served, nbytes, ids, None, [], grid, chain,  # type: ignore[arg-type]
                   meta=meta, shard=shard), None


def set_cut(array: V3Array, cut: list[int] | None) -> None:
    """Each decoded chunk cut to ``cut`` (ncview: a chunk larger than the shape)."""
    if cut is None or len(cut) != array.ndim:
        return
    array.stored_chunks = array.grid_chunks
    array.cut = tuple(cut)
    array.nbytes = math.prod(cut) * array.dtype.itemsize


class MergedMetadata(Mapping[str, Any]):
    """A set's metadata keys and the v2 documents shown for its v3 nodes."""

    def __init__(self, stored: Mapping[str, Any], shown: Mapping[str, bytes]) -> None:
        self._stored, self._shown = stored, shown

    def __getitem__(self, key: str) -> Any:
        return self._shown[key] if key in self._shown else self._stored[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._stored
        yield from (k for k in self._shown if k not in self._stored)

    def __len__(self) -> int:
        return len(self._stored) + sum(k not in self._stored for k in self._shown)


class V3Layout:
    """The v3 nodes of a set (from its ``zarr.json`` keys) and the v2 documents shown for them."""

    def __init__(self, metadata: Mapping[str, Any], max_chunk_bytes: int,
                 budget: MetadataBudget | None = None) -> None:
        """Every ``zarr.json`` parsed, and every v2 document made, within ``budget`` (the
        view's: decode/metadatabound.py; DecodedMetadataRefused past it)."""
        budget = budget if budget is not None else MetadataBudget()
        self.groups: dict[str, V3Group] = {}  # path -> group (implicit ones too)
        self.metas: dict[str, V3ArrayMeta] = {}
        self.plans: dict[str, V3Array] = {}  # arrays served decoded
        self.refused: dict[str, str] = {}  # path -> why the node is served as stored
        self.docs: dict[str, bytes] = {}  # v2 metadata keys shown -> their documents
        found = [k for k in metadata if k == ZARR_JSON or k.endswith("/" + ZARR_JSON)]
        if not found:
            return  # no v3 node: nothing else read (a v2 set's metadata keys are not fetched)
        v2_dirs = {k.rpartition("/")[0] if "/" in k else "" for k in metadata
                   if k.rpartition("/")[2] in (".zgroup", ".zarray")}
        for key in found:
            path = key[: -len(ZARR_JSON)].rstrip("/")
            try:
                data = metadata[key]
                if data is None:
                    raise V3Error("zarr.json is not inline in the reference set")
                if len(data) > MAX_ZARR_JSON_BYTES:
                    raise V3Error(f"zarr.json is {len(data):,} bytes, more than the "
                                  f"{MAX_ZARR_JSON_BYTES:,} it is parsed up to")
                budget.parse(data)
                try:
                    doc = json.loads(bytes(data))
                except ValueError:
                    raise V3Error("zarr.json is not valid JSON") from None
                node = parse_node(path, doc)
            except V3Error as e:
                self.refused[path or "/"] = str(e)
                continue
            if isinstance(node, V3Group):
                self.groups[path] = node
                continue
            self.metas[path] = node
            array, reason = plan_v3_array(node, max_chunk_bytes)
            if array is None:
                self.refused[path or "/"] = reason or "not decoded"
                continue
            self.plans[path] = array
            prefix = f"{path}/" if path else ""
            self.docs[prefix + ".zarray"] = budget.write(
                json.dumps(v2_array(node, list(array.grid_chunks))).encode())
            self.docs[prefix + ".zattrs"] = budget.write(json.dumps(v2_attrs(node)).encode())
        for path in list(self.groups) + list(self.plans):
            head = path
            while head:
                head = head.rpartition("/")[0]
                if head in self.plans or head in self.metas or head in v2_dirs:
                    break
                self.groups.setdefault(head, V3Group(head, {}))
        over = len(self.groups) + len(self.plans) - MAX_NODES
        for path in sorted(self.plans)[max(len(self.plans) - over, 0) :] if over > 0 else []:
            del self.plans[path]
            prefix = f"{path}/" if path else ""
            del self.docs[prefix + ".zarray"], self.docs[prefix + ".zattrs"]
            self.refused[path or "/"] = f"more than {MAX_NODES:,} v3 groups and arrays in the set"
        for path, group in self.groups.items():
            prefix = f"{path}/" if path else ""
            self.docs[prefix + ".zgroup"] = budget.write(b'{\n    "zarr_format": 2\n}')
            self.docs[prefix + ".zattrs"] = budget.write(json.dumps(v2_attrs(group)).encode())

    def __bool__(self) -> bool:
        return bool(self.groups or self.metas or self.refused)
