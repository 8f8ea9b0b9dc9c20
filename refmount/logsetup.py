"""Where refmount's log lines go.

``stderr_warnings``: until a serving process takes over, warnings (skipped keys, stale
mounts, a re-parse) go to stderr as ``refmount: WARNING: …`` — in the CLI and in the indexer
child. Every handler formats through ``RedactingFormatter``: no credential in a log line.
"""

from __future__ import annotations

import logging
import sys

from .redact import RedactingFormatter


def stderr_warnings() -> None:
    """Until a daemon takes over, warnings (skipped keys, stale mounts) go to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("refmount: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
