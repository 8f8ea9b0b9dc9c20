"""Which targets a mount may read (confinement of local files, allowed protocols).

Kept free of the daemon's imports (trio, pyfuse3, aiohttp) so that the CLI can check a
reference set's targets before any daemon exists.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import fsspec

from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.base.urls import LOCAL_PROTOCOLS, is_chained, is_local, local_path
from refmount.base.urls import protocol as url_protocol
from refmount.config import MountConfig
from refmount.targets.rules import Route, TargetRules


class _BadURL(ValueError):
    pass


class TargetRefused(ValueError):
    """A reference names a target this mount may not read; the message says which."""


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

    def __init__(self, local_roots: list[str], base_dir: str | None, remote_protocol: str | None,
                 own_roots: Iterable[str] = ()):
        self.local_roots = [os.path.realpath(r) for r in local_roots]
        self.confined = self.local_roots != ["/"]
        if self.confined:  # the set's own objects (an Icechunk repository's chunks), whatever
            # allow_local names: SOURCE is read wherever it lies
            self.local_roots += [r for r in map(os.path.realpath, own_roots) if r not in self.local_roots]
        # Relative local paths are relative to SOURCE's directory (a JSON file's directory,
        # or a Parquet set's own directory; see ``relative``).
        self.base_dir = base_dir
        self.remote_protocol = remote_protocol
        self.home = os.path.expanduser("~")  # fixed once: "~" in URLs means this directory
        self._protocols: dict[str, str | None] = {}
        # Verdicts on single-link remote URLs ("" for none: the LRU holds no None).
        self._remote: LRU[str, str] = LRU(100_000)

    def full_url(self, url: str) -> str:
        """The URL as this mount reads it. Local paths come out absolute and normalised, the
        same in the CLI and in the daemon (whose working directory is ``/``): a relative
        path (also ``file://relative``) is relative to SOURCE's directory, and ``~`` is the
        home directory of the mounting user."""
        if not is_local(url):
            return url
        protocol, sep, rest = url.partition("://")
        if not sep and self.remote_protocol and self.remote_protocol not in LOCAL_PROTOCOLS:
            return f"{self.remote_protocol}://{url}"
        path = rest if sep else url
        if path.startswith("~"):
            path = os.path.join(self.home, path[1:].lstrip("/")) if path[1:2] in ("", "/") else path
        if not os.path.isabs(path):
            if self.base_dir is None:
                return url  # refused by problem(): no directory to be relative to
            path = os.path.join(self.base_dir, path)
        path = os.path.normpath(path)
        return f"{protocol}://{path}" if sep else path

    def route(self, rules: TargetRules, url: str) -> Route:
        """Where ``url`` is read under target ``rules``: matched as resolved here
        (``full_url``), and each rewritten URL resolved the same way. The policy applies to
        the rewritten URLs (``Route.urls``)."""
        route = rules.route(self.full_url(url))
        if not route.rewritten:
            return route
        return Route(route.original, route.rule, tuple(self.full_url(u) for u in route.urls))

    def cache_identity(self, url: str) -> str:
        """What names a target in a disk cache shared with other mounts: the URL as resolved
        here, and, for a confined mount, its allowed directories — so that bytes cached by a
        mount that may read more (a private one) are never served by one that may not."""
        full = self.full_url(url)
        if self.confined:
            return f"{full}\0confined:{':'.join(self.local_roots)}"
        return full

    @property
    def roots(self) -> list[str] | None:
        """The allowed directories for local reads, None when not confined."""
        return self.local_roots if self.confined else None

    def relative(self, url: str) -> bool:
        """Whether ``url`` is a relative local path (bare or ``file://relative``), which
        ``full_url`` joins to ``base_dir`` (a path without a protocol takes
        ``remote_protocol``'s instead, when one is set). ``~/…`` is not: it is the home
        directory's."""
        protocol, sep, path = url.partition("://") if "://" in url else ("", "", url)
        if is_chained(url) or (sep and protocol not in LOCAL_PROTOCOLS) or os.path.isabs(path):
            return False
        if path[:1] == "~" and path[1:2] in ("", "/"):
            return False
        return bool(sep) or not (self.remote_protocol and self.remote_protocol not in LOCAL_PROTOCOLS)

    def _chain(self, url: str) -> list[tuple[str, str]]:
        """(protocol, path) of each link of a (possibly chained) URL."""
        if not is_chained(url):  # one link (fsspec would split an IPv6 host at its "::")
            return [(url_protocol(url), url)]
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
        if not is_local(full) and not is_chained(full):
            # One remote link: the answer depends on the URL alone (asked before every
            # fetch and disk-cache lookup), so it is remembered.
            known = self._remote.get(full)
            if known is None:
                known = self._problem(full, resolve=False) or ""
                self._remote.put(full, known)
            return known or None
        return self._problem(full, resolve=resolve)

    def _problem(self, full: str, *, resolve: bool) -> str | None:
        if is_local(full) and not os.path.isabs(local_path(full)):
            return "relative local path, and SOURCE is not a local file to be relative to"
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
            if protocol in LOCAL_PROTOCOLS:
                local = local_path(path) if is_local(path) else path  # (not absolute: refused)
                if not os.path.isabs(local):
                    return "relative local path, and SOURCE is not a local file to be relative to"
                real = os.path.realpath(local) if resolve else os.path.normpath(local)
                if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in self.local_roots):
                    roots = ":".join(self.local_roots) or "none"
                    where = local if real == os.path.normpath(local) else f"{local} (-> {real})"
                    return (f"local file {where} is outside the allowed directories ({roots}); "
                            "allow it with -o allow_local=DIR")
        if self.confined and len(chain) > 1 and any(p in LOCAL_PROTOCOLS for p, _ in chain):
            # Its inner file system would open the file itself, following symlinks: only a
            # plain local path is opened beneath the allowed directories (targets/localfile.py).
            return ("a chained URL over a local file is not allowed where local files are "
                    "confined: name the file itself, or allow all with -o allow_local=/")
        return None


def target_policy(cfg: MountConfig, own_objects: str | None = None) -> TargetPolicy:
    """The policy of a mount with ``cfg``; ``own_objects``: the URL prefix of the set's own
    objects read as targets (``OpenedTree.own_objects``), readable whatever ``allow_local`` names
    when local."""
    # allowed: the directory holding them (the repository), so that the objects' own directory
    # (``chunks``) is opened beneath it, never followed as a symlink out of it
    own = ([os.path.dirname(local_path(own_objects).rstrip("/"))]
           if own_objects is not None and is_local(own_objects) else [])
    base = None
    if is_local(cfg.source):
        # A directory SOURCE is a Parquet set: relative paths in it are relative to the
        # directory itself (record files name theirs relative to their own directory, below
        # it: see refs/parquetset.py), as they are to the directory of a ``.zmetadata`` SOURCE.
        real = os.path.realpath(local_path(cfg.source))
        base = real if os.path.isdir(real) else os.path.dirname(real)
    return TargetPolicy(cfg.local_roots(), base, cfg.remote_protocol, own)


def check_targets(cfg: MountConfig, targets: Iterable[tuple[str, Callable[[], str]]]) -> None:
    """Refuse the mount if any distinct target URL is not allowed — where it is read, after
    the target rules (``-o targets``) rewrote it, every mirror. ``targets``: the URLs a
    format knows before mounting, each with a function naming a key that uses it
    (``Format.targets``; a format read lazily, like Parquet, has its targets checked at read
    time instead)."""
    policy = None
    rules = TargetRules.from_json(cfg.targets)
    for url, key_of in targets:
        policy = policy or target_policy(cfg)
        route = policy.route(rules, url) if rules else None
        for target in route.urls if route is not None else (url,):
            reason = policy.problem(target, resolve=True)
            if reason:
                via = ""
                if route is not None and route.rewritten:
                    assert route.rule is not None
                    via = f" (read as {redact_url(target)} by target rule {route.rule.describe()})"
                raise TargetRefused(f"key {key_of()!r}: {redact_url(url)}{via}: {reason}")
