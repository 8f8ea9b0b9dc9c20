"""The benchmarks' shared harness: processes and their CPU, FUSE mounts of the peers
(refmount, fsspec's FUSE bridge), nginx (with added latency and a bandwidth cap), the served
data, fresh cache directories, the wait for an idle machine, and the measuring children
(each measurement runs in a child process so that it can be bounded by a timeout and stopped
by its PID without touching anything else on the machine).

Nothing here is imported by refmount or its tests.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
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
    top = [(d, short_cmd(p)) for d, p in per[:3] if d > 0]
    return total, top


def short_cmd(pid: int) -> str:
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


def fuse_unmount(mnt: Path, pids: list[int], log: Callable[[str], None], timeout: float = 30.0,
                 tries: int = 10) -> None:
    """``fusermount3 -u`` (up to ``tries`` times while the mount is busy), a lazy unmount if
    that fails; then make sure ``pids`` (processes we started) are gone."""
    for attempt in range(tries):
        if not mounted(mnt):
            break
        r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or not mounted(mnt):
            break
        if attempt == tries - 1:
            log(f"    fusermount3 -u {mnt} failed ({r.stderr.strip()}); lazy unmount")
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, timeout=60)
        time.sleep(0.5)
    for pid in pids:
        if not wait_gone(pid, timeout):
            log(f"    pid {pid} still running after unmount; stopping it")
            stop_pid(pid)
    if mounted(mnt):
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, timeout=60)


def refmount_daemon_pid(mnt: Path) -> int | None:
    """The detached daemon serving ``mnt`` (argv ends with the mountpoint)."""
    target = os.path.abspath(mnt)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        argv = proc_cmdline(int(name))
        if "refmount.fuse.daemon" in argv and argv and argv[-1] == target:
            return int(name)
    return None


def wait_answers(mnt: Path, probe: str, timeout: float, proc: subprocess.Popen | None = None,
                 on_tick: Callable[[], None] | None = None) -> bool:
    """True once ``stat(mnt/probe)`` works (polled every 5 ms: the time until a mount answers
    is what the scale rows measure), False at the deadline or when ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        if on_tick is not None:
            on_tick()
        if mounted(mnt):
            with contextlib.suppress(OSError):
                os.stat(mnt / probe)
                return True
        time.sleep(0.005 if on_tick is None else 0.05)
    return False


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes ({} if it is gone)."""
    out = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out


def run_rusage(cmd: list[str], timeout: float, env: dict[str, str] | None = None
               ) -> tuple[int | None, str, float, int]:
    """Run ``cmd``; (exit code or None on timeout, its output, seconds, its own peak RSS). The
    peak comes from wait4(2): the refmount CLI's, not its detached daemon's."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                elapsed = time.perf_counter() - t0
                p.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                p.kill()
                p.wait()
                return None, "", timeout, 0
            time.sleep(0.002)
        err.seek(0)
        return p.returncode, err.read(), elapsed, ru.ru_maxrss * 1024


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
    {access}
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
        listen {host}:{port} backlog=4096;
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
                 latency_ms: float = 0.0, rate: str | None = None, access_log: Path | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = root
        self.host = host  # a loopback address
        self.fixed_port = port  # 0: a free port of 127.0.0.1
        self.access_log = access_log  # one line per request (the requests a peer made), or none
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
            self.port = self.fixed_port or free_port()
            conf = self.run_dir / "nginx.conf"
            conf.write_text(NGINX_CONF.format(user=user, group=group, workers=self.workers, host=self.host,
                                              run=self.run_dir, port=self.port, root=self.root,
                                              modules=ECHO_MODULE if self.latency_ms > 0 else "",
                                              access=f"access_log {self.access_log};" if self.access_log
                                              else "access_log off;",
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
                with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), 0.2):
                    return
                time.sleep(0.05)
            last = (self.run_dir / "nginx.stderr").read_text(errors="replace")
            self.stop()
        raise RuntimeError(f"nginx did not start: {last[-1000:]}")

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.port}/{name}"

    def requests(self) -> int:
        """The requests answered so far (with ``access_log``; 0 without)."""
        if self.access_log is None or not self.access_log.exists():
            return 0
        with open(self.access_log, "rb") as f:
            return sum(1 for _ in f)

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



# ============================================================================================
# Peers: refmount and fsspec's FUSE bridge, mounted and unmounted
# ============================================================================================


def checkout_env(repo: Path | None = None) -> dict[str, str]:
    """The environment of every refmount and child process: this checkout's refmount and bench
    (``repo``: another checkout's refmount, for a comparison with a base)."""
    path = os.environ.get("PYTHONPATH")
    first = str(repo or REPO)
    return dict(os.environ, PYTHONPATH=f"{first}{os.pathsep}{path}" if path else first)


class Failed(Exception):
    """A measurement did not produce a number; ``str()`` goes in the table cell."""

    def __init__(self, why: str, partial: list[dict[str, Any]] | None = None) -> None:
        super().__init__(why)
        self.partial = partial or []


@dataclass
class Mount:
    peer: str  # "refmount" | "fsspec-fuse"
    mnt: Path
    pids: list[int]  # processes that serve the mount (that we started)
    seconds: float = 0.0  # until the mount answered
    cli_peak: int | None = None  # refmount's CLI (detached mode): its own peak RSS

    @property
    def cpu_pid(self) -> int:
        return self.pids[0]

    def stats(self) -> dict[str, Any] | None:
        if self.peer != "refmount":
            return None
        try:
            return json.loads(os.getxattr(self.mnt, "user.refmount.stats"))
        except (OSError, ValueError):
            return None

    def unmount(self, log: Callable[[str], None]) -> None:
        if self.peer == "fsspec-fuse":  # libfuse2 unmounts on SIGTERM
            for pid in self.pids:
                stop_pid(pid, 10)
        fuse_unmount(self.mnt, self.pids, log)
        for pid in self.pids:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def mount_refmount(refs: Path, mnt: Path, opts: list[str], timeout: float, log: Callable[[str], None],
                   probe: str = ".zgroup", foreground: bool = False, repo: Path | None = None) -> Mount:
    """``refmount REFS MNT -o OPTS`` (``-f``: the started process serves) until the mount
    answers ``stat(MNT/probe)``; raises Failed, leaving nothing mounted. ``repo``: the
    checkout whose refmount runs (this one when None)."""
    mnt.mkdir(parents=True, exist_ok=True)
    # -P: the refmount of PYTHONPATH (checkout_env), not one in the current directory
    cmd = [PY, "-P", "-m", "refmount", str(refs), str(mnt), *(["-f"] if foreground else []),
           "-o", ",".join(opts)]
    log(f"  $ {' '.join(cmd)}")
    if foreground:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=checkout_env(repo))
        if not wait_answers(mnt, probe, timeout, proc=proc):
            why = "DNF (mount)" if proc.poll() is None else f"mount failed (exit {proc.returncode})"
            fuse_unmount(mnt, [proc.pid], log)
            stop_pid(proc.pid)
            raise Failed(why)
        return Mount("refmount", mnt, [proc.pid], time.perf_counter() - t0)
    rc, err, elapsed, peak = run_rusage(cmd, timeout, env=checkout_env(repo))
    pid = refmount_daemon_pid(mnt)
    if rc is None or rc != 0 or pid is None or not wait_answers(mnt, probe, 30):
        fuse_unmount(mnt, [pid] if pid else [], log)
        if rc is None:
            raise Failed("DNF (mount)")
        log(f"    refmount failed ({rc}): {err.strip()[-300:]}")
        raise Failed("mount failed")
    log(f"    mounted in {elapsed:.2f} s, daemon pid {pid}")
    return Mount("refmount", mnt, [pid], elapsed, peak)


def mount_fsspec_fuse(refs: Path, mnt: Path, log_path: Path, timeout: float, probe: str = ".zgroup",
                      threads: bool = False, fs: dict[str, Any] | None = None,
                      on_tick: Callable[[int], None] | None = None) -> Mount:
    """fsspec's FUSE bridge over ReferenceFileSystem (``fs``: its options) in a child
    (``bench.children``) until the mount answers; raises Failed, leaving nothing mounted.
    ``on_tick(pid)`` while waiting."""
    mnt.mkdir(parents=True, exist_ok=True)
    spec = {"refs": str(refs), "mnt": str(mnt), "threads": threads, "fs": fs or {}}
    t0 = time.perf_counter()
    with open(log_path, "w") as err:
        proc = subprocess.Popen([PY, "-m", "bench.children", "fsspec_fuse", json.dumps(spec)],
                                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=checkout_env())
    m = Mount("fsspec-fuse", mnt, [proc.pid])
    tick = (lambda: on_tick(proc.pid)) if on_tick else None
    if not wait_answers(mnt, probe, timeout, proc, on_tick=tick):
        why = "DNF (mount)" if proc.poll() is None else f"mount failed (exit {proc.returncode})"
        m.unmount(lambda _: None)
        raise Failed(why)
    m.seconds = time.perf_counter() - t0
    return m


# ============================================================================================
# Cold passes, an idle machine, measuring children
# ============================================================================================


class CacheDirs:
    """refmount cache directories under ``root``: ``fresh(tag)`` for a cold pass (cold = a fresh
    mount AND a fresh cache_dir). A used one is moved aside and all are deleted at the end:
    deleting tens of thousands of block files right before a cold pass made every file the
    next pass creates cost a scan past recently deleted inodes (ext4 without a journal), a
    cost of the benchmark's clean-up, not of a cold start."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def fresh(self, tag: str) -> Path:
        path = self.root / tag
        self.set_aside(path)
        path.mkdir(parents=True)
        return path

    def set_aside(self, path: Path) -> None:
        if path.exists():
            trash = self.root / ".used"
            trash.mkdir(parents=True, exist_ok=True)
            path.rename(trash / f"{path.name}-{time.monotonic_ns()}")

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def wait_idle(max_wait: float, idle_load: float) -> tuple[float, float]:
    """Wait up to ``max_wait`` seconds until the machine's busy cores (over half a second)
    fall to ``idle_load`` or below: other work on a 2-core machine shows up in every number.
    (seconds waited, busy cores at the end)."""
    t0 = time.monotonic()
    while True:
        b0 = machine_busy()
        time.sleep(0.5)
        load = (machine_busy() - b0) / 0.5
        waited = time.monotonic() - t0
        if load <= idle_load or waited >= max_wait:
            return waited, load


def run_child(kind: str, spec: dict[str, Any], timeout: float, err_path: Path | None = None,
              live: set[int] | None = None) -> list[dict[str, Any]]:
    """Run a measuring child (``bench.children``); its JSON lines. Raises Failed("timeout") or
    Failed("error") with the lines it printed as ``.partial``; ``live``: our running children."""
    with open(err_path or os.devnull, "w") as err:
        proc = subprocess.Popen([PY, "-m", "bench.children", kind, json.dumps(spec)], stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, text=True, env=checkout_env())
        if live is not None:
            live.add(proc.pid)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            try:
                out, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                out = ""
        finally:
            if live is not None and proc.poll() is not None:
                live.discard(proc.pid)
    results = [json.loads(ln) for ln in (out or "").splitlines() if ln.startswith("{")]
    fatal = [r["fatal"] for r in results if "fatal" in r]
    results = [r for r in results if "fatal" not in r]
    if timed_out:
        raise Failed("timeout", results)
    if fatal or (proc.returncode != 0 and not results):
        raise Failed("error", results) from Exception(fatal[0] if fatal else f"exit {proc.returncode}")
    return results

