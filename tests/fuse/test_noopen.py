"""``-o no_open``: with refmount's pyfuse3 patch the daemon answers the first ``OPEN`` with
``ENOSYS`` and the kernel sends no ``OPEN`` and no ``RELEASE`` after; without it (a stock
pyfuse3, forced by ``REFMOUNT_PYFUSE3_STOCK=1``) files are opened and released as before, and
one log line says why. The requests are counted from libfuse's debug log (``-o debug`` in the
foreground: every request the kernel sends, one line each)."""

from __future__ import annotations

import collections
import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

import psutil
import pyfuse3
import pytest
from support.mounts import CLI, cli_env, is_mounted, opts_arg, stop_foreground

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

CHUNKS = 20
SIZE = 10_000


def local_set(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    blob = random.Random(54).randbytes(CHUNKS * SIZE)
    target = tmp_path / "data.bin"
    target.write_bytes(blob)
    refs: dict[str, object] = {".zgroup": '{"zarr_format": 2}'}
    expected = {}
    for i in range(CHUNKS):
        refs[f"c/{i}"] = [str(target), i * SIZE, SIZE]
        expected[f"c/{i}"] = blob[i * SIZE: (i + 1) * SIZE]
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    return source, expected


def opcodes(text: str) -> collections.Counter[str]:
    return collections.Counter(re.findall(r"opcode: ([A-Z_]+)", text))


def read_counted(mounter, tmp_path: Path, stock: bool) -> tuple[collections.Counter[str], str]:
    """Mount in the foreground with libfuse's debug log, read every chunk twice (``open()``
    then ``os.open``/``os.read``), check the bytes; the requests the reads caused, and the
    daemon's log."""
    source, expected = local_set(tmp_path)
    m = mounter.track(source, "debug", "no_open")
    env = {**cli_env(), **({"REFMOUNT_PYFUSE3_STOCK": "1"} if stock else {})}
    err_path = m.log.with_suffix(".stderr")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([*CLI, str(source), str(m.path), "-f", *opts_arg(m.opts)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=tmp_path, env=env)
    m.procs.append(psutil.Process(proc.pid))
    try:
        deadline = time.monotonic() + 120
        while not (is_mounted(m.path) and os.path.exists(m.path / ".zgroup")):
            assert proc.poll() is None, err_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "not mounted after 120 s"
            time.sleep(0.05)
        os.listdir(m.path / "c")
        before = len(err_path.read_bytes())
        for key, want in expected.items():
            with open(m.path / key, "rb") as f:
                assert f.read() == want, key
        for key, want in expected.items():
            fd = os.open(m.path / key, os.O_RDONLY)
            try:
                assert os.read(fd, 2 * SIZE) == want, key
            finally:
                os.close(fd)
        time.sleep(0.5)  # RELEASE is sent after close returns
        counted = opcodes(err_path.read_bytes()[before:].decode(errors="replace"))
    finally:
        stop_foreground(proc, m.path)
    return counted, m.log.read_text(errors="replace")


def test_no_open_sends_no_open_or_release(mount, tmp_path):
    if not getattr(pyfuse3, "REFMOUNT_READ_INODE", False):
        pytest.fail("pyfuse3 lacks patches/pyfuse3-noopen.patch: run scripts/setup.sh")
    counted, log = read_counted(mount, tmp_path, stock=False)
    assert counted["OPEN"] <= 1, counted  # the first one, answered ENOSYS
    assert counted["RELEASE"] == 0, counted
    assert counted["READ"] >= CHUNKS, counted  # each chunk read once by the daemon
    assert "lacks refmount's no_open patch" not in log


def test_stock_pyfuse3_opens_files_and_says_so(mount, tmp_path):
    counted, log = read_counted(mount, tmp_path, stock=True)
    assert counted["OPEN"] == 2 * CHUNKS, counted
    assert counted["RELEASE"] == 2 * CHUNKS, counted
    assert log.count("lacks refmount's no_open patch") == 1, log[-3000:]


def test_no_open_range_past_its_target_with_concurrent_readers(mount, tmp_path):
    """A 1 TB range of a 4 KiB file read by 16 readers at once at offsets in and far past its
    end, through fresh mounts: each gets the bytes that exist, never zero-filled pages
    (docs/semantics.md, ranges longer than their target). With no_open it is settled at lookup;
    settled at the first READ instead, readers got zero-filled pages."""
    from concurrent.futures import ThreadPoolExecutor

    target = tmp_path / "small.bin"
    blob = random.Random(4).randbytes(4096)
    target.write_bytes(blob)
    source = tmp_path / "tb.json"
    source.write_text(json.dumps({".zgroup": '{"zarr_format": 2}', "big": [str(target), 0, 10**12]}))
    offsets = (0, 10**6, 10**9, 10**12 - 4096)

    def one(mnt: Path, off: int) -> None:
        with open(mnt / "big", "rb", buffering=0) as f:
            f.seek(off)
            data = f.read(64 << 10)
        assert data == blob[off: off + (64 << 10)], f"@{off}: {len(data)} bytes"

    for i in range(4):
        m = mount(source, "no_open")
        if i % 2:  # listed first: the kernel has the file from the listing, not from a lookup
            assert "big" in os.listdir(m.path)
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(one, [m.path] * 16, [offsets[i % 4] for i in range(16)]))
        m.unmount()
