"""Fetching bytes of reference targets through fsspec, from trio, without blocking it.

fsspec's async filesystems (http, s3, gcs, ...) run coroutines on fsspec's own asyncio
loop thread; we submit to that loop with ``run_coroutine_threadsafe`` and wake the trio
task through its token — no thread per request. Synchronous filesystems (local files,
chained URLs) run on trio worker threads under a capacity limiter. Every fetch has a
deadline covering its retries; cancellation propagates into the asyncio task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

import fsspec
import trio
from fsspec.core import url_to_fs
from fsspec.spec import AbstractFileSystem

from .stats import Stats

log = logging.getLogger(__name__)

# Errors that retrying cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
              ValueError, TypeError, NotImplementedError)


class ShortRead(OSError):
    """The target answered with fewer/more bytes than asked: retried, never served."""


class FetchError(Exception):
    """A fetch failed for good. ``str()`` is safe to log (no credentials)."""

    def __init__(self, url: str, reason: str, errno_: int = errno.EIO) -> None:
        super().__init__(f"{redact_url(url)}: {reason}")
        self.url = url
        self.reason = reason
        self.errno = errno_


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:x-amz-[a-z-]*|sig|signature|token|access_token|key|api_key|"
    r"x-goog-[a-z-]*|se|sp|sv)=)[^&#\s]*"
)


def redact_url(url: str) -> str:
    """Drop user:password@ and signature/token query values from a URL before logging."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("***@", url))


def describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:200]}"


async def await_future(fut: concurrent.futures.Future) -> Any:
    """Wait in trio for a future completed by another thread; cancel it if we are."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    fut.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        fut.cancel()
        raise
    return fut.result()


class Fetcher:
    def __init__(
        self,
        remote_protocol: str | None,
        remote_options: dict[str, Any],
        *,
        timeout: float,
        retries: int,
        max_connections: int,
        stats: Stats,
    ) -> None:
        self.remote_protocol = remote_protocol
        self.remote_options = remote_options
        self.timeout = timeout
        self.retries = retries
        self.stats = stats
        self._limiter = trio.CapacityLimiter(max_connections)
        self._threads = trio.CapacityLimiter(max(4, min(max_connections, 32)))
        self._fs: dict[str, AbstractFileSystem] = {}

    # ---- filesystem resolution ----------------------------------------------------------
    def resolve(self, url: str) -> tuple[AbstractFileSystem, str]:
        if "://" not in url and "::" not in url and self.remote_protocol:
            url = f"{self.remote_protocol}://{url}"
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        if "::" in url:  # chained URL: let fsspec build the chain each time (cached inside)
            return url_to_fs(url, **self.remote_options)
        fs = self._fs.get(protocol)
        if fs is None:
            cls = fsspec.get_filesystem_class(protocol)
            options = dict(self.remote_options)
            if getattr(cls, "async_impl", False):
                options.setdefault("asynchronous", False)
            fs = self._fs[protocol] = cls(**options)
        return fs, fs._strip_protocol(url)

    # ---- the bridge ---------------------------------------------------------------------
    async def _call(self, fs: AbstractFileSystem, method: str, *args: Any, **kw: Any) -> Any:
        if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
            coro = getattr(fs, "_" + method)(*args, **kw)
            fut = asyncio.run_coroutine_threadsafe(coro, fs.loop)
            return await await_future(fut)
        fn: Callable[..., Any] = getattr(fs, method)
        return await trio.to_thread.run_sync(
            lambda: fn(*args, **kw), limiter=self._threads, abandon_on_cancel=True
        )

    async def _with_retries(self, url: str, what: str, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``op`` with retries and exponential backoff, all within ``self.timeout``."""
        attempt = 0
        with trio.move_on_after(self.timeout) as scope:
            while True:
                try:
                    async with self._limiter:
                        return await op()
                except _PERMANENT as e:
                    code = errno.ENOENT if isinstance(e, FileNotFoundError) else errno.EIO
                    raise FetchError(url, f"{what}: {describe(e)}", code) from None
                except FetchError:
                    raise
                except Exception as e:
                    if attempt >= self.retries:
                        raise FetchError(
                            url, f"{what}: {describe(e)} (after {attempt + 1} attempts)"
                        ) from None
                    attempt += 1
                    self.stats.retries += 1
                    delay = min(0.1 * 2 ** (attempt - 1), 2.0) * (0.5 + random.random())
                    log.debug("retry %d of %s for %s: %s", attempt, what, redact_url(url),
                              describe(e))
                    await trio.sleep(delay)
        assert scope.cancelled_caught
        raise FetchError(url, f"{what}: timed out after {self.timeout:g} s", errno.EIO)

    async def cat_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the target; raises FetchError (never returns short)."""
        fs, path = self.resolve(url)
        want = end - start

        async def op() -> bytes:
            data = await self._call(fs, "cat_file", path, start=start, end=end)
            if not isinstance(data, bytes | bytearray | memoryview):
                raise FetchError(url, f"bytes {start}-{end}: backend returned {type(data)}")
            if len(data) != want:
                # A server that ignores Range, or a target shorter than its reference.
                raise ShortRead(f"got {len(data)} bytes, expected {want}")
            return bytes(data)

        data = await self._with_retries(url, f"bytes {start}-{end}", op)
        self.stats.requests += 1
        self.stats.bytes_fetched += len(data)
        return data

    async def size(self, url: str) -> int:
        fs, path = self.resolve(url)

        async def op() -> int:
            info = await self._call(fs, "info", path)
            size = info.get("size")
            if size is None:
                raise FetchError(url, "size: the storage does not report a size")
            return int(size)

        return await self._with_retries(url, "size", op)
