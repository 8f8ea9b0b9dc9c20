"""The ``gen`` entries of a Version 1 set: each validated and its products counted before
any is made, the set refused up front where its keys' fixed text already passes
``max_generated`` or its products ``max_keys``, then expanded into the index a batch at a
time, each batch sized by the bytes its keys and URLs make."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.compute as pc

from refmount.refs.indexbuilder import IndexBuilder, generated_why
from refmount.refs.keyrules import key_too_long
from refmount.refs.limits import Limits
from refmount.refs.model import ReferenceSetError
from refmount.refs.sandbox import MAX_RENDERED
from refmount.refs.v1columns import Dimension, Plan, Room
from refmount.refs.v1templates import TemplateSet

GEN_BATCH = 1 << 18  # most products evaluated in one batch
GEN_BATCH_BYTES = 16 << 20  # bytes of keys and URLs one batch of products is sized to make
FIRST_RENDERED_BATCH = 1024  # products of a first batch whose sizes only rendering tells


class GenEntry:
    """One ``gen`` entry, validated, its number of products known before any is made."""

    def __init__(self, entry: Any, i: int, templates: TemplateSet) -> None:
        name = templates.name
        where = self.where = f"gen[{i}]"
        self.templates = templates
        if not isinstance(entry, dict):
            raise ReferenceSetError(f"{name}: {where} must be an object")
        unknown = set(entry) - {"key", "url", "offset", "length", "dimensions"}
        if unknown:
            raise ReferenceSetError(f"{name}: {where} has unknown fields {sorted(unknown)}")
        for req in ("key", "url", "dimensions"):
            if req not in entry:
                raise ReferenceSetError(f"{name}: {where} needs '{req}'")
        if ("offset" in entry) != ("length" in entry):
            have, missing = ("offset", "length") if "offset" in entry else ("length", "offset")
            raise ReferenceSetError(
                f"{name}: {where} has '{have}' but no '{missing}' (give both or neither)")
        for field in ("key", "url", "offset", "length"):
            if field in entry and not isinstance(entry[field], str | int):
                raise ReferenceSetError(f"{name}: {where}.{field} must be a string")
        dims_spec = entry["dimensions"]
        if not isinstance(dims_spec, dict) or not dims_spec:
            raise ReferenceSetError(f"{name}: {where}.dimensions must be a non-empty object")
        clash = set(dims_spec) & set(templates.context)
        if clash:
            raise ReferenceSetError(
                f"{name}: {where}: dimension {sorted(clash)[0]!r} shadows a template")
        self.dims = {k: Dimension.parse(name, f"{where}.dimensions.{k}", v)
                     for k, v in dims_spec.items()}
        self.shape = [d.length for d in self.dims.values()]
        self.products = math.prod(self.shape)  # a Python int: exact however large
        names = list(self.dims)
        self.plans = {
            f: Plan(str(entry[f]), templates, names, f"{where}.{f}")
            for f in ("key", "url", "offset", "length")
            if f in entry
        }

    def longest(self) -> int | None:
        """Characters of a product's key and URL together at most, when both are evaluated
        on columns (None: one of them is rendered per product)."""
        key, url = (self.plans[f].longest(self.dims) for f in ("key", "url"))
        return None if key is None or url is None else key + url

    def expand(self, builder: IndexBuilder) -> None:
        """Add the entry's references a batch at a time, each batch sized to make about
        GEN_BATCH_BYTES of keys and URLs: from their longest text when it is known before
        rendering, else from what the batch before made (the first: FIRST_RENDERED_BATCH
        products). Keys are checked against ``max_key_length``, and keys and URLs counted
        against ``max_generated``, a batch at a time — renderings as each is made."""
        templates, names, dims = self.templates, list(self.dims), list(self.dims.values())
        total, plans = self.products, self.plans
        where = f"{templates.name}: {self.where}"
        max_len = builder.limits.max_key_length
        each_key = max_len if builder.bad_keys == "error" else MAX_RENDERED
        too_long = key_too_long(max_len)
        if self.plans["key"].shortest() > max_len:  # bad_keys=skip (else refused before)
            builder.skip_all(f"{self.where}: every one of its {total:,} keys {too_long}", total)
            return
        known = self.longest()
        n_next = FIRST_RENDERED_BATCH if known is None else _batch_for(known)
        start = 0
        while start < total:
            stop = min(start + n_next, total)
            n = stop - start
            flat = np.arange(start, stop, dtype=np.int64)
            idx = np.unravel_index(flat, self.shape)  # C order: the last dimension varies fastest
            cols = {k: dims[j].at(idx[j]) for j, k in enumerate(names)}

            def contexts(cols: dict[str, np.ndarray] = cols, n: int = n) -> Iterator[dict]:
                base = dict(templates.context)
                lists = {k: v.tolist() for k, v in cols.items()}
                for r in range(n):
                    for k in names:
                        base[k] = lists[k][r]
                    yield base

            room = builder.room()
            left = sys.maxsize if room is None else room
            why = generated_why(builder.limits.max_generated)
            keys = plans["key"].strings(cols, n, contexts, Room(each_key, left, too_long, why, "key"))
            key_lengths = pc.binary_length(keys)
            key_bytes = pc.sum(key_lengths).as_py() or 0
            urls = plans["url"].strings(cols, n, contexts,
                                        Room(MAX_RENDERED, max(left - key_bytes, 0), "", why))
            if "offset" in plans:
                offsets = plans["offset"].integers(cols, n, contexts)
                lengths = plans["length"].integers(cols, n, contexts)
            else:
                offsets = lengths = None
            made = (pc.max(key_lengths).as_py() or 0) + (pc.max(pc.binary_length(urls)).as_py() or 0)
            builder.add_columns(keys, urls, offsets, lengths, where=where)
            start = stop
            n_next = _batch_for(max(made, known or 0))


def _batch_for(product_bytes: int) -> int:
    """Products a batch may have when each makes up to ``product_bytes`` of key and URL."""
    return max(1, min(GEN_BATCH, GEN_BATCH_BYTES // max(product_bytes, 1)))


def check_generated(name: str, entries: list[GenEntry], before: int, limits: Limits,
                    bad_keys: str) -> None:
    """Refuse, before anything is generated, an entry whose keys are all longer than
    ``max_key_length``, or whose keys' fixed text alone (times its products, with the
    ``before`` bytes of keys and URLs already made) comes to more than ``max_generated``."""
    total = before
    for e in entries:
        if not e.products:
            continue
        key, url = e.plans["key"], e.plans["url"]
        shortest = key.shortest()
        if shortest > limits.max_key_length:
            if bad_keys == "error":
                raise ReferenceSetError(
                    f"{name}: {e.where}.key: every key {key_too_long(limits.max_key_length)}")
            continue  # bad_keys=skip: every key is dropped as its batch is made, none kept
        prior = total
        total += e.products * shortest + (url.shortest() if url.constant else 0)
        if total > limits.max_generated:
            so_far = f" (with the {prior:,} bytes before it)" if prior else ""
            raise ReferenceSetError(
                f"{name}: {e.where}: {e.products:,} keys of at least {shortest:,} bytes"
                f"{so_far}: {generated_why(limits.max_generated)}")


def check_key_count(name: str, entries: list[GenEntry], before: int, max_keys: int) -> None:
    """Refuse, before anything is generated, entries whose products together with the
    ``before`` keys already read come to more than ``max_keys``."""
    total = before
    for e in entries:
        prior, total = total, total + e.products
        if total > max_keys:
            so_far = f" ({total:,} keys with the {prior:,} before it)" if prior else ""
            raise ReferenceSetError(
                f"{name}: {e.where} has {e.products:,} products, a key each{so_far}: more keys "
                f"than a set may have (limit max_keys={max_keys})")
