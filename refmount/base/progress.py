"""A one-line progress indicator on a terminal's stderr, for work that may take a while
(indexing SOURCE at mount, ``inspect``, ``expand``).

It shows the seconds spent, the bytes this process has read (``rchar`` of
``/proc/self/io``: files and sockets alike, so it moves while a large SOURCE is parsed and
before the first key comes out) and, where the caller counts them, the keys. Nothing is
written when stderr is not a terminal, and nothing at all for work that ends within
``DELAY`` seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

DELAY = 0.5  # seconds before the first line
INTERVAL = 0.2


def bytes_read() -> int | None:
    """Bytes this process has read so far (files and sockets), or None where not known."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    """``with Progress("reading refs.json", keys=True) as p: ... p.count += 1``."""

    def __init__(self, label: str, keys: bool = True, stream: TextIO | None = None,
                 force: bool = False, unit: str = "keys") -> None:
        self.label = label
        self.keys = keys
        self.unit = unit  # what ``count`` counts
        self.count = 0
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()
        self._read0 = bytes_read()
        if force or self.stream.isatty():
            self._thread = threading.Thread(target=self._run, daemon=True, name="refmount-progress")
            self._thread.start()

    def line(self) -> str:
        """The current line (without the spinner)."""
        took = time.monotonic() - self._start
        parts = [f"{took:.0f} s"]
        now = bytes_read()
        if now is not None and self._read0 is not None:
            read = now - self._read0
            parts.append(f"{human_bytes(read)} read ({human_bytes(read / max(took, 1e-9))}/s)")
        if self.keys:
            parts.append(f"{self.count:,} {self.unit}")
        return f"{self.label}: {', '.join(parts)}"

    def _run(self) -> None:
        if self._stop.wait(DELAY):
            return
        spinner = "|/-\\"
        i = width = 0
        while True:
            text = f"{spinner[i % 4]} {self.line()}"
            width = max(width, len(text))
            self.stream.write("\r" + text.ljust(width))
            self.stream.flush()
            i += 1
            if self._stop.wait(INTERVAL):
                break
        self.stream.write("\r" + " " * width + "\r")
        self.stream.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
