"""Icechunk's object ids as it prints them: Crockford base 32, upper case, unpadded (a 12-byte
snapshot, manifest or chunk id is 20 characters, an 8-byte node id 13)."""

from __future__ import annotations

import base64
import re

_RFC = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = str.maketrans(_RFC, _CROCKFORD)
_FROM_CROCKFORD = str.maketrans(_CROCKFORD, _RFC)
ID12_TEXT = re.compile(r"[0-9A-HJKMNP-TV-Z]{20}")


def encode(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").rstrip("=").translate(_TO_CROCKFORD)


def decode(text: str) -> bytes:
    """The bytes of an id printed by :func:`encode` (ValueError if it is not one)."""
    if not re.fullmatch(r"[0-9A-HJKMNP-TV-Z]*", text):
        raise ValueError(text)
    padded = text.translate(_FROM_CROCKFORD)
    return base64.b32decode(padded + "=" * (-len(padded) % 8))


def is_id12(text: str) -> bool:
    return ID12_TEXT.fullmatch(text) is not None
