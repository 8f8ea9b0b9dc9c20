"""Which keys an index may hold: paths (no empty, '.' or '..' component, no NUL, no
component over 255 bytes), within ``max_key_length`` and ``max_key_depth``, never both a
file and a directory, one name per path; the leading-'/' quirk; one line for each refusal."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from refmount.refs.limits import Limits, size_text
from refmount.refs.model import ReferenceSetError

_NAME_MAX = 255


def short_key(key: str) -> str:
    return repr(key if len(key) <= 80 else key[:77] + "...")


class KeyChecks:
    """The key checks of ``IndexBuilder.finish`` (which this is a part of): refused with
    ``bad_keys=error``, dropped and listed in ``skipped`` with ``bad_keys=skip``."""

    bad_keys: str
    limits: Limits
    skipped: list[str]
    quirks: Counter[str]

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
            raise ReferenceSetError(f"key {short_key(names[0])} {reason(names[0])}{more}")
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
            lambda k: f"is both a file and a directory (other keys start with {short_key(k + '/')})",
        )
        return table


def key_too_long(max_len: int) -> str:
    return f"is longer than {max_len:,} bytes (limit max_key_length={size_text(max_len)})"


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


def refuse_root_clash(keys: pa.Array, rooted: pa.Array, same_as_next: pa.Array) -> None:
    """Refuse '/a/b' next to 'a/b' (sorted keys): two names for one path."""
    n = len(keys)
    clash = pc.and_(same_as_next, pc.not_equal(rooted.slice(0, n - 1), rooted.slice(1)))
    if isinstance(clash, pa.ChunkedArray):
        clash = clash.combine_chunks()
    if pc.any(clash).as_py():
        name = keys[pc.index(clash, True).as_py()].as_py().decode()
        raise ReferenceSetError(
            f"keys {short_key('/' + name)} and {short_key(name)} are the same path "
            "(a leading '/' means the root): keep one of them"
        )
