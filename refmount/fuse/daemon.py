"""The serving process: map the index, mount, answer FUSE requests on trio, unmount.

Started either in the foreground (``refmount -f``) or as a detached child of the CLI
(``python -m refmount.fuse.daemon``), which receives its configuration as JSON on stdin (not
argv, to keep secrets out of ``ps``) and reports readiness on an inherited pipe
(serving/readiness.py). The set's core is core/setcore.py's; this module adds the FUSE wiring over it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyfuse3
import trio

from refmount.base import guestloop, process
from refmount.base.errors import MountError
from refmount.base.redact import redact_url
from refmount.config import MountConfig, describe_options
from refmount.fuse.catalogops import CatalogFS
from refmount.fuse.mountfailure import captured_stderr, explain
from refmount.fuse.mountpoint import check_mountpoint
from refmount.fuse.noopen import choose_no_open
from refmount.fuse.operations import RefFS
from refmount.fuse.pagepush import PagePusher
from refmount.fuse.requestwait import install as quick_request_wait
from refmount.refs import IndexFile
from refmount.serving.readiness import run_detached, sd_notify
from refmount.sets.setmount import SetMount, build_sets, serves_sets

if TYPE_CHECKING:  # a set's core (the read path: fsspec's HTTP, numpy, pyarrow) is imported
    # when one is built, so that a catalogue mounts before any of it is loaded
    from refmount.base.stats import Stats
    from refmount.cache.blocks import DiskCache
    from refmount.cache.writer import CacheWriter
    from refmount.core.reader import RefReader
    from refmount.core.setcore import SetCore
    from refmount.decode.decoder import ChunkDecoder
    from refmount.targets.fetch import Fetcher

log = logging.getLogger("refmount")

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


class Mount:
    """One set's core (``core.SetCore``) and the FUSE operations over it, owning their
    start-up and shutdown.

    Made by ``build_filesystem``; nothing runs yet and nothing is left behind if it is
    dropped (``close`` is safe at any point). Serving follows the core's lifecycle
    (``core/setcore.py``): ``bind_loop``, ``start(nursery)`` (which also gives the FUSE operations
    the nursery their kernel notifications run in), the mount answers (the daemon's
    business: ``pyfuse3.init``, READY), ``warm()``, then ``aclose()`` and ``close()``.
    """

    user_signals = False  # SIGUSR1 and SIGUSR2 are logged and ignored

    def __init__(self, core: SetCore, fs: RefFS) -> None:
        self.core = core
        self.fs = fs

    @property
    def summary(self) -> str:
        return f"{self.core.info['keys']} keys"

    @property
    def stats(self) -> Stats:
        return self.core.stats

    @property
    def info(self) -> dict[str, str]:
        return self.core.info

    @property
    def fetcher(self) -> Fetcher:
        return self.core.fetcher

    @property
    def reader(self) -> RefReader:
        return self.core.reader

    @property
    def disk(self) -> DiskCache | None:
        return self.core.disk

    @property
    def writer(self) -> CacheWriter | None:
        return self.core.writer

    @property
    def decoder(self) -> ChunkDecoder | None:
        return self.core.decoder

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.core.bind_loop(loop)

    def start(self, nursery: trio.Nursery, trim: Callable[[int], int] | None = None) -> None:
        """Background work of the FUSE operations and of every part of the core runs in
        ``nursery`` from now on (see ``SetCore.start``)."""
        self.fs.attach(nursery)
        self.core.start(nursery, trim)

    async def warm(self) -> None:
        await self.core.warm()

    async def aclose(self) -> None:
        await self.core.aclose()

    def close(self, timeout: float = 5.0) -> None:
        self.core.close(timeout=timeout)


def build_filesystem(cfg: MountConfig, index_file: IndexFile) -> Mount:
    """The core of ``index_file`` and the FUSE operations over it, not yet running."""
    from refmount.core.setcore import build_core

    core = build_core(cfg, index_file)
    fs = RefFS(
        core.tree,
        core.reader,
        core.stats,
        pusher=PagePusher(pyfuse3.notify_store, core.stats) if cfg.page_push else None,
        uid=cfg.uid,
        gid=cfg.gid,
        umask=cfg.umask,
        attr_timeout=cfg.attr_timeout,
        mtime_ns=core.mtime_ns,
        info=core.info,
        decoder=core.decoder,
        no_open=cfg.no_open and choose_no_open(pyfuse3),
    )
    return Mount(core, fs)


def build_mount(cfg: MountConfig, index_file: IndexFile) -> Mount | SetMount:
    """What serves the mount: one set (``build_filesystem``), or, with ``-o catalog`` or
    ``reload``, the sets and the FUSE operations routing to them (``fuse/catalogops.py``)."""
    if not serves_sets(cfg):
        return build_filesystem(cfg, index_file)
    mount = build_sets(cfg, index_file)
    mount.fs = mount.front = CatalogFS(
        mount.sets, single=not cfg.catalog, uid=cfg.uid, gid=cfg.gid, umask=cfg.umask,
        attr_timeout=cfg.attr_timeout, page_push=cfg.page_push, mtime_ns=time.time_ns(),
        info=mount.info, describe=mount.describe)
    return mount


def serve(cfg: MountConfig, index_file: IndexFile, on_ready: Callable[[], None],
          log_target: str = "") -> int:
    """Mount and serve until unmounted or signalled. Raises MountError before mounting.
    ``log_target`` (what ``setup_logging`` returned) is shown by ``refmount stats``."""
    trim = process.tune()
    check_mountpoint(cfg.mountpoint, cfg.nonempty)
    metrics_sock = metrics_socket(cfg)
    try:
        mount = build_mount(cfg, index_file)
    except BaseException:
        if metrics_sock is not None:
            metrics_sock.close()
        raise
    if log_target:
        mount.info["log"] = "syslog (journalctl -t refmount)" if log_target == "syslog" else log_target
    with captured_stderr() as printed:  # libfuse's and fusermount3's reasons
        try:
            pyfuse3.init(mount.fs, cfg.mountpoint, fuse_options(cfg))
        except RuntimeError as e:
            mount.close()
            if metrics_sock is not None:
                metrics_sock.close()
            raise MountError(explain(cfg.mountpoint, str(e), printed())) from None
        said = printed().strip()
    if said:
        log.warning("while mounting: %s", said)
    log.info(
        "mounted %s on %s: %s (options: %s)",
        redact_url(cfg.source), cfg.mountpoint, mount.summary, describe_options(cfg),
    )
    try:
        # trio (FUSE) as a guest of the asyncio loop fsspec's filesystems run on: one thread.
        guestloop.run(_main, cfg, mount, on_ready, trim, metrics_sock, on_loop=mount.bind_loop,
                      before_close=mount.aclose)
    finally:
        if metrics_sock is not None:
            metrics_sock.close()
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


async def _main(cfg: MountConfig, mount: Mount | SetMount, on_ready: Callable[[], None],
                trim: Callable[[int], int] | None, metrics_sock: socket.socket | None) -> None:
    async with trio.open_nursery() as nursery:
        mount.start(nursery, trim)
        if metrics_sock is not None:
            nursery.start_soon(_serve_metrics, mount, metrics_sock)
        nursery.start_soon(_fuse_main, cfg, nursery)
        nursery.start_soon(_stop_on_signal, nursery)
        if not mount.user_signals:
            nursery.start_soon(_log_user_signals)
        # The mount answers once a stat from another thread comes back through our loop.
        st = await trio.to_thread.run_sync(os.stat, cfg.mountpoint)
        set_kernel_readahead(st.st_dev, cfg.read_ahead_kb)
        on_ready()
        sd_notify("READY=1\nSTATUS=serving " + cfg.mountpoint)
        await mount.warm()


def metrics_socket(cfg: MountConfig) -> socket.socket | None:
    """The listener of ``-o metrics``, bound before mounting (an address in use is an error
    and nothing mounted), or None."""
    if not cfg.metrics:
        return None
    from refmount.serving.metrics import bind

    return bind(cfg.metrics)


async def _serve_metrics(mount: Mount | SetMount, sock: socket.socket) -> None:
    from refmount.serving.metrics import MetricsCollector, MetricsListener, Reading

    if isinstance(mount, SetMount):
        sets, fs = mount.sets, mount.fs
        own = [fs.stats] if fs is not None else []

        def read() -> Reading:
            return Reading("fuse", cores=[v.core for v in sets.counted_versions()], own=own,
                           sets=mount.describe(), retired=sets.retired)
    else:
        def read() -> Reading:
            return Reading("fuse", cores=[mount.core])

    await MetricsListener(MetricsCollector(read)).serve(sock)


async def _fuse_main(cfg: MountConfig, nursery: trio.Nursery) -> None:
    wait = quick_request_wait(pyfuse3)  # fuse/requestwait.py
    await pyfuse3.main(min_tasks=4, max_tasks=cfg.max_tasks)
    if wait is not None:
        log.debug("requests read without waiting: %d, after waiting: %d", wait.fast_total, wait.waited_total)
    nursery.cancel_scope.cancel()  # unmounted from outside (fusermount3 -u)


# After a stop signal, requests in flight get this long to finish; then they are cancelled
# (fetches included) and their readers get an error once the mount is gone. Far inside
# systemd's stop timeout, whatever the fetch timeout is.
STOP_GRACE = 1.5


async def _stop_on_signal(nursery: trio.Nursery) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, unmounting", signal.Signals(signum).name)
            sd_notify("STOPPING=1")
            pyfuse3.terminate()
            break
    await trio.sleep(STOP_GRACE)  # cancelled with the nursery when main() ends by itself
    log.warning("requests still in flight %.1f s after the stop signal: cancelled", STOP_GRACE)
    nursery.cancel_scope.cancel()


async def _log_user_signals() -> None:
    """SIGUSR1 and SIGUSR2 are logged and otherwise ignored: the mount keeps serving."""
    with trio.open_signal_receiver(*process.USER_SIGNALS) as signals:
        async for signum in signals:
            log.info("received %s: nothing to do, still serving", signal.Signals(signum).name)


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


def _detached_main() -> int:
    return run_detached("daemon", lambda cfg, index_file, report, log_target: serve(
        cfg, index_file, lambda: report("READY"), log_target))


if __name__ == "__main__":
    sys.exit(_detached_main())
