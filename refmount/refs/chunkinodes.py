"""The inode numbers of chunk keys computed from an array's grid, shared by the trees that
compute them (a Parquet set's ``ChunkTree``, an Icechunk snapshot's ``IcechunkTree``).

Chunk inodes live in their own range (bit 62), above the metadata keys' ``KeyTree`` numbers
and below the decoded view's synthesized ones (bit 63): array id (16 bits) | level (6 bits) |
p (40 bits). Level 0 is a chunk file (p: its number in C order over the grid); level L >= 1 a
chunk directory of ``/``-separated keys (p: the flattened index of the L coordinates it fixes).
Readdir tokens above ``CHUNK_TOKEN`` enumerate an array directory's chunks.
"""

from __future__ import annotations

CHUNK = 1 << 62
P_BITS, LEVEL_BITS, AID_BITS = 40, 6, 16
P_MASK = (1 << P_BITS) - 1
CHUNK_TOKEN = 1 << 41


def chunk_ino(aid: int, level: int, p: int) -> int:
    return CHUNK | (aid << (P_BITS + LEVEL_BITS)) | (level << P_BITS) | p


def split_ino(ino: int) -> tuple[int, int, int]:
    """(array id, level, p) of a chunk inode."""
    return ((ino >> (P_BITS + LEVEL_BITS)) & ((1 << AID_BITS) - 1),
            (ino >> P_BITS) & ((1 << LEVEL_BITS) - 1), ino & P_MASK)
