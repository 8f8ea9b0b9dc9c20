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
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import trio

from refmount.base.errors import FetchError, ReadError
from refmount.base.redact import redact_url
from refmount.base.singleflight import SingleFlight
from refmount.targets import reaper

__all__ = ["Credential", "CredentialError", "CredentialProcess", "RuleCredentials",
           "merge_options", "parse_output", "run_command"]

log = logging.getLogger(__name__)

MAX_OUTPUT = 64 * 2**10  # bytes a credential process may print on stdout
MAX_STDERR = 64 * 2**10  # bytes of its stderr kept (the rest is read and dropped)
STDERR_SHOWN = 200  # characters of its stderr's last line shown in the log
DEFAULT_MARGIN = 300.0  # refresh this long before the expiry (at most a quarter of the lifetime)
DEFAULT_TIMEOUT = 30.0
MIN_BACKOFF = 1.0
MAX_BACKOFF = 60.0
EXPIRY_SKEW = 30.0  # a credential is not used in the last tenth of its lifetime, at most this
MIN_INTERVAL = 1.0  # the background refresh runs the command at most once a second
MAX_SLEEP = 60.0  # the wall clock is looked at again at least this often (suspend, clock steps)

_REFMOUNT_FIELDS = {"options", "expiry"}
_AWS_FIELDS = {"Version", "AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"}


class CredentialError(ReadError):
    """No valid credential is available for a read: its reply is ``EIO``. The message names
    the rule's label and why, never a credential. ``logged`` is set: the credential process's
    failure was logged once, with its details, when it happened."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(redact_url(message))
        self.reason = redact_url(reason or message)  # why, without the label
        self.logged = True


class ProcessFailed(Exception):
    """One run of the command gave no credential. ``reason`` is safe to show everywhere;
    ``detail`` (the redacted, truncated end of its stderr) only in the log line."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Credential:
    """Storage options and when they stop being valid (seconds since the epoch; None:
    never). ``issued`` is when refmount received them."""

    options: Mapping[str, Any]
    expiry: float | None
    issued: float

    def __repr__(self) -> str:  # the options never reach a log through a repr
        return f"Credential(expiry={self.expiry!r}, issued={self.issued!r}, options=***)"

    @property
    def usable_until(self) -> float | None:
        """When it stops being used: shortly before its expiry (a tenth of its lifetime, at
        most ``EXPIRY_SKEW`` s), so that no request leaves with a credential about to expire
        (a server's clock, a request queued behind others)."""
        if self.expiry is None:
            return None
        return self.expiry - min(EXPIRY_SKEW, max(self.expiry - self.issued, 0.0) / 10)

    def refresh_at(self, margin: float) -> float | None:
        """When to fetch the next one: ``margin`` before the expiry, but no earlier than
        three quarters of the way through its lifetime (and before it stops being used)."""
        if self.expiry is None:
            return None
        lifetime = max(self.expiry - self.issued, 0.0)
        until = self.usable_until
        assert until is not None
        # Never sooner than MIN_INTERVAL after the last: a command printing credentials that
        # live a moment does not make a busy loop.
        return max(min(self.expiry - min(margin, lifetime / 4), until),
                   self.issued + MIN_INTERVAL)

    def valid(self, now: float) -> bool:
        until = self.usable_until
        return until is None or now < until


def parse_expiry(value: Any) -> float | None:
    """An expiry as seconds since the epoch: ISO 8601 text (UTC if it names no zone), a
    number of seconds since the epoch, or None. ValueError naming the problem (the value is
    not repeated: it is part of the output, which is never shown)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("the expiry is true or false, not a time")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("the expiry is not a positive number of seconds since the epoch")
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("the expiry is not an ISO 8601 time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    raise ValueError(f"the expiry is a JSON {type(value).__name__}, not a time or a number")


def parse_output(data: bytes, *, now: float) -> Credential:
    """The credential a process printed (see the module's docstring). ValueError naming what
    is wrong, never quoting the output."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("its output is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"its output is not JSON (line {e.lineno}, column {e.colno})") from None
    if not isinstance(doc, dict):
        raise ValueError("its output is not a JSON object")
    if "Version" in doc:
        unknown = sorted(set(doc) - _AWS_FIELDS)
        if doc["Version"] != 1:
            raise ValueError("its output has \"Version\" other than 1 (AWS credential_process "
                             "format Version 1 is understood)")
        options: dict[str, Any] = {}
        for field, option in (("AccessKeyId", "key"), ("SecretAccessKey", "secret"),
                              ("SessionToken", "token")):
            value = doc.get(field)
            if value is None and field == "SessionToken":
                continue
            if not isinstance(value, str) or not value:
                raise ValueError(f"its output has no \"{field}\" string (AWS credential_process "
                                 "format)")
            options[option] = value
        expiry = parse_expiry(doc.get("Expiration"))
    elif "options" in doc:
        unknown = sorted(set(doc) - _REFMOUNT_FIELDS)
        options = doc["options"]
        if not isinstance(options, dict):
            raise ValueError("its \"options\" is not a JSON object of storage options")
        expiry = parse_expiry(doc.get("expiry"))
    else:
        raise ValueError("its output has neither \"options\" (refmount's format) nor "
                         "\"Version\" (AWS credential_process format)")
    if unknown:
        raise ValueError(f"its output has unknown fields: {', '.join(map(repr, unknown))[:200]}")
    if expiry is not None and expiry <= now:
        ago = now - expiry
        raise ValueError(f"the credential it printed expired {ago:.0f} s ago "
                         f"({_utc(expiry)}): is the clock right?")
    return Credential(options, expiry, now)


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def merge_options(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` on top; a value that is an object in both (``headers``,
    ``client_kwargs``) is merged the same way, so a credential's ``Authorization`` header
    keeps the rule's other headers."""
    out = dict(base)
    for name, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(name), Mapping):
            out[name] = merge_options(out[name], value)
        else:
            out[name] = value
    return out


def _last_line(stderr: bytes) -> str:
    """The last non-empty line of a process's stderr, redacted and cut short, for the log."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    last = redact_url("".join(c if c.isprintable() else "?" for c in last))
    return last if len(last) <= STDERR_SHOWN else last[:STDERR_SHOWN] + "…"


def shown_command(argv: Sequence[str]) -> str:
    """The command as messages name it: its arguments (configuration, not secrets, but
    redacted all the same), cut short."""
    text = redact_url(shlex.join(argv))
    return text if len(text) <= 100 else text[:100] + "…"


def command_problem(argv: Sequence[str]) -> str | None:
    """Why ``argv`` cannot be run as a credential process (None: it can be): a relative path
    (the detached daemon runs in ``/``), a command that is not on ``PATH`` or not an
    executable file. Checked when the option is read, so that a typo stops refmount."""
    command = argv[0]
    if "/" in command:
        if not os.path.isabs(command):
            return (f"{command!r} is a relative path: give an absolute path or a command "
                    "name found on PATH")
        if not (os.path.isfile(command) and os.access(command, os.X_OK)):
            return f"{command} is not an executable file"
        return None
    if shutil.which(command) is None:
        return f"no command {command!r} on PATH"
    return None


def _stop(proc: trio.Process) -> None:
    """Ask the reaper (targets/reaper.py) to kill the command and every descendant it has."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()


def _kill_group(proc: trio.Process) -> None:
    """The reaper did not end in time: its process group, and it, killed outright."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _startable(argv: Sequence[str]) -> str | None:
    """Why ``argv[0]`` cannot be started (as ``execvp`` would find it), or None."""
    command = argv[0]
    path = command if "/" in command else shutil.which(command)
    if path is None or not os.path.exists(path):
        return os.strerror(errno.ENOENT)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        return os.strerror(errno.EACCES)
    return None


async def run_command(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT,
                      max_output: int = MAX_OUTPUT) -> bytes:
    """What ``argv`` prints on stdout (at most ``max_output`` bytes), run with no shell, the
    environment inherited, stdin from ``/dev/null``, in a session of its own. ProcessFailed
    if it cannot start, runs longer than ``timeout`` or prints more than ``max_output`` (its
    process group is then killed), or exits with a non-zero status (the end of its stderr
    in ``detail``)."""
    name = shown_command(argv)
    if (why := _startable(argv)) is not None:
        raise ProcessFailed(f"cannot run {name}: {why}")
    try:  # under the reaper: the command and every process it starts end together
        proc = await trio.lowlevel.open_process(
            reaper.command(list(argv)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise ProcessFailed(f"cannot run {name}: {e.strerror or type(e).__name__}") from None
    out, err = bytearray(), bytearray()
    too_big = False

    async def read_stdout() -> None:
        nonlocal too_big
        assert proc.stdout is not None
        while chunk := await proc.stdout.receive_some(65536):
            out.extend(chunk)
            if len(out) > max_output:
                too_big = True
                _stop(proc)
                return

    async def read_stderr() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some(65536):
            if len(err) < MAX_STDERR:
                err.extend(chunk[: MAX_STDERR - len(err)])

    try:
        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_stdout)
                nursery.start_soon(read_stderr)
                await proc.wait()
                if too_big:
                    nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None or scope.cancelled_caught or too_big:
            _stop(proc)
        with trio.CancelScope(shield=True):
            with trio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                _kill_group(proc)
                with trio.move_on_after(5):
                    await proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                    await stream.aclose()
    if too_big:
        raise ProcessFailed(f"{name} printed more than {max_output} bytes: killed")
    if scope.cancelled_caught:
        raise ProcessFailed(f"{name} did not finish within {timeout:g} s: killed",
                            _last_line(bytes(err)))
    if proc.returncode != 0:
        status = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                  else f"exit status {proc.returncode}")
        raise ProcessFailed(f"{name} failed ({status})", _last_line(bytes(err)))
    return bytes(out)


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
                "expiry": None if self.expiry is None else _utc(self.expiry),
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
                        "further notice" if cred.expiry is None else _utc(cred.expiry))
        else:
            log.info("credentials for %s: generation %d, valid until %s", self.label,
                     self._generation, "further notice" if cred.expiry is None
                     else _utc(cred.expiry))
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
                then = (f"the current credential is used until {_utc(until)} (it expires at "
                        f"{_utc(cred.expiry)}), then reads that need it fail with EIO")
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
