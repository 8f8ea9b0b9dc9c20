"""Byte caches: ``MemoryLRU`` (bounded, in memory) and ``DiskCache`` (persistent, shared)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import mmap
import os
import secrets
import struct
import threading
import time
import weakref
from collections.abc import Callable, Hashable

import xxhash

from refmount.base.lru import LRU
from refmount.base.process import private_dir

log = logging.getLogger(__name__)

Block = bytes | memoryview  # a cached piece: fetched bytes, or a view of a disk read


class MemoryLRU(LRU[Hashable, Block]):
    """The memory cache: least-recently-used blocks, bounded by their total byte size
    (``capacity``); a block larger than that is not kept."""

    __slots__ = ("capacity",)

    def __init__(self, capacity: int) -> None:
        super().__init__(max_weight=capacity, weigh=len)
        self.capacity = capacity

    @property
    def size(self) -> int:
        return self.weight


def _libc_allocator() -> tuple[Callable[[int], int], Callable[[int], None]] | None:
    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return None
    malloc.argtypes = [ctypes.c_size_t]
    malloc.restype = ctypes.c_void_p
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return malloc, free


_ALLOCATOR = _libc_allocator()


def aligned_buffer(size: int, align: int = 4096) -> memoryview:
    """Writable, ``align``-aligned memory for a block read with direct I/O, freed when the
    last view of it goes. Not zero-filled: the read overwrites it, and a zero fill (or a
    copy out of a reused buffer) is a pass over the whole block that a disk hit need not
    make. It is a plain ``malloc`` of ``size + align`` used from its first aligned byte:
    ``posix_memalign`` leaves a small free fragment before every block, and under a mixed
    load those fragments kept the heap from ever coalescing (RSS doubled in bench/diagnostics/soak.py)."""
    if _ALLOCATOR is not None:
        malloc, free = _ALLOCATOR
        ptr = malloc(size + align)
        if ptr:
            array = (ctypes.c_char * size).from_address(ptr + (-ptr % align))
            weakref.finalize(array, free, ptr)
            return memoryview(array).cast("B")
    raw = bytearray(size + align)  # fallback: zero-filled, aligned by hand
    skip = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % align
    return memoryview(raw)[skip : skip + size]


class _AlignedBuffer(threading.local):
    """One page-aligned, reused buffer per worker thread, for direct I/O.

    Direct I/O needs aligned memory; reusing it also means no fresh pages are touched per
    block (first-touch page faults were a large part of the daemon's CPU)."""

    def __init__(self) -> None:
        self.buf: mmap.mmap | None = None

    def get(self, size: int) -> memoryview:
        if self.buf is None or len(self.buf) < size:
            # The old map is unmapped once no view of it is left (not closed here: a
            # view may still be alive in a traceback).
            self.buf = mmap.mmap(-1, round_up(size, 1 << 20))
        return memoryview(self.buf)


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class DiskCache:
    """Persistent block cache shared by mounts: ``<dir>/blocks/<aa>/<digest>`` files.

    * A block file is a 4 KiB header (magic, data length, xxh3-128 of the data, digest of
      the cache key, zero padding) followed by the data. It is written to a temporary file
      and renamed into place, so readers — in this or another mount — see whole blocks only.
    * Blocks are written and read with ``O_DIRECT`` where the filesystem allows it: the
      kernel already keeps the mount's own pages in its page cache, so a second, buffered
      copy of the same bytes under the cache directory would only double the memory used
      and the copying done. Filesystems without direct I/O (tmpfs, some network ones) get
      ordinary buffered I/O.
    * Every read verifies length and checksum; a bad block is deleted and reported as
      a miss, so it is fetched again.
    * Recency is the file's mtime (touched on hits), so several mounts sharing the
      directory agree on what to evict. Eviction rescans the directory and removes the
      oldest files until the total is below 90 % of ``capacity``.
    * Any write error (unwritable directory, disk full) disables writing for a while,
      with one warning: the mount keeps serving from memory and the network.

    All methods are blocking; callers run them in worker threads.
    """

    MAGIC = b"RMBLK\x00\x02\x00"
    HEADER = struct.Struct("<8sQ16s32s")  # magic, length, xxh3-128(data), sha256(key)
    HEADER_SIZE = 4096  # the data starts page-aligned, as direct I/O needs
    ALIGN = 4096
    DIRECT_LIMIT = 16 * 2**20  # larger blocks (rare: whole-fetched big ranges) go buffered
    RETRY_WRITES_AFTER = 60.0
    COPY_BELOW = 128 * 1024  # smaller blocks read directly are copied out of their buffer
    TOUCH_AFTER = 600.0  # refresh a hit's mtime (its LRU recency) at most every 10 minutes
    STALE_TMP_AFTER = 3600.0  # a temporary block file older than this was left by a crash

    def __init__(self, directory: str, capacity: int, *, direct_io: bool = True,
                 target_key: Callable[[str], str] | None = None) -> None:
        self.directory = directory
        # What a reference's URL means depends on the mount (a relative path on SOURCE's
        # directory, remote_protocol, remote_options such as an endpoint): keys are made from
        # ``target_key(url)``, so that mounts sharing the directory never share bytes of
        # different targets that happen to be written alike.
        self._target_key = target_key
        self.root = os.path.join(directory, "blocks")
        self.capacity = capacity
        self.direct_io = direct_io
        self._lock = threading.Lock()
        self._estimate: int | None = None  # bytes on disk, as far as we know
        self._evicting = False
        self._writes_off_until = 0.0
        self._dirs_ready = False
        self._uid = os.geteuid()  # block files are this user's, or not read
        self._direct = direct_io and hasattr(os, "O_DIRECT")  # see ``direct``
        self._buffer = _AlignedBuffer()
        # Which blocks may be on disk: a bitmap over the first bits of the key digest, so
        # a miss (every cold read) is answered without a thread hop or a syscall. False
        # positives (hash collisions, blocks evicted since) only cost a lookup; blocks
        # written by another mount after our scan are not seen (they are fetched again).
        self._present: bytearray | None = None  # None until the first scan: assume yes
        self._marked_before_scan: list[bytes] = []  # blocks written while the scan ran
        self.corrupt = 0
        self.write_errors = 0
        # what this object wrote and evicted (in the cache writer process: cache/writer.py
        # hands them to the daemon), and the bytes its scan found on disk
        self.blocks_written = self.bytes_written = 0
        self.evictions = self.evicted_bytes = 0
        self.scanned_bytes: int | None = None

    def key_digest(self, url: str, start: int, length: int) -> bytes:
        if self._target_key is not None:
            url = self._target_key(url)
        return hashlib.sha256(f"{url}\0{start}\0{length}".encode()).digest()

    @property
    def direct(self) -> bool:
        """Whether blocks are read with ``O_DIRECT`` (off if the file system refuses it)."""
        return self._direct

    def block_path(self, digest: bytes) -> str:
        """Where the block with this key digest lives (``root/ab/abcd…``)."""
        h = digest.hex()
        return os.path.join(self.root, h[:2], h)

    # ---- presence filter ----------------------------------------------------------------
    PRESENCE_BITS = 24  # 2 MiB bitmap: ~6 % false positives with a million blocks on disk

    @classmethod
    def _bit(cls, digest: bytes) -> int:
        return int.from_bytes(digest[:4], "big") >> (32 - cls.PRESENCE_BITS)

    def may_contain(self, url: str, start: int, length: int) -> bool:
        """False only when the block is certainly not on disk (cheap: no I/O)."""
        present = self._present
        if present is None:
            return True
        bit = self._bit(self.key_digest(url, start, length))
        return bool(present[bit >> 3] & (1 << (bit & 7)))

    def mark(self, digest: bytes) -> None:
        """Note a block as (soon) on disk."""
        present = self._present
        if present is None:
            with self._lock:
                if self._present is None:  # the first scan may have listed its directory already
                    self._marked_before_scan.append(digest)
                    return
                present = self._present
        bit = self._bit(digest)
        present[bit >> 3] |= 1 << (bit & 7)

    def _presence_from(self, names: list[str]) -> bytearray:
        present = bytearray(1 << (self.PRESENCE_BITS - 3))
        for name in names:
            try:
                bit = self._bit(bytes.fromhex(name[:8]))
            except ValueError:
                continue
            present[bit >> 3] |= 1 << (bit & 7)
        return present

    def scan(self) -> None:
        """Learn which blocks are on disk (blocking; run in a thread once at start)."""
        files = self.files()
        self.scanned_bytes = sum(size for _, size, _ in files)
        present = self._presence_from([os.path.basename(path) for _, _, path in files])
        with self._lock:
            if self._present is not None:  # blocks written during the scan
                n = len(present)
                merged = int.from_bytes(present, "little") | int.from_bytes(self._present, "little")
                present = bytearray(merged.to_bytes(n, "little"))
            for digest in self._marked_before_scan:
                bit = self._bit(digest)
                present[bit >> 3] |= 1 << (bit & 7)
            self._marked_before_scan = []
            self._present = present

    def _open(self, path: str, flags: int, mode: int = 0o600) -> tuple[int, bool]:
        """Open with O_DIRECT when this filesystem supports it; returns (fd, direct)."""
        if self._direct:
            try:
                return os.open(path, flags | os.O_DIRECT, mode), True
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._direct = False  # not supported here: buffered from now on
                if flags & os.O_CREAT:  # some file systems create the file, then refuse
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        return os.open(path, flags, mode), False

    def get(self, url: str, start: int, length: int, *, upto: bool = False) -> Block | None:
        """The block of ``length`` bytes at ``start``; with ``upto``, a block stored under
        that key may be shorter (it ends at the end of its target)."""
        digest = self.key_digest(url, start, length)
        path = self.block_path(digest)
        size = self.HEADER_SIZE + length
        try:
            # Never through a symlink (the directories are the mounting user's, checked at
            # mount; this holds even if one was not).
            fd, direct = self._open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("disk cache: cannot read %s: %s", path, e.strerror)
            return None
        try:
            st = os.fstat(fd)
            if st.st_uid != self._uid:
                raise OSError(errno.EPERM, f"owned by uid {st.st_uid}, not by this mount's user")
            if upto and self.HEADER_SIZE < st.st_size < size:
                size = st.st_size
                length = size - self.HEADER_SIZE
            if st.st_size != size:
                raw: bytes | memoryview = b""
            elif direct and size <= self.DIRECT_LIMIT:
                view = aligned_buffer(round_up(size, self.ALIGN), self.ALIGN)
                n = os.preadv(fd, [view], 0)
                raw = view[: min(n, size)]
            else:
                if direct:
                    # Too big for one aligned buffer: read it buffered. The descriptor is
                    # closed before it is replaced, and never closed twice: by then its
                    # number may belong to another thread's file.
                    os.close(fd)
                    fd = -1
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                raw = os.pread(fd, size, 0)
        except OSError as e:
            log.warning("disk cache: cannot read %s: %s", path, e.strerror)
            return None
        finally:
            if fd >= 0:
                os.close(fd)
        if len(raw) == size:
            magic, n, checksum, key = self.HEADER.unpack_from(raw)
            body = raw[self.HEADER_SIZE :]
            if (
                magic == self.MAGIC
                and key == digest
                and n == length
                and xxhash.xxh3_128_digest(body) == checksum
            ):
                if time.time() - st.st_mtime > self.TOUCH_AFTER:
                    with contextlib.suppress(OSError):
                        os.utime(path, follow_symlinks=False)  # LRU recency, shared by mounts
                if isinstance(body, memoryview) and len(body) < self.COPY_BELOW:
                    # A view keeps the whole aligned buffer (header and padding: 12 KiB for
                    # a 1 KiB chunk) alive, and the memory cache counts only the chunk.
                    return bytes(body)
                return body  # a view of the direct read's buffer, or bytes read buffered
        self.corrupt += 1
        log.warning("disk cache: dropping corrupt block %s (%s bytes %d+%d)", path, url, start, length)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None

    def put_digest(self, digest: bytes, length: int, padded: memoryview) -> None:
        """Write one block: its ``length`` bytes start ``padded``, page-aligned memory that
        is zero after them up to a multiple of the page size (the cache writer's ring), so
        direct I/O writes it as is, without a copy."""
        data = padded[:length]
        now = time.monotonic()
        if now < self._writes_off_until or len(data) > self.capacity // 4:
            return
        path = self.block_path(digest)
        header = self.HEADER.pack(self.MAGIC, len(data), xxhash.xxh3_128_digest(data), digest)
        size = self.HEADER_SIZE + len(data)
        # Created exclusively (O_EXCL|O_NOFOLLOW) under a name nobody can guess, in a
        # directory that is ours alone: nothing planted there is ever written through. The
        # rename makes the last writer of a block win atomically.
        tmp = f"{path}.{secrets.token_hex(8)}.tmp"
        try:
            if not self._dirs_ready:
                # Private to the mounting user: blocks are what it (perhaps root) could read.
                private_dir(self.root)
                for i in range(256):
                    private_dir(os.path.join(self.root, f"{i:02x}"))
                self._dirs_ready = True
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            if size <= self.DIRECT_LIMIT:
                fd, direct = self._open(tmp, flags)
            else:
                fd, direct = os.open(tmp, flags, 0o600), False
            try:
                if direct:
                    aligned = round_up(size, self.ALIGN)
                    head = self._buffer.get(self.HEADER_SIZE)[: self.HEADER_SIZE]
                    head[: self.HEADER.size] = header
                    head[self.HEADER.size :] = bytes(self.HEADER_SIZE - self.HEADER.size)
                    if os.writev(fd, [head, padded[: aligned - self.HEADER_SIZE]]) != aligned:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    os.ftruncate(fd, size)
                else:
                    pad = bytes(self.HEADER_SIZE - self.HEADER.size)
                    if os.writev(fd, [header, pad, data]) != size:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            finally:
                os.close(fd)
            os.replace(tmp, path)
            self.mark(digest)
            self.blocks_written += 1
            self.bytes_written += size
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
            self._estimate += size
            need_evict = self._estimate > self.capacity and not self._evicting
            if need_evict:
                self._evicting = True
        if need_evict:
            try:
                self.evict()
            finally:
                with self._lock:
                    self._evicting = False

    def files(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every block file on disk (blocking: a directory walk);
        temporary files left by a writer that died long ago are removed on the way."""
        out = []
        try:
            subdirs = list(os.scandir(self.root))
        except OSError:  # not there yet, or unusable (reported when writing)
            return out
        for sub in subdirs:
            if not sub.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for entry in os.scandir(sub.path):
                    if entry.name.endswith(".tmp"):
                        self._remove_if_stale(entry)  # else being written: not a block yet
                        continue
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        out.append((st.st_mtime, st.st_size, entry.path))
        return out

    def _remove_if_stale(self, entry: os.DirEntry) -> None:
        """A temporary file is renamed within a second of its creation; one this old was
        left by a writer that died, and would take disk space no eviction accounts for."""
        with contextlib.suppress(OSError):
            if time.time() - entry.stat(follow_symlinks=False).st_mtime > self.STALE_TMP_AFTER:
                os.unlink(entry.path)

    @property
    def held_bytes(self) -> int | None:
        """The bytes of block files on disk as far as this object knows (None before its first
        write): the total of the directory at its last walk, plus what it wrote since.
        Other mounts sharing the directory write and evict too: an estimate."""
        return self._estimate

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self.files())

    def evict(self) -> None:
        files = sorted(self.files())
        total = sum(size for _, size, _ in files)
        target = int(self.capacity * 0.9)
        for _, size, path in files:
            if total <= target:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:  # evicted by another mount meanwhile
                pass
            else:
                self.evictions += 1
                self.evicted_bytes += size
            total -= size
        with self._lock:
            self._estimate = total
