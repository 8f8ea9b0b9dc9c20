"""The body of a range response (``refmount.targets.httpread.read_bounded``): read whole, or handed to a
sink piece by piece as it arrives, never past the range asked for."""

from __future__ import annotations

import asyncio

import pytest

from refmount.targets.httpread import read_bounded
from refmount.targets.rangeanswers import ShortRead


class Body:
    """aiohttp's ``response.content`` for a body arriving in ``pieces``."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    async def read(self, n: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > n:
            piece, rest = piece[:n], piece[n:]
            self.pieces.insert(0, rest)
        return piece


class Response:
    def __init__(self, pieces: list[bytes], content_length: int | None = None) -> None:
        self.content = Body(pieces)
        self.content_length = content_length


def test_the_body_is_joined_without_a_sink() -> None:
    assert asyncio.run(read_bounded(Response([b"abc", b"def"]), 6)) == b"abcdef"


def test_with_a_sink_each_piece_goes_there_as_it_arrives_and_the_count_is_returned() -> None:
    got: list[tuple[int, bytes]] = []
    n = asyncio.run(read_bounded(Response([b"abc", b"de", b"f"]), 6, lambda at, p: got.append((at, p))))
    assert n == 6
    assert got == [(0, b"abc"), (3, b"de"), (5, b"f")]


def test_a_body_longer_than_the_range_is_refused_and_the_sink_never_gets_more() -> None:
    got: list[tuple[int, bytes]] = []
    with pytest.raises(ShortRead):
        asyncio.run(read_bounded(Response([b"abcd", b"efgh"]), 6, lambda at, p: got.append((at, p))))
    assert b"".join(p for _, p in got) == b"abcdef"  # the range's bytes, not one more
    with pytest.raises(ShortRead):  # a Content-Length that says so: before any byte
        asyncio.run(read_bounded(Response([b"abcdefgh"], content_length=8), 6,
                                 lambda at, p: got.append((at, p))))
