"""Handing chunks to the kernel's page cache before they are read (``FUSE_NOTIFY_STORE``).

A reader going through chunks in order finds most of them already read ahead in the
daemon's memory. Still, each chunk costs a ``READ`` round trip: the kernel asks, the daemon
answers from memory, the reader waits for both. When a chunk that is already in memory is
*opened*, ``PagePusher`` instead stores its bytes in the file's page cache before the open
is answered (the kernel knows the inode by then: it has just been looked up), so the
reader's ``read()`` is a page-cache hit and no ``READ`` reaches the daemon at all.

The kernel locks each page it stores into, and a page stays locked while a ``READ`` of it
waits for the daemon: a store into such a page from the FUSE thread would wait for itself.
So the caller pushes only for an open with no other open handle of the same file in the
daemon — a ``READ`` always belongs to an open handle (the kernel releases a handle only
after its reads, readahead included, are answered), so then none can be outstanding.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from refmount.base.lru import LRU
from refmount.base.stats import Stats
from refmount.cache.blocks import Block

log = logging.getLogger(__name__)


class PagePusher:
    REMEMBERED = 1 << 17  # inodes whose bytes the kernel got (pushed or read): not pushed again

    def __init__(self, store: Callable[[int, int, Block], None], stats: Stats) -> None:
        self._store = store
        self.stats = stats
        self._given: LRU[int, bool] = LRU(self.REMEMBERED)
        self.enabled = True

    def wanted(self, inode: int) -> bool:
        """Whether pushing this inode's bytes may save a READ (the kernel has not had them)."""
        return self.enabled and inode not in self._given

    def given(self, inode: int) -> None:
        """The kernel got this inode's bytes (a READ answered them): no push on later opens."""
        self._given.put(inode, True)

    def push(self, inode: int, data: Block) -> None:
        """Store ``data`` (the whole file) in the page cache of ``inode`` (see the module doc
        for when this is safe). The kernel copies it; the GIL is released meanwhile."""
        if not self.enabled:
            return
        self.given(inode)
        try:
            self._store(inode, 0, data)
            self.stats.pushed += len(data)
        except OSError as e:
            if e.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
                log.info("the kernel does not take page-cache stores: chunks go by READ")
                self.enabled = False
            # Anything else (ENOENT: the kernel forgot the inode): its READ will come.
