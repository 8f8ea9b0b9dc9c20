"""Whether a mount answers ``OPEN`` with ``ENOSYS`` (FUSE's ``no_open``).

After one such answer the kernel sends no ``OPEN`` and no ``RELEASE`` for any file of the
mount, keeps each file's page cache across opens by itself, and sends its ``READ``\\ s with
file handle 0. Stock pyfuse3 then hands ``Operations.read`` that 0 and not the inode, so the
daemon could not tell which file is read; refmount's patch of pyfuse3
(``patches/pyfuse3-noopen.patch``, applied by ``scripts/setup.sh``) passes the request's
inode instead and marks the module with ``REFMOUNT_READ_INODE``. A mount with ``-o no_open``
checks the marker at start; without it the mount opens files as before (one log line says
so).

``REFMOUNT_PYFUSE3_STOCK=1`` in the daemon's environment makes it behave as with a stock
pyfuse3 (what the tests of that path use).
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

MARKER = "REFMOUNT_READ_INODE"
STOCK_ENV = "REFMOUNT_PYFUSE3_STOCK"


def reads_by_inode(pyfuse3: Any) -> bool:
    """Whether ``pyfuse3`` hands ``read`` the inode when the file handle is 0 (the patch)."""
    if os.environ.get(STOCK_ENV, "") not in ("", "0"):
        return False
    return getattr(pyfuse3, MARKER, False) is True


def choose_no_open(pyfuse3: Any) -> bool:
    """Whether the mount's files are read without OPEN; logs the one line when not."""
    if reads_by_inode(pyfuse3):
        return True
    log.info("pyfuse3 %s lacks refmount's no_open patch (scripts/setup.sh builds it): "
             "each file is opened and released (2 more requests a file)",
             getattr(pyfuse3, "__version__", "?"))
    return False
