"""The plan of the answer to a request for a path: what the path names, the status, headers and
byte range, and for a GET the first piece of the body, decided before any header is sent.

``PathPlanner`` is the part of ``http/frontend.py``'s ``HttpFrontEnd`` that asks the set's core:
``_plan_now`` answers on the asyncio loop when no I/O is needed (the tree answering from its
index, a size known, bytes in memory), raising ``NeedsTrio`` otherwise; ``_plan`` answers in
trio (called through ``triocall.TrioCaller``). It also reads the body's later pieces (``_read``,
``_read_now``) and makes the synthesized ``.zmetadata`` (``core/consolidated.py``) once.
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import trio

from refmount.base.errors import ReadError
from refmount.core.consolidated import (
    MAX_BYTES,
    MAX_VALUES,
    METADATA_NAMES,
    ConsolidationRefused,
    consolidation,
)
from refmount.core.reader import ReadState
from refmount.core.setcore import SetCore
from refmount.decode.codecplan import DecodedArray
from refmount.decode.metadatabound import DecodedMetadataRefused
from refmount.http.ranges import (
    RangeNotSatisfiable,
    content_range,
    if_range_matches,
    parse_range,
    unsatisfied_range,
)
from refmount.http.validators import etag_for, is_not_modified, ref_parts
from refmount.refs import Ref, RefKind
from refmount.refs.tree import Node

log = logging.getLogger(__name__)

READ_PIECE = 1 << 20  # bytes asked of the reader at a time

_SLASHES = re.compile("/{2,}")


def merge_slashes(raw: str) -> str:
    """A request's path with each run of ``/`` made one, as nginx's ``merge_slashes on`` does:
    ``//a//b/`` names what ``/a/b/`` names (zarr lists ``http://host:port//`` when given
    ``http://host:port/``)."""
    return _SLASHES.sub("/", raw) if "//" in raw else raw


def path_names(raw: str) -> list[bytes] | None:
    """A request's path (still %-encoded) -> the names of its components (None: it names
    nothing). A trailing ``/`` leaves an empty last name; empty components (``%2F%2F`` too)
    are merged away; ``.``, ``..`` and a NUL name nothing."""
    path = urllib.parse.unquote_to_bytes(raw)
    if not path.startswith(b"/"):
        return None
    parts = path[1:].split(b"/")
    names = [p for p in parts[:-1] if p] + parts[-1:]
    if any(p in (b".", b"..") or b"\0" in p for p in names):
        return None
    return names


@dataclass
class Found:
    """What a path names: a directory, or a file with its served size."""

    key: str
    node: Node | None  # None: the synthesized .zmetadata
    is_dir: bool
    size: int = 0
    ref: Ref | None = None
    array: DecodedArray | None = None
    data: bytes | None = None  # served as is (the synthesized .zmetadata)


@dataclass
class Plan:
    """The answer to a request for a path, decided in trio (``PathPlanner._plan``)."""

    found: Found
    status: int
    headers: dict[str, str]
    start: int = 0
    stop: int = 0
    first: bytes | memoryview | None = None  # the first piece of a GET's body
    error: ReadError | None = None  # the first piece (or the size) could not be had
    state: ReadState = field(default_factory=ReadState)


class Unavailable(Exception):
    """What the server would synthesize for this path is past its bounds: a 503."""

class NeedsTrio(Exception):
    """The answer needs I/O or waiting (a lookup that may load, a size to measure, bytes
    not in memory, a decoded chunk): it is planned in trio. ``ref``: a key whose bytes may
    be coming in a stretch read ahead (waited for on the loop first)."""

    def __init__(self, ref: Ref | None = None) -> None:
        super().__init__()
        self.ref = ref


def _content_type(key: str) -> str:
    name = key.rpartition("/")[2]
    if name in (*METADATA_NAMES, ".zmetadata") or name.endswith(".json"):
        return "application/json"
    return "application/octet-stream"



class PathPlanner:
    """The core's calls of ``HttpFrontEnd`` (which sets these attributes)."""

    core: SetCore | None
    cache_control: str
    _identity: str
    _mtime: float
    _last_modified: str
    _zmetadata: bytes | None
    _zmetadata_refused: bool
    _zmetadata_lock: trio.Lock

    def _decide(self, found: Found, method: str, conditions: dict[str, str | None]) -> Plan:
        """Status, headers and byte range of the answer for a file whose size is known."""
        size = found.size
        if found.ref is not None:
            etag = etag_for(ref_parts(found.ref, set_identity=self._identity, mtime_ns=self.core.mtime_ns,
                                      decoded=found.array is not None, size=size))
        else:  # the synthesized .zmetadata: its bytes
            etag = etag_for(b"refmount-zmetadata\0" + self._identity.encode() + b"\0" + (found.data or b""))
        headers = {"ETag": etag, "Last-Modified": self._last_modified, "Accept-Ranges": "bytes",
                   "Cache-Control": self.cache_control, "Content-Type": _content_type(found.key)}
        if is_not_modified(method, if_none_match=conditions["If-None-Match"],
                           if_modified_since=conditions["If-Modified-Since"], etag=etag, mtime=self._mtime):
            return Plan(found, 304, headers)
        status, start, stop = 200, 0, size
        if if_range_matches(conditions["If-Range"], etag):
            try:
                wanted = parse_range(conditions["Range"], size)
            except RangeNotSatisfiable:
                headers["Content-Range"] = unsatisfied_range(size)
                return Plan(found, 416, headers)
            if wanted is not None:
                status, start, stop = 206, wanted.start, wanted.stop
                headers["Content-Range"] = content_range(wanted, size)
        return Plan(found, status, headers, start, stop)


    # ---- trio side: the core's calls ---------------------------------------------------------
    async def _find(self, parts: list[bytes]) -> Found | None:
        tree = self.core.tree
        node: Node | None = tree.root
        names = parts[:-1] if parts[-1] == b"" else parts
        for name in names:
            assert node is not None
            if not node.is_dir:
                return None
            node = await tree.lookup(node, name)
            if node is None:
                if names == [b".zmetadata"] and await self._synthesizes_zmetadata():
                    data = await self._synthesized_zmetadata()
                    if data is None:
                        raise Unavailable
                    return Found(".zmetadata", None, False, len(data), data=data)
                return None
        assert node is not None
        key = tree.path(node).decode("utf-8", "surrogateescape")
        if node.is_dir:
            return Found(key, node, True)
        if parts[-1] == b"":
            return None  # a file named as a directory
        try:
            ref = await tree.ref(node)
        except DecodedMetadataRefused:
            raise Unavailable from None  # logged once, when the decoded view was made
        size = await tree.size(node)
        array = self.core.array(node)
        if array is None and size < 0:  # a whole-file target not yet measured: its size (no bytes fetched)
            size = await self.core.reader.size(ref)
        return self._file_found(key, node, ref, size, array)

    def _find_now(self, parts: list[bytes]) -> Found | None:
        """``_find`` without I/O, for a tree that answers from its index (``core.key_tree``);
        ``NeedsTrio`` when the answer needs more."""
        tree = self.core.key_tree
        if tree is None:
            raise NeedsTrio
        node: Node | None = tree.root
        names = parts[:-1] if parts[-1] == b"" else parts
        for name in names:
            assert node is not None
            if not node.is_dir:
                return None
            node = tree.find(node, name)
            if node is None:
                if (names == [b".zmetadata"] and self.core.view is None
                        and tree.find(tree.root, b"zarr.json") is not None):
                    return None  # a Zarr v3 set shown as stored: no v2 .zmetadata
                if names == [b".zmetadata"]:
                    if self._zmetadata_refused:
                        raise Unavailable
                    if self._zmetadata is None:
                        raise NeedsTrio  # made once, in a worker thread
                    return Found(".zmetadata", None, False, len(self._zmetadata), data=self._zmetadata)
                return None
        assert node is not None
        key = tree.path(node).decode("utf-8", "surrogateescape")
        if node.is_dir:
            return Found(key, node, True)
        if parts[-1] == b"":
            return None  # a file named as a directory
        size = tree.size_now(node)
        if size < 0:
            raise NeedsTrio  # a whole-file target to measure
        return self._file_found(key, node, tree.ref_now(node), size, None)

    def _file_found(self, key: str, node: Node, ref: Ref, size: int, array: DecodedArray | None) -> Found:
        """A file with its served size: a range running past the end of its target (when
        that is known) serves the bytes that exist."""
        if array is None and ref.kind is RefKind.RANGE:
            clipped = self.core.reader.clipped(ref)
            size = size if clipped is None else clipped
        return Found(key, node, False, size, ref, array)

    async def _plan(self, parts: list[bytes], method: str, conditions: dict[str, str | None]) -> Plan | None:
        """In trio: the node of ``parts`` and, for a file, the answer; for a GET, the size
        settled and the first piece of the body read (a failure there is the plan's
        ``error``: the headers are not sent yet)."""
        found = await self._find(parts)
        if found is None or found.is_dir:
            return None if found is None else Plan(found, 200, {})
        get = method == "GET"
        if get and found.ref is not None and found.array is None and found.ref.kind is RefKind.RANGE:
            # A range running past the end of its target is served as the bytes that exist
            # (as st_size in a mount): found out before the headers, which carry the size.
            try:
                found.size = await self._settle(found.ref)
            except ReadError as e:
                plan = self._decide(found, method, conditions)
                plan.error = e
                return plan
        plan = self._decide(found, method, conditions)
        if get and plan.status in (200, 206) and plan.start < plan.stop:
            # The first piece before the headers: a target that fails now is a 502, not a cut.
            try:
                plan.first = await self._read(found, plan.start, min(plan.stop - plan.start, READ_PIECE),
                                              plan.state)
            except ReadError as e:
                plan.error = e
        return plan

    def _plan_now(self, parts: list[bytes], method: str, conditions: dict[str, str | None]) -> Plan | None:
        """``_plan`` answered on the asyncio loop, with no call into trio, when it needs no
        I/O: the tree answers from its index, the size is known and, for a GET, the first
        piece of the body is in memory; ``NeedsTrio`` otherwise."""
        found = self._find_now(parts)
        if found is None or found.is_dir:
            return None if found is None else Plan(found, 200, {})
        get = method == "GET"
        if get and found.ref is not None and found.ref.kind is RefKind.RANGE:
            if not self.core.reader.settled(found.ref):
                raise NeedsTrio(found.ref)
            found.size = self._settled_size(found.ref)
        plan = self._decide(found, method, conditions)
        if get and plan.status in (200, 206) and plan.start < plan.stop:
            first = self._read_now(found, plan.start, min(plan.stop - plan.start, READ_PIECE))
            if first is None:
                raise NeedsTrio(found.ref if found.array is None else None)
            plan.first = first
        return plan

    async def _arrived(self, ref: Ref) -> bool:
        """Wait on the loop for the bytes of ``ref`` that a stretch read ahead is bringing
        (True once they are in, or the stretch is over); False at once when none is."""
        arrived = asyncio.get_running_loop().create_future()

        def call() -> None:
            if not arrived.done():
                arrived.set_result(None)

        if not self.core.reader.when_arrived(ref, call):
            return False
        await arrived
        return True

    async def _settle(self, ref: Ref) -> int:
        await self.core.reader.settle(ref)
        return self._settled_size(ref)

    def _settled_size(self, ref: Ref) -> int:
        clipped = self.core.reader.clipped(ref)
        return ref.length if clipped is None else clipped

    async def _read(self, found: Found, off: int, size: int, state: ReadState) -> bytes | memoryview:
        data = self._read_now(found, off, size)
        if data is not None:
            return data
        stats = self.core.stats
        stats.reads += 1
        if found.array is not None:
            assert self.core.decoder is not None and found.ref is not None
            data = await self.core.decoder.read(found.key, found.array, found.ref, off, size)
        else:
            assert found.ref is not None
            data = await self.core.reader.read(found.ref, off, size, state)
        stats.bytes_read += len(data)
        return data

    def _read_now(self, found: Found, off: int, size: int) -> bytes | memoryview | None:
        """The bytes when they are at hand (the synthesized ``.zmetadata``, inline bytes, a
        block in memory), with no I/O; None otherwise."""
        if found.data is not None:
            data: bytes | memoryview | None = found.data[off: off + size]
        elif found.array is not None:
            return None
        else:
            assert found.ref is not None
            data = self.core.reader.read_now(found.ref, off, size)
            if data is None:
                return None
        stats = self.core.stats
        stats.reads += 1
        stats.bytes_read += len(data)
        return data


    async def _synthesizes_zmetadata(self) -> bool:
        """Whether a ``.zmetadata`` is synthesized for a set that has none: not for a Zarr v3
        set (a ``zarr.json`` at its root) shown as stored, whose clients read no v2 consolidated
        metadata; under ``-o decode`` its v2 view's documents are consolidated."""
        tree = self.core.tree
        return self.core.view is not None or await tree.lookup(tree.root, b"zarr.json") is None

    async def _synthesized_zmetadata(self) -> bytes | None:
        """The consolidated metadata of a set that has none, made once (in a worker thread,
        key by key within ``consolidated``'s bounds), or None when the set is past them
        (then never made again: one log line)."""
        async with self._zmetadata_lock:
            if self._zmetadata is None and not self._zmetadata_refused:
                def make() -> Any:
                    pairs = self.core.metadata_pairs(METADATA_NAMES, max_keys=MAX_VALUES, max_bytes=MAX_BYTES)
                    return consolidation(pairs)

                try:
                    made = await trio.to_thread.run_sync(make)
                except ConsolidationRefused as e:
                    log.error("no consolidated metadata (.zmetadata) is served for this set: %s", e)
                    self._zmetadata_refused = True
                    return None
                for key, why in sorted(made.skipped.items()):
                    log.warning("the synthesized .zmetadata leaves out %s: %s", key, why)
                self._zmetadata = made.document
        return self._zmetadata

