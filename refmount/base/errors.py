"""refmount's own exceptions, by who sees them.

* ``MountError``: the mount cannot be made (mountpoint, FUSE, daemon start-up). The message is
  the user's one line (``refmount: error: ...``); no mount is left behind.
* ``ConfigError``: a mount option or the command line is wrong; also one line for the user.
* ``CatalogError``: a catalogue (``sets/catalog.py``) or a set's identity cannot be read; one line.
* ``ReadError``: one read (or stat, or open) of one file in the mount failed. The FUSE
  operations reply with its ``reply_errno`` and the rest of the mount keeps answering.
  ``FetchError`` (the bytes of a target could not be had) and the decoded view's
  ``DecodeError`` are read errors; fuse/operations.py knows only this base class.

Kept free of imports beyond the standard library, so that every layer (the CLI before any
daemon exists, the Python API, the fetcher, the FUSE operations) can use it.
"""

from __future__ import annotations

import errno

from refmount.base.redact import redact_url


class MountError(RuntimeError):
    """refmount could not mount; the message is refmount's own one-line explanation."""


class ConfigError(ValueError):
    """A bad mount option or command line; the message names the option and the problem."""


class CatalogError(ValueError):
    """The catalogue cannot be read; ``str()`` is one line naming the problem and the remedy."""


class ReadError(Exception):
    """One read of one file failed for good. ``reply_errno`` is what the reader gets: EIO,
    whatever the cause (a missing, refused, stalled or corrupt target is an I/O error of the
    file in the mount, docs/semantics.md). ``logged`` is set once the error has been logged
    with its context (key, codec), so that it is logged once however many readers share it.
    ``str()`` is safe to log (no credentials)."""

    reply_errno: int = errno.EIO

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.logged = False


class FetchError(ReadError):
    """The bytes of a target could not be had (after retries, within the deadline).
    ``errno`` is the cause (ENOENT for a missing target, EACCES for one this mount may not
    read, EIO otherwise), for logs and callers; readers get ``reply_errno`` (EIO)."""

    def __init__(self, url: str, reason: str, errno_: int = errno.EIO, timed_out: bool = False) -> None:
        # Backend exceptions repeat URLs (with credentials) in their text: redact it all.
        super().__init__(redact_url(f"{url}: {reason}"))
        self.url = url
        self.reason = reason
        self.errno = errno_
        self.timed_out = timed_out
