"""DiskCache on its own (no mount): bookkeeping that a mount cannot show quickly."""

from __future__ import annotations

import os
import threading
import time

from refmount.cache.blocks import DiskCache, aligned_buffer, round_up


def _put(disk: DiskCache, url: str, length: int = 8192) -> bytes:
    padded = aligned_buffer(round_up(length, 4096))
    padded[:length] = os.urandom(length)
    padded[length:] = bytes(len(padded) - length)
    digest = disk.key_digest(url, 0, length)
    disk.put_digest(digest, length, padded)
    return digest


def test_temporary_files_left_by_a_crash_are_removed_and_fresh_ones_kept(tmp_path):
    """A writer killed between create and rename leaves ``<digest>.<random>.tmp``: it is
    never renamed or overwritten, and eviction does not count it, so it would take space
    for ever. Old ones go at the next scan; a young one may be another mount's write."""
    disk = DiskCache(str(tmp_path), 2**30)
    block = disk.block_path(_put(disk, "u"))
    stale = f"{block[:-8]}00000000.8d0f2a41c3b5e697.tmp"
    fresh = f"{block[:-8]}11111111.31c7a9e05b4d28f6.tmp"
    for path in (stale, fresh):
        with open(path, "wb") as f:
            f.write(b"x" * 10000)
    old = time.time() - DiskCache.STALE_TMP_AFTER - 60
    os.utime(stale, (old, old))
    disk.scan()
    assert not os.path.exists(stale)
    assert os.path.exists(fresh)
    assert os.path.exists(block)
    assert disk.get("u", 0, 8192) is not None


def test_blocks_written_while_the_first_scan_runs_are_known(tmp_path, monkeypatch):
    """The presence filter answers "certainly not on disk" without I/O; a block written
    after the start-up scan listed the directory, but before the filter existed, must
    still be found (it was missed and fetched again)."""
    disk = DiskCache(str(tmp_path), 2**30)
    _put(disk, "before")
    listed = threading.Event()
    go_on = threading.Event()
    files = disk.files

    def slow_files():
        out = files()
        listed.set()
        go_on.wait(10)
        return out

    monkeypatch.setattr(disk, "files", slow_files)
    scanner = threading.Thread(target=disk.scan)
    scanner.start()
    assert listed.wait(10)
    _put(disk, "during")  # written (and marked) while the scan is between list and publish
    go_on.set()
    scanner.join(10)
    assert disk.may_contain("before", 0, 8192)
    assert disk.may_contain("during", 0, 8192)
    assert disk.get("during", 0, 8192) is not None
