"""Which targets a set names only on condition of the mount's authorisation may be read: an
Icechunk repository's virtual chunks. The repository declares its virtual chunk containers
(URL prefixes; ``refs/icechunk``); the mount reads a virtual chunk only when a ``targets=``
rule's prefix covers its URL (the rule may hold only ``{"prefix": ...}``: its options and
credentials apply as for any target), or, for a local one, when ``allow_local`` was given and
covers it. The version a virtual chunk's reference recorded (ETag, or a time its target was
not modified after) becomes the target's pin (``Pins.add``), checked by the fetcher as a pin
file's are. Pure: no I/O.
"""

from __future__ import annotations

import os

from refmount.base.urls import is_local, local_path
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
        self.refused: dict[str, tuple[int, str]] = {}  # container -> (targets left out, why)

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
