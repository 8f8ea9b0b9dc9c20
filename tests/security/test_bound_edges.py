"""Every bound, just under and just over, through both front ends: a set just under a bound is
served (a mount reads the key, ``refmount serve`` answers 200 with the same bytes); one just
over is refused as docs/security.md's table of bounds says — one ``refmount: error:`` line
naming the bound (nothing mounted or listening), or ``EIO`` / the documented HTTP status for
the keys a read-time bound covers — in bounded CPU time and memory.

The hostile harness (test_limits.py) runs the big inputs through a mount; here each bound is
met exactly, with the options lowered where an option sets it (data of a few MB), at the
code's value where none does (decoded metadata's 2^20 JSON values, the synthesized
``.zmetadata``'s 2^20, the pin file's 64 MiB). What decides is the CPU time of the CLI and of
the process that serves (psutil), not wall time: the timeouts are generous against a loaded
machine, and a run that takes them is reported as such.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from support.bombs import json_values, list_of_values, metadata_of_bytes, metadata_with_values
from support.mounts import CLI, REPO, cli_env, daemon_procs, fusermount_u, is_mounted, wait_gone
from support.serving import Reply, Served

from refmount.core.consolidated import MAX_VALUES as ZMETADATA_VALUES
from refmount.decode.metadatabound import MAX_BYTES as DECODED_BYTES
from refmount.decode.metadatabound import MAX_VALUES as DECODED_VALUES
from refmount.targets.pins import MAX_PIN_FILE, PIN_FORMAT

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(900)]

# CPU seconds of the CLI and of what serves, for one run. A pin file at its bound is parsed
# three times in all (the CLI checks it, then the set's targets against it; the daemon loads it):
# some 8 CPU s each on a quiet machine, 24 in all measured at a load of 15.
BOUND_CPU = 45.0
BOUND_RSS = 1 << 30  # peak RSS of what serves
MiB = 1 << 20
TARGET = bytes(range(256)) * 16

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
class Edge:
    """One side of one bound: ``served`` (``key`` reads as ``expected``), or refused: at start
    (``mention``, the words of the one line) or at read (``status`` over HTTP, EIO in a mount)."""

    name: str
    source: Path
    opts: tuple[str, ...]
    key: str
    expected: bytes | None = None
    mention: tuple[str, ...] = ()
    status: int = 200  # what ``refmount serve`` answers for ``key``
    mount_eio: bool = False  # a read-time refusal: EIO in a mount
    mount: bool = True  # also through a mount (the synthesized .zmetadata exists only in serve)


@dataclass
class Outcome:
    name: str
    cpu: float = 0.0
    rss: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def write(path: Path, content: bytes | str | dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def refs_set(path: Path, refs: dict[str, object], *, gz: bool = False) -> Path:
    doc = json.dumps({"version": 1, "refs": refs}).encode()
    return write(path, gzip.compress(doc, 1) if gz else doc)


# ---- the edges ------------------------------------------------------------------------------------


def edges(d: Path) -> list[Edge]:
    target = write(d / "target.bin", TARGET)
    chunk = [str(target), 16, 64]  # every set reads this chunk
    out: list[Edge] = []

    def pair(bound: str, make: object, opts: tuple[str, ...], key: str, expected: bytes | None,
             mention: tuple[str, ...], **over: object) -> None:
        assert callable(make)
        under_src, over_src = make(d / f"{bound}-under"), make(d / f"{bound}-over")
        out.append(Edge(f"{bound}-under", under_src, opts, key, expected))
        out.append(Edge(f"{bound}-over", over_src, opts, key, expected, mention, **over))  # type: ignore[arg-type]

    # max_inline=1M: an inline value of 1 MiB, then of one byte more
    for side, n in (("under", MiB), ("over", MiB + 1)):
        refs_set(d / f"max_inline-{side}" / "refs.json", {"big": "x" * n, "c": chunk})
    pair("max_inline", lambda p: p / "refs.json", ("max_inline=1M",), "c", TARGET[16:80],
         ("max_inline=1M", "big"))
    # max_keys=1000: the chunk and 999 inline keys, then 1,000
    for side, n in (("under", 999), ("over", 1000)):
        refs_set(d / f"max_keys-{side}" / "refs.json", {"c": chunk, **{f"k/{i}": "v" for i in range(n)}})
    pair("max_keys", lambda p: p / "refs.json", ("max_keys=1000",), "c", TARGET[16:80], ("max_keys=1000",))
    # max_key_length=1K: a key of 1,024 bytes, then 1,025 (components of at most 255 bytes)
    for side, n in (("under", 1024), ("over", 1025)):
        long_key = "/".join(["k" * 200] * 5) + "/" + "k" * (n - 1005)
        refs_set(d / f"max_key_length-{side}" / "refs.json", {"c": chunk, long_key: "v"})
    pair("max_key_length", lambda p: p / "refs.json", ("max_key_length=1K",), "c", TARGET[16:80],
         ("max_key_length=1K",))
    # max_key_depth=16: a key of 16 components, then 17
    for side, n in (("under", 16), ("over", 17)):
        refs_set(d / f"max_key_depth-{side}" / "refs.json", {"c": chunk, "/".join(["d"] * n): "v"})
    pair("max_key_depth", lambda p: p / "refs.json", ("max_key_depth=16",), "c", TARGET[16:80],
         ("max_key_depth=16",))
    # max_nesting=8: a .zattrs object making the document 8 deep, then 9
    for side, n in (("under", 6), ("over", 7)):  # the document, refs, .zattrs, then n objects
        nested: object = 1
        for _ in range(n):
            nested = {"a": nested}
        refs_set(d / f"max_nesting-{side}" / "refs.json", {"c": chunk, ".zattrs": nested})
    pair("max_nesting", lambda p: p / "refs.json", ("max_nesting=8",), "c", TARGET[16:80],
         ("max_nesting=8",))
    # max_source=1M: a set of exactly 1 MiB (padded with spaces), then one byte more
    for side, n in (("under", MiB), ("over", MiB + 1)):
        doc = json.dumps({"version": 1, "refs": {"c": chunk}}).encode()
        write(d / f"max_source-{side}" / "refs.json", doc + b" " * (n - len(doc)))
    pair("max_source", lambda p: p / "refs.json", ("max_source=1M",), "c", TARGET[16:80],
         ("max_source=1M",))
    # decoded metadata (-o decode): exactly 2^20 JSON values in its metadata keys, then one more;
    # over it, the rewritten metadata is refused at read: EIO, 503
    for side, total in (("under", DECODED_VALUES), ("over", DECODED_VALUES + 1)):
        keys = metadata_with_values(total)
        refs = {k: v.decode() for k, v in keys.items()}
        refs_set(d / f"decoded-values-{side}" / "refs.json", {**refs, "c": chunk})
    out.append(Edge("decoded-values-under", d / "decoded-values-under" / "refs.json", ("decode",),
                    "a0/.zattrs"))
    out.append(Edge("decoded-values-over", d / "decoded-values-over" / "refs.json", ("decode",),
                    "a0/.zattrs", status=503, mount_eio=True))
    # decoded metadata (-o decode): exactly 64 MiB read (or kept rewritten), then one byte more;
    # a gzip set of 64 .zattrs of a 1 MB string
    for side, total in (("under", DECODED_BYTES), ("over", DECODED_BYTES + 1)):
        keys = metadata_of_bytes(total)
        refs = {k: v.decode() for k, v in keys.items()}
        refs_set(d / f"decoded-bytes-{side}" / "refs.json.gz", {**refs, "c": chunk}, gz=True)
    out.append(Edge("decoded-bytes-under", d / "decoded-bytes-under" / "refs.json.gz", ("decode",),
                    "a000/.zattrs"))
    out.append(Edge("decoded-bytes-over", d / "decoded-bytes-over" / "refs.json.gz", ("decode",),
                    "a000/.zattrs", status=503, mount_eio=True))
    # the synthesized .zmetadata (refmount serve): 2^20 JSON values, then one more (503)
    group = b'{"zarr_format":2}'
    for side, total in (("under", ZMETADATA_VALUES), ("over", ZMETADATA_VALUES + 1)):
        attrs = list_of_values(total - json_values(group))
        refs_set(d / f"zmetadata-values-{side}" / "refs.json",
                 {".zgroup": group.decode(), ".zattrs": attrs.decode(), "c": chunk})
    out.append(Edge("zmetadata-values-under", d / "zmetadata-values-under" / "refs.json", (),
                    ".zmetadata", mount=False))
    out.append(Edge("zmetadata-values-over", d / "zmetadata-values-over" / "refs.json", (),
                    ".zmetadata", status=503, mount=False))
    # a pin file of 64 MiB less a few bytes pinning the chunk's target among 600,000 others, then
    # one of 64 MiB and one byte
    st = os.stat(target)
    pin = json.dumps({str(target): {"size": st.st_size, "mtime_ns": st.st_mtime_ns}})[1:-1]
    set_path = refs_set(d / "pins" / "refs.json", {"c": chunk})
    for side, size in (("under", MAX_PIN_FILE - 64), ("over", MAX_PIN_FILE + 1)):
        write(d / "pins" / f"pins-{side}.json", pin_file(pin, size))
        out.append(Edge(f"pins-{side}", set_path, (f"pins={d / 'pins' / f'pins-{side}.json'}",), "c",
                        TARGET[16:80], ("pins", "larger than 64 MiB") if side == "over" else ()))
    return out


def pin_file(pin: str, size: int) -> bytes:
    """A pin file of exactly ``size`` bytes: ``pin`` first, then entries of other targets."""
    head = ('{"format": "' + PIN_FORMAT + '", "targets": {' + pin).encode()
    entry = b', "http://h.example/data/%09d.nc": {"etag": "\\"0123456789abcdef\\"", "size": 123456789}'
    n = (size - len(head) - 2) // len(entry % 0)
    body = b"".join(entry % i for i in range(n))
    doc = head + body + b"}}"
    return doc[:-2] + b" " * (size - len(doc)) + b"}}"


# ---- the front ends -------------------------------------------------------------------------------


def run_cli(args: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run([sys.executable, "-c", WRAPPER, *CLI, *args], capture_output=True, text=True,
                       timeout=400, env=env, cwd=str(REPO))
    return json.loads(r.stdout)


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("refmount: WARNING:")]


def refused(edge: Edge, res: dict, out: Outcome) -> None:
    lines = error_lines(res["stderr"])
    if res["rc"] == 0:
        out.problems.append("served, expected a refusal")
    elif len(lines) != 1 or not lines[0].startswith("refmount: error:"):
        out.problems.append(f"expected one 'refmount: error:' line, got {res['stderr'][:300]!r}")
    else:
        out.problems += [f"the error does not name {w!r}: {lines[0][:300]}" for w in edge.mention
                         if w.lower() not in lines[0].lower()]


def through_a_mount(edge: Edge, base: Path) -> Outcome:
    out = Outcome(f"{edge.name} (mount)")
    mnt = base / "mnt" / edge.name
    mnt.mkdir(parents=True)
    t0 = time.monotonic()
    res = run_cli([str(edge.source), str(mnt), "-o", ",".join(("no_disk_cache", *edge.opts))], cli_env())
    out.cpu = res["cpu"]
    if edge.mention:
        refused(edge, res, out)
        if is_mounted(mnt):
            fusermount_u(mnt, lazy=True)
            out.problems.append("left a mount")
        if daemon_procs(mnt):
            out.problems.append("left a daemon")
    elif res["rc"] != 0:
        out.problems.append(f"refused, expected it served: {res['stderr'][:300]}")
    else:
        procs = daemon_procs(mnt)
        try:
            data = (mnt / edge.key).read_bytes()
            if edge.mount_eio:
                out.problems.append(f"{edge.key}: read {len(data)} bytes, expected EIO")
            elif edge.expected is not None and data != edge.expected:
                out.problems.append(f"{edge.key}: other bytes")
        except OSError as e:
            if not (edge.mount_eio and e.errno == errno.EIO):
                out.problems.append(f"{edge.key}: {e}")
        finally:
            out.rss = sum(_hwm(p) for p in procs)
            out.cpu += sum(_cpu(p) for p in procs)
            fusermount_u(mnt)
            wait_gone(daemon_procs(mnt), 30)
    out.seconds = time.monotonic() - t0
    return out


def through_serve(edge: Edge, base: Path) -> Outcome:
    out = Outcome(f"{edge.name} (serve)")
    log = base / "logs" / f"{edge.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    opts = ",".join((f"log={log}", "no_disk_cache", "client_timeout=300",
                     f"allow_local={edge.source.parent.parent}", *edge.opts))
    res = run_cli(["serve", str(edge.source), "--listen", "127.0.0.1:0", "-o", opts], cli_env())
    out.cpu = res["cpu"]
    if edge.mention:
        refused(edge, res, out)
    elif res["rc"] != 0:
        out.problems.append(f"refused, expected it served: {res['stderr'][:300]}")
    else:
        url, pid = res["stdout"].split()
        served = Served(url, int(pid), log, str(edge.source))
        try:
            proc = psutil.Process(served.pid)
            reply: Reply = served.request("GET", "/" + edge.key, timeout=300)
            if reply.status != edge.status:
                out.problems.append(f"GET /{edge.key}: {reply.status}, expected {edge.status}")
            elif edge.status == 200 and edge.expected is not None and reply.body != edge.expected:
                out.problems.append(f"GET /{edge.key}: other bytes")
            if edge.status != 200 and edge.mount_eio:  # the read-time refusal: one log line
                said = [ln for ln in served.log_text().splitlines() if "no decoded metadata" in ln]
                if len(said) != 1:
                    out.problems.append(f"expected one log line of the refusal, got {len(said)}")
            out.rss = _hwm(proc)
            out.cpu += _cpu(proc)
        finally:
            served.stop()
    out.seconds = time.monotonic() - t0
    return out


def _cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        return 0.0


def _hwm(p: psutil.Process) -> int:
    try:
        with open(f"/proc/{p.pid}/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def test_every_bound_just_under_is_served_and_just_over_refused_through_both_front_ends(tmp_path, capsys):
    cases = edges(tmp_path / "sets")
    runs = [(through_serve, e) for e in cases] + [(through_a_mount, e) for e in cases if e.mount]
    with ThreadPoolExecutor(2) as ex:
        outcomes = list(ex.map(lambda run: run[0](run[1], tmp_path / "runs"), runs))
    for o in outcomes:
        if o.cpu > BOUND_CPU:
            o.problems.append(f"over bounds: {o.cpu:.1f} CPU s")
        if o.rss > BOUND_RSS:
            o.problems.append(f"over bounds: {o.rss / MiB:.0f} MiB")
    slowest = sorted(outcomes, key=lambda o: -o.cpu)[:3]
    biggest = sorted(outcomes, key=lambda o: -o.rss)[:3]
    with capsys.disabled():
        print(f"\nbound edges: {len(outcomes)} runs ({len(cases)} sides of {len(cases) // 2} bounds); "
              "most CPU " + ", ".join(f"{o.name} {o.cpu:.1f} s ({o.seconds:.1f} s)" for o in slowest)
              + "; largest " + ", ".join(f"{o.name} {o.rss / MiB:.0f} MiB" for o in biggest))
    problems = [f"[{o.name}] " + "; ".join(o.problems) for o in outcomes if o.problems]
    assert not problems, "\n".join(problems)
