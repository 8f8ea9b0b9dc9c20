"""The S3 listener of ``refmount serve`` (``--s3-listen``): its configuration checked at start,
its socket served by an ``S3Dialect`` over the HTTP view's front end."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

from refmount.base.errors import ConfigError, MountError
from refmount.base.redact import redact_in_logs
from refmount.config import MountConfig, read_token
from refmount.http.frontend import HttpFrontEnd
from refmount.http.s3auth import SigV4Checker
from refmount.http.s3dialect import S3Dialect
from refmount.http.s3request import bucket_name

log = logging.getLogger("refmount")

__all__ = ["S3Listener", "s3_checker"]


def s3_checker(cfg: MountConfig, token: str | None) -> SigV4Checker | None:
    """The SigV4 checker of the configured key pair (None: anonymous); MountError when the
    options do not go together."""
    if cfg.s3_listen is None:
        return None
    if (cfg.s3_access_key is None) != (cfg.s3_secret_key is None):
        raise MountError(
            "s3_access_key and s3_secret_key=@FILE go together: give both (signed "
            "requests only) or neither (anonymous)"
        )
    if cfg.s3_access_key is None:
        if token is not None:
            raise MountError(
                "--s3-listen with auth_token needs s3_access_key and s3_secret_key=@FILE: "
                "an anonymous S3 listener would serve what the token protects"
            )
        return None
    try:
        secret = read_token(cfg.s3_secret_key, "s3_secret_key")
    except ConfigError as e:
        raise MountError(str(e)) from None
    redact_in_logs(secret)
    return SigV4Checker(cfg.s3_access_key, secret, max_skew=cfg.s3_max_skew)


class S3Listener:
    def __init__(self, sock: socket.socket, cfg: MountConfig, checker: SigV4Checker | None) -> None:
        self.sock = sock
        self.cfg = cfg
        self.checker = checker
        self.dialect: S3Dialect | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    async def start(self, loop: asyncio.AbstractEventLoop, front: HttpFrontEnd) -> asyncio.AbstractServer:
        cfg = self.cfg
        bucket = cfg.s3_bucket or bucket_name(cfg.source)
        self.dialect = S3Dialect(front, bucket=bucket, region=cfg.s3_region, checker=self.checker)
        server = await loop.create_server(self.dialect.protocol_factory, sock=self.sock)
        what = "a bucket per set" if cfg.catalog else f"bucket {bucket}"
        access = "SigV4 with one key" if self.checker is not None else "anonymous"
        log.info("serving S3 (path-style, read-only) at %s: %s, %s", self.url, what, access)
        if not ipaddress.ip_address(self.sock.getsockname()[0]).is_loopback:
            log.warning(
                "serving S3 on %s: other hosts can reach it%s",
                self.url,
                "" if self.checker else " anonymously (s3_access_key, s3_secret_key=@FILE)",
            )
        return server

    async def shutdown(self) -> None:
        if self.dialect is not None:
            await self.dialect.shutdown(timeout=1.0)
