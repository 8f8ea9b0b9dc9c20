"""The progress line: bytes read move before any key is counted; nothing on a non-terminal."""

from __future__ import annotations

import io
import os
import tempfile
import time

from refmount.base import progress
from refmount.base.progress import Progress, bytes_read, human_bytes


def test_bytes_read_counts_file_reads():
    with tempfile.TemporaryFile() as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        before = bytes_read()
        assert before is not None
        f.seek(0)
        f.read()
        assert bytes_read() - before >= 1 << 20


def test_line_shows_time_bytes_and_keys():
    p = Progress("indexing x", keys=True, stream=io.StringIO())  # not a terminal: no thread
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 3_000_000)
        f.seek(0)
        f.read()
    p.count = 1234
    line = p.line()
    assert line.startswith("indexing x: ") and "MB read" in line and "1,234 keys" in line, line
    assert "keys" not in Progress("indexing x", keys=False, stream=io.StringIO()).line()
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000) == "1.5 MB"
    targets = Progress("verifying", stream=io.StringIO(), unit="targets")
    targets.count = 7
    assert targets.line().endswith("7 targets")


def test_written_only_after_the_delay_and_cleared(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.05)
    out = io.StringIO()
    with Progress("reading y", stream=out, force=True):
        time.sleep(0.4)
    text = out.getvalue()
    assert "\r| reading y: " in text and text.endswith("\r"), text
    quick = io.StringIO()
    with Progress("reading z", stream=quick, force=True):
        pass
    assert quick.getvalue() == ""
    silent = io.StringIO()  # not a terminal and not forced
    with Progress("reading w", stream=silent):
        time.sleep(0.1)
    assert silent.getvalue() == ""
