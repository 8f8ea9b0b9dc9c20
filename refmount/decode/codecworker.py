"""Codec worker processes: chunks whose codecs are not all on the allow-list
(``chunkcodecs.ALLOWED``) are decoded here, never in the serving process.

Third-party codecs registered with numcodecs (kerchunk's ``grib`` over eccodes, its FITS
codecs, imagecodecs ...) are native parsers of untrusted bytes. Each worker is a fresh
interpreter (``python -m refmount.decode.codecworker``), started on the first chunk that needs one,
that decodes one chunk at a time under resource limits:

* ``RLIMIT_AS``: its address space at start plus ``memory`` bytes;
* ``RLIMIT_CPU``: ``cpu_seconds`` of CPU per chunk (the soft limit is moved on before each
  chunk; SIGXCPU ends the worker);
* no core files; it dies with the serving process (``PR_SET_PDEATHSIG``);
* its answer is at most the chunk's decoded size; a longer one is refused unread.

A worker that dies (a signal, an exit, a limit), or takes longer than ``timeout`` seconds of
wall time, is a :class:`WorkerDied` for that chunk only (``EIO`` for that read) and one log
line; the next chunk starts a new worker. Workers run side by side, one per
thread asking at once (the decode ``WorkerPool``'s threads call :meth:`CodecWorkers.decode`, which
blocks: never call it from the trio loop).

The pipe protocol (stdin/stdout of the worker): a request is ``<I`` spec length, the spec
(``ChunkCodecs.spec()``: codec configurations, dtype, decoded size), ``<Q`` stored length,
the stored bytes; an answer is one status byte (0: decoded bytes follow, 1: an error
message follows), ``<Q`` length, the payload.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from refmount.base.spawn import child_env, module_command

log = logging.getLogger(__name__)

MAX_MESSAGE = 4096  # bytes of an error message from a worker
SPECS_KEPT = 64  # decoding plans a worker keeps built


class WorkerDied(Exception):
    """The worker decoding a chunk died or was stopped; the next chunk gets a new one."""


class WorkerError(Exception):
    """The worker answered with an error (a corrupt chunk, a bound, out of memory)."""


class _Worker:
    """One worker process and its pipes, used by one thread at a time."""

    def __init__(self, memory: int, cpu_seconds: int, label: str) -> None:
        env = child_env()
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"  # no thread pools: they would only cost address space
        self.proc = subprocess.Popen(
            module_command("refmount.decode.codecworker", "--memory", str(memory), "--cpu",
                           str(cpu_seconds), "--for", label),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
            cwd="/", start_new_session=False)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()

    def request(self, spec: bytes, stored: Any, max_out: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        data = memoryview(stored).cast("B")
        self._write(struct.pack("<I", len(spec)) + spec + struct.pack("<Q", len(data)), deadline)
        self._write(data, deadline)
        status, n = struct.unpack("<BQ", self._read(9, deadline))
        if status == 0 and n <= max_out:
            return self._read(n, deadline)
        if status == 1 and n <= MAX_MESSAGE:
            raise WorkerError(self._read(n, deadline).decode("utf-8", "replace"))
        raise WorkerDied(f"the codec worker answered {n:,} bytes, more than the chunk's "
                         f"{max_out:,}")

    def _write(self, data: Any, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self._wait(self._out, select.POLLOUT, deadline)
            try:
                n = os.write(self._out, view[: 1 << 20])
            except BrokenPipeError:
                raise WorkerDied(self._why()) from None
            view = view[n:]

    def _read(self, n: int, deadline: float) -> bytes:
        parts = []
        while n:
            self._wait(self._in, select.POLLIN, deadline)
            piece = os.read(self._in, min(n, 1 << 20))
            if not piece:
                raise WorkerDied(self._why())
            parts.append(piece)
            n -= len(piece)
        return b"".join(parts)

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            self.kill()
            raise WorkerDied("the codec worker took too long (stopped)")

    def _why(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "the codec worker closed its pipe (stopped)"
        if code < 0:
            name = signal.Signals(-code).name
            extra = {"SIGXCPU": ": CPU limit", "SIGKILL": ": killed, out of memory?"}.get(name, "")
            return f"the codec worker died of {name}{extra}"
        return f"the codec worker exited with status {code}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()  # type: ignore[union-attr]


class CodecWorkers:
    """Codec worker processes, started when first needed: as many as threads ask at once."""

    def __init__(self, *, memory: int, cpu_seconds: int = 30, timeout: float = 120.0,
                 label: str = "") -> None:
        self.memory = memory
        self.cpu_seconds = cpu_seconds
        self.timeout = timeout
        self.label = label or "-"
        self.started = 0  # workers started (a restart counts)
        self.deaths = 0
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    def decode(self, spec: bytes, stored: Any, nbytes: int) -> bytes:
        """The decoded bytes of one chunk (at most ``nbytes``), from a worker. Blocks."""
        worker = self._take()
        try:
            out = worker.request(spec, stored, nbytes, self.timeout)
        except WorkerDied as e:
            worker.kill()
            with self._lock:
                self._all.discard(worker)
                self.deaths += 1
            log.warning("codec worker pid %d: %s; a new one starts for the next chunk",
                        worker.proc.pid, e)
            raise
        except BaseException:
            self._give_back(worker)
            raise
        self._give_back(worker)
        return out

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise WorkerDied("the mount is closing")
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            try:
                worker = _Worker(self.memory, self.cpu_seconds, self.label)
            except OSError as e:
                raise WorkerDied(f"cannot start a codec worker: {e.strerror or e}") from None
            self._all.add(worker)
            self.started += 1
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed or not worker.alive():
                worker.kill()
                self._all.discard(worker)
                return
            self._idle.put(worker)

    def close(self) -> None:
        """End every worker (the one decoding a chunk now as well)."""
        with self._lock:
            self._closed = True
            workers, self._all = list(self._all), set()
        for w in workers:
            w.kill()


# ---- the worker's side ------------------------------------------------------------------------


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _read_exact(f: Any, n: int) -> bytes | None:
    data = f.read(n)
    if n and not data:
        return None
    if len(data) != n:
        raise EOFError("short request")
    return data


def serve(memory: int, cpu_seconds: int) -> int:
    """Decode requests from stdin until it closes."""
    from refmount.decode.chunkcodecs import ChunkCodecs
    from refmount.decode.v3codecs import V3Chain, chain_from_spec

    _die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import numcodecs  # noqa: F401  (before the address-space limit is measured)
    import numpy  # noqa: F401

    limit = _address_space() + memory
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # The pipes move to descriptors of their own: a codec that writes to fd 1 (or reads fd 0)
    # writes to stderr (reads /dev/null) instead of breaking the protocol.
    stdin = os.fdopen(os.dup(0), "rb")
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    plans: dict[bytes, ChunkCodecs | V3Chain] = {}
    while True:
        head = _read_exact(stdin, 4)
        if head is None:
            return 0
        spec = _read_exact(stdin, struct.unpack("<I", head)[0]) or b""
        stored = _read_exact(stdin, struct.unpack("<Q", _read_exact(stdin, 8) or b"")[0]) or b""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = int(usage.ru_utime + usage.ru_stime) + 1
        _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_seconds, hard))
        try:
            plan = plans.get(spec)
            if plan is None:
                if len(plans) >= SPECS_KEPT:
                    plans.clear()
                plan = plans[spec] = chain_from_spec(spec)  # v2's chain or a Zarr v3 one
            out = plan.decode(stored)
            status, payload = 0, out
        except MemoryError:
            status, payload = 1, memoryview(f"out of memory (the worker's limit is {memory:,} "
                                            f"bytes above its start)".encode())
        except Exception as e:
            text = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            payload = memoryview(text.encode("utf-8", "replace")[:MAX_MESSAGE])
            status = 1
        del stored
        stdout.write(struct.pack("<BQ", status, memoryview(payload).nbytes))
        stdout.write(payload)
        stdout.flush()


def main() -> int:
    args = sys.argv[1:]
    opts = dict(zip(args[::2], args[1::2], strict=False))
    try:
        return serve(int(opts["--memory"]), int(opts["--cpu"]))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return 1


if __name__ == "__main__":
    sys.exit(main())
