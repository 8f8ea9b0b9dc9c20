"""Building the key index: references accumulated in Arrow record batches (a tight path
for ranges, vectorised batches for ``gen``), bounded by the set's limits as they come, then
sorted, de-duplicated (the last value wins) and checked (``keyrules.py``) into one table."""

from __future__ import annotations

import base64
import binascii
import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from refmount.refs.index import SCHEMA
from refmount.refs.keyrules import KeyChecks, key_too_long, refuse_root_clash, short_key
from refmount.refs.limits import DEFAULT_LIMITS, Limits, size_text
from refmount.refs.model import INT64_MAX, ReferenceSetError, RefKind

_BATCH = 1 << 16


def _last_of_each_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch without the earlier values of a key it holds more than once (the last one
    read wins, as in a JSON object): a set repeating keys costs memory for its distinct keys
    only, not for every repetition until ``finish``. A hash count per batch; the grouping runs
    only when there are repeats."""
    keys = batch.column(0)
    if pc.count_distinct(keys).as_py() == batch.num_rows:
        return batch
    rows = pa.table({"key": keys, "row": pa.array(np.arange(batch.num_rows))})
    last = rows.group_by("key", use_threads=False).aggregate([("row", "max")])["row_max"]
    return batch.take(pa.array(np.sort(last.to_numpy())))  # in the order they were read


class IndexBuilder(KeyChecks):
    """Accumulates references in Arrow batches, then sorts, validates and writes them."""

    def __init__(self, bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS) -> None:
        self.bad_keys = bad_keys
        self.limits = limits
        self._url_ids: dict[str, int] = {}
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0  # in _batches
        self._reset()
        self.skipped: list[str] = []
        self.skipped_unnamed = 0  # keys skipped besides those in ``skipped`` (skip_all)
        self.quirks: Counter[str] = Counter()  # producer quirks accepted: what -> how many
        # Bytes of the keys and distinct URLs added so far; bounded once ``bound_generated``
        # is called (Version 1 sets, whose templates make more than they are given).
        self.generated = 0
        self._generated_bound: tuple[int, str] | None = None

    def bound_generated(self, name: str) -> None:
        """From now on refuse the set (named ``name``) once its keys and distinct URLs come
        to more than ``max_generated`` bytes; counted a batch of keys, and a URL, at a time."""
        self._generated_bound = (self.limits.max_generated, name)

    def skip_all(self, what: str, n: int) -> None:
        """``bad_keys=skip``: ``n`` keys, all bad, skipped without being made."""
        self.skipped.append(what)
        self.skipped_unnamed += n - 1

    def room(self) -> int | None:
        """Bytes of keys and URLs that may still be added (None: no bound)."""
        if self._generated_bound is None:
            return None
        return self._generated_bound[0] - self.generated

    def add_generated(self, size: int, where: str) -> None:
        """``size`` more bytes of keys or URLs, made by ``where`` (named with the set's
        name): refused past the bound."""
        self.generated += size
        bound = self._generated_bound
        if bound is not None and self.generated > bound[0]:
            raise ReferenceSetError(f"{where}: {generated_why(bound[0])}")

    def _reset(self) -> None:
        # Cleared in place after each flush, so add_items can keep local references.
        self._keys: list[str] = []
        self._kinds: list[int] = []
        self._urls: list[int] = []
        self._offs: list[int] = []
        self._lens: list[int] = []
        self._data: list[bytes] = []

    def add_items(self, items: Iterable[tuple[str, Any]]) -> None:
        """Add (key, Version 0 value) pairs. Range references — nearly every key of a big
        set — take a tight path; anything else goes through ``add_value``'s validation."""
        keys, kinds, urls, offs, lens, data = (
            self._keys, self._kinds, self._urls, self._offs, self._lens, self._data
        )
        url_ids = self._url_ids
        add_value = self.add_value
        for key, value in items:
            if type(value) is list and len(value) == 3:
                url, off, ln = value
                if (
                    type(off) is int and type(ln) is int and type(url) is str and url
                    and off >= 0 and ln >= 0 and off + ln <= INT64_MAX
                ):
                    uid = url_ids.get(url)
                    if uid is None:
                        uid = url_ids[url] = len(url_ids)
                    keys.append(key)
                    kinds.append(1)
                    urls.append(uid)
                    offs.append(off)
                    lens.append(ln)
                    data.append(b"")
                    if len(keys) >= _BATCH:
                        self._flush()
                    continue
            add_value(key, value)

    def _url_id(self, url: object, key: str, where: str | None = None) -> int:
        if type(url) is not str or not url:
            raise ReferenceSetError(f"{where or 'key ' + short_key(key)}: URL must be a non-empty string")
        uid = self._url_ids.get(url)
        if uid is None:
            if self._generated_bound is not None:
                self.add_generated(
                    len(url), where or f"{self._generated_bound[1]}: the URL of key {short_key(key)}")
            uid = self._url_ids[url] = len(self._url_ids)
        return uid

    def add_inline(self, key: str, data: bytes) -> None:
        if len(data) > self.limits.max_inline:
            self._too_large(key, len(data))
        self._keys.append(key)
        self._kinds.append(RefKind.INLINE)
        self._urls.append(0)
        self._offs.append(0)
        self._lens.append(len(data))
        self._data.append(data)
        if len(self._keys) >= _BATCH:
            self._flush()

    def _too_large(self, key: str, size: int, at_least: str = "") -> None:
        raise ReferenceSetError(
            f"key {short_key(key)}: inline value of {at_least}{size:,} bytes is over the limit "
            f"max_inline={size_text(self.limits.max_inline)}")

    def add_range(self, key: str, url: object, offset: object, length: object) -> None:
        if type(offset) is not int or type(length) is not int:
            raise ReferenceSetError(
                f"key {short_key(key)}: offset and length must be integers, "
                f"got {json.dumps(offset, default=str)} and {json.dumps(length, default=str)}"
            )
        if offset < 0 or length < 0 or offset > INT64_MAX or offset + length > INT64_MAX:
            raise ReferenceSetError(
                f"key {short_key(key)}: offset {offset} / length {length} out of range "
                "(must be non-negative and fit in 64 bits)"
            )
        uid = self._url_id(url, key)
        self._keys.append(key)
        self._kinds.append(RefKind.RANGE)
        self._urls.append(uid)
        self._offs.append(offset)
        self._lens.append(length)
        self._data.append(b"")
        if len(self._keys) >= _BATCH:
            self._flush()

    def add_whole(self, key: str, url: object) -> None:
        uid = self._url_id(url, key)
        self._keys.append(key)
        self._kinds.append(RefKind.WHOLE)
        self._urls.append(uid)
        self._offs.append(0)
        self._lens.append(-1)
        self._data.append(b"")
        if len(self._keys) >= _BATCH:
            self._flush()

    def add_value(self, key: str, value: Any, render_url: Callable[[str], str] | None = None) -> None:
        """Add one Version 0 style value (also used for Version 1 ``refs``)."""
        t = type(value)
        if t is list:
            n = len(value)
            if n == 3:
                url = value[0]
                if render_url is not None and type(url) is str:
                    url = render_url(url)
                self.add_range(key, url, value[1], value[2])
            elif n == 1:
                url = value[0]
                if render_url is not None and type(url) is str:
                    url = render_url(url)
                self.add_whole(key, url)
            else:
                raise ReferenceSetError(
                    f"key {short_key(key)}: a list value must be [url] or [url, offset, length], "
                    f"got {n} elements"
                )
        elif t is str:
            if len(value) > self.limits.max_inline and not value.startswith("base64:"):
                self._too_large(key, len(value), "at least ")  # UTF-8: a byte or more a character
            self.add_inline(key, decode_inline(key, value))
        elif t is dict:
            # The spec: an object value is a JSON file; render it as fsspec does.
            self.add_inline(key, json.dumps(value, default=float).encode())
        else:
            raise ReferenceSetError(
                f"key {short_key(key)}: value must be a string, a JSON object or a list, "
                f"got {type(value).__name__ if value is not None else 'null'}"
            )

    def add_columns(
        self,
        keys: pa.Array,
        urls: pa.Array,
        offsets: np.ndarray | None,
        lengths: np.ndarray | None,
        where: str,
    ) -> None:
        """Add a batch of generated references (ranges, or whole targets when offsets is None).
        The batch's keys are checked against ``max_key_length`` and counted against
        ``max_generated`` here, before they are kept."""
        self._flush()
        keys, urls, offsets, lengths = self._long_keys(keys, urls, offsets, lengths, where)
        n = len(keys)
        self._count(n)
        self.add_generated(pc.sum(pc.binary_length(keys)).as_py() or 0, where)
        if pc.any(pc.equal(pc.binary_length(urls), 0)).as_py():
            raise ReferenceSetError(f"{where}: a rendered URL is empty")
        encoded = pc.dictionary_encode(urls)
        mapping = np.fromiter(
            (self._url_id(u, where, where) for u in encoded.dictionary.to_pylist()), np.int32
        )
        url_ids = mapping[encoded.indices.to_numpy()]
        if offsets is None or lengths is None:
            kind, offs, lens = RefKind.WHOLE, np.zeros(n, np.int64), np.full(n, -1, np.int64)
        else:
            kind, offs, lens = RefKind.RANGE, offsets, lengths
            if (offs < 0).any() or (lens < 0).any() or (offs > INT64_MAX - lens).any():
                raise ReferenceSetError(f"{where}: a rendered offset or length is negative or too large")
        self._batches.append(
            pa.record_batch(
                [
                    keys.cast(pa.large_binary()),
                    pa.array(np.full(n, int(kind), np.int8)),
                    pa.array(url_ids, pa.int32()),
                    pa.array(offs, pa.int64()),
                    pa.array(lens, pa.int64()),
                    _empty_binary(n),
                ],
                names=["key", "kind", "url", "offset", "length", "data"],
            )
        )

    def _long_keys(self, keys: pa.Array, urls: pa.Array, offsets: np.ndarray | None,
                   lengths: np.ndarray | None, where: str
                   ) -> tuple[pa.Array, pa.Array, np.ndarray | None, np.ndarray | None]:
        """A batch's keys longer than ``max_key_length``: refused (naming the first), or
        with ``bad_keys=skip`` dropped from the batch at once."""
        max_len = self.limits.max_key_length
        long_rows = pc.greater(pc.binary_length(keys), max_len)
        if not pc.any(long_rows).as_py():
            return keys, urls, offsets, lengths
        first = keys[pc.index(long_rows, True).as_py()].as_py()
        first = first.decode(errors="replace") if isinstance(first, bytes) else first
        if self.bad_keys == "error":
            raise ReferenceSetError(f"{where}: key {short_key(first)} {key_too_long(max_len)}")
        dropped = pc.filter(keys, long_rows)
        self.skipped.extend(short_key(k)[1:-1] for k in dropped.to_pylist())
        keep = pc.invert(long_rows)
        mask = keep.to_numpy(zero_copy_only=False)
        return (pc.filter(keys, keep), pc.filter(urls, keep),
                None if offsets is None else offsets[mask],
                None if lengths is None else lengths[mask])

    def _count(self, n: int) -> None:
        """``n`` more rows go into the batches: refused past ``max_keys`` (counted as read,
        duplicates included; checked once a batch)."""
        self._rows += n
        if self._rows > self.limits.max_keys:
            raise ReferenceSetError(
                f"the set has more than {self.limits.max_keys:,} keys "
                f"(limit max_keys={self.limits.max_keys})")

    def flush(self) -> None:
        """Move the references added one by one into a batch (checked and counted)."""
        self._flush()

    def _flush(self) -> None:
        if not self._keys:
            return
        self._count(len(self._keys))
        try:
            keys = pa.array(self._keys, pa.large_string()).cast(pa.large_binary())
        except (pa.ArrowInvalid, UnicodeEncodeError):
            bad = next(k for k in self._keys if not _encodable(k))
            raise ReferenceSetError(f"key {bad!r} is not valid Unicode text") from None
        if self._generated_bound is not None:
            self.add_generated(pc.sum(pc.binary_length(keys)).as_py() or 0,
                               f"{self._generated_bound[1]}: refs")
        self._batches.append(_last_of_each_key(
            pa.record_batch(
                [
                    keys,
                    pa.array(self._kinds, pa.int8()),
                    pa.array(self._urls, pa.int32()),
                    pa.array(self._offs, pa.int64()),
                    pa.array(self._lens, pa.int64()),
                    pa.array(self._data, pa.large_binary()),
                ],
                names=["key", "kind", "url", "offset", "length", "data"],
            )
        ))
        for column in (self._keys, self._kinds, self._urls, self._offs, self._lens, self._data):
            column.clear()

    @property
    def keys_read(self) -> int:
        """Keys added so far, a repeated key counted each time (what ``max_keys`` bounds)."""
        return self._rows + len(self._keys)

    def __len__(self) -> int:
        """Rows held so far: repeats of a key within a finished batch are already dropped."""
        return sum(b.num_rows for b in self._batches) + len(self._keys)

    def finish(self) -> pa.Table:
        """Sort, de-duplicate (last value wins, as in a JSON object), validate keys."""
        self._flush()
        plain = pa.schema([(f.name, pa.int32() if f.name == "url" else f.type) for f in SCHEMA])
        table = pa.Table.from_batches(self._batches, schema=plain).combine_chunks()
        self._batches = []
        self._rows = 0
        if table.num_rows:
            table, rooted = self._root_slash(table)
            # Arrow's sort is stable: among duplicate keys the last one read stays last.
            order = pc.sort_indices(table["key"])
            table = table.take(order)
            keys = table["key"]
            if table.num_rows > 1:
                same_as_next = pc.equal(keys.slice(0, len(keys) - 1), keys.slice(1))
                if pc.any(same_as_next).as_py():
                    if rooted is not None:
                        refuse_root_clash(keys, rooted.take(order), same_as_next)
                    keep = pc.invert(pa.concat_arrays([*same_as_next.chunks, pa.array([False])]))
                    table = table.filter(keep)
            table = self._check_keys(table)
        urls = pa.array(list(self._url_ids) or [""], pa.large_string())
        url_col = pa.DictionaryArray.from_arrays(table["url"].combine_chunks(), urls)
        return pa.table(
            [table["key"], table["kind"], url_col, table["offset"], table["length"], table["data"]],
            schema=SCHEMA,
        )


def generated_why(bound: int) -> str:
    return (f"the set's keys and URLs come to more than {bound:,} bytes "
            f"(limit max_generated={size_text(bound)})")


def _empty_binary(n: int) -> pa.Array:
    """n empty (not null) binary values, without n Python objects."""
    offsets = pa.py_buffer(np.zeros(n + 1, np.int64))
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, offsets, pa.py_buffer(b"")])


def _encodable(s: str) -> bool:
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


_ASCII_SPACE = {ord(c): None for c in " \t\n\r\f\v"}


def decode_inline(key: str, value: str) -> bytes:
    if value.startswith("base64:"):
        try:
            return base64.b64decode(value[7:], validate=True)
        except (binascii.Error, ValueError):
            pass
        try:
            # Line-wrapped base64 (base64.encodebytes, MIME) is valid; other junk is refused,
            # not skipped over as a lenient decoder would.
            return base64.b64decode(value[7:].translate(_ASCII_SPACE), validate=True)
        except (binascii.Error, ValueError):
            raise ReferenceSetError(f"key {short_key(key)}: invalid base64 data") from None
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise ReferenceSetError(f"key {short_key(key)}: inline text is not valid Unicode") from None
