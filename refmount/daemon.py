"""The serving process: map the index, mount, answer FUSE requests on trio, unmount.

Started either in the foreground (``refmount -f``) or as a detached child of the CLI
(``python -m refmount.daemon``), which receives its configuration as JSON on stdin (not
argv, to keep secrets out of ``ps``) and reports readiness on an inherited pipe.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import logging.handlers
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import pyfuse3
import trio

from . import guestloop, process
from .cache import Block, DiskCache, MemoryLRU
from .cachewriter import CacheWriter
from .codecworker import CodecWorkers
from .config import MountConfig
from .decoded import ChunkDecoder, DecodedTree, DecodedView
from .errors import MountError
from .fetch import Fetcher
from .fs import RefFS
from .mountpoint import check_mountpoint
from .pagepush import PagePusher
from .policy import target_policy
from .reader import RefReader
from .redact import RedactingFormatter, redact_url
from .refs import IndexFile, Ref, format_named
from .refs.limits import Limits
from .stats import Stats
from .tree import Tree

log = logging.getLogger("refmount")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(cfg: MountConfig, detached: bool) -> str:
    """Configure the root logger; returns a description of where logs go."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    target = cfg.log or ("syslog" if detached else "stderr")
    handler: logging.Handler
    if target == "syslog" and not os.path.exists("/dev/log"):
        process.private_dir(os.path.join(cfg.cache_dir, "log"))
        name = cfg.mountpoint.strip("/").replace("/", "_") or "root"
        target = os.path.join(cfg.cache_dir, "log", f"{name}.log")
    if target == "stderr":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    elif target == "syslog":
        handler = logging.handlers.SysLogHandler(address="/dev/log")
        handler.setFormatter(RedactingFormatter(f"refmount[{os.getpid()}]: %(levelname)s %(message)s"))
    else:
        # The log file is the mounting user's only: it names targets and keys.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            process.private_file(fd)
        finally:
            os.close(fd)
        handler = logging.FileHandler(target)
        handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(cfg.log_level.upper())
    # Third-party chatter stays at warning unless we debug.
    for noisy in ("fsspec", "aiohttp", "botocore", "s3fs", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if cfg.debug else logging.WARNING)
    return target


def fuse_options(cfg: MountConfig) -> set[str]:
    fsname = redact_url(cfg.fsname or cfg.source)
    fsname = "".join("_" if c in ",\\ \t\n" else c for c in fsname)[:200]
    opts = {"ro", "nodev", "nosuid", "default_permissions", f"fsname={fsname}",
            f"subtype={cfg.subtype}"}
    if cfg.allow_other:
        opts.add("allow_other")
    elif cfg.allow_root:
        opts.add("allow_root")
    if cfg.debug:
        opts.add("debug")
    return opts


def sd_notify(message: str) -> None:
    """systemd's notify protocol: one datagram to $NOTIFY_SOCKET (no-op without it)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
    except OSError as e:
        log.warning("cannot notify systemd at %s: %s", addr, e.strerror)


class Mount:
    """A built file system and everything that serves it, owning their start-up and shutdown.

    The parts are made by ``build_filesystem``; nothing runs yet and nothing is left behind if
    it is dropped (``close`` is safe at any point). Serving goes in this order:

    1. ``bind_loop(loop)``: fsspec's async file systems live on the asyncio loop trio runs as
       a guest of (``guestloop``);
    2. ``start(nursery)``: the FUSE operations, the reader, the decoder and the fetcher run
       their background work (readahead, merged requests, kernel notifications) in the
       daemon's nursery, and the idle-time heap trim starts;
    3. the mount answers (the daemon's business: ``pyfuse3.init``, READY);
    4. ``warm()``: the disk cache's writer process starts and the cache directory is listed
       (after READY: a large one takes a while), then returns;
    5. ``aclose()`` on the loop once trio is done (HTTP sessions), then ``close()``: the
       decoder's threads stop, the cache writer finishes its queued blocks (up to
       ``timeout``) and exits.
    """

    def __init__(self, fs: RefFS, fetcher: Fetcher, reader: RefReader, disk: DiskCache | None,
                 writer: CacheWriter | None, decoder: ChunkDecoder | None) -> None:
        self.fs = fs
        self.fetcher = fetcher
        self.reader = reader
        self.disk = disk
        self.writer = writer
        self.decoder = decoder
        self._nursery: trio.Nursery | None = None

    @property
    def stats(self) -> Stats:
        return self.fs.stats

    @property
    def info(self) -> dict[str, str]:
        return self.fs.info

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.fetcher.bind_loop(loop)

    def start(self, nursery: trio.Nursery, trim: Callable[[int], int] | None = None) -> None:
        """Background work of every part runs in ``nursery`` from now on; with ``trim``
        (``malloc_trim``), freed heap memory is given back after a few idle seconds."""
        self._nursery = nursery
        self.fs.attach(nursery)
        self.reader.attach(nursery)
        if self.decoder is not None:
            self.decoder.attach(nursery)
        self.fetcher.attach(nursery)
        if trim is not None:
            nursery.start_soon(self._trim_when_idle, trim)

    async def warm(self) -> None:
        """Start the disk cache's writer process and learn which blocks are on disk (a
        worker thread); the writer's log lines are relayed in the nursery until it exits."""
        assert self._nursery is not None, "start() first"
        if self.writer is not None and (child_log := self.writer.start()) is not None:
            self._nursery.start_soon(self.writer.relay_logs, child_log)
        if self.disk is not None:
            await trio.to_thread.run_sync(self.disk.scan, abandon_on_cancel=True)

    async def _trim_when_idle(self, trim: Callable[[int], int]) -> None:
        """Give freed heap memory back to the system after a few seconds without reads."""
        last, trimmed = -1, True
        while True:
            await trio.sleep(5.0)
            reads = self.stats.reads
            if reads != last:
                last, trimmed = reads, False
            elif not trimmed:
                trim(0)  # a few milliseconds, once per idle period
                trimmed = True

    async def aclose(self) -> None:
        """Close the HTTP sessions of the fetcher's file systems (on the asyncio loop)."""
        await self.fetcher.aclose()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the cache writer once it has written its queued blocks (up to ``timeout``).
        Idempotent, and safe whether or not the mount was started."""
        if self.decoder is not None:
            self.decoder.close()
        if self.writer is not None:
            self.writer.close(timeout=timeout)
        self._nursery = None


def build_filesystem(cfg: MountConfig, index_file: IndexFile) -> Mount:
    """The parts of a mount of ``index_file``, wired and not yet running (see ``Mount``)."""
    stats = Stats()
    fetcher = Fetcher(
        cfg.remote_options,
        target_policy(cfg),
        timeout=cfg.timeout,
        retries=cfg.retries,
        max_connections=cfg.max_connections,
        stats=stats,
        merge_gap=cfg.merge_gap,
        merge_limit=cfg.block_size,
    )
    disk = writer = None
    if cfg.disk_cache:
        # A reference's URL is resolved like the fetcher does (SOURCE's directory,
        # remote_protocol), and the storage options (endpoint, ...) are part of the key.
        options = hashlib.sha256(json.dumps(cfg.remote_options, sort_keys=True, default=str).encode())
        tag, identity = options.hexdigest()[:16], fetcher.policy.cache_identity
        disk = DiskCache(cfg.cache_dir, cfg.cache_size, target_key=lambda url: f"{tag}\0{identity(url)}")
        writer = CacheWriter(disk, stats)
    reader = RefReader(
        fetcher,
        MemoryLRU(cfg.memory_cache_size),
        disk,
        disk_writer=writer,
        whole_fetch_limit=cfg.whole_fetch_limit,
        block_size=cfg.block_size,
        max_readahead=cfg.max_readahead,
        stats=stats,
    )
    fmt = format_named(index_file.kind)
    opened = fmt.open_tree(index_file, cfg.source, cfg.target_options, bad_keys=cfg.bad_keys,
                           limits=Limits.from_config(cfg), relative=fetcher.policy.relative)
    tree: Tree = opened.tree
    mtime_ns = opened.mtime_ns
    info = {"source": redact_url(cfg.source), "format": fmt.name, **opened.info}
    info["keys"] = str(len(tree))
    decoder = None
    if cfg.decode:
        view = DecodedView.from_index(opened.metadata, cfg.max_chunk_bytes)
        view.warn()
        info.update(view.describe())
        tree = DecodedTree(tree, view)

        async def read_stored(ref: Ref) -> Block:
            return await reader.read(ref, 0, await reader.size(ref))

        decoder = ChunkDecoder(
            view, reader.memory, read_stored, resolve=tree.resolve,
            # decoded bytes in flight: a quarter of the memory cache, the chunks decoded
            # ahead of a reader included (they land there)
            max_bytes=max(cfg.memory_cache_size // 4, 16 * 2**20), stats=stats,
            # codecs off the allow-list: in worker processes, one per decode thread at most,
            # each allowed its chunk's steps and decoded bytes twice over
            workers=CodecWorkers(memory=2 * cfg.max_chunk_bytes + 256 * 2**20, label=cfg.mountpoint),
        )
    fs = RefFS(
        tree,
        reader,
        stats,
        pusher=PagePusher(pyfuse3.notify_store, stats) if cfg.page_push else None,
        uid=cfg.uid,
        gid=cfg.gid,
        umask=cfg.umask,
        attr_timeout=cfg.attr_timeout,
        mtime_ns=mtime_ns,
        info=info,
        decoder=decoder,
    )
    return Mount(fs, fetcher, reader, disk, writer, decoder)


def serve(cfg: MountConfig, index_file: IndexFile, on_ready: Callable[[], None]) -> int:
    """Mount and serve until unmounted or signalled. Raises MountError before mounting."""
    trim = process.tune()
    check_mountpoint(cfg.mountpoint)
    mount = build_filesystem(cfg, index_file)
    try:
        pyfuse3.init(mount.fs, cfg.mountpoint, fuse_options(cfg))
    except RuntimeError as e:
        mount.close()
        raise MountError(f"cannot mount on {cfg.mountpoint}: {e}") from None
    log.info(
        "mounted %s on %s: %s keys (options: %s)",
        redact_url(cfg.source), cfg.mountpoint, mount.info["keys"], describe_options(cfg),
    )
    try:
        # trio (FUSE) as a guest of the asyncio loop fsspec's filesystems run on: one thread.
        guestloop.run(_main, cfg, mount, on_ready, trim, on_loop=mount.bind_loop,
                      before_close=mount.aclose)
    finally:
        pyfuse3.close(unmount=True)
        mount.close(timeout=5.0)  # finish queued block writes
        stats = mount.stats.as_dict()
        log.info(
            "unmounted %s: %d reads, %d bytes read, %d fetches, %d bytes fetched, "
            "%d errors, %d retries",
            cfg.mountpoint, stats["reads"], stats["bytes_read"], stats["requests"],
            stats["bytes_fetched"], stats["errors"], stats["retries"],
        )
    return 0


async def _main(cfg: MountConfig, mount: Mount, on_ready: Callable[[], None],
                trim: Callable[[int], int] | None) -> None:
    async with trio.open_nursery() as nursery:
        mount.start(nursery, trim)
        nursery.start_soon(_fuse_main, cfg, nursery)
        nursery.start_soon(_stop_on_signal, nursery)
        # The mount answers once a stat from another thread comes back through our loop.
        st = await trio.to_thread.run_sync(os.stat, cfg.mountpoint)
        set_kernel_readahead(st.st_dev, cfg.read_ahead_kb)
        on_ready()
        sd_notify("READY=1\nSTATUS=serving " + cfg.mountpoint)
        await mount.warm()


async def _fuse_main(cfg: MountConfig, nursery: trio.Nursery) -> None:
    await pyfuse3.main(min_tasks=4, max_tasks=cfg.max_tasks)
    nursery.cancel_scope.cancel()  # unmounted from outside (fusermount3 -u)


async def _stop_on_signal(nursery: trio.Nursery) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, unmounting", signal.Signals(signum).name)
            sd_notify("STOPPING=1")
            pyfuse3.terminate()
            return


def set_kernel_readahead(dev: int, kb: int) -> None:
    """FUSE mounts get the kernel's default 128 KiB readahead; larger reads mean fewer
    round trips through the daemon. Only root may change it (best effort)."""
    path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    if kb <= 0 or not os.path.exists(path):
        return
    try:
        with open(path, "w") as f:
            f.write(str(kb))
    except OSError as e:
        log.debug("cannot set %s: %s", path, e.strerror)


def describe_options(cfg: MountConfig) -> str:
    shown: dict[str, Any] = {}
    for k, v in vars(cfg).items():
        if k in ("source", "mountpoint"):
            continue
        if k in ("remote_options", "target_options") and v:
            v = {key: "***" for key in v}  # keys only: values may be credentials
        shown[k] = v
    return json.dumps(shown, sort_keys=True)


def _detached_main() -> int:
    """Entry of the detached daemon: config on stdin, readiness on --ready-fd."""
    ready_fd = int(sys.argv[sys.argv.index("--ready-fd") + 1])
    text = sys.stdin.read()
    if not text:
        return 0  # the CLI found a problem before handing over: nothing to do
    payload = json.loads(text)
    cfg = MountConfig(**payload["config"])
    index_file = IndexFile(**payload["index"])
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.chdir("/")
    ready = os.fdopen(ready_fd, "w")

    def report(message: str) -> None:
        try:
            ready.write(message + "\n")
            ready.close()
        except OSError:
            pass

    try:
        setup_logging(cfg, detached=True)
        os.dup2(devnull, 2)  # from here on everything goes to the log
        return serve(cfg, index_file, lambda: report("READY"))
    except MountError as e:
        report(f"ERROR {e}")
        return 1
    except Exception as e:
        log.exception("daemon failed")
        report(f"ERROR daemon failed: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(_detached_main())
