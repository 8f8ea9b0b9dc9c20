"""How the fetcher tries a read (a part of ``Fetcher``, targets/fetch.py): one bound of connections
per host, retries with backoff under one deadline, mirrors tried in order and a failing one
remembered as down; what is permanent and what a backend's error says, in one line."""

from __future__ import annotations

import errno
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import trio

from refmount.base.errors import FetchError
from refmount.base.redact import redact_url
from refmount.base.stats import Stats
from refmount.targets.policy import TargetPolicy
from refmount.targets.rangeanswers import ShortRead
from refmount.targets.rules import Route

log = logging.getLogger(__name__)

# Errors that retrying cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
              ValueError, TypeError, NotImplementedError)


def mirror_down(e: BaseException) -> bool:
    """Whether a failed attempt says the mirror is down — no connection, a time-out, a 5xx,
    408 or 429 — so that the next mirror is tried, rather than answering: a 404 or 403
    (raised as permanent errors before this is asked), another 4xx, a short or shifted
    range (retried on the same mirror)."""
    if isinstance(e, ShortRead):
        return False
    status = getattr(e, "status", None)  # aiohttp's ClientResponseError
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    return True


def describe(exc: BaseException) -> str:
    """One line for a backend exception, with any URL in it redacted."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_url(f"{type(exc).__name__}: {text[:200]}")


class Retries:
    """The attempts of a ``Fetcher`` (its ``__init__`` sets the attributes)."""

    # A mirror that failed (no connection, 5xx, time-out) is tried last for this long.
    MIRROR_DOWN = 30.0

    policy: TargetPolicy
    timeout: float
    retries: int
    stats: Stats
    max_connections: int
    route: Callable[[str], Route]
    _down: dict[tuple[int, int], float]
    _host_limiters: dict[str, trio.CapacityLimiter]

    def _mirror_order(self, route: Route) -> list[int]:
        """The mirrors of ``route`` in the order to try them: those not known to be down in
        the rule's order, then those that failed within ``MIRROR_DOWN`` s."""
        if len(route.urls) == 1 or route.rule is None:
            return [0]
        now = trio.current_time()
        number = route.rule.number
        up = [i for i in range(len(route.urls)) if self._down.get((number, i), 0.0) <= now]
        return up + [i for i in range(len(route.urls)) if i not in up]

    def _mark_down(self, route: Route, mirror: int, why: str, then: int | None) -> None:
        """Remember that a mirror failed (``why``); one log line when it was not known to be
        down (``then``: the mirror read next)."""
        assert route.rule is not None
        key = (route.rule.number, mirror)
        now = trio.current_time()
        was_up = self._down.get(key, 0.0) <= now
        self._down[key] = now + self.MIRROR_DOWN
        if was_up:
            rewrite = route.rule.rewrite
            log.warning("target rule %s: mirror %s failed (%s); %s for %g s",
                        route.rule.describe(), redact_url(rewrite[mirror]), why,
                        f"reading from mirror {redact_url(rewrite[then])}" if then is not None
                        else "no other mirror left to read from", self.MIRROR_DOWN)
    def _limiter(self, url: str) -> trio.CapacityLimiter:
        """One bound per host, so a stalled server cannot take every slot from the others."""
        host = urlsplit(self.policy.full_url(url)).netloc.rpartition("@")[2] or "local"
        limiter = self._host_limiters.get(host)
        if limiter is None:
            limiter = self._host_limiters[host] = trio.CapacityLimiter(self.max_connections)
        return limiter

    async def _with_retries(self, url: str, what: str, op: Callable[[str], Awaitable[Any]]) -> Any:
        """Run ``op(target)`` with retries and exponential backoff, all within
        ``self.timeout``. ``target`` is the URL ``url`` is read from (``route``). With
        mirrors, each attempt reads from one mirror (never bytes of two in one answer): the
        first not known to be down; a mirror that is down (``mirror_down``; an attempt gets
        ``timeout / mirrors`` s) is remembered as such and the next one is tried at once,
        without using up a retry; an answer (404, 403, a bad range) is retried on the same
        mirror or is final."""
        route = self.route(url)
        urls = route.urls
        order = self._mirror_order(route)
        per_try = self.timeout / len(urls)
        attempt = pos = 0
        target = urls[order[0]]

        def via() -> str:
            return f" from {redact_url(target)}" if route.rewritten else ""

        with trio.move_on_after(self.timeout) as scope:
            while True:
                mirror = order[pos]
                target = urls[mirror]
                try:
                    async with self._limiter(target):
                        if len(urls) == 1:
                            return await op(target)
                        with trio.fail_after(per_try):
                            return await op(target)
                except _PERMANENT as e:
                    code = (errno.ENOENT if isinstance(e, FileNotFoundError)
                            else errno.EACCES if isinstance(e, PermissionError) else errno.EIO)
                    raise FetchError(url, f"{what}{via()}: {describe(e)}", code) from None
                except FetchError:
                    raise
                except Exception as e:
                    down = len(urls) > 1 and mirror_down(e)
                    why = (f"no answer within {per_try:g} s" if isinstance(e, trio.TooSlowError)
                           else describe(e))
                    if down:
                        then = order[pos + 1] if pos + 1 < len(order) else None
                        self._mark_down(route, mirror, why, then)
                        if then is not None:  # the next mirror, at once
                            pos += 1
                            continue
                    if attempt >= self.retries:
                        raise FetchError(
                            url, f"{what}{via()}: {why} (after {attempt + 1} attempts)"
                        ) from None
                    attempt += 1
                    self.stats.retried(url)
                    if down:  # every mirror failed: start again from the best one
                        order, pos = self._mirror_order(route), 0
                    delay = min(0.1 * 2 ** (attempt - 1), 2.0) * (0.5 + random.random())
                    log.debug("retry %d of %s for %s: %s", attempt, what, redact_url(target), why)
                    await trio.sleep(delay)
        assert scope.cancelled_caught
        raise FetchError(url, f"{what}{via()}: timed out after {self.timeout:g} s", errno.EIO,
                         timed_out=True)
