"""Decompression bombs for the decoded view's bounds, made cheaply: streams of zeros compressed
piece by piece, and zstd frames of RLE blocks (4 bytes for every 128 KiB of output)."""

from __future__ import annotations

import bz2
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
