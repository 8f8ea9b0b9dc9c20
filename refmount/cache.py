"""Byte caches: ``MemoryLRU`` (bounded, in memory) and ``DiskCache`` (persistent, shared)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable

import xxhash

log = logging.getLogger(__name__)


class MemoryLRU:
    """Least-recently-used map of key -> bytes, bounded by total byte size."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()

    def get(self, key: Hashable) -> bytes | None:
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
        return data

    def put(self, key: Hashable, data: bytes) -> None:
        if len(data) > self.capacity:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= len(old)
        self._items[key] = data
        self.size += len(data)
        while self.size > self.capacity:
            _, evicted = self._items.popitem(last=False)
            self.size -= len(evicted)

    def __len__(self) -> int:
        return len(self._items)


class DiskCache:
    """Persistent block cache shared by mounts: ``<dir>/blocks/<aa>/<digest>`` files.

    * A block file is a 64-byte header (magic, data length, xxh3-128 of the data, digest
      of the cache key) followed by the data. It is written to a temporary file and
      renamed into place, so readers — in this or another mount — see whole blocks only.
    * Every read verifies length and checksum; a bad block is deleted and reported as
      a miss, so it is fetched again.
    * Recency is the file's mtime (touched on hits), so several mounts sharing the
      directory agree on what to evict. Eviction rescans the directory and removes the
      oldest files until the total is below 90 % of ``capacity``.
    * Any write error (unwritable directory, disk full) disables writing for a while,
      with one warning: the mount keeps serving from memory and the network.

    All methods are blocking; callers run them in worker threads.
    """

    MAGIC = b"RMBLK\x00\x01\x00"
    HEADER = struct.Struct("<8sQ16s32s")  # magic, length, xxh3-128(data), sha256(key)
    RETRY_WRITES_AFTER = 60.0
    TOUCH_AFTER = 600.0  # refresh a hit's mtime (its LRU recency) at most every 10 minutes

    def __init__(self, directory: str, capacity: int) -> None:
        self.root = os.path.join(directory, "blocks")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._estimate: int | None = None  # bytes on disk, as far as we know
        self._evicting = False
        self._writes_off_until = 0.0
        self._dirs_ready = False
        self.corrupt = 0
        self.write_errors = 0

    @staticmethod
    def key_digest(url: str, start: int, length: int) -> bytes:
        return hashlib.sha256(f"{url}\0{start}\0{length}".encode()).digest()

    def _path(self, digest: bytes) -> str:
        h = digest.hex()
        return os.path.join(self.root, h[:2], h)

    def get(self, url: str, start: int, length: int) -> bytes | None:
        digest = self.key_digest(url, start, length)
        path = self._path(digest)
        hdr = self.HEADER
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("disk cache: cannot read %s: %s", path, e.strerror)
            return None
        try:
            st = os.fstat(fd)
            head = os.read(fd, hdr.size)
            data = os.read(fd, max(st.st_size - hdr.size, 0))  # one bytes object, no copy after
        except OSError as e:
            log.warning("disk cache: cannot read %s: %s", path, e.strerror)
            return None
        finally:
            os.close(fd)
        if len(head) == hdr.size:
            magic, n, checksum, key = hdr.unpack(head)
            if (
                magic == self.MAGIC
                and key == digest
                and n == length == len(data)
                and xxhash.xxh3_128_digest(data) == checksum
            ):
                if time.time() - st.st_mtime > self.TOUCH_AFTER:
                    with contextlib.suppress(OSError):
                        os.utime(path)  # recency for LRU eviction, shared across mounts
                return data
        self.corrupt += 1
        log.warning("disk cache: dropping corrupt block %s (%s bytes %d+%d)", path, url, start, length)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None

    def put(self, url: str, start: int, data: bytes) -> None:
        now = time.monotonic()
        if now < self._writes_off_until or len(data) > self.capacity // 4:
            return
        digest = self.key_digest(url, start, len(data))
        path = self._path(digest)
        header = self.HEADER.pack(self.MAGIC, len(data), xxhash.xxh3_128_digest(data), digest)
        # Unique per process and thread; the same block is never written twice at once
        # within a mount (single-flight), and rename makes the last writer win atomically.
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            if not self._dirs_ready:
                for i in range(256):
                    os.makedirs(os.path.join(self.root, f"{i:02x}"), exist_ok=True)
                self._dirs_ready = True
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.writev(fd, [header, data])
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            self.write_errors += 1
            self._writes_off_until = now + self.RETRY_WRITES_AFTER
            log.warning(
                "disk cache: cannot write to %s (%s); caching in memory only for %d s",
                self.root, e.strerror, self.RETRY_WRITES_AFTER,
            )
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        with self._lock:
            if self._estimate is None:
                self._estimate = self._scan_total()
            self._estimate += len(data) + self.HEADER.size
            need_evict = self._estimate > self.capacity and not self._evicting
            if need_evict:
                self._evicting = True
        if need_evict:
            try:
                self.evict()
            finally:
                with self._lock:
                    self._evicting = False

    def _files(self) -> list[tuple[float, int, str]]:
        out = []
        try:
            subdirs = list(os.scandir(self.root))
        except FileNotFoundError:
            return out
        for sub in subdirs:
            if not sub.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for entry in os.scandir(sub.path):
                    if entry.name.endswith(".tmp"):
                        continue  # being written (or left by a crash: overwritten next time)
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        out.append((st.st_mtime, st.st_size, entry.path))
        return out

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self._files())

    def evict(self) -> None:
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        target = int(self.capacity * 0.9)
        for _, size, path in files:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
        with self._lock:
            self._estimate = total
