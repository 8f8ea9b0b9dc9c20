"""The one error of the Icechunk reader."""

from __future__ import annotations

from refmount.refs.model import ReferenceSetError


class IcechunkError(ReferenceSetError):
    """The repository is malformed, incomplete or too big; ``str(err)`` is one line."""
