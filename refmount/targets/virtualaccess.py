"""Which targets a set names only on condition of the mount's authorisation may be read: an
Icechunk repository's virtual chunks. The repository declares its virtual chunk containers
(URL prefixes; ``refs/icechunk``); the mount reads a virtual chunk only when a ``targets=``
rule's prefix covers its URL (the rule may hold only ``{"prefix": ...}``: its options and
credentials apply as for any target), or, for a local one, when ``allow_local`` was given and
covers it. The version a virtual chunk's reference recorded (ETag, or a time its target was
not modified after) becomes the target's pin (``Pins.add``), checked by the fetcher as a pin
file's are. A redirect of a virtual chunk is followed only to a location under a declared
container that a rule authorises (``redirect_problem``, asked by targets/redirects.py). Pure: no
I/O.
"""

from __future__ import annotations

import os

from refmount.base.urls import climbs, is_local, local_path, normal_url
from refmount.targets.pins import Pins
from refmount.targets.rules import TargetRules
from refmount.targets.versions import Version


class VirtualAccess:
    """What a format asks about a virtual chunk (``Format.open_tree``'s ``access``).
    ``allow_local``: the directories ``-o allow_local`` names (None: not given); ``pins``: where
    recorded versions go (None: not checked, ``-o no_virtual_pins``)."""

    def __init__(self, rules: TargetRules, allow_local: list[str] | None, pins: Pins | None) -> None:
        self.rules = rules
        self.roots = [os.path.normpath(r) for r in allow_local or []]
        self.pins = pins
        self.containers: tuple[str, ...] = ()  # the virtual chunk containers of the set
        self.refused: dict[str, tuple[int, str]] = {}  # container -> (targets left out, why)

    def declare(self, containers: list[str]) -> None:
        """The virtual chunk containers (URL prefixes) the set declares."""
        self.containers = tuple(containers)

    def container(self, url: str) -> str | None:
        """The longest declared container ``url`` lies under (None: none)."""
        covering = [c for c in self.containers if under(c, url)]
        return max(covering, key=len) if covering else None

    def redirect_problem(self, target: str, location: str) -> str | None:
        """Why a redirect of the target ``target`` to ``location`` (as a set would name it: a
        rule's rewrite read as its prefix) may not be followed as far as virtual chunks go
        (None if it may, or if ``target`` is not a virtual chunk): the location must lie under
        a declared container, and a rule must authorise it."""
        if self.container(target) is None:
            return None
        if self.container(location) is None:
            return ("the target is a virtual chunk, and the location is outside every virtual "
                    "chunk container the repository declares")
        if self.rules.match(location) is None:
            return ("the target is a virtual chunk, and no targets rule authorises the "
                    "location's container")
        return None

    def problem(self, url: str) -> str | None:
        """Why a virtual chunk's ``url`` may not be read (None if it may)."""
        if self.rules.match(url) is not None:
            return None
        if is_local(url):
            path = os.path.normpath(local_path(url))
            if any(path == r or path.startswith(r.rstrip("/") + "/") for r in self.roots):
                return None
            return "no targets rule covers it, nor allow_local"
        return "no targets rule covers it"

    def pin(self, url: str, etag: str | None, modified_by: int | None) -> None:
        """The version of ``url`` a reference recorded: its ETag, or a time it was not modified
        after (the first recorded for a URL is kept)."""
        if self.pins is not None and (etag or modified_by is not None):
            self.pins.add(url, Version(etag=etag or None, modified_by=None if etag else modified_by))

    def left_out(self, container: str, count: int, reason: str) -> None:
        """``count`` virtual chunks under ``container`` left out of a set's references, for
        ``reason`` (what ``refmount verify`` reports)."""
        known, _ = self.refused.get(container, (0, reason))
        self.refused[container] = (known + count, reason)


def under(prefix: str, url: str) -> bool:
    """Whether ``url`` lies under the container ``prefix``: on a path-segment boundary (a
    prefix ending with ``/`` matches what starts with it), compared as a client sends them
    (``urls.normal_url``), local ones by path, and without a ``..`` segment after it."""
    if not prefix or is_local(prefix) != is_local(url):
        return False
    if is_local(url):
        p, u = os.path.normpath(local_path(prefix)), local_path(url)
        p = p + "/" if prefix.endswith("/") and not p.endswith("/") else p
    else:
        p, u = normal_url(prefix), normal_url(url)
    if p.endswith("/"):
        rest = u[len(p):] if u.startswith(p) else None
    else:
        rest = u[len(p) + 1:] if u.startswith(p + "/") else ("" if u == p else None)
    return rest is not None and not climbs(rest)
