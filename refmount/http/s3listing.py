"""Pages of an S3 listing (``ListObjects``/``ListObjectsV2``) walked from a set's tree.

A listing is a depth-first walk of the tree below the prefix's directory, each directory in the
order its tree gives (``Tree.entries``): for a set served as stored from its key index
(``KeyTree``) that is the keys' byte order, which S3 promises; a chunk grid computed by a
Parquet set, an Icechunk repository or the decoded view lists its chunks in grid order. No page
materialises more than its own ``max-keys`` entries: the walk resumes from a ``Cursor`` (the
tree's resume token at each depth), which the continuation token carries, and looks through at
most ``SCAN_BUDGET`` entries per page (a page may then be shorter than ``max-keys`` and still
truncated, as S3 allows).

``after`` (``start-after``, a V1 ``marker`` not given by this server) lists the keys after it in
byte order: in a ``KeyTree`` found by binary search; in other trees by skipping what is not
after it, directories whose keys all sort before it unvisited.

With a delimiter, the keys whose rest after the prefix holds it are rolled into one common
prefix each (a directory rolled up is not walked); a common prefix is given once, also across
the pages of a listing (the cursor carries the last given).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, field
from typing import Any

import trio
import xxhash

from refmount.http.s3xml import ListItem, xml_safe

__all__ = [
    "MAX_TOKEN",
    "SCAN_BUDGET",
    "BadToken",
    "Cursor",
    "Listed",
    "decode_token",
    "encode_token",
    "list_page",
]

SCAN_BUDGET = 20_000  # entries looked at by one page at most (plus 10 per key asked for)
MAX_TOKEN = 8192  # characters of a continuation token (its depth bounds it: 4095 components)
CHECKPOINT_EVERY = 256  # entries walked between yields to trio


class BadToken(ValueError):
    """A continuation token this listing did not give."""


@dataclass
class Cursor:
    """Where a listing resumes: the tree's token at each depth below the prefix's directory
    (each resumes at the entry to walk next; above the last, that entry is the directory to
    go back into), whether the root's extra entry was given, the common prefix last given."""

    tokens: list[int]
    extra_done: bool = False
    last_prefix: bytes | None = None


@dataclass
class Listed:
    items: list[ListItem] = field(default_factory=list)
    prefixes: list[bytes] = field(default_factory=list)
    truncated: bool = False
    cursor: Cursor | None = None  # where the next page starts (truncated only)
    last: bytes | None = None  # the last key or common prefix given


def _binding(scope: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(scope)


def encode_token(cursor: Cursor, scope: bytes) -> str:
    """An opaque continuation token for ``cursor``, valid for the listing ``scope`` names."""
    doc: dict[str, Any] = {"b": _binding(scope), "t": cursor.tokens}
    if cursor.extra_done:
        doc["x"] = 1
    if cursor.last_prefix is not None:
        doc["p"] = base64.b64encode(cursor.last_prefix).decode()
    return base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode()).decode()


def decode_token(token: str, scope: bytes) -> Cursor:
    """The cursor of a token given by ``encode_token`` for the same ``scope``; BadToken otherwise."""
    if len(token) > MAX_TOKEN:
        raise BadToken("too long")
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        tokens = doc["t"]
        prefix = doc.get("p")
        ok = (
            isinstance(doc, dict)
            and doc.get("b") == _binding(scope)
            and isinstance(tokens, list)
            and 0 < len(tokens) <= 4096
            and all(isinstance(t, int) and 0 <= t < 1 << 63 for t in tokens)
            and (prefix is None or isinstance(prefix, str))
        )
        if not ok:
            raise BadToken("not this listing's")
        last = base64.b64decode(prefix, validate=True) if prefix is not None else None
    except (ValueError, UnicodeError, KeyError, TypeError, binascii.Error) as e:
        raise BadToken(str(e)) from None
    return Cursor(list(tokens), bool(doc.get("x")), last)


Describe = Callable[[Any, bytes, int], Awaitable[ListItem | None]]


@dataclass
class _Frame:
    node: Any
    path: bytes  # the directory's path and "/", b"" for the base at the root
    entries: AsyncIterator[tuple]
    at: int  # the token resuming at the entry being walked
    reenter: bool  # its first entry is the directory the cursor goes back into
    after_dir: int = 0  # the token after the directory being walked below this one


async def _base(tree: Any, prefix: bytes) -> tuple[Any, bytes] | None:
    """The directory holding the keys of ``prefix`` (its last component is a name's start)."""
    node = tree.root
    path, _, _ = prefix.rpartition(b"/")
    if not path:
        return (node, b"") if not prefix.startswith(b"/") else None
    for name in path.split(b"/"):
        if not name or name in (b".", b".."):
            return None
        node = await tree.lookup(node, name)
        if node is None or not node.is_dir:
            return None
    return node, path + b"/"


def _seek(key_tree: Any, base_path: bytes, prefix: bytes, after: bytes | None) -> list[int] | None:
    """In a ``KeyTree``: the cursor at the first key at or after ``prefix`` and after ``after``
    (None: there is none)."""
    index = key_tree.index
    low = prefix if after is None else max(prefix, after + b"\0")
    i = index.bisect(low)
    if i >= index.n or not index.key(i).startswith(prefix):
        return None
    depth = index.key(i)[len(base_path) :].count(b"/") + 1
    return [i + 1] * depth


async def list_page(
    tree: Any,
    *,
    prefix: bytes,
    delimiter: bytes | None,
    max_keys: int,
    describe: Describe,
    cursor: Cursor | None = None,
    after: bytes | None = None,
    sorted_tree: Any = None,
    extra: ListItem | None = None,
    url: bool = False,
) -> Listed:
    """One page of the listing of ``prefix`` from ``cursor`` (None: from the start, or after
    ``after``). ``describe(node, key, size)`` gives a file's item (None: left out);
    ``sorted_tree`` is the ``KeyTree`` when ``tree`` is one; ``extra`` an item listed at the
    root before the first entry that sorts after it (the synthesized ``.zmetadata``);
    ``url``: keys XML cannot carry are listed."""
    out = Listed()
    if max_keys <= 0:
        return out
    if after is not None and after < prefix:
        after = None
    base = await _base(tree, prefix)
    if base is None:
        return out
    base_node, base_path = base
    name_prefix = prefix[len(base_path) :]
    last_prefix = cursor.last_prefix if cursor is not None else None
    extra_done = cursor.extra_done if cursor is not None else False
    pending = (
        extra
        if (
            extra is not None
            and not extra_done
            and base_path == b""
            and extra.key.startswith(prefix)
            and (after is None or extra.key > after)
        )
        else None
    )
    tokens = cursor.tokens if cursor is not None else [0]
    filter_after = after
    if cursor is None and sorted_tree is not None and (after is not None or name_prefix):
        seek = _seek(sorted_tree, base_path, prefix, after)
        if seek is None:
            return out
        tokens = seek  # what follows is after ``after``; its common prefixes are still checked
    budget = SCAN_BUDGET + 10 * max_keys
    scanned = 0
    dlen = len(delimiter) if delimiter else 0

    async with AsyncExitStack() as stack:

        async def open_frame(node: Any, path: bytes, start: int, reenter: bool) -> _Frame:
            entries = await stack.enter_async_context(aclosing(tree.entries(node, start)))
            return _Frame(node, path, entries, start, reenter)

        frames = [await open_frame(base_node, base_path, tokens[0], len(tokens) > 1)]
        while frames:
            frame = frames[-1]
            try:
                name, ino, is_dir, nxt, size = await frame.entries.__anext__()
            except StopAsyncIteration:
                if len(frames) == 1 and pending is not None:  # the extra item sorts last
                    if len(out.items) + len(out.prefixes) >= max_keys:
                        return _truncated(out, frames, last_prefix, False)
                    out.items.append(pending)
                    out.last, pending = pending.key, None
                frames.pop()
                if frames:
                    frames[-1].at = frames[-1].after_dir
                continue
            scanned += 1
            if scanned % CHECKPOINT_EVERY == 0:
                await trio.lowlevel.checkpoint()
            full = frame.path + name
            if frame.reenter:  # the cursor goes back into this directory
                frame.reenter = False
                depth = len(frames)
                if is_dir and depth < len(tokens):
                    frame.after_dir = nxt
                    frames.append(
                        await open_frame(tree.node(ino), full + b"/", tokens[depth], depth + 1 < len(tokens))
                    )
                    continue
            if scanned > budget:  # the next page starts at this entry
                return _truncated(out, frames, last_prefix, pending is None)
            if pending is not None and len(frames) == 1 and full > pending.key:  # in byte order
                if len(out.items) + len(out.prefixes) >= max_keys:
                    return _truncated(out, frames, last_prefix, False)
                out.items.append(pending)
                out.last, pending = pending.key, None
            if len(frames) == 1 and not full.startswith(prefix):
                if sorted_tree is not None and full > prefix:
                    break  # past every key of the prefix
                frame.at = nxt
                continue
            rel = full[len(prefix) :]
            rolled: bytes | None = None
            if delimiter:
                probe = rel + b"/" if is_dir else rel
                k = probe.find(delimiter)
                if k >= 0:
                    rolled = prefix + probe[: k + dlen]
            if rolled is not None:
                if rolled != last_prefix and (filter_after is None or rolled > filter_after):
                    if len(out.items) + len(out.prefixes) >= max_keys:
                        return _truncated(out, frames, last_prefix, pending is None)
                    out.prefixes.append(rolled)
                    out.last = last_prefix = rolled
                frame.at = nxt
                continue
            if is_dir:
                below = full + b"/"
                if filter_after is not None and below < filter_after and not filter_after.startswith(below):
                    frame.at = nxt  # every key below sorts before ``after``
                    continue
                frame.after_dir = nxt
                frames.append(await open_frame(tree.node(ino), below, 0, False))
                continue
            if (filter_after is not None and full <= filter_after) or (not url and not xml_safe(full)):
                frame.at = nxt
                continue
            if len(out.items) + len(out.prefixes) >= max_keys:
                return _truncated(out, frames, last_prefix, pending is None)
            frame.at = nxt
            item = await describe(tree.node(ino), full, size)
            if item is not None:
                out.items.append(item)
                out.last = full
    return out


def _truncated(out: Listed, frames: list[_Frame], last_prefix: bytes | None, extra_done: bool) -> Listed:
    """``out``, more to come: the next page starts at the entry each frame is at."""
    out.truncated = True
    out.cursor = Cursor([f.at for f in frames], extra_done, last_prefix)
    return out
