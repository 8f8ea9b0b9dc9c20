"""A zarr chunk's codecs run within bounds: the pure decoding of one chunk for ``-o decode``.

A chunk is decoded as zarr decodes it -- the compressor, then the filters in reverse order,
the result viewed as the array's dtype and flattened in the array's order -- then made
little-endian. What decoding may produce is bounded by what the array's ``.zarray`` declares:

* every step has an output bound (``ChunkCodecs.limits``): the last filter's output is the
  chunk's decoded size (``prod(chunks) * itemsize``), and each step before it at most the
  encoded size of the step after (:func:`encoded_bound`, exact for size-changing filters
  such as ``astype``, a compressor's worst-case expansion for a compressor used as a filter);
* decompressors stream and stop one byte past their bound (zlib, gzip, bz2, lzma, zstd:
  :func:`stream_decompress`); blosc and lz4 declare their decompressed size in a header,
  checked before anything is allocated;
* the other built-in filters produce a size known from their input (:func:`decoded_size`),
  checked before they run.

Output past a bound is a :class:`BoundError` naming the step, the size and the bound (EIO
for that read); nothing larger than the bound is ever held.

Only the codecs in :data:`ALLOWED` (numcodecs' own, well-fuzzed built-ins) are run in the
serving process; a chain with any other codec (kerchunk's ``grib``, ``FITSAscii``,
imagecodecs ...) runs in a codec worker process (``decode/codecworker.py``), where the same
bounds apply to the built-in steps and the process's resource limits to the rest.
"""

from __future__ import annotations

import bz2
import json
import lzma
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.format import descr_to_dtype, dtype_to_descr

# numcodecs' built-in codecs that run inside the serving process (a codec counts only when
# its class is numcodecs' own: a third-party codec registered under one of these ids runs in
# the codec worker).
STREAMED = frozenset({"zlib", "gzip", "bz2", "lzma", "zstd"})
HEADERED = frozenset({"blosc", "lz4"})
CHECKSUMS = frozenset({"crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3"})
SAME_SIZE = frozenset({"shuffle", "bitround"})
RETYPED = frozenset({"delta", "fixedscaleoffset", "quantize", "astype"})
ALLOWED = STREAMED | HEADERED | CHECKSUMS | SAME_SIZE | RETYPED | {"packbits", "base64"}

PIECE = 1 << 20  # decompressed bytes produced per step of a streaming decompressor


class BoundError(ValueError):
    """A step's output would exceed its bound."""


def allowed(codec: Any) -> bool:
    """True for a numcodecs built-in of the allow-list (run in process)."""
    return (getattr(codec, "codec_id", None) in ALLOWED
            and type(codec).__module__.split(".")[0] == "numcodecs")


def _itemsize(dt: Any) -> int:
    return max(np.dtype(dt).itemsize, 1)


def _retype(codec: Any) -> tuple[int, int]:
    """(decoded itemsize, encoded itemsize) of a size-changing filter."""
    if codec.codec_id == "astype":
        return _itemsize(codec.decode_dtype), _itemsize(codec.encode_dtype)
    return _itemsize(codec.dtype), _itemsize(codec.astype)


def encoded_bound(codec: Any, n: int) -> int | None:
    """The most bytes ``codec`` encodes ``n`` decoded bytes to (None: not known)."""
    cid = codec.codec_id
    if not allowed(codec):
        return None
    if cid in STREAMED or cid in HEADERED:
        return n + n // 8 + 1024  # worst-case expansion of incompressible data, generously
    if cid in SAME_SIZE:
        return n
    if cid in CHECKSUMS:
        return n + 8
    if cid in RETYPED:
        dec, enc = _retype(codec)
        return -(-n // dec) * enc
    if cid == "packbits":
        return n // 8 + 2
    if cid == "base64":
        return -(-n // 3) * 4
    return None


def decoded_size(codec: Any, m: int) -> int:
    """The size of what a non-streaming allow-listed ``codec`` decodes ``m`` bytes to (at
    most), known before it runs."""
    cid = codec.codec_id
    if cid in SAME_SIZE:
        return m
    if cid in CHECKSUMS:  # a 4-byte checksum, checked and stripped
        return max(m - 4, 0)
    if cid in RETYPED:
        dec, enc = _retype(codec)
        return (m // enc) * dec
    if cid == "packbits":
        return max(m - 1, 0) * 8
    if cid == "base64":
        return m * 3 // 4
    raise AssertionError(cid)


def _too_big(what: str, limit: int) -> BoundError:
    return BoundError(f"{what}: decodes to more than {limit:,} bytes, the most this chunk's "
                      f"metadata allows")


def stream_decompress(cid: str, codec: Any, buf: Any, limit: int) -> bytes:
    """Decompress ``buf`` as ``codec`` does (``cid``: zlib, gzip, bz2, lzma, zstd), producing
    at most ``limit`` bytes: BoundError as soon as the output goes past it. A stream that
    comes out in one piece is returned without a copy."""
    data = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
    pieces: list[bytes] = []
    got = 0

    def keep(piece: bytes) -> None:
        nonlocal got
        got += len(piece)
        if got > limit:
            raise _too_big(cid, limit)
        if piece:
            pieces.append(piece)

    def result() -> bytes:
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    if cid == "zstd":
        import zstandard

        size = zstandard.frame_content_size(bytes(data[:18])) if len(data) >= 4 else -1
        if size > limit:
            raise _too_big(f"zstd (frame header says {size:,} bytes)", limit)
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        while piece := reader.read(min(PIECE, limit + 1 - got)):
            keep(piece)
        return result()

    def make() -> Any:
        if cid == "zlib":
            return zlib.decompressobj()
        if cid == "gzip":
            return zlib.decompressobj(31)
        if cid == "bz2":
            return bz2.BZ2Decompressor()
        return lzma.LZMADecompressor(format=codec.format,
                                     filters=codec.filters if codec.format == lzma.FORMAT_RAW else None)

    rest: Any = data
    while True:  # one stream (gzip, bz2 and xz read on across concatenated streams)
        d = make()
        while True:
            piece = d.decompress(rest, limit + 1 - got)
            rest = d.unconsumed_tail if cid in ("zlib", "gzip") else b""
            keep(piece)
            if d.eof:
                break
            if not piece and not rest and (cid in ("zlib", "gzip") or d.needs_input):
                raise ValueError("incomplete or truncated stream")
        rest = d.unused_data
        if cid == "zlib" or not rest or (cid == "gzip" and not rest.strip(b"\0")):
            return result()  # zlib ignores what follows its stream, as zlib.decompress does
        if cid == "lzma" and codec.format not in (lzma.FORMAT_XZ, lzma.FORMAT_AUTO):
            return result()


def header_size(cid: str, buf: Any) -> int:
    """The decompressed size a blosc or lz4 buffer declares in its header."""
    data = memoryview(buf).cast("B")
    if cid == "blosc":
        if len(data) < 16:
            raise ValueError("blosc: buffer shorter than its 16-byte header")
        nbytes, _blocksize, cbytes = struct.unpack_from("<III", data, 4)
        if cbytes > len(data):
            raise ValueError(f"blosc: header says {cbytes:,} compressed bytes, {len(data):,} given")
        return nbytes
    if len(data) < 4:
        raise ValueError("lz4: buffer shorter than its 4-byte size header")
    return struct.unpack_from("<I", data, 0)[0]


def decode_step(codec: Any, buf: Any, limit: int | None) -> Any:
    """One codec's decoding of ``buf``, its output at most ``limit`` bytes (None: a codec
    outside the allow-list, bounded by the process it runs in)."""
    cid = codec.codec_id
    if limit is None or not allowed(codec):
        out = codec.decode(buf)
    elif cid in STREAMED:
        return stream_decompress(cid, codec, buf, limit)
    else:
        m = memoryview(buf).nbytes if not isinstance(buf, np.ndarray) else buf.nbytes
        if cid in HEADERED:
            size = header_size(cid, buf)
            if size > limit:
                raise _too_big(f"{cid} (header says {size:,} bytes)", limit)
        elif decoded_size(codec, m) > limit:
            raise _too_big(f"{cid} ({m:,} bytes in)", limit)
        out = codec.decode(buf)
    if limit is not None and _nbytes(out) > limit:
        raise _too_big(cid, limit)
    return out


def _nbytes(buf: Any) -> int:
    return buf.nbytes if hasattr(buf, "nbytes") else memoryview(buf).nbytes


@dataclass
class ChunkCodecs:
    """One array's decoding of a chunk: codecs, dtype, decoded size and the bound of each
    step (in decoding order: the compressor, then the filters reversed)."""

    compressor: Any
    filters: list[Any]  # in metadata order (decoded reversed)
    dtype: np.dtype  # as stored
    nbytes: int  # decoded chunk size
    configs: list[dict[str, Any]] = field(default_factory=list)  # compressor's (if any), filters'
    ceiling: int | None = None  # the bound of a step after a codec whose sizes are not known
    limits: list[int | None] = field(init=False)
    _spec: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.out_dtype = self.dtype.newbyteorder("<")
        sizes: list[int | None] = [self.nbytes]
        for f in self.filters:
            prev = sizes[-1]
            bound = None if prev is None else encoded_bound(f, prev)
            sizes.append(self.ceiling if bound is None else bound)
        # step i of decoding outputs: the compressor -> sizes[-1]; filter j -> sizes[j]
        steps = [sizes[-1]] if self.compressor is not None else []
        self.limits = steps + [sizes[j] for j in reversed(range(len(self.filters)))]

    @property
    def steps(self) -> list[Any]:
        return ([self.compressor] if self.compressor is not None else []) + list(reversed(self.filters))

    @property
    def isolated(self) -> bool:
        """True when a codec outside the allow-list takes part: decoded in a worker process."""
        return not all(allowed(c) for c in self.steps)

    @property
    def peak(self) -> int:
        """The largest bound of a step (known ones)."""
        return max([n for n in self.limits if n is not None] + [self.nbytes])

    def decode(self, stored: Any) -> memoryview:
        """The decoded bytes of one chunk (numcodecs' zlib, zstd, blosc and lz4 release the
        GIL). Raises ValueError naming the step that failed or went past its bound."""
        from numcodecs.compat import ensure_ndarray_like

        stage = "stored bytes"
        try:
            buf: Any = stored
            for codec, limit in zip(self.steps, self.limits, strict=True):
                stage = codec.codec_id
                buf = decode_step(codec, buf, limit)
            stage = "view as " + self.dtype.str
            arr = ensure_ndarray_like(buf)
            if arr.dtype.hasobject:
                raise ValueError("decoded to objects")
            arr = arr.view(self.dtype).reshape(-1, order="A")
        except BoundError:
            raise
        except Exception as e:
            raise ValueError(f"{stage}: {type(e).__name__}: {e}") from None
        if arr.nbytes != self.nbytes:
            ids = "+".join(c.codec_id for c in self.steps) or "none"
            raise ValueError(f"{ids}: decoded to {arr.nbytes} bytes, expected {self.nbytes}")
        if arr.dtype != self.out_dtype:
            arr = arr.astype(self.out_dtype)
        return memoryview(np.ascontiguousarray(arr).view(np.uint8)).cast("B")

    # ---- as sent to a codec worker ------------------------------------------------------------
    def spec(self) -> bytes:
        """What a codec worker needs to build this decoding (JSON; computed once)."""
        if self._spec is None:
            self._spec = self._make_spec()
        return self._spec

    def _make_spec(self) -> bytes:
        return json.dumps({"configs": self.configs, "compressor": self.compressor is not None,
                           "dtype": dtype_to_descr(self.dtype), "nbytes": self.nbytes,
                           "ceiling": self.ceiling},
                          sort_keys=True).encode()

    @classmethod
    def from_spec(cls, spec: bytes) -> ChunkCodecs:
        import numcodecs

        obj = json.loads(spec)
        codecs = [numcodecs.get_codec(dict(c)) for c in obj["configs"]]
        comp = codecs[0] if obj["compressor"] else None
        filters = codecs[1:] if obj["compressor"] else codecs
        nbytes = int(obj["nbytes"])
        if not 0 <= nbytes <= 2**40:
            raise ValueError("bad chunk size")
        ceiling = obj.get("ceiling")
        return cls(comp, filters, descr_to_dtype(_tuples(obj["dtype"])), nbytes, obj["configs"],
                   None if ceiling is None else int(ceiling))


def _tuples(descr: Any) -> Any:
    """A dtype description back from JSON (its tuples came back as lists)."""
    if isinstance(descr, list):
        return [tuple(_tuples(x) if isinstance(x, list) and i == 1 else x for i, x in enumerate(f))
                for f in descr]
    return descr
