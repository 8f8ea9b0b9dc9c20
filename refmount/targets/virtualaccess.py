"""Which targets a set names only on condition of the mount's authorisation may be read: an
Icechunk repository's virtual chunks. The repository declares its virtual chunk containers
(URL prefixes; ``refs/icechunk``); the mount reads a virtual chunk only when a ``targets=``
rule's prefix covers its URL (the rule may hold only ``{"prefix": ...}``: its options and
credentials apply as for any target), or, for a local one, when ``allow_local`` was given and
covers it. Pure: no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from refmount.base.urls import is_local, local_path
from refmount.targets.rules import TargetRules


def virtual_access(rules: TargetRules, allow_local: list[str] | None) -> Callable[[str], str | None]:
    """``problem(url)``: why a virtual chunk's ``url`` may not be read (None if it may).
    ``allow_local``: the directories ``-o allow_local`` names (None: not given)."""
    roots = [os.path.normpath(r) for r in allow_local or []]

    def problem(url: str) -> str | None:
        if rules.match(url) is not None:
            return None
        if is_local(url):
            path = os.path.normpath(local_path(url))
            if any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
                return None
            return "no targets rule covers it, nor allow_local"
        return "no targets rule covers it"

    return problem
