"""The decoded view of one reference set (``-o decode``) and the tree seen through it.

``DecodedView`` is built from a set's metadata keys: which arrays decode (``plan_array``,
decode/codecplan.py) and why the others are served as referenced (``skipped``), which key is a
decoded chunk, the rewritten metadata and the served sizes. ``.zarray`` is served with no
codecs and a little-endian ``dtype``, as netCDF-C is shown the array (``ncview``: char as
``<U1``, chunks cut to the shape, scalars as ``[1]``); ``.zattrs`` with the attributes a
netCDF client needs (``ncattrs``: a typed ``_FillValue`` from ``fill_value``, every number
typed, one length per dimension name). Arrays netCDF-C cannot read are left out of the
netCDF side (``left_out``: their ``.zarray`` and ``.zattrs`` are ``hidden``). Inside
``.zmetadata``, zarr's side: decoded, with zarr's own dtype. Everything else is untouched.
The tree seen through the view is ``DecodedTree`` (decode/decodedtree.py).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from refmount.config import DECODE_MAX_CHUNK_BYTES
from refmount.decode.codecplan import DecodedArray, codec_ids, plan_array, rewrite_zarray
from refmount.decode.metadatabound import DecodedMetadataRefused, MetadataBudget, is_view_metadata
from refmount.decode.ncattrs import ARRAY_DIMENSIONS, dumps_zattrs, netcdf_zattrs
from refmount.decode.ncview import NcArray, array_dims, netcdf_array, resolve_dims
from refmount.decode.v3view import MergedMetadata, V3Layout, set_cut
from refmount.decode.zarrv3 import ZARR_JSON
from refmount.refs import RefKind

log = logging.getLogger(__name__)

# The most bytes of one metadata document the view parses: a .zarray holds no attributes
# (those are in .zattrs), so a real one is well under a kilobyte; consolidated metadata
# holds every array's and group's metadata and attributes.
MAX_ZARRAY_BYTES = 1 << 20
MAX_ZMETADATA_BYTES = 16 << 20
Buffer = bytes | memoryview


def _dumps(obj: Any) -> bytes:
    # allow_nan: zarr writes NaN fill values as the string "NaN", but other writers may not.
    return json.dumps(obj, indent=4, sort_keys=True, ensure_ascii=True).encode()


# ---- the view of one reference set ---------------------------------------------------------


def _parse(data: Buffer | None, budget: MetadataBudget) -> Any:
    """A metadata document parsed, None if not inline, too large or not JSON."""
    if data is None or len(data) > MAX_ZARRAY_BYTES:
        return None
    budget.parse(data)
    try:
        return json.loads(bytes(data))
    except ValueError:
        return None


class IndexMetadata(Mapping[str, "Buffer | None"]):
    """Metadata keys of a ``KeyIndex`` (its rows ``rows``) as a mapping read from the index on
    each pass: a value is a view into the mapped index (None: not inline), so a document is
    copied only by whoever parses it, after checking its size."""

    def __init__(self, index: Any, rows: list[int], budget: MetadataBudget) -> None:
        self._index = index
        budget.keys(len(rows))
        self._rows: dict[str, int] = {}
        for i in rows:
            key = index.key(i).decode("utf-8", "surrogateescape")
            budget.name(key)
            self._rows[key] = i

    def __getitem__(self, key: str) -> Buffer | None:
        ref = self._index.ref(self._rows[key], view=True)
        return ref.data if ref.kind is RefKind.INLINE else None

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


class DecodedView:
    """Built from a set's ``.zarray``, ``.zattrs`` and ``.zmetadata`` keys (``metadata``: key
    -> bytes, or None for a key that is not inline). A ``.zarray`` or ``.zattrs`` larger than
    MAX_ZARRAY_BYTES is not parsed (its array is served as referenced; its attributes as
    they are); a ``.zmetadata`` larger than MAX_ZMETADATA_BYTES is not parsed either, and the
    arrays under its directory are served as referenced, as it describes them. Only what
    serving needs is kept: the plans and the rewritten metadata. All of it is made within
    ``budget`` (decode/metadatabound.py); past it, the view is ``refused``: nothing decoded,
    and its metadata keys fail with that error."""

    def __init__(self, metadata: Mapping[str, Buffer | None],
                 max_chunk_bytes: int = DECODE_MAX_CHUNK_BYTES, budget: MetadataBudget | None = None) -> None:
        self.refused: DecodedMetadataRefused | None = None
        self.arrays: dict[str, DecodedArray] = {}
        self.skipped: dict[str, str] = {}  # array path -> why it is served as referenced
        self.plain: set[str] = set()  # arrays that need no decoding
        self.codecs: dict[str, list[str]] = {}  # array path -> codec ids (every array)
        self.left_out: dict[str, str] = {}  # array path -> why netCDF clients do not see it
        self.hidden: set[str] = set()  # metadata keys not listed (arrays left out of netCDF)
        self.sampled = False  # made from only the first metadata keys (from_index's ``first``)
        self._meta: dict[str, bytes] = {}  # rewritten metadata keys
        self._zarr: dict[str, dict[str, Any]] = {}  # .zarray key -> as zarr clients get it
        # fixed-width string arrays shown as char: their chunk names (listed with ".0" added)
        self._suffixed: dict[str, re.Pattern[str]] = {}
        self._nc: dict[str, NcArray] = {}
        self._dims: dict[str, Any] = {}
        self._attr_paths: set[str] = set()
        self._max_depth = 0
        try:
            self._build(metadata, max_chunk_bytes, budget if budget is not None else MetadataBudget())
        except DecodedMetadataRefused as e:
            self._refuse(e)

    def _build(self, metadata: Mapping[str, Buffer | None], max_chunk_bytes: int,
               budget: MetadataBudget) -> None:
        nc_shown: dict[str, NcArray] = {}  # array path -> as netCDF-C is shown it
        # Zarr v3: each zarr.json shown as v2 documents (decode/v3view.py)
        self.v3 = V3Layout(metadata, max_chunk_bytes, budget)
        for path, why in self.v3.refused.items():
            self.skipped[path] = why
            self.left_out[path] = f"not decoded: {why}"
        if self.v3.docs:
            metadata = MergedMetadata(metadata, self.v3.docs)
            self._meta.update((k, v) for k, v in self.v3.docs.items() if k.endswith(".zgroup"))
        for key, data in metadata.items():
            if not (key == ".zarray" or key.endswith("/.zarray")):
                continue
            path = key[: -len(".zarray")].rstrip("/")
            if data is None:
                self._leave_out(path, ".zarray is not inline in the reference set", skip=True)
                continue
            if len(data) > MAX_ZARRAY_BYTES:
                self._leave_out(path, f".zarray is {len(data):,} bytes, more than the "
                                f"{MAX_ZARRAY_BYTES:,} a .zarray is parsed up to", skip=True)
                continue
            budget.parse(data)
            try:
                meta = json.loads(bytes(data))
            except ValueError:
                self._leave_out(path, ".zarray is not valid JSON", skip=True)
                continue
            if isinstance(meta, dict):
                self.codecs[path] = codec_ids(meta)
            nc = netcdf_array(meta)
            v3 = self.v3.plans.get(path) if key in self.v3.docs else None
            if v3 is not None:
                set_cut(v3, nc.cut)
                array, reason = v3, None
                self.codecs[path] = list(v3.codecs)
            else:
                array, reason = plan_array(path, meta, max_chunk_bytes, nc.cut)
            if array is not None:
                self.arrays[path] = array
                served = rewrite_zarray(meta)
            elif reason is not None:
                self.skipped[path or "/"] = reason
                served = None
            else:
                self.plain.add(path)
                served = meta
            if served is not None and nc.zarray is not None:
                n = len(nc.zarray["shape"]) - (1 if nc.strlen else 0)  # zarr's own dimensions
                zarr_side = {**served, "shape": nc.zarray["shape"][:n], "chunks": nc.zarray["chunks"][:n]}
                if nc.strlen and n:
                    self._suffixed[path] = re.compile(r"[0-9]+" + r"\.[0-9]+" * (n - 1))
                self._zarr[key] = zarr_side
                self._meta[key] = budget.write(_dumps({
                    **zarr_side, "shape": nc.zarray["shape"], "chunks": nc.zarray["chunks"],
                    "dtype": nc.zarray["dtype"], "fill_value": nc.zarray["fill_value"]}))
                nc_shown[path] = nc
            elif served is not None:
                self._zarr[key] = served
                if array is not None:
                    self._meta[key] = budget.write(_dumps(served))
                self._leave_out(path, nc.why or "not a netCDF variable")
            else:
                self._leave_out(path, nc.why or f"not decoded: {reason}")
        too_big = {key for key, data in metadata.items()
                   if (key == ".zmetadata" or key.endswith("/.zmetadata"))
                   and data is not None and len(data) > MAX_ZMETADATA_BYTES}
        for key in too_big:  # first: other .zmetadata keys may describe the same arrays
            self._unparsed_zmetadata(key[: -len(".zmetadata")], len(metadata[key] or b""))
            for path in [p for p in nc_shown if (p + "/").startswith(key[: -len(".zmetadata")])]:
                del nc_shown[path]
        attrs: dict[str, Any] = {}
        for key, data in metadata.items():
            if key == ".zattrs" or key.endswith("/.zattrs"):
                path = key[: -len(".zattrs")].rstrip("/")
                if path in self.left_out:
                    self.hidden.add(key)
                else:
                    attrs[path] = _parse(data, budget)
        self._dims = resolve_dims({p: (array_dims(attrs.get(p), nc), nc.shape or [])
                                   for p, nc in nc_shown.items()})
        for path, parsed in attrs.items():
            key = f"{path}/.zattrs" if path else ".zattrs"
            nc_array = nc_shown.get(path)
            if nc_array is None and (f"{path}/.zarray" if path else ".zarray") in metadata:
                continue  # an array not shown to netCDF clients (its attributes are unlisted)
            rendered = netcdf_zattrs(None if nc_array is None else nc_array.zarray, parsed,
                                     self._dims.get(path))
            if rendered is not None:
                self._meta[key] = budget.write(dumps_zattrs(rendered))
        self._nc = nc_shown
        self._attr_paths = set(attrs)
        for key, data in metadata.items():
            if (key == ".zmetadata" or key.endswith("/.zmetadata")) and key not in too_big:
                rewritten = self._zmetadata(key, None if data is None else bytes(data), budget)
                if rewritten is not None:
                    self._meta[key] = budget.write(rewritten)
        self._max_depth = max((p.count("/") + 1 for p in self.arrays), default=0)

    def _refuse(self, e: DecodedMetadataRefused) -> None:
        """Past the budget: nothing decoded, nothing rewritten kept; ``warn`` logs why."""
        self.refused = e
        e.logged = True  # once, by warn(), not by each read it fails
        self.arrays, self.skipped, self.plain, self.codecs = {}, {}, set(), {}
        self.left_out, self.hidden, self._meta, self._zarr, self._suffixed = {}, set(), {}, {}, {}
        self._nc, self._dims, self._attr_paths, self._max_depth = {}, {}, set(), 0
        self.v3 = V3Layout({}, DECODE_MAX_CHUNK_BYTES)  # no v3 node shown either

    def check(self, key: str) -> None:
        """``DecodedMetadataRefused`` for a metadata key of a refused view."""
        if self.refused is not None and is_view_metadata(key):
            raise self.refused.with_traceback(None)

    def _leave_out(self, path: str, why: str, skip: bool = False) -> None:
        """An array netCDF clients are not shown (its ``.zarray`` and ``.zattrs`` unlisted)."""
        if skip:
            self.skipped[path or "/"] = why
        self.left_out[path or "/"] = why
        self.hidden.add(f"{path}/.zarray" if path else ".zarray")

    def _unparsed_zmetadata(self, base: str, size: int) -> None:
        """The arrays under a ``.zmetadata`` too large to parse: served as it describes them
        (as referenced)."""
        for path in [p for p in self.arrays if (p + "/").startswith(base)]:
            del self.arrays[path]
            key = f"{path}/.zarray" if path else ".zarray"
            del self._meta[key]
            self._zarr.pop(key, None)
            self._leave_out(path, f"{base}.zmetadata is {size:,} bytes, more than the "
                            f"{MAX_ZMETADATA_BYTES:,} consolidated metadata is parsed up to", skip=True)

    def _zmetadata(self, key: str, data: bytes | None, budget: MetadataBudget) -> bytes | None:
        if data is None:
            return None
        budget.parse(data)
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        inner = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(inner, dict):
            return None
        base = key[: -len(".zmetadata")]
        changed = False
        new = dict(inner)
        for name, meta in inner.items():
            if name == ".zarray" or name.endswith("/.zarray"):
                served = self._zarr.get(base + name)
                if served is not None and served != meta:
                    new[name] = served  # as zarr reads the chunks: a char array stays |S1
                    changed = True
            elif name == ".zattrs" or name.endswith("/.zattrs"):
                path = (base + name[: -len(".zattrs")]).rstrip("/")
                if path in self.left_out:
                    continue
                nc = self._nc.get(path)
                if nc is None and name[: -len(".zattrs")] + ".zarray" in inner:
                    continue
                dims = self._dims.get(path) if path in self._attr_paths else None
                if dims is not None and nc is not None and nc.strlen:
                    dims = dims[:-1]  # zarr's side has no string-length dimension
                attrs = netcdf_zattrs(None if nc is None else nc.zarray, meta, dims)
                if attrs is not None and attrs != meta:
                    new[name] = attrs
                    changed = True
        if not changed:
            return None
        return _dumps({**obj, "metadata": new})

    @classmethod
    def from_index(cls, index: Any, max_chunk_bytes: int = DECODE_MAX_CHUNK_BYTES,
                   first: int | None = None) -> DecodedView:
        """From a ``KeyIndex``: its ``.zarray``, ``.zattrs`` and ``.zmetadata`` keys, found with
        one vectorised pass over the key column (``IndexMetadata``: nothing copied up front).
        ``first``: only that many of those keys, in key order (a sample, for a note)."""
        import pyarrow.compute as pc

        keys = index.table["key"]
        hits = pc.or_(pc.or_(pc.ends_with(keys, pattern=".zarray"), pc.ends_with(keys, pattern=".zattrs")),
                      pc.or_(pc.ends_with(keys, pattern=".zmetadata"), pc.ends_with(keys, pattern=ZARR_JSON)))
        rows = np.flatnonzero(hits.to_numpy(zero_copy_only=False))
        sampled = first is not None and len(rows) > first
        budget = MetadataBudget()
        try:
            metadata = IndexMetadata(index, rows[:first].tolist(), budget)
        except DecodedMetadataRefused as e:
            view = cls({}, max_chunk_bytes)
            view._refuse(e)
        else:
            view = cls(metadata, max_chunk_bytes, budget)
        view.sampled = sampled
        return view

    # ---- what a key is --------------------------------------------------------------------
    def array_of(self, key: str) -> DecodedArray | None:
        """The decoded array whose chunk ``key`` is, if any."""
        if not key or key.rpartition("/")[2][:1] == ".":
            return None
        head = key
        for _ in range(self._max_depth + 1):
            head, _, _tail = head.rpartition("/")
            array = self.arrays.get(head)
            if array is not None:
                rel = key[len(head) + 1 :] if head else key
                return array if array.is_chunk_name(rel) else None
            if not head:
                break
        return self.arrays.get("") if "" in self.arrays and self.arrays[""].is_chunk_name(key) else None

    def metadata(self, key: str) -> bytes | None:
        """The rewritten bytes of a metadata key (``.zarray``, ``.zattrs``, ``.zmetadata``), if
        rewritten."""
        return self._meta.get(key)

    def zarr_metadata(self, key: str) -> bytes | None:
        """A metadata key as zarr clients read it from consolidated metadata (``.zmetadata``
        synthesized by ``refmount serve``): a ``.zarray`` decoded but with zarr's dtype (a
        char array stays ``|S1``: zarr reads ``<U1`` as four bytes a character), arrays left
        out of the netCDF side included; None: as referenced."""
        zarr = self._zarr.get(key)
        if zarr is not None:
            return _dumps(zarr)
        if key in self.hidden:
            return None
        nc = self._nc.get(key[: -len(".zattrs")].rstrip("/")) if key.endswith(".zattrs") else None
        if nc is not None and nc.strlen and key in self._meta:  # zarr's side: no string-length dimension
            attrs = json.loads(self._meta[key])
            if isinstance(attrs.get(ARRAY_DIMENSIONS), list):
                attrs[ARRAY_DIMENSIONS] = attrs[ARRAY_DIMENSIONS][:-1]
            return dumps_zattrs(attrs)
        return self._meta.get(key)

    def size(self, key: str, stored: int) -> int:
        """The served size of ``key`` whose referenced size is ``stored``."""
        meta = self._meta.get(key)
        if meta is not None:
            return len(meta)
        array = self.array_of(key)
        return array.nbytes if array is not None else stored

    def entry_sizer(self, dir_path: str) -> Callable[[str, int], int]:
        """``size(name, stored)`` for the entries of one directory (one look-up per directory,
        a regular-expression match per entry)."""
        prefix = dir_path + "/" if dir_path else ""
        candidates: list[tuple[DecodedArray, str]] = []
        head = dir_path
        while True:
            array = self.arrays.get(head)
            if array is not None:
                rel = dir_path[len(head) + 1 :] if head else dir_path
                candidates.append((array, rel + "/" if rel else ""))
                break
            if not head:
                break
            head = head.rpartition("/")[0]
        meta = self._meta

        def size(name: str, stored: int) -> int:
            if name[:1] == ".":
                m = meta.get(prefix + name)
                return len(m) if m is not None else stored
            for array, rel in candidates:
                if array.is_chunk_name(rel + name):
                    return array.nbytes
            return stored

        return size

    @property
    def has_suffixed(self) -> bool:
        return bool(self._suffixed)

    def suffixed(self, dir_path: str) -> re.Pattern[str] | None:
        """The chunk names of a fixed-width string array at ``dir_path`` shown as char (each
        listed with ``.0`` added, for its string-length dimension), if it is one."""
        return self._suffixed.get(dir_path)

    def is_hidden(self, key: str) -> bool:
        """Whether ``key`` is a metadata key of an array left out of the netCDF side (not listed,
        not found by name)."""
        return key in self.hidden

    def describe(self) -> dict[str, str]:
        """For the root's xattrs."""
        if self.refused is not None:
            return {"decoded_arrays": "0", "decoded_metadata": f"refused: {self.refused}"}
        return {
            "decoded_arrays": str(len(self.arrays)),
            "not_decoded": json.dumps(dict(sorted(self.skipped.items())), sort_keys=True),
            "netcdf_left_out": json.dumps(dict(sorted(self.left_out.items())), sort_keys=True),
        }

    def left_out_line(self) -> str | None:
        """One line naming the arrays netCDF clients do not see through the view, and why."""
        if not self.left_out:
            return None
        items = sorted(self.left_out.items())
        shown = "; ".join(f"{p}: {why}" for p, why in items[:20])
        more = f"; and {len(items) - 20} more" if len(items) > 20 else ""
        return (f"decode: netCDF clients (ncdump, CDO, NCO) do not see {len(items)} "
                f"array{'s' if len(items) != 1 else ''} (zarr reads them): {shown}{more}")

    def warn(self) -> None:
        """One warning per array served as referenced although decoding was asked for, and one
        line naming the arrays left out of the netCDF side; or the one line of a refused view."""
        if self.refused is not None:
            log.error("decode: no decoded metadata for this set (its .zarray, .zattrs and .zmetadata "
                      "keys give EIO, 503 over HTTP; its chunks are served as referenced): %s", self.refused)
            return
        for path, why in sorted(self.skipped.items()):
            log.warning("decode: array %s is served as referenced (not decoded): %s", path, why)
        line = self.left_out_line()
        if line is not None:
            log.warning("%s", line)


# ---- the tree as served through the view ---------------------------------------------------
