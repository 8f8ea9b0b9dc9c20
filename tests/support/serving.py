"""``refmount serve`` for the serve tier: start the CLI (detached, as users do), talk HTTP to it,
read its counters, and always stop it (SIGTERM to the PID it reported, then SIGKILL)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .mounts import CliResult, run_cli, wait_gone


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT/
    pid: int
    log: Path
    source: str
    opts: list[str] = field(default_factory=list)
    stderr: str = ""  # what refmount serve said before detaching

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urllib.parse.urlsplit(self.url).port or 80

    def request(self, method: str, path: str, headers: dict[str, str] | None = None,
                timeout: float = 60) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, headers=headers or {})
            r = conn.getresponse()
            body = r.read()
            return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, body)
        finally:
            conn.close()

    def stats(self, headers: dict[str, str] | None = None) -> dict:
        r = self.request("GET", "/.refmount/stats", headers)
        assert r.status == 200, r
        return json.loads(r.body)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"

    def rss(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, wait until gone (SIGKILL after ``timeout``). Never raises."""
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(self.pid)
            if "refmount" not in " ".join(p.cmdline()):
                return  # not ours (the PID was reused)
            p.send_signal(signal.SIGTERM)
            if wait_gone([p], timeout):
                p.kill()
                wait_gone([p], 5)


def serve_cli(source: str | os.PathLike, *opts: str, listen: str = "127.0.0.1:0",
              foreground: bool = False, extra_env: dict[str, str] | None = None) -> CliResult:
    args = ["serve", str(source), "--listen", listen]
    if opts:
        args += ["-o", ",".join(opts)]
    if foreground:
        args.append("-f")
    return run_cli(*args, extra_env=extra_env)


class Servers:
    """Starts servers and stops every one of them at ``cleanup``."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Served] = []

    def __call__(self, source: str | os.PathLike, *opts: str) -> Served:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"serve{len(self.started)}.log"
        all_opts = [f"log={log}", "no_disk_cache", *opts]
        r = serve_cli(source, *all_opts)
        assert r.returncode == 0, f"refmount serve failed ({r.returncode}): {r.stderr}"
        url, pid = r.stdout.split()
        s = Served(url, int(pid), log, str(source), all_opts, r.stderr)
        self.started.append(s)
        return s

    def cleanup(self) -> None:
        for s in self.started:
            s.stop()
