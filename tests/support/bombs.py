"""Decompression bombs for the decoded view's bounds, made cheaply: streams of zeros compressed
piece by piece, and zstd frames of RLE blocks (4 bytes for every 128 KiB of output)."""

from __future__ import annotations

import bz2
import json
import lzma
import struct
import zlib

import numcodecs

PIECE = 16 << 20


def zstd_rle(size: int) -> bytes:
    """A zstd frame without a content size whose blocks each repeat one byte 128 KiB times
    (``size`` a multiple of 128 KiB): 4 bytes of frame per 128 KiB of output."""
    block = 128 << 10
    assert size % block == 0 and size
    n = size // block
    head = struct.pack("<I", 0xFD2FB528) + bytes([0x00, 0x38])  # no FCS; window 128 KiB
    rle = (block << 3) | (1 << 1)  # block type 1 (RLE), not last
    body = (struct.pack("<I", rle)[:3] + b"\0") * (n - 1)
    return head + body + struct.pack("<I", rle | 1)[:3] + b"\0"


def deflate(size: int, wbits: int = 15) -> bytes:
    """``size`` zero bytes (a multiple of 16 MiB, or less) as one zlib (wbits 15) or gzip (31)
    stream. After a full flush the compressor's state is the same for every piece of zeros,
    so one piece's output is repeated; the trailer is computed for the whole."""
    zeros = bytes(min(size, PIECE))
    n = max(size // PIECE, 1)
    assert n * len(zeros) == size
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    first = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) if n > 1 else b""
    end = c.flush()  # an empty last block, then the trailer (for 2 pieces: replaced)
    check = 1 if wbits == 15 else 0
    for _ in range(n):
        check = zlib.adler32(zeros, check) if wbits == 15 else zlib.crc32(zeros, check)
    trailer = (struct.pack(">I", check) if wbits == 15
               else struct.pack("<II", check, size & 0xFFFFFFFF))
    return first + again * (n - 1) + end[: -len(trailer)] + trailer


def other(codec_id: str, size: int) -> bytes:
    """``size`` zero bytes compressed by bz2 or lzma (xz), piece by piece."""
    c = bz2.BZ2Compressor(1) if codec_id == "bz2" else lzma.LZMACompressor(preset=0)
    zeros = bytes(min(size, PIECE))
    return b"".join(c.compress(zeros[: min(PIECE, size - done)]) for done in range(0, size, PIECE)
                    ) + c.flush()


def bomb(codec_id: str, size: int) -> bytes:
    """A chunk of ``codec_id`` (zlib, gzip, bz2, lzma, zstd, blosc, lz4) that decodes to
    ``size`` bytes; blosc and lz4 say so in their header (their bytes are a small buffer's
    with the size patched)."""
    if codec_id == "zstd":
        return zstd_rle(size)
    if codec_id in ("zlib", "gzip"):
        return deflate(size, 15 if codec_id == "zlib" else 31)
    if codec_id in ("bz2", "lzma"):
        return other(codec_id, size)
    small = bytearray(numcodecs.get_codec({"id": codec_id}).encode(bytes(4096)))
    if codec_id == "blosc":
        struct.pack_into("<I", small, 4, size)
    else:
        struct.pack_into("<I", small, 0, size)
    return bytes(small)


# ---- sets just under and just over a bound -----------------------------------------------------


def json_values(data: bytes) -> int:
    """The JSON values refmount counts in a metadata document (one, plus every ``{``, ``[``
    and ``,``): core/consolidated.py and decode/metadatabound.py count them so."""
    return 1 + data.count(b"{") + data.count(b"[") + data.count(b",")


def list_of_values(n: int) -> bytes:
    """``{"v":[[0,0,...]]}`` counted as ``n`` values (n >= 4): a JSON document of about 2n
    bytes, made without a Python loop per value."""
    assert n >= 4
    body = b"0," * (n - 4) + b"0"
    doc = b'{"v":[[' + body + b"]]}"
    assert json_values(doc) == n
    return doc


def zarray_doc(compressor: str | None = "zlib") -> bytes:
    meta = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<f4",
            "compressor": None if compressor is None else {"id": compressor}, "filters": None,
            "fill_value": None, "order": "C"}
    return json.dumps(meta).encode()


def metadata_with_values(total: int, per_doc: int = 500_000) -> dict[str, bytes]:
    """Decoded arrays ``a0``, ``a1``, ... each with a ``.zarray`` and a ``.zattrs``, whose
    metadata keys and documents come to exactly ``total`` values as the decoded view counts
    them (one per key, and each document's): every ``.zattrs`` at most ``per_doc`` values
    (under the 1 MiB a document is parsed up to), the last one fills the count."""
    zarray = zarray_doc()
    keys: dict[str, bytes] = {}
    left = total
    i = 0
    while True:
        fixed = 2 + json_values(zarray)  # the two keys, the .zarray
        room = left - fixed
        assert room >= 4, "no room for a last .zattrs"
        n = min(room, per_doc)
        if room - n < 4 + fixed and room != n:  # the remainder would not make an array
            n = room - (4 + fixed) if room - (4 + fixed) >= 4 else room
        keys[f"a{i}/.zarray"] = zarray
        keys[f"a{i}/.zattrs"] = list_of_values(n)
        left -= fixed + n
        i += 1
        if left == 0:
            return keys


def metadata_of_bytes(total: int, per_doc: int = 1_000_000) -> dict[str, bytes]:
    """Decoded arrays whose metadata, as the decoded view counts it (decode/metadatabound.py:
    keys' names and documents read, rewritten documents kept), comes to exactly ``total`` bytes
    on the side that reaches it first: ``.zattrs`` of one long string each (few JSON values),
    the last one's string sized from a first count."""
    from refmount.decode.metadatabound import MetadataBudget
    from refmount.decode.view import DecodedView

    zarray = zarray_doc()

    def make(last: int) -> dict[str, bytes]:
        keys: dict[str, bytes] = {}
        n = total // per_doc
        for i in range(n + 1):
            keys[f"a{i:03d}/.zarray"] = zarray
            keys[f"a{i:03d}/.zattrs"] = json.dumps({"note": "x" * (per_doc if i < n else last)}).encode()
        return keys

    def counted(keys: dict[str, bytes]) -> int:
        budget = MetadataBudget(max_bytes=1 << 40, max_values=1 << 40)
        for key in keys:
            budget.name(key)
        view = DecodedView(keys, budget=budget)
        assert view.refused is None
        return max(budget.read, budget.written)

    first = 1000
    last = first + total - counted(make(first))  # each character of the string: one byte more,
    assert 0 <= last <= per_doc  # read and written alike (ASCII, no escapes)
    return make(last)
