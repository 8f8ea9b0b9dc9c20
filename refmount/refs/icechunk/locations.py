"""Relative virtual chunk locations: ``vcc://NAME/path`` (also spelled ``_vcc://``, as
icechunk's design notes write it) names the virtual chunk container ``NAME`` of the
repository's config; the chunk's URL is that container's URL prefix followed by ``path``
(icechunk's ``expand_location``). Any other location is absolute and is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

SCHEMES = ("vcc://", "_vcc://")


class UnknownContainer(Exception):
    """A relative location whose container name the repository does not declare."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def relative(location: str) -> tuple[str, str | None] | None:
    """(container name, path) of a relative location, the path None when no ``/`` follows
    the name; None for an absolute location."""
    lowered = location[:8].lower()
    for scheme in SCHEMES:
        if lowered.startswith(scheme):
            name, slash, path = location[len(scheme):].partition("/")
            return name, path if slash else None
    return None


def absolute(location: str, names: Mapping[str, str]) -> str:
    """The absolute URL of ``location`` (``names``: container name -> URL prefix);
    UnknownContainer when it names a container ``names`` has not."""
    parts = relative(location)
    if parts is None:
        return location
    name, path = parts
    prefix = names.get(name) if name else None
    if prefix is None or path is None:
        raise UnknownContainer(name)
    return prefix + path if prefix.endswith("/") else f"{prefix}/{path}"
