"""The ``templates`` of a Version 1 set, rendered with jinja2's SandboxedEnvironment
(reference files are untrusted): each rendering bounded in time by a watchdog, in output and
memory by the sandbox, and all of a set's renderings together by its CPU budget."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SecurityError

from refmount.base.lru import LRU
from refmount.refs.model import ReferenceSetError
from refmount.refs.sandbox import MAX_RENDERED, RENDER_MEMORY, BoundedSandbox, MemoryCap

RENDER_SECONDS = 2.0  # one template rendering may take at most this long
URL_CACHE_BYTES = 16 << 20  # rendered refs URLs kept for reuse


class RenderBudget:
    """The CPU seconds all template renderings of one set may take together (the limit
    ``max_template_seconds``): each rendering is bounded by the watchdog, but a set of many
    distinct templates, or a ``gen`` rendered product by product, adds them up. Time is
    counted while ``running`` (re-entrant: a batch of renderings is measured once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spent = 0.0
        self._since: float | None = None

    @contextmanager
    def running(self) -> Iterator[None]:
        if self._since is not None:
            yield
            return
        self._since = time.thread_time()
        try:
            yield
        finally:
            self.spent += time.thread_time() - self._since
            self._since = None

    @property
    def active(self) -> bool:
        return self._since is not None

    def used(self) -> float:
        """CPU seconds spent so far, the rendering under way included."""
        running = time.thread_time() - self._since if self._since is not None else 0.0
        return self.spent + running

    def exceeded(self) -> bool:
        return self.used() > self.seconds

    def message(self) -> str:
        return (f"the set's templates take more than {self.seconds:g} CPU seconds to render in all "
                f"(limit max_template_seconds={self.seconds:g})")


class Watchdog:
    """Interrupts a rendering that runs longer than RENDER_SECONDS, or past the set's
    RenderBudget (SIGALRM, main thread)."""

    def __init__(self, budget: RenderBudget) -> None:
        self.started: float | None = None
        self.budget = budget

    def _tick(self, signum: int, frame: Any) -> None:
        if self.started is None:
            return
        if time.monotonic() - self.started > RENDER_SECONDS:
            self.started = None
            raise TimeoutError(f"template rendering took longer than {RENDER_SECONDS:g} s")
        if self.budget.exceeded():
            self.started = None
            raise TimeoutError(self.budget.message())

    @contextmanager
    def armed(self) -> Iterator[Watchdog]:
        try:
            old = signal.signal(signal.SIGALRM, self._tick)
        except ValueError:  # not the main thread: no watchdog available
            yield self
            return
        signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
        try:
            yield self
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            signal.signal(signal.SIGALRM, old)


def _bounded(template: Any, context: dict[str, Any]) -> str:
    """Render as a stream and stop at MAX_RENDERED characters, so that a loop of large
    outputs is refused before it takes the memory, not after."""
    parts: list[str] = []
    size = 0
    for chunk in template.generate(context):
        size += len(chunk)
        if size > MAX_RENDERED:
            raise SecurityError(f"rendered text longer than {MAX_RENDERED} characters")
        parts.append(chunk)
    return "".join(parts)


class TemplateSet:
    """The ``templates`` section: plain strings are variables, strings containing
    ``{{`` become functions called with keyword arguments (``{{f(c='text')}}``)."""

    def __init__(self, templates: dict[str, Any], name: str, watchdog: Watchdog) -> None:
        self.env = BoundedSandbox(undefined=StrictUndefined, autoescape=False)
        self.name = name
        self.watchdog = watchdog
        self.budget = watchdog.budget
        self.plain: dict[str, str] = {}
        self.context: dict[str, Any] = {}
        for key, value in templates.items():
            if not isinstance(value, str):
                raise ReferenceSetError(f"{name}: templates.{key} must be a string")
            if "{{" in value or "{%" in value:
                template = self.compile(value, f"templates.{key}")
                self.context[key] = self._function(template, key)
            else:
                self.plain[key] = value
                self.context[key] = value
        self._url_cache: LRU[str, str] = LRU(100_000, max_weight=URL_CACHE_BYTES, weigh=len)
        self.memory_cap = MemoryCap()

    def _function(self, template: Any, key: str) -> Callable[..., str]:
        def call(**kwargs: Any) -> str:
            return _bounded(template, kwargs)

        call.__name__ = key
        return call

    def compile(self, source: str, where: str) -> Any:
        try:
            return self.env.from_string(source)
        except TemplateError as e:
            raise ReferenceSetError(f"{self.name}: {where}: bad template: {e}") from None

    def render(self, template: Any, context: dict[str, Any], where: str) -> str:
        with self.rendering(where):
            return self._render(template, context, where)

    @contextmanager
    def rendering(self, where: str) -> Iterator[None]:
        """Renderings inside count against the set's RenderBudget; refused once past it
        (checked when the outermost ``rendering`` ends, and by the watchdog meanwhile)."""
        outer = not self.budget.active
        with self.budget.running():
            yield
        if outer and self.budget.exceeded():
            raise ReferenceSetError(f"{self.name}: {where}: {self.budget.message()}")

    def _render(self, template: Any, context: dict[str, Any], where: str) -> str:
        self.watchdog.started = time.monotonic()
        try:
            with self.memory_cap:
                out = _bounded(template, context)
        except SecurityError as e:
            raise ReferenceSetError(f"{self.name}: {where}: template refused by sandbox: {e}") from None
        except MemoryError:
            raise ReferenceSetError(
                f"{self.name}: {where}: template refused: it needs more than "
                f"{RENDER_MEMORY >> 30} GiB of memory") from None
        except TimeoutError as e:
            if self.budget.exceeded():
                raise ReferenceSetError(f"{self.name}: {where}: {self.budget.message()}") from None
            raise ReferenceSetError(f"{self.name}: {where}: template failed: {e}") from None
        except (TemplateError, ArithmeticError, TypeError, ValueError) as e:
            raise ReferenceSetError(f"{self.name}: {where}: template failed: {e}") from None
        finally:
            self.watchdog.started = None
        return out

    def render_url(self, url: str) -> str:
        """A ``refs`` URL with templates applied (cached: many refs share a URL)."""
        if "{{" not in url and "{%" not in url:
            return url
        out = self._url_cache.get(url)
        if out is None:
            out = self.render(self.compile(url, f"url {url[:60]!r}"), self.context, "refs url")
            self._url_cache.put(url, out)
        return out
