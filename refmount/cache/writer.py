"""Disk-cache writes in a child process, fed through a shared-memory ring.

Writing a block file is a handful of system calls and some Python around each. Done by
a thread of the daemon, every one of them hands the GIL back and forth with the thread
serving FUSE and HTTP, and that contention cost more CPU than the writes themselves
(perf: futex wake-ups and context switches). So the daemon only copies a fetched block
into a ring of shared memory and sends a 48-byte note down a pipe; a child process
(``python -m refmount.cache.writer``) writes the block file from the ring — with direct
I/O, straight from the shared pages — and advances a counter in the ring's first page
that tells the daemon how much space is free again. Beside it, the child keeps what it
wrote and evicted (``DiskCounters``), which the daemon reads when it is asked (the
metrics): nothing more crosses on the read path.

Writes are best effort: when the ring is full (the disk is slower than the network) a
block is simply not cached. If the child cannot start or dies, the daemon logs one
warning and goes on without writing to the disk cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass, fields
from typing import IO

import trio

from refmount.base.process import USER_SIGNALS, private_files, user_signals_ignored
from refmount.base.spawn import child_env, module_command
from refmount.base.stats import Stats
from refmount.cache.blocks import DiskCache, round_up

log = logging.getLogger(__name__)

_NOTE = struct.Struct("<QQ32s")  # ring position, length, key digest
_CONSUMED = struct.Struct("<Q")  # in the ring's first page: end of the last written block
# also in the first page, a cache line further: a sequence number (odd while the child
# updates them), then DiskCounters' fields in order (held_bytes -1: not known yet)
_COUNTERS_AT = 64
_SEQ = struct.Struct("<Q")
_COUNTERS = struct.Struct("<5Qq")
_PAGE = 4096


@dataclass
class DiskCounters:
    """What a cache writer's child did to the disk cache since it started."""

    blocks_written: int = 0
    bytes_written: int = 0  # block files' sizes, headers included
    evictions: int = 0  # block files removed to make room
    evicted_bytes: int = 0
    write_errors: int = 0  # failed writes (each turns writing off for a while)
    held_bytes: int | None = None  # block files on disk, as the child estimates them

    def add(self, other: DiskCounters) -> None:
        """Add ``other``'s counters to these (not ``held_bytes``: a size now, not a count)."""
        for f in fields(self):
            if f.name != "held_bytes":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _publish(view: memoryview, disk: DiskCache) -> None:
    """The child's side: ``disk``'s counters into the ring's first page."""
    (seq,) = _SEQ.unpack_from(view, _COUNTERS_AT)
    _SEQ.pack_into(view, _COUNTERS_AT, seq + 1)
    held = disk.held_bytes
    _COUNTERS.pack_into(view, _COUNTERS_AT + _SEQ.size, disk.blocks_written, disk.bytes_written,
                        disk.evictions, disk.evicted_bytes, disk.write_errors,
                        -1 if held is None else held)
    _SEQ.pack_into(view, _COUNTERS_AT, seq + 2)


def _read_counters(view: memoryview) -> DiskCounters | None:
    """The daemon's side: the counters the child published last (None if it was updating
    them at each of a few tries: the caller keeps what it read before)."""
    for _ in range(100):
        (before,) = _SEQ.unpack_from(view, _COUNTERS_AT)
        if before % 2 == 0:
            values = _COUNTERS.unpack_from(view, _COUNTERS_AT + _SEQ.size)
            (after,) = _SEQ.unpack_from(view, _COUNTERS_AT)
            if after == before:
                *counts, held = values
                return DiskCounters(*counts, held_bytes=None if held < 0 else held)
    return None


class CacheWriter:
    """Daemon side: ``submit`` copies a block into the ring and notes it to the child."""

    RING_SIZE = 64 * 2**20

    def __init__(self, disk: DiskCache, stats: Stats, ring_size: int = RING_SIZE) -> None:
        self.disk = disk
        self.stats = stats
        self.capacity = ring_size
        self._head = 0  # monotonic ring position of the next block
        self._ring: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._notes: int | None = None  # write end of the note pipe
        self._proc: subprocess.Popen[bytes] | None = None
        self._failed = False
        self._counters = DiskCounters()  # the last read

    def start(self) -> IO[bytes] | None:
        """Start the child; returns its stderr (log lines to relay), None on failure."""
        fds: list[int] = []
        try:
            ring_fd = os.memfd_create("refmount-cache-ring", 0)
            fds.append(ring_fd)
            os.ftruncate(ring_fd, _PAGE + self.capacity)
            self._ring = mmap.mmap(ring_fd, _PAGE + self.capacity)
            read_end, self._notes = os.pipe()
            fds.append(read_end)
            os.set_blocking(self._notes, False)
            with contextlib.suppress(OSError):  # room for many notes (default: 64 KiB)
                fcntl.fcntl(self._notes, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
            cmd = module_command("refmount.cache.writer", str(read_end), str(ring_fd),
                                 str(self.capacity), self.disk.directory, str(self.disk.capacity),
                                 "1" if self.disk.direct_io else "0")
            with user_signals_ignored():  # until the child ignores them itself
                self._proc = subprocess.Popen(
                    cmd, env=child_env(), pass_fds=(read_end, ring_fd), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                )
        except OSError as e:
            self._fail(f"cannot start the cache writer process: {e}")
            return None
        finally:
            for fd in fds:
                os.close(fd)
        self._view = memoryview(self._ring)
        return self._proc.stderr

    @property
    def pid(self) -> int | None:
        """The child's process id once started (None before, or if it could not start)."""
        return self._proc.pid if self._proc is not None else None

    def exit_status(self, timeout: float = 0) -> int | None:
        """The child's exit status, waiting up to ``timeout`` seconds for it to exit; None
        while it runs (or if it never started)."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def counters(self) -> DiskCounters:
        """What the child has written and evicted so far (a read of shared memory; zero
        before it starts; its last values once it has exited)."""
        if self._view is not None:
            read = _read_counters(self._view)
            if read is not None:
                self._counters = read
        return self._counters

    @property
    def ring_position(self) -> int:
        """Bytes of ring space taken since the start (monotonic: it goes on round the ring)."""
        return self._head

    def _fail(self, why: str) -> None:
        if not self._failed:
            self._failed = True
            log.warning("disk cache: %s; not writing to the disk cache from now on", why)

    def submit(self, url: str, start: int, data: bytes | memoryview, key_length: int | None = None) -> None:
        """Queue a block for writing; never blocks (a full ring drops the block). It is
        stored under (url, start, key_length or its length): a grid block that ends at the
        end of its target is shorter than the grid."""
        if self._failed or self._view is None or self._notes is None:
            return
        n = len(data)
        need = round_up(n, _PAGE)
        if need > self.capacity // 2 or n > self.disk.capacity // 4:
            return
        pos = self._head
        phys = pos % self.capacity
        if phys + need > self.capacity:  # does not fit before the end: start over at 0
            pos += self.capacity - phys
            phys = 0
        (consumed,) = _CONSUMED.unpack_from(self._view, 0)
        if pos + need - consumed > self.capacity:
            self.stats.cache_writes_dropped += 1
            return
        digest = self.disk.key_digest(url, start, key_length or n)
        base = _PAGE + phys
        self._view[base : base + n] = data
        if need > n:
            self._view[base + n : base + need] = bytes(need - n)
        try:
            os.write(self._notes, _NOTE.pack(pos, n, digest))
        except BlockingIOError:
            self.stats.cache_writes_dropped += 1  # the child is far behind: not cached
            return
        except OSError as e:
            self._fail(f"the cache writer process is gone ({e.strerror})")
            return
        self._head = pos + need
        self.disk.mark(digest)

    async def relay_logs(self, stream: IO[bytes]) -> None:
        """Log the child's lines ("LEVEL message") as our own, until it exits."""
        pipe = trio.lowlevel.FdStream(os.dup(stream.fileno()))
        stream.close()
        buf = b""
        levels = logging.getLevelNamesMapping()
        async with pipe:
            while chunk := await pipe.receive_some(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    name, _, rest = text.partition(" ")
                    level = levels.get(name)
                    log.log(level or logging.WARNING, "%s", rest if level else text)
        if not self._failed and self._notes is not None:
            self._fail("the cache writer process exited")

    def close(self, timeout: float = 5.0) -> None:
        """Let the child finish the queued blocks (up to ``timeout``) and stop it."""
        notes, self._notes = self._notes, None
        if notes is not None:
            os.close(notes)  # end of notes: the child drains the ring and exits
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _child(notes_fd: int, ring_fd: int, capacity: int, directory: str, cache_size: int, direct: bool) -> int:
    # Stopping is the daemon's business: it closes the note pipe when it unmounts.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *USER_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s", level=logging.INFO)
    private_files()  # block files and directories are the mounting user's only
    ring = mmap.mmap(ring_fd, _PAGE + capacity)
    os.close(ring_fd)
    view = memoryview(ring)
    disk = DiskCache(directory, cache_size, direct_io=direct)
    notes = os.fdopen(notes_fd, "rb", buffering=1 << 16)
    while True:
        note = notes.read(_NOTE.size)
        if len(note) < _NOTE.size:
            return 0
        pos, n, digest = _NOTE.unpack(note)
        base = _PAGE + pos % capacity
        need = round_up(n, _PAGE)
        try:
            disk.put_digest(digest, n, view[base : base + need])
        except Exception:  # one bad block must not stop the cache
            logging.exception("disk cache: writing a block failed")
        _publish(view, disk)
        _CONSUMED.pack_into(view, 0, pos + need)


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(_child(int(args[0]), int(args[1]), int(args[2]), args[3], int(args[4]), args[5] == "1"))
