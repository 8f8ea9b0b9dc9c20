"""A real HTTP server for the tests: Debian's nginx with a configuration of its own.

nginx's static module answers ``Range`` requests (206 Partial Content) by default, which is what
fsspec's HTTP filesystem needs for byte-range references. The server listens on 127.0.0.1 only,
keeps its pid file, logs and temp directories in a private directory, runs in the foreground as
our child (``-g 'daemon off;'``) and is stopped by its own PID.

The access log records the ``X-Refmount-Test`` request header and the ``Range`` header, so tests
can check that options such as ``remote_options`` reach the HTTP requests.

Standalone use (for a quick manual check)::

    python tests/support/servers.py DIR       # serves DIR until Ctrl-C
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

NGINX = "/usr/sbin/nginx"

_CONF = """\
{user_line}
worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 256; }}
http {{
    types {{
        application/json json;
        application/octet-stream bin nc gz zst;
        text/plain txt;
        text/html html;
    }}
    default_type application/octet-stream;
    log_format refmount '$remote_addr "$request" $status $body_bytes_sent '
                        'range="$http_range" x_refmount_test="$http_x_refmount_test"';
    access_log {run}/access.log refmount;
    client_body_temp_path {run}/client_body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    sendfile on;
    keepalive_timeout 30;
    server {{
        listen 127.0.0.1:{port};
        server_name localhost;
        root {root};
{server_extra}
        location / {{
            autoindex off;
        }}
    }}
}}
"""


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3(objects: dict[str, bytes], public: bool = False):
    """moto's S3 server in a process of its own (moto keeps its buckets per process) on a free
    loopback port, holding ``objects`` ("bucket/key": bytes); yields its endpoint URL. With
    ``public``, anyone may read the buckets (as a public dataset's bucket)."""
    import s3fs

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _port_answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start (exit status {proc.poll()})")
            time.sleep(0.1)
        fs = s3fs.S3FileSystem(key="test", secret="test", skip_instance_cache=True,
                               client_kwargs={"endpoint_url": endpoint, "region_name": "eu-west-1"})
        for path, data in objects.items():
            bucket = path.split("/", 1)[0]
            if not fs.exists(bucket):
                fs.mkdir(bucket)
                if public:
                    fs.call_s3("put_bucket_acl", Bucket=bucket, ACL="public-read")
            fs.pipe(path, data)
            if public:
                fs.call_s3("put_object_acl", Bucket=bucket, Key=path.split("/", 1)[1],
                           ACL="public-read")
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _port_answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


class NginxServer:
    """nginx serving ``root`` (read-only, with Range support) on 127.0.0.1:``port``."""

    def __init__(self, root: str | os.PathLike, run_dir: str | os.PathLike | None = None,
                 server_extra: str = ""):
        """``server_extra``: more directives for the ``server`` block (e.g. ``add_header``)."""
        self.root = Path(root).resolve()
        self.server_extra = server_extra
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="refmount-nginx-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "server not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.run_dir / "access.log"

    @property
    def error_log(self) -> Path:
        return self.run_dir / "error.log"

    def _write_conf(self, port: int) -> Path:
        user_line = ""
        if os.geteuid() == 0:
            # Without this, nginx started as root runs its worker as "nobody", which cannot
            # read pytest's 0700 temporary directories.
            user = pwd.getpwuid(os.geteuid()).pw_name
            group = grp.getgrgid(os.getegid()).gr_name
            user_line = f"user {user} {group};"
        conf = self.run_dir / "nginx.conf"
        conf.write_text(
            _CONF.format(user_line=user_line, run=self.run_dir, port=port, root=self.root,
                         server_extra=self.server_extra)
        )
        return conf

    def start(self, timeout: float = 10.0) -> NginxServer:
        last_err = ""
        for _attempt in range(5):
            port = free_port()
            conf = self._write_conf(port)
            stderr = open(self.run_dir / "nginx.stderr", "ab")  # noqa: SIM115
            try:
                self.proc = subprocess.Popen(
                    [NGINX, "-c", str(conf), "-p", str(self.run_dir),
                     "-e", str(self.error_log), "-g", "daemon off;"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                )
            finally:
                stderr.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if _port_answers(port):
                    self.port = port
                    return self
                time.sleep(0.05)
            # Failed (most likely the port was taken meanwhile): clean up and retry.
            self._stop_proc()
            last_err = (self.run_dir / "nginx.stderr").read_text(errors="replace")
            if self.error_log.exists():
                last_err += self.error_log.read_text(errors="replace")
        raise RuntimeError(f"nginx did not start: {last_err[-2000:]}")

    def _stop_proc(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # SIGQUIT: graceful shutdown of the master and its worker.
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def stop(self) -> None:
        self._stop_proc()
        self.port = None

    def access_lines(self) -> list[str]:
        if not self.access_log.exists():
            return []
        return self.access_log.read_text(errors="replace").splitlines()

    def __enter__(self) -> NginxServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class NginxConfigured(NginxServer):
    """nginx running a whole configuration of the caller's: ``render(port)`` gives its text
    for the port to listen on (pid file, logs and caches under ``run_dir``, the caller's job)."""

    def __init__(self, render: Callable[[int], str], run_dir: str | os.PathLike) -> None:
        super().__init__(run_dir, run_dir=run_dir)
        self.render = render

    def _write_conf(self, port: int) -> Path:
        conf = self.run_dir / "nginx.conf"
        conf.write_text(self.render(port))
        return conf

    def user_line(self) -> str:
        """``user NAME GROUP;`` for this process's user (nginx started as root otherwise runs
        its workers as nobody, who cannot read pytest's private temporary directories)."""
        return f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"


def _main(argv: list[str]) -> int:
    root = argv[1] if len(argv) > 1 else "."
    with NginxServer(root) as srv:
        print(f"serving {srv.root} at {srv.url} (logs in {srv.run_dir}); Ctrl-C to stop")
        with contextlib.suppress(KeyboardInterrupt):
            while srv.proc is not None and srv.proc.poll() is None:
                time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
