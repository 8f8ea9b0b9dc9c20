"""What a URL names, from its text alone: local file or not, and its protocol.

One definition for the CLI (is SOURCE a local file, to make absolute), the option defaults
(``allow_local``'s default is SOURCE's directory), the target policy and the fetcher. No I/O.

A URL is *local* when it names one file of this machine directly: a path without a protocol
(``/data/a.nc``, ``data/a.nc``, ``~/a.nc``) or a ``file://`` / ``local://`` URL. Chained URLs
(``simplecache::/data/a.nc``, ``zip://x::file:///a.zip``) are not: another file system stands
between the path and its bytes, and it is not confined the way a local path is
(targets/policy.py). Whether a path without a protocol is read with ``remote_protocol`` instead is the
target policy's business (``TargetPolicy.full_url``), not this module's.
"""

from __future__ import annotations

import re

from fsspec.registry import available_protocols

LOCAL_PROTOCOLS = frozenset({"file", "local"})
_WORD = re.compile("[a-z]+")


def is_chained(url: str) -> bool:
    """Whether ``url`` chains file systems (``a::b``)."""
    return "::" in url


def protocol(url: str) -> str:
    """The protocol of the first link of ``url``; ``"file"`` for a plain path. In a chain, a
    link that is a known protocol or lowercase letters only is a protocol name
    (``simplecache::...``), as fsspec reads it (``fsspec.core._un_chain``)."""
    head = url.split("::", 1)[0]
    proto, sep, _ = head.partition("://")
    if sep:
        return proto
    if is_chained(url) and (head in available_protocols() or _WORD.fullmatch(head)):
        return head
    return "file"


def is_local(url: str) -> bool:
    """Whether ``url`` names a local file directly: a plain path, ``file://`` or ``local://``
    (not a chained URL, not any other protocol)."""
    if is_chained(url):
        return False
    proto, sep, _ = url.partition("://")
    return not sep or proto in LOCAL_PROTOCOLS


def local_path(url: str) -> str:
    """The path of a local URL (``file:///a`` -> ``/a``, ``file://a`` -> ``a``; a plain path
    as it is). Raises ValueError for a URL that is not local."""
    if not is_local(url):
        raise ValueError("not a local URL")  # (it may carry credentials: not repeated)
    _, sep, rest = url.partition("://")
    return rest if sep else url
