"""Credentials that refresh: storage options printed by a command, renewed before they expire.

A target rule may name a *credential process* (``"credentials": {"process": [cmd, args...]}``),
like AWS's ``credential_process``: refmount runs the command (no shell, the serving process's
environment, stdin from ``/dev/null``) and reads on its stdout one JSON object in either
format:

* refmount's own: ``{"options": {...fsspec storage options...}, "expiry": E}``, where ``E`` is
  an ISO 8601 time (``2026-11-26T16:00:00Z``; without a zone, UTC), seconds since the epoch,
  or ``null`` (never expires: the command runs once). An HTTP bearer token is
  ``{"options": {"headers": {"Authorization": "Bearer ..."}}}``: fsspec's HTTP file system
  sends the ``headers`` storage option with every request;
* AWS's ``credential_process`` format: ``{"Version": 1, "AccessKeyId": ..., "SecretAccessKey":
  ..., "SessionToken": ..., "Expiration": "<ISO 8601>"}``, given to s3fs as its ``key``,
  ``secret`` and ``token`` options.

``CredentialProcess`` holds the current credential and its *generation* (1 for the first, one
more for each refresh). ``options()`` returns the generation and the options valid now; the
fetcher keys its file system instances by generation, so reads in flight finish on the old
instance while new reads use the new one. ``run()``, in the serving process's nursery, fetches
the first credential at once and each next one ``refresh_margin`` before the current one
expires (at most a quarter of its lifetime before, at most once a second), and retries a
failed run with backoff (1 s doubling to 60 s). A credential is not used in the last tenth of
its lifetime (at most 30 s). A failure is logged once, with the command's exit status and the
redacted, truncated last line of its stderr; while it lasts, a still valid credential goes on
being used and, once it has expired, reads that need it fail with ``CredentialError`` (``EIO``).
Success after failures is logged once too.

What the command prints is never logged, shown or put in an error: a refusal names only what is
wrong with it (not JSON, a missing field, its size, an expiry in the past). Bounds: the command
runs at most ``timeout`` seconds (then its process group is killed) and may print at most
``max_output`` bytes (64 KiB; more and it is killed).

Running the command is ``targets/credentialcommand.py``; reading what it prints,
``targets/credentialoutput.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import trio

from refmount.base.errors import FetchError, ReadError
from refmount.base.redact import redact_url
from refmount.base.singleflight import SingleFlight
from refmount.targets.credentialcommand import (
    DEFAULT_TIMEOUT,
    MAX_OUTPUT,
    ProcessFailed,
    run_command,
    shown_command,
)
from refmount.targets.credentialoutput import Credential, parse_output, utc

__all__ = ["CredentialError", "CredentialProcess", "RuleCredentials"]

log = logging.getLogger(__name__)

DEFAULT_MARGIN = 300.0  # refresh this long before the expiry (at most a quarter of the lifetime)
MIN_BACKOFF = 1.0
MAX_BACKOFF = 60.0
MAX_SLEEP = 60.0  # the wall clock is looked at again at least this often (suspend, clock steps)


class CredentialError(ReadError):
    """No valid credential is available for a read: its reply is ``EIO``. The message names
    the rule's label and why, never a credential. ``logged`` is set: the credential process's
    failure was logged once, with its details, when it happened."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(redact_url(message))
        self.reason = redact_url(reason or message)  # why, without the label
        self.logged = True


Runner = Callable[[Sequence[str]], Awaitable[bytes]]


class CredentialProcess:
    """The credential of one rule, from its command (see the module's docstring).

    ``label`` names the rule in messages (never a secret). ``clock`` is the wall clock
    (seconds since the epoch) that expiries are compared with; ``runner`` runs the command
    and returns its stdout (default: ``run_command`` with ``timeout``)."""

    def __init__(self, argv: Sequence[str], *, label: str,
                 refresh_margin: float = DEFAULT_MARGIN, timeout: float = DEFAULT_TIMEOUT,
                 max_output: int = MAX_OUTPUT, clock: Callable[[], float] = time.time,
                 runner: Runner | None = None, min_backoff: float = MIN_BACKOFF,
                 max_backoff: float = MAX_BACKOFF,
                 on_change: Callable[[CredentialProcess], None] | None = None,
                 number: int = 0) -> None:
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError("a credential process is a non-empty list of non-empty strings")
        self.argv = tuple(argv)
        self.label = label
        self.number = number  # the target rule's (0: none)
        self.refresh_margin = refresh_margin
        self.clock = clock
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self._runner: Runner = runner or (
            lambda a: run_command(a, timeout=timeout, max_output=max_output))
        self._current: Credential | None = None
        self._generation = 0
        self._flight: SingleFlight[None, Credential] = SingleFlight()
        self._failure: str | None = None  # why the last run gave nothing (None: it did)
        self._failures = 0  # runs in a row that failed
        self._retry_at = 0.0  # on the wall clock: no run before (after a failure)
        self._running = False  # run() is refreshing in the background
        self._changed = trio.Event()
        self.refreshes = 0  # credentials received
        self.failures = 0  # runs that gave none
        self._on_change = on_change  # told after each run (stats)

    @property
    def generation(self) -> int:
        """1 for the first credential, one more for each refresh (0: none yet)."""
        return self._generation

    @property
    def expiry(self) -> float | None:
        return None if self._current is None else self._current.expiry

    def describe(self) -> dict[str, Any]:
        """What may be shown of it (stats): the command's name, the generation, the expiry,
        the failures; never the options."""
        return {"command": shown_command(self.argv), "generation": self._generation,
                "expiry": None if self.expiry is None else utc(self.expiry),
                "refreshes": self.refreshes, "failures": self.failures,
                "failing": self._failure is not None}

    # ---- what the fetcher asks -----------------------------------------------------------
    async def options(self) -> tuple[int, dict[str, Any]]:
        """The generation and the storage options valid now. Runs the command when there is
        no valid credential (once for all concurrent callers; within the backoff after a
        failure, not again), and when a refresh is due and ``run()`` is not running. Raises
        ``CredentialError`` when no valid credential can be had."""
        now = self.clock()
        cred = self._current
        if cred is not None and cred.valid(now):
            due = cred.refresh_at(self.refresh_margin)
            if due is not None and now >= due and not self._running and now >= self._retry_at:
                with contextlib.suppress(CredentialError):
                    await self.refresh()
                now = self.clock()
                if self._current is not None and self._current.valid(now):
                    cred = self._current
            return self._generation, dict(cred.options)
        if now < self._retry_at and self._flight_idle():
            raise self._error()
        await self.refresh()
        cred = self._current
        assert cred is not None
        return self._generation, dict(cred.options)

    def _flight_idle(self) -> bool:
        return None not in self._flight

    def _error(self) -> CredentialError:
        why = self._failure or "the credential expired"
        return CredentialError(f"credentials for {self.label} unavailable: {why}", why)

    async def refresh(self) -> Credential:
        """Run the command now (joining a run under way): the new credential, or
        CredentialError (with the failure logged once)."""
        return await self._flight.run(None, self._refresh)

    async def _refresh(self) -> Credential:
        try:
            out = await self._runner(self.argv)
            try:
                cred = parse_output(out, now=self.clock())
            except ValueError as e:
                raise ProcessFailed(f"{shown_command(self.argv)}: {e}") from None
        except ProcessFailed as e:
            self._failed(e)
            raise self._error() from None
        except Exception as e:  # a bug must not end the mount: a failed run like any other
            self._failed(ProcessFailed(f"{shown_command(self.argv)}: unexpected "
                                       f"{type(e).__name__} in refmount"))
            raise self._error() from None
        self._current = cred
        self._generation += 1
        self.refreshes += 1
        if self._failure is not None:
            log.warning("credentials for %s: %s works again after %d failed runs; "
                        "generation %d, valid until %s", self.label,
                        shown_command(self.argv), self._failures, self._generation,
                        "further notice" if cred.expiry is None else utc(cred.expiry))
        else:
            log.info("credentials for %s: generation %d, valid until %s", self.label,
                     self._generation, "further notice" if cred.expiry is None
                     else utc(cred.expiry))
        self._failure, self._failures, self._retry_at = None, 0, 0.0
        self._wake()
        return cred

    def _failed(self, e: ProcessFailed) -> None:
        self.failures += 1
        self._failures += 1
        delay = min(self.min_backoff * 2 ** (self._failures - 1), self.max_backoff)
        self._retry_at = self.clock() + delay
        first = self._failure is None
        self._failure = e.reason
        if first:
            now = self.clock()
            cred = self._current
            if cred is not None and cred.valid(now):
                until = cred.usable_until
                assert until is not None and cred.expiry is not None
                then = (f"the current credential is used until {utc(until)} (it expires at "
                        f"{utc(cred.expiry)}), then reads that need it fail with EIO")
            else:
                then = "reads that need it fail with EIO"
            log.error("credentials for %s: %s%s; %s until it succeeds (retrying in %g s, "
                      "backing off to %g s)", self.label, e.reason,
                      f": {redact_url(e.detail)}" if e.detail else "", then, delay, self.max_backoff)
        else:
            log.debug("credentials for %s: run %d failed again: %s", self.label,
                      self._failures, e.reason)
        self._wake()

    def _wake(self) -> None:
        if self._on_change is not None:
            self._on_change(self)
        self._changed.set()
        self._changed = trio.Event()

    # ---- the background refresh ----------------------------------------------------------
    async def run(self) -> None:
        """Fetch the first credential now and each next one before the current one expires;
        after a failure, again with backoff. Runs until cancelled."""
        self._running = True
        try:
            while True:
                now = self.clock()
                cred = self._current
                if now >= self._retry_at:
                    due = 0.0 if cred is None else cred.refresh_at(self.refresh_margin)
                    if due is not None and now >= due:
                        with contextlib.suppress(CredentialError):
                            await self.refresh()
                        continue
                    wait = (due - now) if due is not None else math.inf
                else:
                    wait = self._retry_at - now
                changed = self._changed
                with trio.move_on_after(min(wait, MAX_SLEEP)):
                    await changed.wait()
        finally:
            self._running = False


class CredentialRule(Protocol):
    """What ``RuleCredentials`` needs of a target rule (``targets.Rule``)."""

    number: int
    prefix: str
    credentials: tuple[str, ...] | None

    def describe(self) -> str: ...


class RuleCredentials:
    """The credential processes of a mount's target rules: one ``CredentialProcess`` per
    rule that names one. Called with a rule, it is the fetcher's credential provider
    (``Fetcher(credentials=...)``): the generation and options valid now, or a ``FetchError``
    of the rule's prefix (``EIO``, already logged) when there are none. ``run()`` refreshes
    them all in the background (``SetCore.start``)."""

    def __init__(self, rules: Iterable[CredentialRule], *, timeout: float = DEFAULT_TIMEOUT,
                 refresh_margin: float = DEFAULT_MARGIN,
                 shown: dict[str, dict[str, Any]] | None = None) -> None:
        """``shown`` (``Stats.credentials``) is kept up to date with ``describe()``."""
        self._shown = shown

        def changed(process: CredentialProcess) -> None:
            if self._shown is not None:
                self._shown[str(process.number)] = process.describe()

        self._processes = {
            r.number: CredentialProcess(r.credentials, label=f"target rule {r.describe()}",
                                        timeout=timeout, refresh_margin=refresh_margin,
                                        on_change=changed, number=r.number)
            for r in rules if r.credentials is not None}
        for process in self._processes.values():
            changed(process)

    def __bool__(self) -> bool:
        return bool(self._processes)

    async def __call__(self, rule: CredentialRule) -> tuple[int, dict[str, Any]]:
        process = self._processes.get(rule.number)
        if process is None:
            raise FetchError(rule.prefix, f"target rule {rule.number} has no credential process")
        try:
            return await process.options()
        except CredentialError as e:
            error = FetchError(rule.prefix, f"no valid credentials from the credential process "
                                            f"of target rule {rule.number}: {e.reason}")
            error.logged = True  # the process's failure was logged once, when it happened
            raise error from None

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per rule number, what may be shown of its credential (never the options)."""
        return {str(n): p.describe() for n, p in self._processes.items()}

    async def run(self) -> None:
        """Refresh every rule's credential before it expires, until cancelled."""
        async with trio.open_nursery() as nursery:
            for process in self._processes.values():
                nursery.start_soon(process.run)
