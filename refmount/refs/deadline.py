"""Reading SOURCE from storage that may not answer: every blocking call bounded in time, and
a failed connection named for what it is.

fsspec's synchronous calls wait as long as the storage does (a black-holed HTTP server holds
``mount`` forever). ``within`` runs one call in a daemon thread and gives up after ``seconds``;
``TimedStream`` does the same for each ``read`` of a stream, through one worker thread of its
own (a hand-off per read, not a thread). A call that timed out leaves its thread blocked in
the storage library: the caller fails with ``SourceTimeout`` and the process goes on (the
thread is a daemon, so it never holds the process's exit).
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
from collections.abc import Callable
from typing import IO, Any, TypeVar

from refmount.refs.model import ReferenceSetError

T = TypeVar("T")


class SourceTimeout(ReferenceSetError):
    """The storage holding SOURCE did not answer in time."""


def within(seconds: float | None, what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, or SourceTimeout naming ``what`` after ``seconds`` (None: no bound)."""
    if seconds is None:
        return fn(*args)
    box: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, fn(*args)))
        except BaseException as e:
            box.append((False, e))
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="refmount-source").start()
    if not done.wait(seconds):
        raise SourceTimeout(f"{what}: no answer within {seconds:g} s (timeout); is the server up?")
    ok, value = box[0]
    if not ok:
        raise value
    return value


class TimedStream:
    """A read-only binary stream whose ``read`` calls each end within ``seconds``."""

    def __init__(self, raw: IO[bytes], seconds: float, what: str) -> None:
        self.raw = raw
        self.seconds = seconds
        self.what = what
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stuck = False

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args = job
            try:
                self._results.put((True, fn(*args)))
            except BaseException as e:
                self._results.put((False, e))

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._stuck:
            raise SourceTimeout(f"{self.what}: no answer within {self.seconds:g} s (timeout)")
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, daemon=True, name="refmount-source")
            self._thread.start()
        self._jobs.put((fn, args))
        try:
            ok, value = self._results.get(timeout=self.seconds)
        except queue.Empty:
            self._stuck = True
            raise SourceTimeout(f"{self.what}: no answer within {self.seconds:g} s while "
                                "reading (timeout)") from None
        if not ok:
            raise value
        return value

    def read(self, n: int = -1) -> bytes:
        return self._call(self.raw.read, n)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self._stuck:
            return  # its thread is still inside the storage library
        try:
            if self._thread is not None:
                self._call(self.raw.close)
            else:
                self.raw.close()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread = None

    def __enter__(self) -> TimedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connection_problem(exc: BaseException) -> str | None:
    """What a failed open really was, when the storage library reported it as something else
    (fsspec's HTTP file system turns every failure into FileNotFoundError): an unknown host,
    a refused connection, a timeout; None if it was none of these."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, socket.gaierror):
            return f"unknown host ({e.strerror or e})"
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return "connection refused (nothing listens at that address and port)"
        if isinstance(e, TimeoutError):
            return "the connection timed out"
        if isinstance(e, OSError) and e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return f"host unreachable ({e.strerror})"
        e = e.__cause__ or e.__context__
    return None
