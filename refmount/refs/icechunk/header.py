"""The header of every Icechunk metadata object, and its zstd-compressed payload.

An object (repo info, snapshot, manifest, transaction log) is 39 bytes of header followed by
a flatbuffer, compressed as the header says::

    0..11   magic "ICE🧊CHUNK" (UTF-8)
    12..35  the writing implementation's name, padded
    36      spec version: 1 or 2
    37      file type: 1 snapshot, 2 manifest, 3 attributes, 4 transaction log, 5 chunk, 6 repo info
    38      compression: 0 none, 1 zstd

The payload is decompressed under ``max_ratio`` and ``max_bytes`` (refs/limits.py's
ExpansionGuard): a zstd bomb is refused after at most EXPANSION_FLOOR bytes of output.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import zstandard

from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.limits import CountingReader, ExpansionGuard
from refmount.refs.model import ReferenceSetError

MAGIC = "ICE🧊CHUNK".encode()
HEADER_SIZE = 39
SPEC_VERSIONS = (1, 2)
SNAPSHOT, MANIFEST, ATTRIBUTES, TRANSACTION_LOG, CHUNK, REPO_INFO = 1, 2, 3, 4, 5, 6
FILE_TYPES = {SNAPSHOT: "snapshot", MANIFEST: "manifest", ATTRIBUTES: "attributes",
              TRANSACTION_LOG: "transaction log", CHUNK: "chunk", REPO_INFO: "repo info"}
NO_COMPRESSION, ZSTD = 0, 1


@dataclass(frozen=True)
class Header:
    implementation: str
    spec_version: int
    file_type: int
    compression: int


def parse_header(data: bytes, name: str) -> Header:
    if len(data) < HEADER_SIZE:
        raise IcechunkError(f"{name}: {len(data)} bytes, too short for an Icechunk object's "
                            f"{HEADER_SIZE}-byte header (truncated?)")
    if data[:len(MAGIC)] != MAGIC:
        raise IcechunkError(f"{name}: not an Icechunk object (no ICE🧊CHUNK magic bytes)")
    impl = data[len(MAGIC):36].rstrip(b"\0 ").decode("utf-8", "replace")
    version, ftype, compression = data[36], data[37], data[38]
    if version not in SPEC_VERSIONS:
        raise IcechunkError(f"{name}: Icechunk spec version {version}, not one this reader knows "
                            f"({', '.join(map(str, SPEC_VERSIONS))})")
    if ftype not in FILE_TYPES:
        raise IcechunkError(f"{name}: unknown Icechunk file type {ftype}")
    if compression not in (NO_COMPRESSION, ZSTD):
        raise IcechunkError(f"{name}: unknown Icechunk compression {compression}")
    return Header(impl, version, ftype, compression)


def payload(data: bytes, name: str, file_type: int, max_bytes: int,
            max_ratio: int) -> tuple[Header, bytes | bytearray]:
    """The header and the decompressed flatbuffer of the object ``data`` of type ``file_type``
    (a bytearray when it was decompressed: read, never written to)."""
    header = parse_header(data, name)
    if header.file_type != file_type:
        raise IcechunkError(f"{name}: an Icechunk {FILE_TYPES[header.file_type]} object where a "
                            f"{FILE_TYPES[file_type]} was expected")
    body = memoryview(data)[HEADER_SIZE:]
    if header.compression == NO_COMPRESSION:
        if max_bytes and len(body) > max_bytes:
            raise IcechunkError(f"{name}: more than {max_bytes:,} bytes")
        return header, bytes(body)
    return header, decompress(body, name, max_bytes, max_ratio)


def decompress(body: memoryview | bytes, name: str, max_bytes: int, max_ratio: int) -> bytearray:
    """The zstd frames ``body``, complete (the decompressor's stream reader yields what it
    has from a truncated frame without complaint: the frames' block headers are walked first)."""
    check_frames(body, name)
    counter = CountingReader(io.BytesIO(body))
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(counter, read_across_frames=True)
        guard = ExpansionGuard(reader, counter, name, max_ratio, reader.close, max_bytes)  # type: ignore[arg-type]
        out = bytearray()  # grown in place: no list of pieces joined into a second copy
        with guard:
            while piece := guard.read(ExpansionGuard.PIECE):
                out += piece
    except ReferenceSetError as e:
        raise IcechunkError(str(e)) from None
    except (zstandard.ZstdError, ValueError) as e:
        raise IcechunkError(f"{name}: corrupt zstd payload ({e})") from None
    if not out:
        raise IcechunkError(f"{name}: empty zstd payload (truncated?)")
    return out


ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50


def check_frames(body: memoryview | bytes, name: str) -> None:
    """Refuse zstd data whose last frame is cut short: walk each frame's header and block
    headers (3 bytes each; a block holds at most 128 KiB of output, so the walk costs little
    next to decompressing) to the last block and the checksum."""
    view = memoryview(body)
    n = len(view)
    pos = 0
    if n == 0:
        raise IcechunkError(f"{name}: empty zstd payload (truncated?)")
    while pos < n:
        if pos + 4 > n:
            raise IcechunkError(f"{name}: zstd payload truncated in a frame's magic number")
        magic = int.from_bytes(view[pos:pos + 4], "little")
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
            if pos + 8 > n:
                raise IcechunkError(f"{name}: zstd payload truncated in a skippable frame")
            pos += 8 + int.from_bytes(view[pos + 4:pos + 8], "little")
            if pos > n:
                raise IcechunkError(f"{name}: zstd payload truncated in a skippable frame")
            continue
        if magic != ZSTD_MAGIC:
            raise IcechunkError(f"{name}: not zstd data (bad frame magic at byte {pos})")
        if pos + 5 > n:
            raise IcechunkError(f"{name}: zstd payload truncated in a frame header")
        fhd = view[pos + 4]
        fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
        pos += 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag] + (1 if single else 0, 2, 4, 8)[fcs_flag]
        while True:
            if pos + 3 > n:
                raise IcechunkError(f"{name}: zstd payload truncated (a block header is missing)")
            h = int.from_bytes(view[pos:pos + 3], "little")
            last, btype, size = h & 1, (h >> 1) & 3, h >> 3
            if btype == 3:
                raise IcechunkError(f"{name}: corrupt zstd payload (reserved block type)")
            pos += 3 + (1 if btype == 1 else size)
            if pos > n:
                raise IcechunkError(f"{name}: zstd payload truncated inside a block")
            if last:
                break
        pos += 4 if checksum else 0
        if pos > n:
            raise IcechunkError(f"{name}: zstd payload truncated in a frame checksum")
