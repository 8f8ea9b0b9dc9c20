"""Every bound, just under and just over, through both front ends: a set just under a bound is
served (a mount reads the key, ``refmount serve`` answers 200 with the same bytes); one just
over is refused as docs/security.md's table of bounds says, in bounded CPU time and memory.

One mount and one ``refmount serve`` exercise both sides of many bounds at once: the sets of
each side are sets of a catalogue (tests/support/boundsets.py), so a set over a bound is the
set that cannot be opened (``EIO``; ``503`` with the fixed text) with one log line naming the
bound, and a set over a read-time bound fails the keys it covers (``EIO``; ``503``/``502``).
The bounds met through a single SOURCE — a pin file, and ``max_sets`` (which refuses the
catalogue) — are refused at start with one ``refmount: error:`` line, nothing mounted or
listening.

* ``lowered`` — the bounds an option lowers, met at the lowered value (data of a few MB):
  ``max_inline``, ``max_keys``, ``max_key_length``, ``max_key_depth``, ``max_nesting``,
  ``max_source``, ``max_generated`` (the keys and URL of a ``gen`` entry, then one byte
  more), ``max_template_seconds`` (a CPU-time bound: just under is one rendering of some
  0.1 s against 0.5, just over twenty of them), ``max_open_memory`` (a set held open by a
  reader, then a set whose index just fits beside it and one whose index is one alignment step
  larger: ``too many sets are in use at once``) and ``max_sets`` (as many sets as the option,
  then the option one lower);
* ``at_code_values`` — the bounds of the code's values: the decoded view's 2^20 JSON values
  and 64 MiB, the synthesized ``.zmetadata``'s 2^20 values (``refmount serve`` only: a mount
  has no synthesized ``.zmetadata``); with them ``max_ratio`` (its ratio counts only beyond
  the first 64 MiB) and ``max_record`` (two record files of one Parquet set, the second 8
  bytes over). ``refmount serve`` only, as a mount has neither: the per-client bound of
  listing pieces (4 made at once: clients that never read a listing of 100,000 keys, 3 then
  5 of them, hold no one else's listing) and ``max_clients`` (as many connections as the
  option, then one more: ``503``);
* a pin file of just under 64 MiB (some 740,000 targets, parsed once, by the CLI), then one
  byte over (refused before it is read).

What decides is the CPU time of the CLI and of the process that serves (psutil), not wall
time: the timeouts are generous against a loaded machine.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from support.boundsets import CHUNK_BYTES, TARGET, Catalogue, MiB, Probe, at_code_values, lowered, write
from support.mounts import CLI, REPO, cli_env, daemon_procs, fusermount_u, is_mounted, wait_gone
from support.serving import Reply, Served

from refmount.sets.opensets import OPEN_FAILED, TOO_MUCH_OPEN
from refmount.targets.pins import MAX_PIN_FILE, PIN_FORMAT

pytestmark = [pytest.mark.fuse, pytest.mark.long(60), pytest.mark.timeout(900)]

BOUND_CPU = 45.0  # CPU seconds of the CLI and of what serves, for one run
BOUND_RSS = 1 << 30  # peak RSS of what serves
COMMON = ("no_disk_cache", "client_timeout=300", "timeout=60")
MAX_CLIENTS = 16

# The CLI under a wrapper that reports its exit status and CPU time (its own and its children's:
# a daemon detaches, so its CPU is measured apart, by psutil).
WRAPPER = r"""
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": r.returncode, "stdout": r.stdout.decode(errors="replace"),
                  "stderr": r.stderr.decode(errors="replace"), "cpu": u.ru_utime + u.ru_stime}))
"""


@dataclass
class Outcome:
    name: str
    cpu: float = 0.0
    rss: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def run_cli(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-c", WRAPPER, *CLI, *args], capture_output=True, text=True,
                       timeout=400, env=cli_env(), cwd=str(REPO))
    return json.loads(r.stdout)


def refused_at_start(res: dict, words: tuple[str, ...], out: Outcome) -> None:
    lines = [ln for ln in res["stderr"].splitlines()
             if ln.strip() and not ln.startswith("refmount: WARNING:")]
    if res["rc"] == 0:
        out.problems.append("served, expected a refusal")
    elif len(lines) != 1 or not lines[0].startswith("refmount: error:"):
        out.problems.append(f"expected one 'refmount: error:' line, got {res['stderr'][:300]!r}")
    else:
        out.problems += [f"the error does not name {w!r}: {lines[0][:300]}" for w in words
                         if w.lower() not in lines[0].lower()]


def logged_once(log: str, probes: list[Probe], out: Outcome) -> None:
    for p in probes:
        if p.log:
            said = [ln for ln in log.splitlines() if all(w in ln for w in p.log)]
            if len(said) != 1:
                out.problems.append(f"{p.name}/{p.key}: {len(said)} log lines with {p.log}, expected one")


def _cpu(p: psutil.Process) -> float:
    try:
        procs = [p, *p.children(recursive=True)]
        return sum(t.user + t.system + t.children_user + t.children_system
                   for t in (q.cpu_times() for q in procs))
    except psutil.Error:
        return 0.0


def _hwm(p: psutil.Process) -> int:
    try:
        with open(f"/proc/{p.pid}/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


# ---- a mount ------------------------------------------------------------------------------------


def read_in_mount(mnt: Path, p: Probe, out: Outcome) -> None:
    try:
        data = (mnt / p.name / p.key).read_bytes()
        if p.refused:
            out.problems.append(f"{p.name}/{p.key}: read {len(data)} bytes, expected EIO")
        elif (p.expected is not None and data != p.expected) or not data:
            out.problems.append(f"{p.name}/{p.key}: other bytes")
    except OSError as e:
        if not (p.refused and e.errno == errno.EIO):
            out.problems.append(f"{p.name}/{p.key}: {e}")


def through_a_mount(cat: Catalogue, base: Path, extra: tuple[str, ...] = ()) -> Outcome:
    out = Outcome(f"{cat.path.parent.name} (mount)")
    mnt, log = base / "mnt" / cat.path.parent.name, base / "logs" / f"{cat.path.parent.name}-mount.log"
    mnt.mkdir(parents=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    res = run_cli([str(cat.path), str(mnt), "-o", ",".join(("catalog", f"log={log}", *COMMON,
                                                               *cat.options, *extra))])
    out.cpu = res["cpu"]
    if res["rc"] != 0:
        out.problems.append(f"refused, expected it served: {res['stderr'][:300]}")
        return out
    procs = daemon_procs(mnt)
    try:
        probes = [p for p in cat.probes if not p.serve_only]
        for p in probes:
            if p.bound != "max_open_memory":
                read_in_mount(mnt, p, out)
        held = [p for p in probes if p.bound == "max_open_memory"]
        if held:  # m-a held open by a reader while m-b, then m-c, opens
            with open(mnt / "m-a" / "k", "rb") as f:
                f.read(1)
                for p in held:
                    read_in_mount(mnt, p, out)
        logged_once(log.read_text(errors="replace"), probes, out)
    finally:
        out.rss = sum(_hwm(p) for p in procs)
        out.cpu += sum(_cpu(p) for p in procs)
        fusermount_u(mnt)
        wait_gone(daemon_procs(mnt), 30)
    out.seconds = time.monotonic() - t0
    return out


# ---- refmount serve -----------------------------------------------------------------------------


def stuck_client(s: Served, path: str) -> socket.socket:
    """A client that asks for ``path`` and never reads the answer."""
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.connect((s.host, s.port))
    c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return c


def get_in_serve(s: Served, p: Probe, out: Outcome) -> None:
    reply: Reply = s.request("GET", f"/{p.name}/{p.key}", timeout=300)
    expected = p.status if p.refused else 200
    if reply.status != expected:
        out.problems.append(f"GET /{p.name}/{p.key}: {reply.status}, expected {expected}")
    elif not p.refused and ((p.expected is not None and reply.body != p.expected) or not reply.body):
        out.problems.append(f"GET /{p.name}/{p.key}: other bytes")
    elif p.refused == "open":
        text = TOO_MUCH_OPEN if p.bound == "max_open_memory" else OPEN_FAILED
        if text.encode() not in reply.body:
            out.problems.append(f"GET /{p.name}/{p.key}: {reply.body[:200]!r}, not the fixed text")


def listings_per_client(s: Served, out: Outcome) -> None:
    """3, then 5 clients (the 4 pieces made at once, then more) that never read a listing of
    100,000 keys: a listing and a key are still answered at once."""
    stuck: list[socket.socket] = []
    try:
        for n in (3, 5):
            stuck += [stuck_client(s, "/listing/d/") for _ in range(n - len(stuck))]
            time.sleep(2)  # each has filled its socket buffers and waits for its client
            t0 = time.monotonic()
            r = s.request("GET", "/listing/?format=json", timeout=60)
            key = s.request("GET", "/listing/c", timeout=60)
            if r.status != 200 or b'"d"' not in r.body or key.body != CHUNK_BYTES:
                out.problems.append(f"{n} clients stuck on a listing: {r.status}, {key.status}")
            if (took := time.monotonic() - t0) > 10:
                out.problems.append(f"{n} clients stuck on a listing: answered in {took:.1f} s")
    finally:
        for c in stuck:
            c.close()


def max_clients(s: Served, out: Outcome) -> None:
    """MAX_CLIENTS - 1 idle connections and a request: 200; MAX_CLIENTS and a request: 503."""
    for held, expected in ((MAX_CLIENTS - 1, 200), (MAX_CLIENTS, 503)):
        idle = [socket.create_connection((s.host, s.port)) for _ in range(held)]
        try:
            time.sleep(1)
            try:
                got = str(s.request("GET", "/listing/c", timeout=60).status)
            except OSError as e:  # no answer at all: neither served nor the documented 503
                got = f"no answer ({e})"
            if got != str(expected):
                out.problems.append(f"{held} idle connections: {got}, expected {expected}")
        finally:
            for c in idle:
                c.close()
        time.sleep(2)  # the server has seen them go


def through_serve(cat: Catalogue, base: Path, extra: tuple[str, ...] = ()) -> Outcome:
    name = cat.path.parent.name
    out = Outcome(f"{name} (serve)")
    log = base / "logs" / f"{name}-serve.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    opts = ",".join(("catalog", f"log={log}", *COMMON, f"allow_local={cat.path.parent}",
                     f"max_clients={MAX_CLIENTS}", *cat.options, *extra))
    res = run_cli(["serve", str(cat.path), "--listen", "127.0.0.1:0", "-o", opts])
    out.cpu = res["cpu"]
    if res["rc"] != 0:
        out.problems.append(f"refused, expected it served: {res['stderr'][:300]}")
        return out
    url, pid = res["stdout"].split()
    s = Served(url, int(pid), log, str(cat.path))
    try:
        proc = psutil.Process(s.pid)
        for p in cat.probes:
            if p.bound != "max_open_memory":
                get_in_serve(s, p, out)
        held = [p for p in cat.probes if p.bound == "max_open_memory"]
        if held:  # m-a held open by a client that does not read while m-b, then m-c, opens
            holder = stuck_client(s, "/m-a/k")
            try:
                time.sleep(2)
                for p in held:
                    get_in_serve(s, p, out)
            finally:
                holder.close()
        if any(p.bound == "listings" for p in cat.probes):
            listings_per_client(s, out)
            time.sleep(2)
            max_clients(s, out)
        logged_once(s.log_text(), cat.probes, out)
        out.rss = _hwm(proc)
        out.cpu += _cpu(proc)
    finally:
        s.stop()
    out.seconds = time.monotonic() - t0
    return out


# ---- refused at start: max_sets, a pin file -------------------------------------------------------


def at_start(name: str, args: Callable[[Path], list[str]], words: tuple[str, ...],
             base: Path) -> Outcome:
    """A run refused at start, or (no ``words``) a single SOURCE served whose key reads right."""
    out = Outcome(name)
    t0 = time.monotonic()
    mnt = base / "mnt" / name
    mnt.mkdir(parents=True)
    res = run_cli(args(mnt))
    out.cpu = res["cpu"]
    serving = args(mnt)[0] == "serve"
    if words:
        refused_at_start(res, words, out)
        if not serving and (is_mounted(mnt) or daemon_procs(mnt)):
            fusermount_u(mnt, lazy=True)
            out.problems.append("left a mount or a daemon")
    elif res["rc"] != 0:
        out.problems.append(f"refused, expected it served: {res['stderr'][:300]}")
    elif serving:
        url, pid = res["stdout"].split()
        s = Served(url, int(pid), base / "none.log", "")
        try:
            if s.request("GET", "/c", timeout=300).body != CHUNK_BYTES:
                out.problems.append("GET /c: other bytes")
            out.rss, out.cpu = _hwm(psutil.Process(s.pid)), out.cpu + _cpu(psutil.Process(s.pid))
        finally:
            s.stop()
    else:
        procs = daemon_procs(mnt)
        try:
            if (mnt / "c").read_bytes() != CHUNK_BYTES:
                out.problems.append("c: other bytes")
        finally:
            out.rss, out.cpu = sum(_hwm(p) for p in procs), out.cpu + sum(_cpu(p) for p in procs)
            fusermount_u(mnt)
            wait_gone(daemon_procs(mnt), 30)
    out.seconds = time.monotonic() - t0
    return out


def pin_file(pin: str, size: int) -> bytes:
    """A pin file of exactly ``size`` bytes: ``pin`` first, then entries of other targets."""
    head = ('{"format": "' + PIN_FORMAT + '", "targets": {' + pin).encode()
    entry = b', "http://h.example/data/%09d.nc": {"etag": "\\"0123456789abcdef\\"", "size": 123456789}'
    n = (size - len(head) - 2) // len(entry % 0)
    doc = head + b"".join(entry % i for i in range(n)) + b"}}"
    return doc[:-2] + b" " * (size - len(doc)) + b"}}"


Run = tuple[str, Callable[[Path], list[str]], tuple[str, ...]]


def single_source_runs(d: Path, low: Catalogue) -> list[Run]:
    target = write(d / "target.bin", TARGET)
    st = os.stat(target)
    pin = json.dumps({str(target): {"size": st.st_size, "mtime_ns": st.st_mtime_ns}})[1:-1]
    source = write(d / "refs.json", {"version": 1, "refs": {"c": [str(target), 16, 64]}})
    runs = []
    for side, size in (("under", MAX_PIN_FILE - 64), ("over", MAX_PIN_FILE + 1)):
        pins = write(d / f"pins-{side}.json", pin_file(pin, size))
        words = ("pins", "larger than 64 MiB") if side == "over" else ()
        opts = f"pins={pins},no_disk_cache,allow_local={d}"
        runs.append((f"pins-{side} (serve)",
                     lambda _m, o=opts: ["serve", str(source), "--listen", "127.0.0.1:0", "-o", o], words))
        runs.append((f"pins-{side} (mount)", lambda m, o=opts: [str(source), str(m), "-o", o], words))
    n = int(next(o for o in low.options if o.startswith("max_sets=")).split("=")[1])
    over = f"catalog,no_disk_cache,max_sets={n - 1}"
    words = (f"more than {n - 1:,} reference sets", "max_sets")
    runs.append(("max_sets-over (serve)", lambda _m: ["serve", str(low.path), "--listen", "127.0.0.1:0",
                                                      "-o", over], words))
    runs.append(("max_sets-over (mount)", lambda m: [str(low.path), str(m), "-o", over], words))
    return runs


def test_every_bound_just_under_is_served_and_just_over_refused_through_both_front_ends(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    low = lowered(tmp_path / "lowered")
    singles = single_source_runs(tmp_path / "single", low)
    longest = [run for run in singles if run[0].startswith("pins-under")]
    with ThreadPoolExecutor(2) as ex:  # the longest runs first; the pin files' while the rest is made
        futures = [ex.submit(at_start, *run, runs_dir) for run in longest]
        code = at_code_values(tmp_path / "code")
        futures += [ex.submit(through_serve, code, runs_dir), ex.submit(through_a_mount, code, runs_dir),
                    ex.submit(through_serve, low, runs_dir), ex.submit(through_a_mount, low, runs_dir)]
        futures += [ex.submit(at_start, *run, runs_dir) for run in singles if run not in longest]
        outcomes = [f.result() for f in futures]
    for o in outcomes:
        if o.cpu > BOUND_CPU:
            o.problems.append(f"over bounds: {o.cpu:.1f} CPU s")
        if o.rss > BOUND_RSS:
            o.problems.append(f"over bounds: {o.rss / MiB:.0f} MiB")
    bounds = {p.bound for c in (low, code) for p in c.probes} | {"pin file", "max_sets", "max_clients"}
    with capsys.disabled():
        print(f"\nbound edges: {len(bounds)} bounds in {len(outcomes)} runs: "
              + ", ".join(f"{o.name} {o.cpu:.1f} CPU s {o.rss / MiB:.0f} MiB ({o.seconds:.1f} s)"
                          for o in outcomes)
              + f"; {code.notes} {low.notes}")
    problems = [f"[{o.name}] " + "; ".join(o.problems) for o in outcomes if o.problems]
    assert not problems, "\n".join(problems)
