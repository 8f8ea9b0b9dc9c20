"""Counters of one mount, shown as xattrs on the root and by ``refmount stats``."""

from __future__ import annotations

import dataclasses
import errno
import time
from dataclasses import dataclass, field
from typing import Any

from refmount.base.latency import Latency
from refmount.base.redact import redact_url

# the target protocols counted apart in the metrics (any other is "other": a bounded label set)
PROTOCOLS = ("http", "https", "s3", "gs", "gcs", "az", "abfs", "abfss", "adl", "file", "local",
             "memory", "hf", "ftp", "sftp", "webdav", "other")
# per protocol: fetches, bytes fetched, retries, reads answered with an error
FETCHES, FETCHED_BYTES, RETRIES, ERRORS = range(4)


@dataclass
class Stats:
    started: float = field(default_factory=time.time)
    requests: int = 0  # successful fetches from targets
    merged: int = 0  # ranges that shared a request with others (adjacent, read at once)
    prefetched: int = 0  # bytes fetched ahead of readers going through a target in order
    prefetch_hits: int = 0  # reads served from those
    readahead_streams: int = 0  # streams of keys read in target order that began reading ahead
    bytes_fetched: int = 0
    retries: int = 0
    errors: int = 0  # reads answered with an error
    lookups: int = 0  # FUSE lookups (names the kernel had not cached, found or not)
    opens: int = 0  # FUSE opens
    reads: int = 0  # FUSE read calls
    bytes_read: int = 0  # bytes returned to readers
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    cache_writes_dropped: int = 0  # blocks not written to the disk cache: the disk fell behind
    pushed: int = 0  # bytes stored in the kernel's page cache at open, ahead of the reads
    decoded: int = 0  # chunks decoded (-o decode), ahead of readers included
    decoded_ahead: int = 0  # chunks decoded ahead of a reader going through an array in order
    open_files: int = 0
    pin_refusals: int = 0  # fetches refused: the target is not its pinned version (-o pins)
    pinned_targets_changed: int = 0  # distinct targets found so
    # the last read that failed: {"time", "key", "target", "reason"} (target redacted)
    last_error: dict[str, Any] | None = None
    # per target rule number with a credential process: its command, generation, expiry,
    # refreshes and failures (targets/credentials.py; never the credential)
    credentials: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a shared mount's or a server's: last_error holds a fixed text (not in as_dict)
    shared: bool = False
    # for the metrics only (serving/metrics.py; not in as_dict): durations of the front end's
    # requests (a FUSE read, an HTTP request) and of fetches, and counts per target protocol
    request_latency: Latency = field(default_factory=Latency)
    fetch_latency: Latency = field(default_factory=Latency)
    protocols: dict[str, list[int]] = field(default_factory=dict)

    def fetched(self, url: str, nbytes: int, seconds: float) -> None:
        """Count a fetch from a target that gave ``nbytes`` in ``seconds``."""
        self.requests += 1
        self.bytes_fetched += nbytes
        self.fetch_latency.observe(seconds)
        counts = self._of(url)
        counts[FETCHES] += 1
        counts[FETCHED_BYTES] += nbytes

    def retried(self, url: str) -> None:
        self.retries += 1
        self._of(url)[RETRIES] += 1

    def _of(self, url: str) -> list[int]:
        protocol = protocol_of(url)
        counts = self.protocols.get(protocol)
        if counts is None:
            counts = self.protocols[protocol] = [0, 0, 0, 0]
        return counts

    def failed(self, key: str, error: Exception) -> None:
        """Count a read answered with an error and remember it as the last one. Of a shared
        mount or a server (``shared``), only a fixed text of its kind: the reason (a target
        path, the allowed directories, a parse excerpt) is in the log, never in the stats
        other users or HTTP clients read."""
        self.errors += 1
        url = getattr(error, "url", None)
        if isinstance(url, str):
            self._of(url)[ERRORS] += 1
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if self.shared:
            self.last_error = {"time": when, "key": key, "target": None, "reason": failure_kind(error)}
            return
        self.last_error = {
            "time": when,
            "key": key,
            "target": redact_url(url) if isinstance(url, str) else None,
            "reason": redact_url(str(getattr(error, "reason", None) or error)),
        }

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in ("shared", "request_latency", "fetch_latency", "protocols"):
            del d[name]
        d["uptime"] = round(time.time() - self.started, 3)
        return d


def failure_kind(error: Exception) -> str:
    """A fixed text for the kind of a failed read (what a shared mount's stats show)."""
    errno_ = getattr(error, "errno", None)
    if getattr(error, "timed_out", False):
        return "a target timed out (the log says more)"
    if type(error).__name__ == "PinMismatch":
        return "a target is not its pinned version (the log says more)"
    if errno_ in (errno.EACCES, errno.EPERM):
        return "a target may not be read by this mount (the log says why)"
    if errno_ == errno.ENOENT:
        return "a target does not exist (the log says more)"
    return "a target could not be read (the log says why)"


def protocol_of(url: str) -> str:
    """The protocol a target is read with, one of ``PROTOCOLS`` (never more of the URL)."""
    scheme, sep, _ = url.rpartition("::")[2].partition("://")
    if not sep:
        return "file"
    scheme = scheme.lower()
    return scheme if scheme in PROTOCOLS else "other"
