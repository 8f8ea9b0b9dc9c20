"""The serving process of ``refmount serve``: map the index, listen, answer HTTP until signalled.

Like the mount's daemon (``fuse/daemon.py``): started in the foreground (``refmount serve -f``) or
as a detached child of the CLI (``python -m refmount.http.daemon --ready-fd N LISTEN``), which
receives its configuration as JSON on stdin and reports ``READY <url>`` or ``ERROR <message>``
on the inherited pipe. The socket is bound before anything else starts, so an address in
use is one error line and nothing left behind; READY (and systemd's ``READY=1``) comes once
an HTTP request to the server has been answered.
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

import trio

from refmount.base import guestloop, process
from refmount.base.errors import ConfigError, MountError
from refmount.base.redact import redact_in_logs, redact_url
from refmount.base.triocall import TrioCaller
from refmount.config import MountConfig, describe_options, read_token, split_listen
from refmount.core.setcore import SetCore, build_core
from refmount.http.frontend import HttpFrontEnd
from refmount.http.s3listener import S3Listener, s3_checker
from refmount.http.sets import SetsRouter
from refmount.refs import IndexFile
from refmount.serving.readiness import run_detached, sd_notify
from refmount.sets.setmount import SetMount, build_sets, serves_sets
from refmount.targets.filesystems import await_task

log = logging.getLogger("refmount")


def bind(listen: str) -> socket.socket:
    """A listening socket on ``HOST:PORT``; MountError saying why not."""
    host, port = split_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise MountError(f"cannot listen on {listen}: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    try:
        return socket.create_server(address, family=family, backlog=1024)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise MountError(f"cannot listen on {listen}: the address is in use (another server "
                             "listens there: choose another with --listen HOST:PORT)") from None
        raise MountError(f"cannot listen on {listen}: {e.strerror}") from None


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _probe_address(sock: socket.socket) -> tuple[str, int]:
    """Where this process can reach its own server (a wildcard address by loopback)."""
    host, port = sock.getsockname()[:2]
    if ipaddress.ip_address(host).is_unspecified:
        host = "::1" if ":" in host else "127.0.0.1"
    return host, port


def is_loopback(sock: socket.socket) -> bool:
    return ipaddress.ip_address(sock.getsockname()[0]).is_loopback


def serve(cfg: MountConfig, index_file: IndexFile, on_ready: Callable[[str], None]) -> int:
    """Listen and serve until signalled. Raises MountError before serving."""
    trim = process.tune()
    try:
        token = read_token(cfg.auth_token) if cfg.auth_token else None
    except ConfigError as e:
        raise MountError(str(e)) from None
    if token:
        redact_in_logs(token)  # a malformed request quoting it: aiohttp logs it as it came
    checker = s3_checker(cfg, token)
    sock = bind(cfg.listen)
    s3sock = metrics_sock = None
    try:
        s3sock = bind(cfg.s3_listen) if cfg.s3_listen else None
        if cfg.metrics:
            from refmount.serving.metrics import bind as bind_metrics

            metrics_sock = bind_metrics(cfg.metrics)
    except BaseException:
        sock.close()
        if s3sock is not None:
            s3sock.close()
        raise
    try:
        core: SetCore | SetMount = (build_sets(cfg, index_file) if serves_sets(cfg)
                                    else build_core(cfg, index_file))
    except BaseException:
        sock.close()
        for extra in (s3sock, metrics_sock):
            if extra is not None:
                extra.close()
        raise
    url = base_url(sock)
    if not is_loopback(sock):
        log.warning("serving on %s: other hosts can reach it%s", url,
                    "" if token else " without a token (auth_token=@FILE)")
    summary = core.summary if isinstance(core, SetMount) else f"{core.info['keys']} keys"
    log.info("serving %s at %s: %s (options: %s)", redact_url(cfg.source), url, summary,
             describe_options(cfg))
    s3 = S3Listener(s3sock, cfg, checker) if s3sock is not None else None
    state: dict[str, HttpFrontEnd] = {}

    async def before_close() -> None:
        front = state.get("front")
        if front is not None:
            await front.shutdown(timeout=1.0)
        if s3 is not None:
            await s3.shutdown()
        await core.aclose()

    try:
        guestloop.run(_main, cfg, core, sock, token, url, on_ready, trim, state, s3, metrics_sock,
                      on_loop=core.bind_loop, before_close=before_close)
    finally:
        sock.close()
        for extra in (s3sock, metrics_sock):
            if extra is not None:
                extra.close()
        core.close(timeout=5.0)
        front = state.get("front")
        counters = front.counters() if front is not None else core.stats.as_dict()
        log.info("stopped serving %s: %d HTTP requests, %d bytes sent, %d fetches, %d errors",
                 url, counters.get("http_requests", 0), counters.get("http_bytes_sent", 0),
                 counters["requests"], counters["errors"])
    return 0


async def _main(cfg: MountConfig, core: SetCore | SetMount, sock: socket.socket, token: str | None, url: str,
                on_ready: Callable[[str], None], trim: Callable[[int], int] | None,
                state: dict[str, HttpFrontEnd], s3: S3Listener | None,
                metrics_sock: socket.socket | None) -> None:
    loop = asyncio.get_running_loop()
    async with trio.open_nursery() as nursery:
        core.start(nursery, trim)
        caller = TrioCaller(nursery)
        settings = {"cors": cfg.cors, "token": token, "max_clients": cfg.max_clients,
                    "client_timeout": cfg.client_timeout, "cache_seconds": cfg.attr_timeout}
        if isinstance(core, SetMount):  # a catalogue, or a set with reload: routed per set
            if cfg.reload:  # clients keep a response no longer than a set may stay unchanged
                settings["cache_seconds"] = min(cfg.attr_timeout, cfg.reload)
            router = SetsRouter(core.sets, caller, single=not cfg.catalog, settings=settings,
                                describe=core.describe)
            front = HttpFrontEnd(None, caller, **settings, router=router)
        else:
            front = HttpFrontEnd(core, caller, **settings)
        state["front"] = front
        server = await await_task(loop, loop.create_server(front.protocol_factory, sock=sock))
        servers = [server]
        if s3 is not None:
            servers.append(await await_task(loop, s3.start(loop, front)))
        nursery.start_soon(_stop_on_signal, nursery, servers)
        if metrics_sock is not None:  # -o metrics: also on a listener of its own
            from refmount.serving.metrics import MetricsCollector, MetricsListener

            nursery.start_soon(MetricsListener(MetricsCollector(front.reading)).serve, metrics_sock)
        # The server answers once a request from another thread comes back through our loop.
        await trio.to_thread.run_sync(_answers, _probe_address(sock), token)
        on_ready(url)
        sd_notify("READY=1\nSTATUS=serving " + url)
        await core.warm()


def _answers(address: tuple[str, int], token: str | None) -> None:
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("HEAD", "/", headers={"Authorization": f"Bearer {token}"} if token else {})
        conn.getresponse().read()
    finally:
        conn.close()


async def _stop_on_signal(nursery: trio.Nursery, servers: list[asyncio.AbstractServer]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, stopping", signal.Signals(signum).name)
            sd_notify("STOPPING=1")
            for server in servers:
                server.close()  # no new connections; open ones end with the loop
            nursery.cancel_scope.cancel()
            return


def _detached_main() -> int:
    return run_detached("server", lambda cfg, index_file, report, log_target: serve(
        cfg, index_file, lambda url: report(f"READY {url} {os.getpid()}")))


if __name__ == "__main__":
    sys.exit(_detached_main())
