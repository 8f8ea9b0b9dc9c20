"""Helpers for ``scripts/bench.py``: processes, FUSE mounts, nginx, the data set, and the
measuring children (each measurement runs in a child process so that it can be bounded by a
timeout and killed by its PID without touching anything else on the machine).

Nothing here is imported by refmount or its tests.
"""

from __future__ import annotations

import contextlib
import grp
import itertools
import json
import os
import pwd
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
CLK_TCK = os.sysconf("SC_CLK_TCK")
NGINX = "/usr/sbin/nginx"

# ============================================================================================
# Processes and mounts
# ============================================================================================


def proc_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = text[text.rindex(")") + 2 :].split()
    return rest  # rest[0] = state, rest[1] = ppid, rest[11] = utime, rest[12] = stime


def proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), None if it is gone."""
    st = proc_stat(pid)
    if st is None:
        return None
    return (int(st[11]) + int(st[12])) / CLK_TCK


def proc_cpu_split(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a process, None if it is gone."""
    st = proc_stat(pid)
    if st is None:
        return None
    return int(st[11]) / CLK_TCK, int(st[12]) / CLK_TCK


def machine_busy() -> float:
    """CPU-seconds all cores spent not idle since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLK_TCK


def steal_cpu() -> float:
    """CPU seconds the hypervisor gave to others while this VM wanted to run (steal), all cores."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[7] if len(fields) > 7 else 0) / CLK_TCK


def cpu_by_pid() -> dict[int, tuple[float, int]]:
    """pid -> (user + system CPU seconds, ppid) for every process and kernel thread."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out[int(name)] = ((int(st[11]) + int(st[12])) / CLK_TCK, int(st[1]))
    return out


def system_cpu() -> float:
    """CPU seconds all cores spent in user, nice and system mode (irq/softirq/idle left out)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:4]]
    return sum(fields) / CLK_TCK


def own_cpu() -> float:
    """CPU seconds of this process and of all its children it has waited for."""
    import resource

    a = resource.getrusage(resource.RUSAGE_SELF)
    b = resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def others_cpu(sys0: float, sys1: float, own: float, s0: dict[int, tuple[float, int]],
               s1: dict[int, tuple[float, int]], mine: set[int]) -> tuple[float, list[tuple[float, str]]]:
    """CPU seconds other user-space processes used between two snapshots: all user+system time on
    the machine minus ours (``own`` = this process and its reaped children, plus ``mine``) and
    minus kernel threads (which include writeback and network work done for us). Processes that
    came and went in between are included. Also the top three others still alive."""
    def delta(pid: int) -> float:
        return max(s1[pid][0] - s0.get(pid, (0.0, 0))[0], 0.0)

    ours = own + sum(delta(p) for p in mine if p in s1 and p != os.getpid())
    kthreads = sum(delta(p) for p, (_, ppid) in s1.items() if p == 2 or ppid == 2)
    total = max(sys1 - sys0 - ours - kthreads, 0.0)
    per = sorted(((delta(p), p) for p, (_, ppid) in s1.items()
                  if p not in mine and p != os.getpid() and p != 2 and ppid != 2), reverse=True)
    top = [(d, _short_cmd(p)) for d, p in per[:3] if d > 0]
    return total, top


def _short_cmd(pid: int) -> str:
    cmd = " ".join(proc_cmdline(pid))
    if not cmd:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
            cmd = f"[{f.read().strip()}]"
    return (cmd if len(cmd) <= 70 else f"{cmd[:30]}...{cmd[-37:]}") or f"pid {pid}"


def proc_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def children_of(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st[1] == str(pid):
                out.append(int(name))
    return out


def pid_alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def stop_pid(pid: int, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: only ever called with PIDs we started."""
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not wait_gone(pid, grace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 5.0)


def _unescape_mount(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace(
        "\\134", "\\"
    )


def mounted(mnt: Path) -> bool:
    target = os.path.abspath(mnt)
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and _unescape_mount(parts[1]) == target:
                return True
    return False


def fuse_unmount(mnt: Path, pids: list[int], log: Callable[[str], None], timeout: float = 30.0) -> None:
    """``fusermount3 -u``; lazy unmount if that fails; then make sure ``pids`` are gone."""
    if mounted(mnt):
        r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0 and mounted(mnt):
            log(f"    fusermount3 -u {mnt} failed ({r.stderr.strip()}); lazy unmount")
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, timeout=60)
    for pid in pids:
        if not wait_gone(pid, timeout):
            log(f"    pid {pid} still running after unmount; stopping it")
            stop_pid(pid)
    if mounted(mnt):
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, timeout=60)


def wait_mount_answers(mnt: Path, expect: list[str], timeout: float,
                       proc: subprocess.Popen | None = None) -> bool:
    """True once ``mnt`` is a mount whose root lists all names in ``expect``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        if mounted(mnt):
            # Listing a mount whose daemon hangs would hang us: list in a bounded child.
            try:
                r = subprocess.run(["ls", "-1a", str(mnt)], capture_output=True, text=True, timeout=10)
            except subprocess.TimeoutExpired:
                return False
            names = set(r.stdout.split())
            if r.returncode == 0 and all(n in names for n in expect):
                return True
        time.sleep(0.1)
    return False


def refmount_daemon_pid(mnt: Path) -> int | None:
    """The detached daemon serving ``mnt`` (argv ends with the mountpoint)."""
    target = os.path.abspath(mnt)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        argv = proc_cmdline(int(name))
        if "refmount.daemon" in argv and argv and argv[-1] == target:
            return int(name)
    return None


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """CPU seconds of every process on the machine (for 'other activity during the run')."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            cpu = proc_cpu(pid)
            if cpu is not None:
                name = " ".join(proc_cmdline(pid))[:100]
                if not name:
                    with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
                        name = f"[{f.read().strip()}]"
                out[pid] = (name or f"[{pid}]", cpu)
    return out


def drop_page_cache(dirs: list[Path]) -> str:
    """Empty the kernel page cache: drop_caches if permitted, else fadvise(DONTNEED) on ``dirs``."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for d in dirs:
        for root, _, files in os.walk(d):
            for fn in files:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(root, fn), os.O_RDONLY)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)
    return "fadvise"


def resident_fraction(path: Path) -> float | None:
    """Share of the file's pages in the page cache (util-linux fincore), None if unknown."""
    try:
        r = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", str(path)],
                           capture_output=True, text=True, timeout=30)
        return int(r.stdout.split()[0]) / max(path.stat().st_size, 1)
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def damon_reclaim() -> str:
    """Describe an active DAMON 'pageout' scheme (proactive reclaim of idle pages), if any."""
    base = Path("/sys/kernel/mm/damon/admin/kdamonds")
    out = []
    with contextlib.suppress(OSError, ValueError):
        for kd in sorted(base.glob("[0-9]*")):
            if (kd / "state").read_text().strip() != "on":
                continue
            for ctx in sorted((kd / "contexts").glob("[0-9]*")):
                aggr_us = int((ctx / "monitoring_attrs/intervals/aggr_us").read_text())
                for sch in sorted((ctx / "schemes").glob("[0-9]*")):
                    action = (sch / "action").read_text().strip()
                    if action != "pageout":
                        continue
                    age = int((sch / "access_pattern/age/min").read_text())
                    out.append(f"kdamond {kd.name}: pageout of pages idle for >= {age * aggr_us / 1e6:g} s")
    return "; ".join(out)


def free_page_reporting() -> str:
    """Whether this (virtual) machine hands free memory back to its host (virtio-balloon free
    page reporting): memory a process touches for the first time is then refaulted from the
    host, many times slower than zeroing a page (see ``fresh_memory_rate``)."""
    for dev in Path("/sys/bus/virtio/devices").glob("virtio*"):
        with contextlib.suppress(OSError, ValueError):
            if int((dev / "device").read_text(), 16) != 5:  # virtio balloon
                continue
            features = (dev / "features").read_text().strip()
            if len(features) > 5 and features[5] == "1":  # VIRTIO_BALLOON_F_REPORTING
                order = Path("/sys/module/page_reporting/parameters/page_reporting_order")
                size = f" of {4 << int(order.read_text()):,} KiB and up" if order.exists() else ""
                return f"on: free blocks{size} go back to the host a few seconds after they are freed"
            return "off"
    return ""


def fresh_memory_rate(size: int = 64 * 2**20) -> float:
    """GiB/s at which a new numpy array of ``size`` bytes is first written (numpy asks for
    transparent huge pages for big arrays, as for zarr's output arrays): 6-7 on this VM while
    the guest's free memory is backed by the host, 0.35-0.8 once free page reporting has
    handed it back (within ten seconds of its being freed). What a pass allocates anew (an
    output array, the page cache a mount fills) may pay this; reused buffers do not."""
    import numpy as np

    t0 = time.perf_counter()
    a = np.ones(size, dtype=np.uint8)
    dt = time.perf_counter() - t0
    del a
    return size / max(dt, 1e-9) / 2**30


def warm_file(path: Path) -> float:
    """Read a file once so it sits in the page cache; returns seconds taken."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while os.read(fd, 16 * MiB):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - t0


# ============================================================================================
# nginx
# ============================================================================================

NGINX_CONF = """\
{modules}user {user} {group};
worker_processes {workers};
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type application/octet-stream;
    access_log off;
    client_body_temp_path {run}/client_body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 120;
    keepalive_requests 1000000;
    open_file_cache max=64 inactive=300s;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        server_name localhost;
        root {root};
{locations}
    }}
}}
"""


# Without added latency: files straight from the root. With it (Debian's echo module): every
# request waits LATENCY seconds without a worker or CPU per byte (echo_sleep is a timer), then
# is redirected internally to a location that serves the file as usual -- Range requests,
# sendfile and keep-alive unchanged; ``limit_rate`` caps each response's bandwidth.
ECHO_MODULE = "load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;\n"
PLAIN_LOCATIONS = "        location / {{ autoindex off;{rate} }}"
DELAYED_LOCATIONS = """\
        location ~ ^/(?<name>[^/].*)$ {{ echo_sleep {latency}; echo_exec /_delayed/$name; }}
        location ^~ /_delayed/ {{ internal; alias {root}/;{rate} }}"""


def nginx_locations(root: Path, latency_ms: float, rate: str | None) -> str:
    limit = f" limit_rate {rate};" if rate else ""
    if latency_ms <= 0:
        return PLAIN_LOCATIONS.format(rate=limit)
    return DELAYED_LOCATIONS.format(latency=f"{latency_ms / 1000:.3f}", root=root, rate=limit)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx with a configuration of its own, in the foreground as our child, stopped by PID."""

    def __init__(self, root: Path, run_dir: Path, workers: int | str = "auto",
                 latency_ms: float = 0.0, rate: str | None = None) -> None:
        self.root = root
        self.run_dir = run_dir
        self.workers = workers
        self.latency_ms = latency_ms  # added before each response's first byte
        self.rate = rate  # nginx limit_rate per response, e.g. "100m" (bytes/s)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(os.getegid()).gr_name
        last = ""
        for _ in range(5):
            self.port = free_port()
            conf = self.run_dir / "nginx.conf"
            conf.write_text(NGINX_CONF.format(user=user, group=group, workers=self.workers,
                                              run=self.run_dir, port=self.port, root=self.root,
                                              modules=ECHO_MODULE if self.latency_ms > 0 else "",
                                              locations=nginx_locations(self.root, self.latency_ms,
                                                                        self.rate)))
            with open(self.run_dir / "nginx.stderr", "wb") as err:
                self.proc = subprocess.Popen(
                    [NGINX, "-c", str(conf), "-p", str(self.run_dir), "-e",
                     str(self.run_dir / "error.log"), "-g", "daemon off;"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                    return
                time.sleep(0.05)
            last = (self.run_dir / "nginx.stderr").read_text(errors="replace")
            self.stop()
        raise RuntimeError(f"nginx did not start: {last[-1000:]}")

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def pids(self) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid, *children_of(self.proc.pid)]

    def cpu(self) -> float:
        return sum(proc_cpu(p) or 0.0 for p in self.pids())

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        workers = children_of(proc.pid)
        proc.terminate()  # the master stops its workers
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for w in workers:  # only workers of the master we started
            if pid_alive(w) and str(proc.pid) == (proc_stat(w) or ["", ""])[1]:
                stop_pid(w)


# ============================================================================================
# Data set and reference set
# ============================================================================================


def ensure_data(path: Path, size: int, log: Callable[[str], None]) -> bool:
    """A file of ``size`` incompressible bytes; reused when present. True if (re)generated."""
    if path.exists() and path.stat().st_size == size:
        return False
    import numpy as np

    log(f"generating {path} ({size / GiB:.2f} GiB)")
    t0 = time.perf_counter()
    block = 64 * MiB
    rng = np.random.default_rng(20240604)
    base = rng.integers(0, 2**63, size=block // 8, dtype=np.uint64)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        done = 0
        k = 0
        while done < size:
            # Every 64 MiB block differs: xor the random base with a per-block constant.
            blk = base ^ np.uint64((k * 0x9E3779B97F4A7C15) & (2**64 - 1))
            n = min(block, size - done)
            f.write(memoryview(blk).cast("B")[:n])
            done += n
            k += 1
    os.replace(tmp, path)
    log(f"  generated in {time.perf_counter() - t0:.1f} s")
    return True


def zarray(n_chunks: int, chunk_bytes: int) -> str:
    elems = chunk_bytes // 8
    return json.dumps({
        "zarr_format": 2, "shape": [n_chunks * elems], "chunks": [elems], "dtype": "<f8",
        "compressor": None, "filters": None, "fill_value": None, "order": "C",
        "dimension_separator": ".",
    })


def build_refs(url: str, n64: int, n1m: int) -> dict[str, Any]:
    """Version 0 references: ``data.bin`` = the whole file; ``a/i`` = 64 KiB ranges at i*64 KiB
    (zarr array a, chunks of 8192 <f8); ``b/j`` = 1 MiB ranges at j*1 MiB (array b)."""
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "data.bin": [url],
        "a/.zarray": zarray(n64, 64 * KiB),
        "a/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["x"]}),
        "b/.zarray": zarray(n1m, MiB),
        "b/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y"]}),
    }
    for i in range(n64):
        refs[f"a/{i}"] = [url, i * 64 * KiB, 64 * KiB]
    for j in range(n1m):
        refs[f"b/{j}"] = [url, j * MiB, MiB]
    return refs


def ensure_decode_data(serve_dir: Path, n_chunks: int, log: Callable[[str], None]) -> tuple[Path, Path]:
    """A zlib+shuffle float32 array of ``n_chunks`` 1 MiB chunks (a smooth field with noise,
    compressing about 2:1 like model output) as HDF5 stores it: the encoded chunks back to back
    in ``decode-N.bin`` (served), with their lengths in ``decode-N.idx``; and the decoded values
    in ``decode-N.f4`` (to verify what readers get). Reused when present."""
    import numcodecs
    import numpy as np

    data = serve_dir / f"decode-{n_chunks}.bin"
    idx, values = data.with_suffix(".idx"), data.with_suffix(".f4")
    if data.exists() and idx.exists() and values.exists():
        return data, values
    log(f"generating the zlib+shuffle array: {n_chunks} x 1 MiB chunks in {data}")
    t0 = time.perf_counter()
    elems = MiB // 4
    rng = np.random.default_rng(16)
    x = np.arange(elems, dtype="f4")
    shuffle, zlib = numcodecs.Shuffle(elementsize=4), numcodecs.Zlib(level=4)
    lengths = []
    with open(str(data) + ".tmp", "wb") as out, open(str(values) + ".tmp", "wb") as vals:
        for i in range(n_chunks):
            chunk = (280 + 10 * np.sin(x / 3000 + i) + rng.normal(0, 0.25, elems)).astype("<f4")
            chunk = np.round(chunk, 2).astype("<f4")  # two decimals, as measured values often are
            encoded = zlib.encode(shuffle.encode(chunk))
            out.write(encoded)
            vals.write(chunk.tobytes())
            lengths.append(len(encoded))
    idx.write_text(json.dumps(lengths))
    os.replace(str(values) + ".tmp", values)
    os.replace(str(data) + ".tmp", data)
    log(f"  generated in {time.perf_counter() - t0:.1f} s, {sum(lengths) / MiB:.0f} MiB stored "
        f"for {n_chunks} MiB decoded")
    return data, values


def build_decode_refs(url: str, data: Path) -> dict[str, Any]:
    """Version 0 references to the zlib+shuffle array ``z`` in ``data`` (filters as kerchunk
    writes them for HDF5: shuffle, then zlib, no compressor)."""
    lengths = json.loads(data.with_suffix(".idx").read_text())
    elems = MiB // 4
    refs: dict[str, Any] = {
        ".zgroup": json.dumps({"zarr_format": 2}),
        "z/.zarray": json.dumps({
            "zarr_format": 2, "shape": [len(lengths) * elems], "chunks": [elems], "dtype": "<f4",
            "compressor": None, "filters": [{"id": "shuffle", "elementsize": 4}, {"id": "zlib", "level": 4}],
            "fill_value": None, "order": "C",
        }),
        "z/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["t"], "units": "K"}),
    }
    off = 0
    for i, n in enumerate(lengths):
        refs[f"z/{i}"] = [url, off, n]
        off += n
    return refs


# ============================================================================================
# Children: ``bench.py _child KIND JSON`` prints one JSON line per measured pass
# ============================================================================================


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_readers(n: int, threads: int, read_one: Callable[[int], int]) -> dict[str, Any]:
    """Items 0..n-1 shared by ``threads`` threads (in order of claim); wall time and bytes."""
    counter = itertools.count()
    total = [0] * threads
    errors: list[str] = []
    n_err = [0]
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def worker(w: int) -> None:
        start.wait()
        got = 0
        while True:
            i = next(counter)
            if i >= n:
                break
            try:
                got += read_one(i)
            except Exception as e:
                with lock:
                    n_err[0] += 1
                    if len(errors) < 3:
                        errors.append(f"item {i}: {type(e).__name__}: {e}"[:300])
        total[w] = got

    ts = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads)]
    for t in ts:
        t.start()
    c0 = time.process_time()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"elapsed": elapsed, "bytes": sum(total), "items": n, "errors": n_err[0],
            "first_errors": errors, "cpu": time.process_time() - c0}


def _sample_ids(n: int, k: int = 16) -> set[int]:
    import random

    return set(random.Random(n).sample(range(n), min(k, n)))


def child_files(spec: dict[str, Any]) -> None:
    """Plain ``open().read()`` of DIR/PREFIX{i} for i < n with ``threads`` threads."""
    base = spec["dir"]
    prefix = spec["prefix"]
    length = spec["length"]
    local = spec["local"]
    sample = _sample_ids(spec["n"])
    kept: dict[int, bytes] = {}

    def read_one(i: int) -> int:
        with open(os.path.join(base, f"{prefix}{i}"), "rb") as f:
            data = f.read()
        if i in sample:
            kept[i] = data
        return len(data)

    res = run_readers(spec["n"], spec["threads"], read_one)
    bad = 0
    with open(local, "rb") as f:
        for i, data in kept.items():
            if data != os.pread(f.fileno(), length, i * length):
                bad += 1
    res["verified"] = f"{len(kept) - bad}/{len(kept)} sampled files match"
    res["verify_failed"] = bad > 0
    emit(res)


def child_local(spec: dict[str, Any]) -> None:
    """The same reads from the local file: open + pread + close per item."""
    path = spec["local"]
    length = spec["length"]

    def read_one(i: int) -> int:
        fd = os.open(path, os.O_RDONLY)
        try:
            return len(os.pread(fd, length, i * length))
        finally:
            os.close(fd)

    emit(run_readers(spec["n"], spec["threads"], read_one))


def _refs_fs(refs: str) -> Any:
    from fsspec.implementations.reference import ReferenceFileSystem

    return ReferenceFileSystem(fo=refs, remote_protocol="http", skip_instance_cache=True)


def child_inproc(spec: dict[str, Any]) -> None:
    """In-process fsspec (ReferenceFileSystem over HTTP): ``passes`` passes on one instance."""
    fs = _refs_fs(spec["refs"])
    mode = spec["mode"]
    for p in range(spec["passes"]):
        if mode == "seq":
            c0 = time.process_time()
            t0 = time.perf_counter()
            got = 0
            with fs.open("data.bin", "rb") as f:
                while chunk := f.read(MiB):
                    got += len(chunk)
            res = {"elapsed": time.perf_counter() - t0, "bytes": got, "items": 1, "errors": 0,
                   "cpu": time.process_time() - c0}
        elif mode == "batch":
            keys = [f"{spec['prefix']}{i}" for i in range(spec["n"])]
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = fs.cat(keys)
            res = {"elapsed": time.perf_counter() - t0, "bytes": sum(len(v) for v in out.values()),
                   "items": len(out), "errors": 0, "cpu": time.process_time() - c0}
        else:
            prefix = spec["prefix"]
            res = run_readers(spec["n"], spec["threads"],
                              lambda i, prefix=prefix: len(fs.cat_file(f"{prefix}{i}")))
        res["pass"] = p
        emit(res)


def zarr_copy(refs_path: Path, data: Path, arr: str) -> Path:
    """The keys of array ``arr`` of a Version 0/1 reference set as files in a new tmpfs
    directory (metadata inline, chunks cut from ``data``, the served file): zarr reading it
    is the local peer of a mount."""
    root = Path(tempfile.mkdtemp(prefix="refmount-bench-zarr-", dir="/dev/shm"))
    refs = json.loads(refs_path.read_text())
    refs = refs.get("refs", refs)
    (root / arr).mkdir()
    with open(data, "rb") as f:
        for key, value in refs.items():
            if not key.startswith(f"{arr}/"):
                continue
            out = root / key
            if isinstance(value, str):
                out.write_text(value)
            else:
                out.write_bytes(os.pread(f.fileno(), value[2], value[1]))
    return root


def child_zarr(spec: dict[str, Any]) -> None:
    """Read a whole zarr array: through a mount (LocalStore) or in-process (fsspec mapper)."""
    import numpy as np
    import zarr

    if spec["store"] == "mount":
        store: Any = zarr.storage.LocalStore(os.path.join(spec["root"], spec["array"]), read_only=True)
    else:
        import fsspec

        # zarr 3 turns a mapper over a *sync* ReferenceFileSystem into an async copy and fails
        # ("Reference-FS's target filesystem must have same value of asynchronous"): build the
        # mapper over an asynchronous ReferenceFileSystem (and HTTP filesystem) instead.
        store = fsspec.get_mapper(f"reference://{spec['array']}", fo=spec["refs"], remote_protocol="http",
                                  remote_options={"asynchronous": True}, asynchronous=True,
                                  skip_instance_cache=True)
    for p in range(spec["passes"]):
        c0 = time.process_time()
        t0 = time.perf_counter()
        arr = zarr.open_array(store=store, mode="r", zarr_format=2)
        data = arr[:]
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        raw = data.view(np.uint8)
        expect = np.fromfile(spec["local"], dtype=np.uint8, count=raw.size)
        ok = bool(np.array_equal(raw, expect))
        emit({"elapsed": elapsed, "bytes": int(raw.size), "items": int(arr.nchunks), "errors": 0,
              "cpu": cpu, "pass": p, "verified": "array matches the file" if ok else "MISMATCH",
              "verify_failed": not ok})
        del data, raw, expect


def child_ncdump(spec: dict[str, Any]) -> None:
    """``ncdump -v VAR`` of a zarr mount through NCZarr, its CDL text counted and dropped."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(["ncdump", "-v", spec["var"], spec["url"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    text = 0
    while chunk := proc.stdout.read(MiB):
        text += len(chunk)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    rc = proc.wait()
    elapsed = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    emit({"elapsed": elapsed, "bytes": spec["bytes"], "items": spec["chunks"], "errors": int(rc != 0),
          "cpu": (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime),
          "verified": f"ncdump exit {rc}, {text / 1e6:,.0f} MB of CDL" + (f": {err[:200]}" if rc else ""),
          "verify_failed": rc != 0})


def child_verify(spec: dict[str, Any]) -> None:
    """Compare random pieces of a file on the mount with the local file."""
    import random

    rnd = random.Random(7)
    size = spec["size"]
    bad = 0
    n = spec.get("n", 16)
    with open(spec["path"], "rb") as a, open(spec["local"], "rb") as b:
        for _ in range(n):
            off = rnd.randrange(0, max(size - 65536, 1))
            if os.pread(a.fileno(), 65536, off) != os.pread(b.fileno(), 65536, off):
                bad += 1
    emit({"verified": f"{n - bad}/{n} random 64 KiB pieces match", "verify_failed": bad > 0})


def child_fsspec_fuse(spec: dict[str, Any]) -> None:
    """fsspec's FUSE bridge (fusepy) over ReferenceFileSystem, in the foreground."""
    from fsspec.fuse import FUSEr, run

    class RootlessFUSEr(FUSEr):
        """FUSEr joins root + path; reference keys have no leading slash: root must be ''."""

        def __init__(self, fs: Any, path: str, ready_file: bool = False) -> None:
            super().__init__(fs, path, ready_file=ready_file)
            self.root = ""

    fs = _refs_fs(spec["refs"])
    run(fs, "", spec["mnt"], foreground=True, threads=spec["threads"], ops_class=RootlessFUSEr)


CHILDREN: dict[str, Callable[[dict[str, Any]], None]] = {
    "files": child_files,
    "local": child_local,
    "inproc": child_inproc,
    "zarr": child_zarr,
    "ncdump": child_ncdump,
    "verify": child_verify,
    "fsspec_fuse": child_fsspec_fuse,
}


def child_main(kind: str, spec_json: str) -> int:
    try:
        CHILDREN[kind](json.loads(spec_json))
    except Exception as e:
        traceback.print_exc()
        emit({"fatal": f"{type(e).__name__}: {e}"[:500]})
        return 1
    return 0
