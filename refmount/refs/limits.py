"""Bounds on what reading a reference set may cost, whatever the input.

Three guards, each cheap next to the parsing it protects:

* :class:`Limits` — the configured bounds (mount options ``max_inline``, ``max_ratio``,
  ``max_key_depth``, ``max_key_length``, ``max_nesting``, ``max_keys``, ``max_generated``,
  ``max_template_seconds``, ``max_record``, ``max_source``, ``max_metadata``).
* :class:`ExpansionGuard` — wraps SOURCE's stream and refuses it as soon as it has expanded
  more than ``max_ratio`` times the bytes taken from the storage so far (a gzip, bz2, xz or
  zstd bomb, by name or as an HTTP ``Content-Encoding``, is stopped while it streams), or
  has yielded more than ``max_source`` bytes in all.
* :class:`JsonReader` — hands a JSON stream to ijson in chunks chosen here, and scans each
  chunk (numpy, no Python loop per byte) for the nesting depth and the length of the token
  being read.

Why the chunks are chosen here: yajl, ijson's C parser, keeps a token that spans two input
buffers in a side buffer and lexes that buffer *from its start* again with every further
buffer. A 128 MiB string read in ijson's fixed 64 KiB buffers is lexed 2048 times over —
quadratic (35 s to mount). Doubling the chunk while a token goes on makes the total work at
most twice the token's length, and the chunk never exceeds the token yajl holds anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from refmount.refs.model import ReferenceSetError

MAX_KEY_DEPTH = 4095  # directory inode numbers keep the depth in 12 bits (see refs/tree.py)
CHUNK = 64 << 10  # the parser's chunk between long tokens
EXPANSION_FLOOR = 64 << 20  # decompressed bytes always allowed, whatever the ratio
# A JSON string of n characters decodes to at least n / 6 bytes ("\u0041" is one byte), so a
# token longer than this cannot become an inline value within max_inline: refuse it unread.
ESCAPE_RATIO = 6


@dataclass(frozen=True)
class Limits:
    max_inline: int = 64 << 20  # bytes of one inline value (decoded)
    max_ratio: int = 200  # decompressed / compressed bytes of SOURCE (0: no limit)
    max_key_depth: int = MAX_KEY_DEPTH  # "/"-separated components of a key
    max_key_length: int = 64 << 10  # bytes of a key
    max_nesting: int = 256  # nesting of JSON arrays and objects in SOURCE
    max_keys: int = 20_000_000  # keys of a JSON set, gen products included
    max_generated: int = 512 << 20  # bytes of keys and distinct URLs of a Version 1 set
    max_template_seconds: float = 10.0  # CPU seconds of all template renderings of a set
    max_record: int = 64 << 20  # bytes a Parquet record file may decode to
    max_source: int = 2 << 30  # bytes of SOURCE read, after any decompression (0: no limit)
    # bytes of metadata documents a repository's snapshot makes (every node's zarr.json), each
    # use of a stored vector counted: what is materialised, not what is stored
    max_metadata: int = 256 << 20
    # seconds a remote SOURCE may take to answer one open or read (not part of what the
    # index is built under: excluded from comparison and repr)
    source_timeout: float | None = field(default=None, compare=False, repr=False)
    # a catalogue's set in a shared mount: the directories its local SOURCE files are opened
    # beneath, no symlink followed (refs/source.open_source); None: opened as named
    source_roots: tuple[str, ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(cls, cfg: Any) -> Limits:
        return cls(cfg.max_inline, cfg.max_ratio, cfg.max_key_depth, cfg.max_key_length,
                   cfg.max_nesting, max_keys=cfg.max_keys, max_generated=cfg.max_generated,
                   max_template_seconds=cfg.max_template_seconds, max_record=cfg.max_record,
                   max_source=cfg.max_source, max_metadata=cfg.max_metadata,
                   source_timeout=cfg.timeout,
                   source_roots=None if (roots := cfg.object_roots()) is None else tuple(roots))

    @property
    def max_token(self) -> int:
        """Longest JSON token (string or number text) read before it is refused."""
        return ESCAPE_RATIO * self.max_inline + (1 << 20)


DEFAULT_LIMITS = Limits()


def size_text(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


# ---- decompression ---------------------------------------------------------------------------


class CountingReader:
    """The compressed stream under a decompressor, counting the bytes taken from it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return data

    def readinto(self, buf: Any) -> int:
        n = self.raw.readinto(buf)  # type: ignore[attr-defined]
        self.count += n or 0
        return n

    def __getattr__(self, name: str) -> Any:  # seek, tell, seekable, closed... as the raw file
        return getattr(self.raw, name)


class ExpansionGuard:
    """A SOURCE stream that may expand at most ``max_ratio`` times the bytes taken from the
    storage so far (beyond EXPANSION_FLOOR: ``counter`` counts them under every decoder, the
    name's compression and an HTTP ``Content-Encoding`` alike) and yield at most ``max_bytes``
    in all (0: no limit). Reads are bounded pieces, so a bomb is refused after a few
    milliseconds of decompression, not after the whole of it. A plain stream is guarded with
    ``max_ratio=0``: only its total counts."""

    PIECE = 1 << 20

    def __init__(self, stream: IO[bytes], counter: CountingReader, name: str, max_ratio: int,
                 close: Callable[[], None], max_bytes: int = 0) -> None:
        self._stream = stream
        self._counter = counter
        self._name = name
        self._max_ratio = max_ratio
        self._max_bytes = max_bytes
        self._close = close
        self.out = 0

    def read(self, n: int = -1) -> bytes:
        """Up to n bytes (all when n < 0), decompressed and checked a PIECE at a time."""
        parts = []
        left = n if n is not None and n >= 0 else -1
        while left:
            piece = self._stream.read(self.PIECE if left < 0 else min(left, self.PIECE))
            if not piece:
                break
            self._count(len(piece))
            parts.append(piece)
            left = left - len(piece) if left > 0 else left
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _count(self, size: int) -> None:
        self.out += size
        if self._max_bytes and self.out > self._max_bytes:
            raise ReferenceSetError(
                f"{self._name}: more than {self._max_bytes:,} bytes to parse (limit "
                f"max_source={size_text(self._max_bytes)}; a set this large is better served "
                "as Parquet references)")
        if self._max_ratio and self.out > EXPANSION_FLOOR and (
            self.out > self._max_ratio * max(self._counter.count, 1)
        ):
            raise ReferenceSetError(
                f"{self._name}: decompresses to more than {self._max_ratio} times its compressed "
                f"size ({self.out:,} bytes from {self._counter.count:,}; limit max_ratio="
                f"{self._max_ratio})")

    def close(self) -> None:
        self._close()

    def __enter__(self) -> ExpansionGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- JSON ----------------------------------------------------------------------------------------


class _Scanner:
    """Nesting depth and current-token length of a JSON byte stream, chunk by chunk.

    State carried between chunks: inside a string or not, the run of backslashes at the end
    of the last chunk (an escaped quote may straddle two chunks), the depth, and where the
    current token began. Only positions of quotes and brackets are looked at one by one."""

    def __init__(self, name: str, limits: Limits, count_values: bool = False) -> None:
        self.name = name
        self.limits = limits
        self.count_values = count_values
        self.values = 0  # with count_values: '[', '{' and ',' outside strings (bounds the values)
        self.in_string = False
        self.backslashes = 0
        self.depth = 0
        self.offset = 0  # bytes scanned
        self.run_start = 0  # offset after the last chunk that had a token boundary
        self.boundary_chunk = b""  # that chunk (a reference, not a copy): where keys are looked for

    def scan(self, data: bytes) -> bool:
        """Scan one chunk; True when it held a token boundary (the current token ended)."""
        import numpy as np  # here, not at the top: catalogues and the CLI's checks load limits.py

        n = len(data)
        a = np.frombuffer(data, np.uint8)
        quotes = np.flatnonzero(a == 34)
        if quotes.size and (self.backslashes or b"\\" in data):
            # A quote after an odd run of backslashes is escaped.
            idx = np.arange(n)
            last_plain = np.maximum.accumulate(np.where(a == 92, -1, idx))
            before = np.where(quotes > 0, last_plain[np.maximum(quotes - 1, 0)], -1)
            run = quotes - 1 - before
            run = np.where(before < 0, run + self.backslashes, run)
            quotes = quotes[run % 2 == 0]
        start_in_string = self.in_string
        boundary = bool(quotes.size)
        folded = a | 32  # "[" and "{" -> 123, "]" and "}" -> 125; no other byte maps there
        brackets = np.flatnonzero((folded == 123) | (folded == 125))
        if brackets.size:
            inside = (np.searchsorted(quotes, brackets) + start_in_string) & 1
            brackets = brackets[inside == 0]
        if self.count_values:
            commas = np.flatnonzero(a == 44)
            outside = ((np.searchsorted(quotes, commas) + start_in_string) & 1) == 0
            self.values += int(outside.sum()) + int((folded[brackets] == 123).sum())
        if brackets.size:
            boundary = True
            steps = np.where(folded[brackets] == 123, 1, -1)
            depths = np.cumsum(steps) + self.depth
            deepest = int(depths.max())
            if deepest > self.limits.max_nesting:
                pos = int(brackets[int(np.argmax(depths > self.limits.max_nesting))])
                key = _last_key(data, pos) or _last_key(self.boundary_chunk, len(self.boundary_chunk))
                raise ReferenceSetError(
                    f"{self.name}: JSON nested deeper than {self.limits.max_nesting} levels at "
                    f"byte {self.offset + pos:,}{_near(key)} (limit max_nesting={self.limits.max_nesting})")
            self.depth = int(depths[-1])
        self.in_string = bool((start_in_string + quotes.size) & 1)
        if not boundary and not start_in_string and (b"," in data or b":" in data):
            boundary = True  # outside strings: between numbers, literals or whitespace
        trailing = n - len(data.rstrip(b"\\"))
        self.backslashes = self.backslashes + n if trailing == n else trailing
        self.offset += n
        if boundary:
            self.run_start = self.offset
            self.boundary_chunk = data
        elif self.offset - self.run_start > self.limits.max_token:
            what = "string" if self.in_string else "token"
            key = _last_key(self.boundary_chunk, len(self.boundary_chunk))
            raise ReferenceSetError(
                f"{self.name}: a JSON {what} longer than {self.limits.max_token:,} bytes from "
                f"byte {self.run_start:,}{_near(key)}: it cannot be an inline value within "
                f"max_inline={size_text(self.limits.max_inline)}")
        return boundary


def _last_key(buf: bytes, end: int) -> str | None:
    """The last object key (``"name":``) that ends before ``end`` in ``buf``, if one is there:
    for naming where a streamed refusal happened. Best effort: the key of the value being read
    when the refusal's chunk holds it, else the last key of the chunk that started it."""

    def escaped(i: int) -> bool:  # a quote after an odd run of backslashes
        return (i - len(buf[max(i - 256, 0) : i].rstrip(b"\\")) - max(i - 256, 0)) % 2 == 1

    colon = buf.rfind(b'":', 0, end)
    while colon >= 0 and escaped(colon):
        colon = buf.rfind(b'":', 0, colon)
    if colon < 0:
        return None
    start = colon
    while (start := buf.rfind(b'"', 0, start)) >= 0 and colon - start <= 256:
        if not escaped(start):
            return buf[start + 1 : colon].decode("utf-8", "replace")
    return None


def _near(key: str | None) -> str:
    return "" if key is None else f", in the value of key {key!r}"


def check_nesting(data: bytes, name: str, limits: Limits) -> None:
    """Refuse a JSON document (whole in memory, e.g. a node's ``zarr.json``) nested deeper
    than ``max_nesting``: ReferenceSetError naming ``name``, the byte and the key, before a
    recursive parser (json.loads) meets it. Scanned a CHUNK at a time, and only when it holds
    more brackets than the bound (an ordinary document is looked at by two ``count`` calls)."""
    if data.count(b"[") + data.count(b"{") <= limits.max_nesting:
        return
    scanner = _Scanner(name, limits)
    view = memoryview(data)
    for i in range(0, len(data), CHUNK):
        scanner.scan(bytes(view[i:i + CHUNK]))


class JsonReader:
    """A JSON stream as ijson reads it (``read(n)``), in chunks chosen by :class:`_Scanner`'s
    verdict rather than by ``n``: CHUNK bytes, doubled while one token goes on (see the
    module's docstring). ijson's parsers take any chunk size from ``read``; ``read(0)`` (its
    probe for text streams) reads nothing."""

    def __init__(self, stream: IO[bytes], name: str, limits: Limits, count_values: bool = False) -> None:
        self._stream = stream
        self._scanner = _Scanner(name, limits, count_values)
        self._size = CHUNK

    def read(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        data = self._stream.read(self._size)
        if data and len(data) < self._size:  # a short read (a pipe, a socket): fill the chunk
            parts = [data]
            got = len(data)
            while got < self._size and (more := self._stream.read(self._size - got)):
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        if data:
            boundary = self._scanner.scan(data)
            self._size = CHUNK if boundary else min(self._size * 2, 1 << 30)
        return data

    @property
    def values(self) -> int:
        """With ``count_values``: an upper bound, less one, on the JSON values read so far
        (each value but the first opens a container or follows a comma)."""
        return self._scanner.values
