"""Which targets a mount may read (confinement of local files, allowed protocols).

Kept free of the daemon's imports (trio, pyfuse3, aiohttp) so that the CLI can check a
reference set's targets before any daemon exists.
"""

from __future__ import annotations

import os

import fsspec

from .config import MountConfig
from .redact import redact_url
from .refs import IndexFile, KeyIndex


class _BadURL(ValueError):
    pass


class TargetRefused(ValueError):
    """A reference names a target this mount may not read; the message says which."""


_LOCAL = frozenset({"file", "local"})
# Protocols that only read bytes from the location their URL names. When local files are
# confined, nothing else is allowed: "reference" would open targets of its own choosing
# (a nested reference set naming /etc/shadow), "dir" prefixes paths ("../.." escapes), etc.
BYTE_STORES = frozenset({
    "file", "local", "http", "https", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl",
    "hdfs", "webhdfs", "ftp", "sftp", "ssh", "oss", "simplecache", "filecache", "blockcache",
    "zip", "tar",
})


class TargetPolicy:
    """Which targets a mount may read. Reference sets are untrusted, and a daemon serving
    other users (allow_other, or root) must not become a way to read ``/etc/shadow``:
    protocols must be known to fsspec, and local files must lie under ``local_roots``
    after symlinks are resolved."""

    def __init__(self, local_roots: list[str], base_dir: str | None, remote_protocol: str | None):
        self.local_roots = [os.path.realpath(r) for r in local_roots]
        self.confined = self.local_roots != ["/"]
        # Relative local paths are relative to SOURCE's directory (a JSON file's directory,
        # or a Parquet set's own directory; see ``relative``).
        self.base_dir = base_dir
        self.remote_protocol = remote_protocol
        self._protocols: dict[str, str | None] = {}

    def full_url(self, url: str) -> str:
        if "://" in url or "::" in url:
            return url
        if self.remote_protocol and self.remote_protocol not in _LOCAL:
            return f"{self.remote_protocol}://{url}"
        if not os.path.isabs(url):
            if self.base_dir is None:
                return url  # refused by check(): no directory to be relative to
            url = os.path.join(self.base_dir, url)
        return url

    def relative(self, url: str) -> bool:
        """Whether ``url`` is a relative local path, which ``full_url`` joins to ``base_dir``
        (a path without a protocol takes ``remote_protocol``'s instead, when one is set)."""
        if "://" in url or "::" in url or os.path.isabs(url):
            return False
        return not (self.remote_protocol and self.remote_protocol not in _LOCAL)

    def _chain(self, url: str) -> list[tuple[str, str]]:
        """(protocol, path) of each link of a (possibly chained) URL."""
        try:
            links = fsspec.core._un_chain(url, {})
        except Exception as e:
            raise _BadURL(" ".join(str(e).split())[:200]) from None
        out = []
        for path, protocol, _ in links:
            proto = protocol[0] if isinstance(protocol, tuple | list) else protocol
            out.append((proto or "file", path))
        return out

    def _protocol_problem(self, protocol: str) -> str | None:
        if protocol not in self._protocols:
            try:
                fsspec.get_filesystem_class(protocol)
                self._protocols[protocol] = None
            except ImportError as e:
                self._protocols[protocol] = f"protocol {protocol!r} needs a missing package ({e})"
            except ValueError:
                self._protocols[protocol] = f"unknown URL protocol {protocol!r}"
        return self._protocols[protocol]

    def problem(self, url: str, *, resolve: bool) -> str | None:
        """Why ``url`` may not be read (None if it may). ``resolve`` follows symlinks of
        local paths (file system I/O: call it from a worker thread)."""
        full = self.full_url(url)
        try:
            chain = self._chain(full)
        except _BadURL as e:
            if "Protocol not known" in str(e):
                return f"unknown URL protocol in {redact_url(full)!r}"
            return f"cannot parse URL ({e})"
        for protocol, path in chain:
            reason = self._protocol_problem(protocol)
            if reason:
                return reason
            if self.confined and protocol not in BYTE_STORES:
                return (f"protocol {protocol!r} is not allowed where local files are confined "
                        f"(allowed: {', '.join(sorted(BYTE_STORES))})")
            if protocol in _LOCAL:
                local = path.removeprefix("file://")
                if not os.path.isabs(local):
                    return "relative local path, and SOURCE is not a local file to be relative to"
                real = os.path.realpath(local) if resolve else os.path.normpath(local)
                if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in self.local_roots):
                    roots = ":".join(self.local_roots) or "none"
                    where = local if real == os.path.normpath(local) else f"{local} (-> {real})"
                    return (f"local file {where} is outside the allowed directories ({roots}); "
                            "allow it with -o allow_local=DIR")
        return None


def target_policy(cfg: MountConfig) -> TargetPolicy:
    local_source = "://" not in cfg.source and "::" not in cfg.source
    base = None
    if local_source:
        # A directory SOURCE is a Parquet set: relative paths in it are relative to the
        # directory itself (record files name theirs relative to their own directory, below
        # it: see refs/parquet.py), as they are to the directory of a ``.zmetadata`` SOURCE.
        real = os.path.realpath(cfg.source)
        base = real if os.path.isdir(real) else os.path.dirname(real)
    return TargetPolicy(cfg.local_roots(), base, cfg.remote_protocol)


def check_targets(cfg: MountConfig, index_file: IndexFile) -> None:
    """Refuse the mount if any distinct target URL is not allowed (JSON sets; Parquet
    record files are read lazily, so their targets are checked at read time)."""
    if index_file.kind != "json":
        return
    index = KeyIndex.open(index_file.path)
    if not index.n:
        return
    policy = target_policy(cfg)
    for url in index.urls():
        reason = policy.problem(url, resolve=True)
        if reason:
            key = index.key(index.first_with_url(url)).decode(errors="replace")
            raise TargetRefused(f"key {key!r}: {redact_url(url)}: {reason}")
