"""What a mount shows about itself, for the mount tests: its stats (the root's
``user.refmount.stats`` xattr) and log lines; waiting for a condition; readers in threads."""

from __future__ import annotations

import json
import os
import threading
import time

HEADER = 4096  # disk-cache block header (magic, length, xxh3-128, key digest; a page)


def run_readers(reader, n: int, timeout: float = 60) -> None:
    """``reader(seed)`` in ``n`` threads at once, seeds 0..n-1; returns when all are done."""
    threads = [threading.Thread(target=reader, args=(s,)) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def stats(m) -> dict:
    return json.loads(os.getxattr(m.path, "user.refmount.stats"))


def log_lines(m, needle: str) -> list[str]:
    try:
        text = m.log.read_text(errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if needle in ln]


def wait_for(pred, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
