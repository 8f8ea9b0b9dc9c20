"""numcodecs codecs that misbehave the way a native codec may on hostile bytes, registered
through numcodecs' entry points so that a mount's processes (the daemon, its codec workers)
find them: ``codec_env(dir)`` writes a distribution's metadata under ``dir`` and returns a
PYTHONPATH that holds it and this package.

- ``refmount-test-abort``: ``os.abort()`` (SIGABRT), as eccodes does on some fuzzed messages;
- ``refmount-test-segv``: reads address 0 (SIGSEGV);
- ``refmount-test-hog``: allocates ``gib`` GiB and touches it;
- ``refmount-test-spin``: burns CPU for ever;
- ``refmount-test-plain``: returns its input (a codec off the allow-list that works);
- ``refmount-test-noisy``: writes to file descriptor 1, then returns its input.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
from numcodecs.abc import Codec

SUPPORT_PARENT = Path(__file__).resolve().parents[1]  # tests/: ``support`` is importable from it


class _Base(Codec):
    def encode(self, buf):
        return buf


class AbortCodec(_Base):
    codec_id = "refmount-test-abort"

    def decode(self, buf, out=None):
        os.abort()


class SegvCodec(_Base):
    codec_id = "refmount-test-segv"

    def decode(self, buf, out=None):
        return ctypes.string_at(0)


class HogCodec(_Base):
    codec_id = "refmount-test-hog"

    def __init__(self, gib: int = 8):
        self.gib = gib

    def decode(self, buf, out=None):
        return np.ones(self.gib << 30, np.uint8)


class SpinCodec(_Base):
    codec_id = "refmount-test-spin"

    def decode(self, buf, out=None):
        n = 0
        while True:
            n += 1


class PlainCodec(_Base):
    codec_id = "refmount-test-plain"

    def decode(self, buf, out=None):
        return bytes(buf)


class NoisyCodec(_Base):
    codec_id = "refmount-test-noisy"

    def decode(self, buf, out=None):
        os.write(1, b"noise from a native library\n" * 100)
        return bytes(buf)


CODECS = (AbortCodec, SegvCodec, HogCodec, SpinCodec, PlainCodec, NoisyCodec)


def codec_env(root: Path) -> str:
    """Register the codecs (a ``.dist-info`` with their entry points under ``root``); the
    PYTHONPATH to give the processes that should find them."""
    info = root / "refmount_test_codecs-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: refmount-test-codecs\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[numcodecs.codecs]\n" + "".join(
        f"{c.codec_id} = support.crashcodec:{c.__name__}\n" for c in CODECS))
    old = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(root), str(SUPPORT_PARENT), old) if p)
