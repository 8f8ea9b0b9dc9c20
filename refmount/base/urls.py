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
import urllib.parse

from fsspec.registry import available_protocols

LOCAL_PROTOCOLS = frozenset({"file", "local"})
_WORD = re.compile("[a-z]+")
# The host of a URL written as an IPv6 literal (``http://[::1]:8080/``, user information
# allowed before it): its colons separate no links of a chain.
_IPV6_HOST = re.compile(r"(://(?:[^/?#\[\]@]*@)?)\[[0-9A-Za-z:.%_~-]*\]")
_ESCAPE = re.compile("%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443", "ftp": "21"}


def is_chained(url: str) -> bool:
    """Whether ``url`` chains file systems (``a::b``): a ``::`` anywhere but in the brackets
    of an IPv6 host (``http://[::1]/a`` is one link, ``simplecache::http://[::1]/a`` two)."""
    return "::" in url and "::" in _IPV6_HOST.sub(r"\1[]", url)


def protocol(url: str) -> str:
    """The protocol of the first link of ``url``; ``"file"`` for a plain path. In a chain, a
    link that is a known protocol or lowercase letters only is a protocol name
    (``simplecache::...``), as fsspec reads it (``fsspec.core._un_chain``)."""
    head = url.split("::", 1)[0] if is_chained(url) else url
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


def _unescape_unreserved(m: re.Match[str]) -> str:
    byte = int(m.group(1), 16)
    return chr(byte) if byte in _UNRESERVED else "%" + m.group(1).upper()


def normal_url(url: str) -> str:
    """``url`` as a client sends it (RFC 3986's normalisations, as yarl makes them for
    aiohttp): the scheme and host in lower case, a default port dropped, percent-escapes of
    unreserved characters decoded (``%2e`` is ``.``) and the others in upper case. Dot
    segments are kept (a client removes them: ``climbs`` tells whether that leaves a path).
    A local or chained URL is returned as it is."""
    if is_local(url) or is_chained(url):
        return url
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    userinfo, at, hostport = authority.rpartition("@")
    host, port = hostport, ""
    if hostport.startswith("["):  # an IPv6 address: [::1]:80
        close = hostport.find("]")
        if close >= 0 and hostport[close + 1: close + 2] == ":":
            host, port = hostport[: close + 1], hostport[close + 2:]
    elif ":" in hostport:
        host, _, port = hostport.rpartition(":")
    if port and port == DEFAULT_PORTS.get(scheme):
        port = ""
    return (scheme + "://" + userinfo + at + host.lower() + (":" + port if port else "")
            + _ESCAPE.sub(_unescape_unreserved, tail))


def climbs(path: str) -> bool:
    """Whether ``path`` (what follows a prefix) has a ``..`` segment, however escaped: fully
    percent-decoded, split at ``/`` and at ``\\`` (what a server may decode, or take as a
    separator, before it removes dot segments)."""
    text = urllib.parse.unquote(path.split("?", 1)[0].split("#", 1)[0], errors="replace")
    return ".." in re.split(r"[/\\]", text)
