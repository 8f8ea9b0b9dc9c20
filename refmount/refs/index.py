"""The columnar key index: one sorted Arrow table, persisted as an Arrow IPC file and
memory-mapped by the daemon.

There is no Python object per key. A reference set of ten million keys is a few
contiguous buffers (sorted key bytes + offsets, kinds, URL ids, offsets, lengths, inline
bytes), so lookups are binary searches over a memory map and a remount of an unchanged
set only maps the file again.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import hashlib
import json
import logging
import mmap
import os
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from refmount.refs.limits import DEFAULT_LIMITS, Limits, size_text
from refmount.refs.model import INT64_MAX, Ref, ReferenceSetError, RefKind

log = logging.getLogger(__name__)

INDEX_FORMAT = "refmount-index-1"
_BATCH = 1 << 16
_NAME_MAX = 255

SCHEMA = pa.schema(
    [
        ("key", pa.large_binary()),  # UTF-8 key, sorted bytewise, unique
        ("kind", pa.int8()),  # RefKind
        ("url", pa.dictionary(pa.int32(), pa.large_string())),  # index 0 when no URL
        ("offset", pa.int64()),
        ("length", pa.int64()),  # -1: whole target of unknown size
        ("data", pa.large_binary()),  # inline bytes; empty for other kinds
    ]
)


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


def _short(key: str) -> str:
    return repr(key if len(key) <= 80 else key[:77] + "...")


class IndexBuilder:
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
            raise ReferenceSetError(f"{where or 'key ' + _short(key)}: URL must be a non-empty string")
        uid = self._url_ids.get(url)
        if uid is None:
            if self._generated_bound is not None:
                self.add_generated(
                    len(url), where or f"{self._generated_bound[1]}: the URL of key {_short(key)}")
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
            f"key {_short(key)}: inline value of {at_least}{size:,} bytes is over the limit "
            f"max_inline={size_text(self.limits.max_inline)}")

    def add_range(self, key: str, url: object, offset: object, length: object) -> None:
        if type(offset) is not int or type(length) is not int:
            raise ReferenceSetError(
                f"key {_short(key)}: offset and length must be integers, "
                f"got {json.dumps(offset, default=str)} and {json.dumps(length, default=str)}"
            )
        if offset < 0 or length < 0 or offset > INT64_MAX or offset + length > INT64_MAX:
            raise ReferenceSetError(
                f"key {_short(key)}: offset {offset} / length {length} out of range "
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
                    f"key {_short(key)}: a list value must be [url] or [url, offset, length], "
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
                f"key {_short(key)}: value must be a string, a JSON object or a list, "
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
            raise ReferenceSetError(f"{where}: key {_short(first)} {key_too_long(max_len)}")
        dropped = pc.filter(keys, long_rows)
        self.skipped.extend(_short(k)[1:-1] for k in dropped.to_pylist())
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
                        _refuse_root_clash(keys, rooted.take(order), same_as_next)
                    keep = pc.invert(pa.concat_arrays([*same_as_next.chunks, pa.array([False])]))
                    table = table.filter(keep)
            table = self._check_keys(table)
        urls = pa.array(list(self._url_ids) or [""], pa.large_string())
        url_col = pa.DictionaryArray.from_arrays(table["url"].combine_chunks(), urls)
        return pa.table(
            [table["key"], table["kind"], url_col, table["offset"], table["length"], table["data"]],
            schema=SCHEMA,
        )

    def _root_slash(self, table: pa.Table) -> tuple[pa.Table, pa.Array | None]:
        """A leading '/' means the root, as some serializers write keys: '/a/b' is 'a/b'.
        Returns the table with such keys rewritten and a mask of the rewritten rows."""
        text = table["key"].cast(pa.large_string())
        rooted = pc.match_substring_regex(text, "^/[^/]")
        n = pc.sum(rooted).as_py() or 0
        if not n:
            return table, None
        self.quirks["keys had a leading '/'"] += n
        keys = pc.if_else(rooted, pc.utf8_slice_codeunits(text, start=1), text).cast(pa.large_binary())
        return table.set_column(0, "key", keys), rooted

    def _reject(self, table: pa.Table, bad: pa.Array, reason: Callable[[str], str]) -> pa.Table:
        bad = bad.combine_chunks() if isinstance(bad, pa.ChunkedArray) else bad
        if not pc.any(bad).as_py():
            return table
        names = [k.decode() for k in table["key"].filter(bad).to_pylist()]
        if self.bad_keys == "error":
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise ReferenceSetError(f"key {_short(names[0])} {reason(names[0])}{more}")
        self.skipped.extend(names)
        return table.filter(pc.invert(bad))

    def _check_keys(self, table: pa.Table) -> pa.Table:
        text = table["key"].cast(pa.large_string())
        table = self._reject(
            table,
            pc.match_substring_regex(text, r"(^|/)\.{0,2}(/|$)"),
            lambda k: "cannot be a path: it has an empty, '.' or '..' component"
            if k
            else "is empty",
        )
        text = table["key"].cast(pa.large_string())
        table = self._reject(
            table, pc.match_substring(text, "\x00"), lambda k: "contains a NUL character"
        )
        long_rows = pc.greater(pc.binary_length(table["key"]), _NAME_MAX)
        if pc.any(long_rows).as_py():
            bad = pa.array(
                [
                    k is not None and max(len(c) for c in k.split(b"/")) > _NAME_MAX
                    for k in pc.if_else(long_rows, table["key"], None).to_pylist()
                ]
            )
            table = self._reject(
                table, bad, lambda k: f"has a path component over {_NAME_MAX} bytes"
            )
        max_len = self.limits.max_key_length
        table = self._reject(
            table,
            pc.greater(pc.binary_length(table["key"]), max_len),
            lambda k: key_too_long(max_len),
        )
        max_depth = self.limits.max_key_depth
        text = table["key"].cast(pa.large_string())
        table = self._reject(
            table,
            pc.greater_equal(pc.count_substring(text, "/"), max_depth),
            lambda k: f"is nested deeper than {max_depth} directories (limit max_key_depth={max_depth})",
        )
        # A key that is also a directory (another key lies under "key/"): refuse or drop
        # the file, since a path cannot be both.
        table = self._reject(
            table,
            pa.array(keys_that_are_directories(table["key"].combine_chunks())),
            lambda k: f"is both a file and a directory (other keys start with {_short(k + '/')})",
        )
        return table


def key_too_long(max_len: int) -> str:
    return f"is longer than {max_len:,} bytes (limit max_key_length={size_text(max_len)})"


def generated_why(bound: int) -> str:
    return (f"the set's keys and URLs come to more than {bound:,} bytes "
            f"(limit max_generated={size_text(bound)})")


def keys_that_are_directories(keys: pa.Array) -> np.ndarray:
    """Which of the sorted, unique keys another key lies under (it starts with ``key/``).

    Worked out from neighbours, never from the directory prefixes of the keys (a key of n
    components has n of them: materialised, deep keys cost memory quadratic in their length).
    In byte order the keys starting with K follow K as one run: first those where a byte
    below '/' follows K, then those under K/, then the rest. So when the key after K starts
    with K/, K is a directory; when it starts with K and then a byte above '/', K is not.
    Only a key followed by K plus a byte below '/' (``a`` before ``a.b`` and ``a/c``) leaves
    it open; if there are such keys, the keys are sorted once more with '/' read as the byte
    0 (keys hold no NUL): then the keys under K come right after K, and K is a directory
    exactly when its successor sorts before K + 0x01. Time linear (n log n with that sort),
    memory a few copies of the key column."""
    n = len(keys)
    mask = np.zeros(n, bool)
    if n < 2:
        return mask
    keys = keys.cast(pa.large_binary())
    first, rest = keys.slice(0, n - 1), keys.slice(1)
    open_question = pc.less(rest, _joined(first, b"/"))  # K < next < K/: next is K + byte < '/'
    if not pc.any(open_question).as_py():
        under = pc.less(rest, _joined(first, b"0"))  # and next >= K/: next starts with K/
        mask[:-1] = under.to_numpy(zero_copy_only=False)
        return mask
    slash_low = pc.replace_substring(keys, "/", "\x00")
    order = pc.sort_indices(slash_low)
    ranked = slash_low.take(order)
    del slash_low
    under = pc.less(ranked.slice(1), _joined(ranked.slice(0, n - 1), b"\x01"))
    mask[order.to_numpy()[:-1]] = under.to_numpy(zero_copy_only=False)
    return mask


def _joined(keys: pa.Array, suffix: bytes) -> pa.Array:
    """Each key followed by ``suffix``."""
    return pc.binary_join_element_wise(keys, pa.scalar(suffix, pa.large_binary()),
                                       pa.scalar(b"", pa.large_binary()))


def _refuse_root_clash(keys: pa.Array, rooted: pa.Array, same_as_next: pa.Array) -> None:
    """Refuse '/a/b' next to 'a/b' (sorted keys): two names for one path."""
    n = len(keys)
    clash = pc.and_(same_as_next, pc.not_equal(rooted.slice(0, n - 1), rooted.slice(1)))
    if isinstance(clash, pa.ChunkedArray):
        clash = clash.combine_chunks()
    if pc.any(clash).as_py():
        name = keys[pc.index(clash, True).as_py()].as_py().decode()
        raise ReferenceSetError(
            f"keys {_short('/' + name)} and {_short(name)} are the same path "
            "(a leading '/' means the root): keep one of them"
        )


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
            raise ReferenceSetError(f"key {_short(key)}: invalid base64 data") from None
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise ReferenceSetError(f"key {_short(key)}: inline text is not valid Unicode") from None


def summary_metadata(table: pa.Table) -> dict[str, str]:
    """Totals stored with the index, so the daemon never scans columns to report them."""
    if not table.num_rows:
        return {"keys": "0", "targets": "0", "referenced_bytes": "0", "inline_bytes": "0"}
    kind = table["kind"]
    ranged = pc.equal(kind, int(RefKind.RANGE))
    remote = pc.not_equal(kind, int(RefKind.INLINE))
    used_urls = pc.count_distinct(pc.filter(table["url"].combine_chunks().indices, remote))
    return {
        "keys": str(table.num_rows),
        "targets": str(used_urls.as_py()),
        "referenced_bytes": str(pc.sum(pc.filter(table["length"], ranged)).as_py() or 0),
        "inline_bytes": str(pc.sum(pc.binary_length(table["data"])).as_py() or 0),
    }


def index_family(source: str, variant: str) -> str:
    """What the persisted indexes of every version of one SOURCE (under the same options)
    share: the start of their file names, ``<family>-<identity>.arrow``."""
    return hashlib.sha256(f"{source}\0{variant}".encode()).hexdigest()[:16]


def prune_index_family(keep: str) -> int:
    """Remove the other indexes of ``keep``'s family (older versions of its SOURCE): the index
    directory keeps the newest index of each SOURCE. A live mount that maps one of them goes
    on reading it (the file is unlinked, its mapping stays). Returns how many were removed."""
    directory, name = os.path.split(keep)
    family = name.split("-", 1)[0] + "-"
    removed = 0
    with os.scandir(directory) as entries:
        for e in entries:
            if e.name.startswith(family) and e.name.endswith(".arrow") and e.name != name:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
                    removed += 1
    return removed


def write_index(table: pa.Table, path: str, metadata: dict[str, str]) -> None:
    """Write atomically (temp file + rename), so concurrent mounts never see half a file. The
    directory is the caller's to vouch for (``process.private_dir`` under ``cache_dir``); the
    temporary file is created exclusively under an unpredictable name (``mkstemp``)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)  # the index holds every target URL
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".arrow")
    try:
        _write(fd, table, metadata)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_temporary_index(table: pa.Table, metadata: dict[str, str]) -> str:
    """Write the index to a new file of this user's (0600, created exclusively under an
    unpredictable ``refmount-index-*.arrow`` name in ``$XDG_RUNTIME_DIR`` or the temporary
    directory: nothing another user planted there is written through); returns its path."""
    directory = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(dir=directory, prefix="refmount-index-", suffix=".arrow")
    try:
        _write(fd, table, metadata)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


def _write(fd: int, table: pa.Table, metadata: dict[str, str]) -> None:
    schema = table.schema.with_metadata({"format": INDEX_FORMAT, **metadata})
    with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for batch in table.to_batches(max_chunksize=max(table.num_rows, 1)):
            writer.write_batch(batch)


class KeyIndex:
    """Read-only view of a written index: sorted keys and their references."""

    def __init__(self, table: pa.Table, metadata: dict[str, str] | None = None) -> None:
        self.table = table.combine_chunks() if table.num_rows else table
        self.metadata = metadata or {}
        n = self.n = table.num_rows

        def column(name: str) -> pa.Array:
            col = self.table[name]
            return col.chunk(0) if col.num_chunks else pa.array([], col.type)

        key = column("key")
        self._koff = np.frombuffer(key.buffers()[1], np.int64, n + 1, key.offset * 8)
        self._kbuf = memoryview(key.buffers()[2] or b"")
        self._kinds = _view(column("kind"), np.int8)
        url = column("url")
        self._url_ids = _view(url.indices, np.int32) if n else np.zeros(0, np.int32)
        self._url_strings = url.dictionary if n else pa.array([], pa.large_string())
        self._offsets = _view(column("offset"), np.int64)
        self._lengths = _view(column("length"), np.int64)
        data = column("data")
        self._doff = np.frombuffer(data.buffers()[1], np.int64, n + 1, data.offset * 8)
        self._dbuf = memoryview(data.buffers()[2] or b"")
        self.keys = _KeySequence(self._koff, self._kbuf, n)

    @classmethod
    def open(cls, path: str) -> KeyIndex:
        """Memory-map an index file: pages are read on demand and shared with the page cache.
        Only a regular file of this user's is read, never through a symlink: the index is
        the tree the mount serves."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise ReferenceSetError(f"{path}: not an index file of this user's")
            if st.st_size == 0:
                raise ReferenceSetError(f"{path}: not a refmount index of this version")
            mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped)))
        if reader.schema.metadata is None or reader.schema.metadata.get(b"format") != INDEX_FORMAT.encode():
            raise ReferenceSetError(f"{path}: not a refmount index of this version")
        meta = {k.decode(): v.decode() for k, v in reader.schema.metadata.items()}
        return cls(reader.read_all(), meta)

    def __len__(self) -> int:
        return self.n

    def key(self, i: int) -> bytes:
        return self._kbuf[self._koff[i] : self._koff[i + 1]].tobytes()

    def bisect(self, key: bytes, lo: int = 0, hi: int | None = None) -> int:
        return bisect.bisect_left(self.keys, key, lo, self.n if hi is None else hi)

    def ref(self, i: int, view: bool = False) -> Ref:
        """Key i's reference; ``view``: inline bytes as a view into the mapped index (no
        copy, so that open handles of a large inline value cost no memory each)."""
        kind = RefKind(int(self._kinds[i]))
        if kind is RefKind.INLINE:
            mapped = self._dbuf[self._doff[i] : self._doff[i + 1]]
            data = mapped if view else mapped.tobytes()
            return Ref(kind, None, 0, len(data), data)  # type: ignore[arg-type]
        url = self._url_strings[int(self._url_ids[i])].as_py()
        return Ref(kind, url, int(self._offsets[i]), int(self._lengths[i]))

    def size(self, i: int) -> int:
        """Byte size of key i, or -1 for a whole-file target whose size is not yet known."""
        return int(self._lengths[i])

    def urls(self) -> Iterator[str]:
        """The distinct target URLs that some key uses."""
        used = np.unique(self._url_ids[self._kinds != RefKind.INLINE])
        for uid in used.tolist():
            yield self._url_strings[uid].as_py()

    def first_with_url(self, url: str) -> int:
        uid = self._url_strings.to_pylist().index(url)
        hits = np.flatnonzero((self._url_ids == uid) & (self._kinds != RefKind.INLINE))
        return int(hits[0])

    def iter_refs(self) -> Iterator[tuple[bytes, Ref]]:
        for i in range(self.n):
            yield self.key(i), self.ref(i)


def _view(array: pa.Array, dtype: type) -> np.ndarray:
    """A zero-copy numpy view of a null-free fixed-width Arrow array. (``to_numpy()``
    faults in several times the column's size; a view touches pages only when read.)"""
    if array.null_count:
        raise ValueError("index columns have no nulls")
    item = np.dtype(dtype).itemsize
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * item)


class _KeySequence:
    """Sequence protocol over the key column, so ``bisect`` runs its loop in C."""

    __slots__ = ("_buf", "_n", "_off")

    def __init__(self, off: np.ndarray, buf: memoryview, n: int) -> None:
        # offsets through a memoryview: its items are Python ints, a numpy array's are numpy
        # scalars, several times slower to make and to slice with (each probe of a lookup)
        self._off, self._buf, self._n = memoryview(off), buf, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        off = self._off
        return self._buf[off[i] : off[i + 1]].tobytes()
