"""refmount: mount a kerchunk reference set as a read-only directory tree (FUSE)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .api import mounted, served, unmount
from .errors import MountError

try:
    __version__ = version("refmount")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = ["MountError", "__version__", "mounted", "served", "unmount"]
