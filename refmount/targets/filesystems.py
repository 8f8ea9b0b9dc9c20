"""The fetcher's fsspec file systems, driven from trio (a part of ``Fetcher``, targets/fetch.py): one
per target rule, credential generation and protocol; where a target is read (its route) and
with which storage options; every call into them.

The daemon runs trio as a guest of an asyncio loop (``daemon.serve``), and fsspec's async
filesystems (http, s3, gcs, ...) are bound to that same loop: a fetch is an asyncio task
created on the thread trio runs on, and its completion wakes the trio task through the
trio token. One thread runs all the Python of the read path, so the FUSE side and the
HTTP side never fight over the GIL (with fsspec's own loop thread, that contention cost
more CPU than the work itself). Without a bound loop (tools, tests) coroutines go to
fsspec's loop thread with ``run_coroutine_threadsafe``. Synchronous filesystems (local
files, chained URLs) run on trio worker threads under a capacity limiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import fsspec
import trio
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from refmount.base.errors import FetchError
from refmount.base.redact import redact_url
from refmount.base.urls import is_chained, protocol
from refmount.base.workers import await_future
from refmount.targets import localfile
from refmount.targets.credentialoutput import merge_options
from refmount.targets.policy import TargetPolicy
from refmount.targets.rules import Route, Rule, TargetRules, options_for

# A credential provider (targets/credentials.py): the storage options a rule's credential process
# gives now, with their generation (a new one after each refresh).
CredentialProvider = Callable[[Rule], Awaitable[tuple[int, dict[str, Any]]]]


async def await_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` as a task of ``loop`` — the loop trio is a guest of, on this thread —
    and wait for it in trio; cancel it if we are cancelled."""
    task = loop.create_task(coro)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    task.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except BaseException:
        task.cancel()
        raise
    return task.result()


def redirects_refused(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for the chained URL ``url`` with its HTTP links made to refuse any
    redirect: fsspec reads them itself (not through ``targets/httpread.py``, where redirects
    are decided on), and aiohttp raises ``TooManyRedirects`` at the first redirect when
    ``max_redirects`` is 1 (0 would mean no limit)."""
    links = {protocol(link) for link in url.split("::")} & {"http", "https"}
    if not links:
        return options
    out = dict(options)
    for name in links:
        link = dict(out.get(name) or {})
        link.pop("allow_redirects", None)
        link["max_redirects"] = 1
        out[name] = link
    return out


class FileSystems:
    """The file systems and routes of a ``Fetcher`` (its ``__init__`` sets the attributes)."""

    remote_options: dict[str, Any]
    rules: TargetRules
    policy: TargetPolicy
    timeout: float
    _credentials: CredentialProvider | None
    _route: Callable[[str], Route]
    _static: dict[int, dict[str, Any]]
    _fs: dict[tuple[int, int, str], AbstractFileSystem]
    _loop: asyncio.AbstractEventLoop | None
    _nursery: trio.Nursery | None
    _threads: trio.CapacityLimiter

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create async filesystems on ``loop``, the loop trio runs as a guest of."""
        self._loop = loop

    async def aclose(self) -> None:
        """Close the HTTP sessions of filesystems bound to our loop (on that loop)."""
        for fs in self._fs.values():
            session = getattr(fs, "_session", None)
            if getattr(fs, "asynchronous", False) and session is not None:
                with contextlib.suppress(Exception):
                    await session.close()

    async def _run(self, fs: AbstractFileSystem, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is not None and getattr(fs, "asynchronous", False):
            # Created by resolve() for our loop (asynchronous instances use the running loop).
            return await await_task(self._loop, coro)
        return await await_future(asyncio.run_coroutine_threadsafe(coro, fs.loop))

    # ---- where a target is read, and with which options ---------------------------------
    def route(self, url: str) -> Route:
        """Where the target ``url`` is read: resolved by the policy, rewritten by the target
        rule with the longest matching prefix (``targets/rules.py``), each mirror's URL."""
        return self._route(url)

    def problem(self, url: str, *, resolve: bool) -> str | None:
        """Why the target ``url`` may not be read (None if it may): the policy's verdict on
        every URL it is read from (after the target rules). ``resolve``: see
        ``TargetPolicy.problem``."""
        for target in self.route(url).urls:
            reason = self.policy.problem(target, resolve=resolve)
            if reason:
                return reason
        return None

    LOAD_AHEAD_TARGETS = 1000  # targets whose file systems ``load_backends`` looks at

    def load_backends(self, urls: Iterable[str]) -> list[str]:
        """Import the fsspec file system classes that reading the first
        ``LOAD_AHEAD_TARGETS`` of ``urls`` goes through (after the target rules), other than
        local files; the protocols loaded. Blocking: for a worker thread once the set serves,
        so that its first fetch does not import them (fsspec's HTTP file system imports
        aiohttp and makes its TLS contexts: about 0.16 s of CPU). A protocol fsspec cannot
        load is left to the fetch that needs it, which reports it."""
        names: set[str] = set()
        for url in itertools.islice(urls, self.LOAD_AHEAD_TARGETS):
            names.update(protocol(target) for target in self.route(url).urls if not is_chained(target))
        loaded = []
        for name in sorted(names - {"file", "local"}):
            try:
                fsspec.get_filesystem_class(name)
            except Exception:  # unknown, or its package is not installed
                continue
            loaded.append(name)
        return loaded

    def static_options(self, rule: Rule | None) -> dict[str, Any]:
        """The storage options of targets under ``rule`` (None: no rule) as configured:
        ``remote_options`` with the rule's merged over them (not a credential process's)."""
        number = rule.number if rule is not None else 0
        options = self._static.get(number)
        if options is None:
            options = self._static[number] = options_for(rule, self.remote_options)
        return options

    def describe(self, url: str) -> dict[str, str]:
        """With target rules: the URL(s) ``url`` is read from (mirrors one per line) and the
        rule that applied ("none"), redacted, for xattrs. Without rules: nothing."""
        if not self.rules:
            return {}
        route = self.route(url)
        return {"resolved": "\n".join(redact_url(u) for u in route.urls),
                "rule": route.rule.describe() if route.rule is not None else "none"}

    async def _options_for(self, rule: Rule | None) -> tuple[int, dict[str, Any]]:
        """(generation, storage options) for targets under ``rule``. The one place options
        are computed for a fetch: a rule with a credential process gets that process's
        current options over its own, and a new generation when they are refreshed — a new
        file system instance then, while reads in flight finish on the old one."""
        options = self.static_options(rule)
        if rule is None or rule.credentials is None:
            return 0, options
        if self._credentials is None:
            raise FetchError(rule.prefix, f"target rule {rule.describe()}: credential processes "
                                          "are not supported by this version of refmount")
        generation, fresh = await self._credentials(rule)
        return generation, merge_options(options, fresh)

    async def _open(self, rule: Rule | None, url: str) -> tuple[AbstractFileSystem, str]:
        """The file system that reads ``url`` (a URL from a route) under ``rule``, and the
        path in it."""
        generation, options = await self._options_for(rule)
        if is_chained(url):  # chained URL: let fsspec build the chain each time (cached inside)
            return url_to_fs(url, **redirects_refused(url, options))
        name = protocol(url)
        key = (rule.number if rule is not None else 0, generation, name)
        fs = self._fs.get(key)
        if fs is None:
            cls = fsspec.get_filesystem_class(name)
            options = dict(options)
            if rule is not None and rule.credentials is not None:
                # Refreshed credentials make new instances: none kept in fsspec's cache.
                options["skip_instance_cache"] = True
            if getattr(cls, "async_impl", False):
                if self._loop is not None:
                    options["asynchronous"] = True
                    # Our own instance: ``aclose`` closes its session, and fsspec's cache
                    # would hand the same one to every fetcher on this thread (each set of a
                    # catalogue, each version of a set being reloaded).
                    options["skip_instance_cache"] = True
                else:
                    options.setdefault("asynchronous", False)
            fs = self._fs[key] = cls(**options)
            self._retire_older(key, fs)
        return fs, fs._strip_protocol(url)

    def _retire_older(self, key: tuple[int, int, str], fs: AbstractFileSystem) -> None:
        """Forget the instances of older credential generations of ``key``'s rule and
        protocol; their sessions close once reads still using them are done (their
        deadline: ``timeout``)."""
        number, generation, name = key
        old = [k for k in self._fs if k[0] == number and k[2] == name and k[1] < generation]
        for k in old:
            previous = self._fs.pop(k)
            if previous is not fs and self._nursery is not None:
                self._nursery.start_soon(self._close_later, previous)

    async def _close_later(self, fs: AbstractFileSystem) -> None:
        await trio.sleep(2 * self.timeout)
        session = getattr(fs, "_session", None)
        if getattr(fs, "asynchronous", False) and session is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                await await_task(self._loop, session.close())

    # ---- the bridge ---------------------------------------------------------------------
    # ``url`` is the URL read (a route's: after the target rules), for the policy.
    async def _call(self, url: str, fs: AbstractFileSystem, method: str, *args: Any, **kw: Any) -> Any:
        if getattr(fs, "async_impl", False) and (
            getattr(fs, "asynchronous", False) or getattr(fs, "loop", None) is not None
        ):
            reason = self.policy.problem(url, resolve=False)  # remote: no local I/O to do
            if reason:
                raise FetchError(url, reason, errno.EACCES)
            return await self._run(fs, getattr(fs, "_" + method)(*args, **kw))
        fn: Callable[..., Any] = getattr(fs, method)
        if isinstance(fs, LocalFileSystem):  # opened beneath the allowed directories, no symlinks
            fn = functools.partial(localfile.call, method, self.policy.roots)

        def checked() -> Any:
            # Local (or chained) target: resolve symlinks right before opening, in the thread.
            reason = self.policy.problem(url, resolve=True)
            if reason:
                raise FetchError(url, reason, errno.EACCES)
            return fn(*args, **kw)

        return await trio.to_thread.run_sync(checked, limiter=self._threads, abandon_on_cancel=True)
