"""The daemon's process-wide settings, applied once by ``process.tune``."""

from __future__ import annotations

import asyncio.selector_events
import os

from refmount import process


def test_tune_applies_the_process_settings_once() -> None:
    transport = asyncio.selector_events._SelectorSocketTransport
    saved_size = transport.max_size
    saved_mask = os.umask(0o022)
    process.tune.cache_clear()
    try:
        transport.max_size = 256 * 1024  # asyncio's default
        trim = process.tune()
        assert os.umask(0o022) == 0o077  # what the daemon creates is the mounting user's only
        assert transport.max_size == process.RECV_SIZE
        assert trim is None or trim(0) in (0, 1)  # glibc's malloc_trim
        os.umask(0o022)
        assert process.tune() is trim  # once: a second call changes nothing
        assert os.umask(0o022) == 0o022
    finally:
        transport.max_size = saved_size
        os.umask(saved_mask)
        process.tune.cache_clear()
