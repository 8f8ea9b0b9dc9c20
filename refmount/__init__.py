"""refmount: mount a kerchunk reference set as a read-only directory tree (FUSE)."""

from __future__ import annotations

from typing import Any

from refmount.base.errors import MountError
from refmount.cli.api import mounted, served, unmount


def __getattr__(name: str) -> Any:
    """``__version__``, looked up when asked for: reading the installed metadata costs tens
    of milliseconds that every daemon and CLI start would otherwise pay."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("refmount")
    except PackageNotFoundError:  # running from a source tree without installation
        return "0.0.0+unknown"

__all__ = ["MountError", "__version__", "mounted", "served", "unmount"]
