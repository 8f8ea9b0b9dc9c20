"""A real browser for the tests: Debian's headless Chromium fetching across origins.

``browser_fetch`` writes a page into a directory that a server on one loopback origin serves
(the *page origin*, e.g. an ``NginxServer`` of that directory), loads it in Chromium, and the
page's script ``fetch()``es each ``Fetch`` on another origin (the server under test), exactly
as a zarr viewer would: with its headers (``Range``...), following the CORS protocol
(preflights included). The script writes a JSON report into the page; Chromium's
``--dump-dom`` prints the page once the fetches are done (``--virtual-time-budget`` holds the
dump until pending network loads end), and ``--enable-logging=stderr`` gives the console:
the page's own ``console.log`` lines and Chromium's CORS refusals ("blocked by CORS
policy"), which the caller prints into the test log.

Per fetch the report says whether the script could read the response (``ok``: a CORS
refusal is a ``TypeError`` in the script, ``error``), its status, the response headers the
script may see (``Content-Range``, ``Content-Length``, ``ETag``, ``Accept-Ranges``: only if
exposed) and the body's length and first bytes.

Chromium runs as root here, so without its sandbox (``--no-sandbox``), in a new session whose
process group is killed if it outlives ``timeout``, with a private ``--user-data-dir`` and no
network beyond the page's own requests.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
    "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0",
)
PAGE_NAME = "refmount-browser-check.html"
READ_HEADERS = ("Content-Range", "Content-Length", "ETag", "Accept-Ranges", "Content-Type")

_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>refmount browser check</title></head>
<body><pre id="result">pending</pre>
<script>
const FETCHES = {fetches};
const READ = {read_headers};
(async () => {{
  const out = {{}};
  for (const f of FETCHES) {{
    const r = {{}};
    try {{
      const resp = await fetch(f.url, {{method: f.method, headers: f.headers, cache: "no-store"}});
      r.ok = true;
      r.status = resp.status;
      r.headers = {{}};
      for (const h of READ) {{
        const v = resp.headers.get(h);
        if (v !== null) r.headers[h] = v;
      }}
      const body = new Uint8Array(await resp.arrayBuffer());
      r.length = body.length;
      r.head = Array.from(body.slice(0, 64)).map(b => b.toString(16).padStart(2, "0")).join("");
    }} catch (e) {{
      r.ok = false;
      r.error = String(e);
    }}
    out[f.name] = r;
    console.log("refmount-browser " + f.name + ": " + JSON.stringify(r));
  }}
  document.getElementById("result").textContent = JSON.stringify(out);
}})();
</script></body></html>
"""

_RESULT = re.compile(r'<pre id="result">(.*?)</pre>', re.S)
_CONSOLE = re.compile(r':CONSOLE[:(]\d+\)?\] "(.*)", source: (\S+)')


@dataclass(frozen=True)
class Fetch:
    """One ``fetch()`` the page makes: a name for the report, the URL, its request headers."""

    name: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "GET"


@dataclass
class BrowserReport:
    """What the page reported (``results``: name -> report), and Chromium's console lines."""

    results: dict[str, dict]
    console: list[str]
    seconds: float
    returncode: int
    stderr_tail: str

    def log(self) -> str:
        """The console output, one line each, for the test log."""
        return "\n".join(f"[chromium console] {line}" for line in self.console)


def _console_lines(stderr: str) -> list[str]:
    lines = []
    for raw in stderr.splitlines():
        m = _CONSOLE.search(raw)
        if m:
            lines.append(f"{m.group(1)} ({m.group(2)})")
    return lines


def browser_fetch(page_dir: Path, page_origin: str, fetches: list[Fetch], *,
                  timeout: float = 60.0) -> BrowserReport:
    """Load ``page_origin/PAGE_NAME`` (written into ``page_dir``, which that origin serves) in
    headless Chromium and return what its ``fetches`` gave, within ``timeout`` seconds."""
    page = _PAGE.format(
        fetches=json.dumps([f.__dict__ for f in fetches]),
        read_headers=json.dumps(READ_HEADERS),
    )
    (Path(page_dir) / PAGE_NAME).write_text(page)
    budget_ms = int(max(1.0, timeout - 5) * 1000)
    with tempfile.TemporaryDirectory(prefix="refmount-chromium-") as profile:
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
               f"--virtual-time-budget={budget_ms}", "--dump-dom",
               f"{page_origin.rstrip('/')}/{PAGE_NAME}"]
        env = {**os.environ, "HOME": profile}
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate(timeout=10)
        finally:
            _kill_group(proc)  # a child left behind by the browser dies with its group
        seconds = time.monotonic() - start
    m = _RESULT.search(out or "")
    results: dict[str, dict] = {}
    if m:
        with contextlib.suppress(ValueError):
            results = json.loads(html.unescape(m.group(1)))
    return BrowserReport(results, _console_lines(err or ""), seconds, proc.returncode,
                         (err or "")[-3000:])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the browser's own process group (the session it was started in)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
