"""A fault-injecting HTTP/1.1 server for the tests (loopback only, threads in this process).

``FaultServer(root)`` serves the files under ``root`` on ``127.0.0.1:<free port>``:

* ``GET`` with ``Range: bytes=a-b`` / ``a-`` / ``-n`` answers ``206 Partial Content`` with a
  ``Content-Range``; without ``Range`` it answers ``200`` with the whole file; ``HEAD`` answers
  with the ``Content-Length`` of the file and ``Accept-Ranges: bytes``. Keep-alive (HTTP/1.1).
* Per path, a *fault script* (a list of :class:`Fault`) says how the next requests misbehave.
  Each request takes the first fault that still has uses left (``times=None``: for ever);
  when the script is used up the path is served correctly again. Kinds:

  ``status``       answer ``status`` (500, 503, 404, ...) with a small body
  ``drop``         send the headers and ``fraction`` of the body, then close the connection
  ``short``        ``206`` with the full ``Content-Range`` but only ``fraction`` of the body
                   (``Content-Length`` matches what is sent: the framing is valid, the data short)
  ``extra``        ``206`` with ``extra`` bytes more than asked (Content-Range and Length agree
                   with the longer body, not with the request)
  ``ignore_range`` ``200`` with the whole file, as a server without Range support would
  ``wrong_range``  ``206`` with as many bytes as asked, but from ``shift`` bytes further on, and
                   a ``Content-Range`` that says so
  ``stall``        answer nothing for ``seconds`` (bounded; ended early by ``stop()``), then
                   close the connection
  ``stall_body``   send the headers and ``fraction`` of the body, then stall like ``stall``
  ``delay``        wait ``seconds``, then answer correctly (a slow, far-away store)
  ``endless``      ``206`` with the right ``Content-Range`` but no ``Content-Length``, then a
                   body that never ends (until the client hangs up, ``seconds`` pass or
                   ``stop()``); ``Request.sent`` counts the body bytes written

  ``encoded``      the file's bytes as stored, labelled ``Content-Encoding: <encoding>`` (a
                   gzip file served as a gzip-encoded transfer of what it holds; a bomb stays
                   a few bytes on disk); with ``methods=("GET", "HEAD")`` HEAD says so too

  ``redirect``     answer ``status`` (301, 302, 303, 307, 308) with ``Location: <location>``
                   (an absolute URL, a path, or anything else a hostile server may send; empty:
                   no ``Location`` header)

  Faults apply to ``GET`` unless ``methods`` says otherwise, and with ``min_bytes`` only to a
  request whose ``Range: bytes=a-b`` asks for at least that many bytes (others pass it by).
* Every request is recorded (:class:`Request`: time, method, path, query, headers, status,
  fault); ``count(path)`` counts them per path.
* ``require_bearer(lifetime)`` makes every path but ``TOKEN_PATH`` answer ``401`` unless the
  request carries ``Authorization: Bearer <token>`` with a token this server issued less than
  ``lifetime`` seconds ago. ``GET TOKEN_PATH`` issues one: ``{"token": ..., "expiry": <epoch
  seconds>}`` (what a credential process would ask an identity provider for);
  ``tokens_issued()`` lists them with their expiries.
* ``stop()`` ends stalls, closes open connections and joins the serving thread.

Standalone use (serves DIR without faults until Ctrl-C)::

    python tests/support/faultserver.py DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

FAULT_KINDS = ("status", "drop", "short", "extra", "ignore_range", "wrong_range", "stall",
               "stall_body", "delay", "endless", "encoded", "redirect")
MAX_STALL = 120.0  # no stall lasts longer than this, whatever the test asks
TOKEN_PATH = "/_token"  # issues bearer tokens once require_bearer() is on


@dataclass
class Fault:
    kind: str
    times: int | None = 1  # None: every request, for ever
    status: int = 503  # for "status"
    fraction: float = 0.5  # share of the body sent by "drop", "short", "stall_body"
    extra: int = 16  # bytes added by "extra"
    shift: int = 1  # offset added by "wrong_range"
    seconds: float = 30.0  # length of "stall" / "stall_body"
    encoding: str = "gzip"  # the Content-Encoding of "encoded"
    location: str = ""  # the Location of "redirect"
    methods: tuple[str, ...] = ("GET",)
    min_bytes: int = 0  # only requests asking for a range at least this long
    used: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r} (one of {FAULT_KINDS})")

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.used >= self.times


@dataclass
class Request:
    time: float  # time.monotonic() when the request line was read
    method: str
    path: str
    query: str
    headers: dict[str, str]
    range: str | None
    status: int | None = None  # None: no status line was sent (stall, dropped)
    fault: str | None = None
    end: float | None = None  # when the response was finished or abandoned
    raw_target: str = ""  # the request target exactly as received
    sent: int = 0  # body bytes written ("endless")


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "faultserver/1"
    server: _Server

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    # --- helpers ----------------------------------------------------------------------------
    def _finish(self, rec: Request, status: int | None) -> None:
        rec.status = status
        rec.end = time.monotonic()

    def _send(self, rec: Request, status: int, headers: dict[str, str], body: bytes = b"",
              head: bool = False, close: bool = False) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body and not head:
            self.wfile.write(body)
        self.wfile.flush()
        self._finish(rec, status)

    def _abort(self) -> None:
        """Close the connection without a proper end (a dead server, a cut cable)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stall(self, seconds: float) -> None:
        self.server.stopping.wait(min(max(seconds, 0.0), MAX_STALL))

    def _serve(self, head: bool) -> None:
        srv = self.server.owner
        split = urlsplit(self.path)
        path = unquote(split.path)
        rng = self.headers.get("Range")
        rec = Request(time.monotonic(), self.command, path, split.query,
                      {k: v for k, v in self.headers.items()}, rng, raw_target=self.path)
        if srv._bearer_lifetime is not None and path == TOKEN_PATH:
            srv._record(rec)
            body = json.dumps(srv.issue_token()).encode()
            self._send(rec, 200, {"Content-Type": "application/json",
                                  "Content-Length": str(len(body))}, body, head)
            return
        if srv._bearer_lifetime is not None and not srv._authorized(
                self.headers.get("Authorization", "")):
            srv._record(rec)
            body = b"401 no valid bearer token\n"
            self._send(rec, 401, {"Content-Type": "text/plain", "WWW-Authenticate": "Bearer",
                                  "Content-Length": str(len(body))}, body, head)
            return
        asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", "").strip())
        fault = srv._take_fault(path, self.command, int(asked[2]) - int(asked[1]) + 1 if asked else None)
        rec.fault = fault.kind if fault else None
        srv._record(rec)

        if fault is not None and fault.kind == "status":
            body = f"{fault.status} injected by faultserver\n".encode()
            self._send(rec, fault.status, {"Content-Type": "text/plain",
                                           "Content-Length": str(len(body))}, body, head)
            return
        if fault is not None and fault.kind == "redirect":
            body = b"redirected by faultserver\n"
            where = {"Location": fault.location} if fault.location else {}
            self._send(rec, fault.status, {"Content-Type": "text/plain", **where,
                                           "Content-Length": str(len(body))}, body, head)
            return
        if fault is not None and fault.kind == "stall":
            self._stall(fault.seconds)
            self._finish(rec, None)
            self._abort()
            return
        if fault is not None and fault.kind == "delay":
            self._stall(fault.seconds)
            fault = None  # then served like any request

        file = srv.file_for(path)
        if file is None:
            body = b"404 not found\n"
            self._send(rec, 404, {"Content-Type": "text/plain",
                                  "Content-Length": str(len(body))}, body, head)
            return
        data = file.read_bytes()
        size = len(data)
        encoded = {"Content-Encoding": fault.encoding} if fault and fault.kind == "encoded" else {}
        if head:
            self._send(rec, 200, {"Content-Length": str(size), "Accept-Ranges": "bytes",
                                  "Content-Type": "application/octet-stream", **encoded}, head=True)
            return

        start, end = 0, size  # [start, end)
        partial = False
        if rng is not None and not (fault is not None and fault.kind == "ignore_range"):
            m = _RANGE.match(rng.strip())
            if m is None or (m.group(1) == "" and m.group(2) == ""):
                self._send(rec, 416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"})
                return
            if m.group(1) == "":
                start, end = max(size - int(m.group(2)), 0), size
            else:
                start = int(m.group(1))
                end = min(int(m.group(2)) + 1, size) if m.group(2) else size
            if start >= size or start >= end:
                self._send(rec, 416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"})
                return
            partial = True

        kind = fault.kind if fault is not None else None
        if kind == "endless" and partial:
            self._endless(rec, start, end, size, fault.seconds)
            return
        if kind == "wrong_range" and partial:
            start, end = start + fault.shift, min(end + fault.shift, size)
        body = data[start:end]
        if kind == "extra" and partial:
            # more than asked: the following bytes of the file, padded past its end
            body += data[end : end + fault.extra].ljust(fault.extra, b"X")
            end = start + len(body)
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes", **encoded}
        status = 206 if partial else 200
        if partial:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"

        if kind == "short":
            cut = body[: int(len(body) * fault.fraction)]
            headers["Content-Length"] = str(len(cut))
            self._send(rec, status, headers, cut, close=True)
            return
        headers["Content-Length"] = str(len(body))
        if kind in ("drop", "stall_body"):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[: int(len(body) * fault.fraction)])
            self.wfile.flush()
            if kind == "stall_body":
                self._stall(fault.seconds)
            self._finish(rec, status)
            self._abort()
            return
        self._send(rec, status, headers, body, close=kind is not None)


    def _endless(self, rec: Request, start: int, end: int, size: int, seconds: float) -> None:
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        piece = b"E" * 2**16
        deadline = time.monotonic() + min(seconds, MAX_STALL)
        try:
            while time.monotonic() < deadline and not self.server.stopping.is_set():
                self.wfile.write(piece)
                rec.sent += len(piece)
        except OSError:
            pass  # the client hung up: what a bounded reader does
        self._finish(rec, 206)
        self._abort()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, owner: FaultServer) -> None:
        self.owner = owner
        self.stopping = threading.Event()
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request, client_address) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up on purpose (timeouts) are expected


class FaultServer:
    """Files under ``root`` over HTTP/1.1 on 127.0.0.1, with per-path fault scripts."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self._lock = threading.Lock()
        self._faults: dict[str, list[Fault]] = {}
        self.requests: list[Request] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._bearer_lifetime: float | None = None
        self._tokens: dict[str, float] = {}  # token -> expiry (time.time())

    # --- life cycle -----------------------------------------------------------------------
    def start(self) -> FaultServer:
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="faultserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        srv, self._server = self._server, None
        if srv is None:
            return
        srv.stopping.set()  # ends stalls
        srv.shutdown()  # stops accepting; returns once serve_forever has returned
        with srv.conn_lock:
            conns = list(srv.connections)
        for c in conns:  # keep-alive connections parked in handler threads
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        srv.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, path: str, userinfo: str = "", query: str = "") -> str:
        host = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return f"http://{host}/{path.lstrip('/')}" + (f"?{query}" if query else "")

    # --- content --------------------------------------------------------------------------
    def file_for(self, path: str) -> Path | None:
        rel = path.lstrip("/")
        if not rel or any(part in ("..", ".") for part in rel.split("/")):
            return None
        p = self.root / rel
        return p if p.is_file() else None

    def put(self, rel: str, data: bytes) -> str:
        """Write a file under ``root``; returns its URL."""
        rel = rel.lstrip("/")
        if any(part in ("", ".", "..") for part in rel.split("/")):
            raise ValueError(f"bad relative path {rel!r}")
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return self.url_for(rel)

    # --- faults ---------------------------------------------------------------------------
    @staticmethod
    def _key(path: str) -> str:
        return "/" + unquote(urlsplit(path).path if "://" in path else path).lstrip("/")

    def add_fault(self, path: str, kind: str, times: int | None = 1, **params) -> Fault:
        """Append a fault to the script of ``path`` (a path like ``/data/a.bin`` or a URL)."""
        fault = Fault(kind, times, **params)
        with self._lock:
            self._faults.setdefault(self._key(path), []).append(fault)
        return fault

    def redirect(self, path: str, location: str, status: int = 302) -> Fault:
        """Make ``path`` answer every GET and HEAD with a redirect to ``location``."""
        return self.add_fault(path, "redirect", None, status=status, location=location,
                              methods=("GET", "HEAD"))

    def set_faults(self, path: str, faults: list[Fault]) -> None:
        with self._lock:
            self._faults[self._key(path)] = list(faults)

    def clear_faults(self, path: str | None = None) -> None:
        with self._lock:
            if path is None:
                self._faults.clear()
            else:
                self._faults.pop(self._key(path), None)

    def _take_fault(self, path: str, method: str, asked: int | None = None) -> Fault | None:
        with self._lock:
            for f in self._faults.get(path, []):
                if f.exhausted or method not in f.methods:
                    continue
                if f.min_bytes and (asked is None or asked < f.min_bytes):
                    continue
                f.used += 1
                return f
        return None

    # --- bearer tokens --------------------------------------------------------------------
    def require_bearer(self, lifetime: float) -> None:
        """From now on every path but ``TOKEN_PATH`` needs a token issued at most ``lifetime``
        seconds ago (see the module's docstring)."""
        with self._lock:
            self._bearer_lifetime = lifetime

    def issue_token(self) -> dict[str, object]:
        """A new token and its expiry (seconds since the epoch)."""
        with self._lock:
            assert self._bearer_lifetime is not None, "require_bearer() first"
            token = secrets.token_urlsafe(24)
            expiry = time.time() + self._bearer_lifetime
            self._tokens[token] = expiry
        return {"token": token, "expiry": expiry}

    def tokens_issued(self) -> dict[str, float]:
        """Every token issued, in order, with its expiry."""
        with self._lock:
            return dict(self._tokens)

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        with self._lock:
            expiry = self._tokens.get(token.strip())
        return expiry is not None and time.time() < expiry

    # --- request log ----------------------------------------------------------------------
    def _record(self, rec: Request) -> None:
        with self._lock:
            self.requests.append(rec)

    def log(self, path: str | None = None, method: str | None = "GET") -> list[Request]:
        key = None if path is None else self._key(path)
        with self._lock:
            return [r for r in self.requests
                    if (key is None or r.path == key) and (method is None or r.method == method)]

    def count(self, path: str | None = None, method: str | None = "GET") -> int:
        return len(self.log(path, method))

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()


@contextlib.contextmanager
def serving(root: Path) -> Iterator[FaultServer]:
    """A started fault server serving the new directory ``root``, stopped on leaving."""
    s = FaultServer(root)
    s.root.mkdir(parents=True)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _main(argv: list[str]) -> int:
    root = argv[1] if len(argv) > 1 else "."
    with FaultServer(root) as srv:
        print(f"serving {srv.root} at {srv.url}; Ctrl-C to stop")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
