"""When the sets of a mount are checked for changes: every ``reload`` seconds and on SIGUSR1.

A check re-reads the catalogue (``-o catalog``: sets appear, disappear, or change their
entry) and then identifies every opened set's SOURCE again (``Sets.check``: those that
changed are re-indexed in the background and swapped in). A catalogue that cannot be read
keeps the sets as they are, with the error logged and shown by ``refmount stats``. Checks
never overlap: a SIGUSR1 during one asks for another right after it.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import trio

from refmount.base.redact import redact_url
from refmount.sets.opensets import Sets

log = logging.getLogger(__name__)

CATALOG_UNREADABLE = "the catalogue cannot be read again: the sets stay as they are (the log says why)"

__all__ = ["Reloader", "watch_signals"]

ReadCatalog = Callable[[], Mapping[str, Any]]  # blocking: the catalogue's entries now


class Reloader:
    """Runs checks of ``sets``: every ``interval`` seconds (None: only when poked) and when
    :meth:`poke` is called (SIGUSR1)."""

    def __init__(self, sets: Sets, *, interval: float | None,
                 read_catalog: ReadCatalog | None = None) -> None:
        self.sets = sets
        self.interval = interval
        self.read_catalog = read_catalog
        self.checks = 0  # checks done
        self.last_check: float | None = None  # wall time the last check ended
        self.catalog_error: str | None = None  # CATALOG_UNREADABLE, or None
        self._catalog_reason: str | None = None  # why it could not be re-read (logged once)
        self._wake = trio.Event()
        self.done = trio.Event()  # set after each check (tests and tools wait on it)

    def poke(self) -> None:
        """Check now (or right after the check under way)."""
        self._wake.set()

    async def run(self) -> None:
        """Check whenever the interval passes or :meth:`poke` is called, forever."""
        wait = math.inf if self.interval is None else self.interval
        while True:
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.check()

    async def check(self) -> int:
        """One check: the catalogue, then every opened set. The number of sets swapped."""
        if self.read_catalog is not None:
            try:
                entries = await trio.to_thread.run_sync(self.read_catalog, abandon_on_cancel=True)
            except Exception as e:
                message = redact_url(str(e) or type(e).__name__)
                if message != self._catalog_reason:  # the reason in the log (once), never in stats
                    log.error("catalogue: cannot read it again, the sets stay as they are: %s",
                              message)
                self._catalog_reason = message
                self.catalog_error = CATALOG_UNREADABLE
            else:
                self.catalog_error = self._catalog_reason = None
                self.sets.update(entries)
        swapped = await self.sets.check()
        self.checks += 1
        self.last_check = time.time()
        done, self.done = self.done, trio.Event()
        done.set()
        return swapped

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reload": self.interval if self.interval is not None else "SIGUSR1",
                               "reload_checks": self.checks}
        if self.last_check is not None:
            out["last_check"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_check))
        if self.catalog_error is not None:
            out["catalog_error"] = self.catalog_error
        return out


async def watch_signals(reloader: Reloader) -> None:
    """SIGUSR1: check now. SIGUSR2: logged and ignored."""
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2) as signals:
        async for signum in signals:
            if signum == signal.SIGUSR1:
                log.info("received SIGUSR1: checking the sets for changes")
                reloader.poke()
            else:
                log.info("received %s: nothing to do, still serving", signal.Signals(signum).name)
