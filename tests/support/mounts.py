"""Mounts through the CLI for the mount tests: /proc/mounts helpers, running ``python -m
refmount``, ``Mount``/``Mounter`` records that always clean up (unmount, then end only the
recorded daemon PIDs), and the CLI's failure contract. conftest.py's fixtures are built on these.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from refmount.base.spawn import has_exited as spawn_has_exited
from support.datasets import Datasets

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "refmount"]
CLI_TIMEOUT = 60  # seconds for the CLI to validate, daemonize and return
DAEMON_EXIT_TIMEOUT = 15  # seconds for a daemon to exit after its mount is gone


def require_fuse() -> None:
    """Fail (never skip) when the machine cannot mount FUSE file systems."""
    problems = []
    if not os.path.exists("/dev/fuse"):
        problems.append("/dev/fuse is missing")
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        problems.append("/dev/fuse is not readable/writable by this user")
    if shutil.which("fusermount3") is None:
        problems.append("fusermount3 is not installed (Debian package fuse3)")
    if problems:
        pytest.fail("FUSE is not usable: " + "; ".join(problems), pytrace=False)


# --- /proc helpers --------------------------------------------------------------------------------


def _unescape_mount_field(s: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_entries() -> list[tuple[str, str, str, str]]:
    """(source, mountpoint, fstype, options) for every line of /proc/mounts."""
    entries = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4:
                entries.append(
                    (_unescape_mount_field(parts[0]), _unescape_mount_field(parts[1]),
                     parts[2], parts[3])
                )
    return entries


def mount_entry(path: str | os.PathLike) -> tuple[str, str, str, str] | None:
    path = os.path.abspath(path)
    found = None
    for e in mount_entries():
        if e[1] == path:
            found = e  # the last one wins (stacked mounts)
    return found


def is_mounted(path: str | os.PathLike) -> bool:
    return mount_entry(path) is not None


def daemon_procs(mnt: str | os.PathLike) -> list[psutil.Process]:
    """Processes (other than us) whose command line names ``mnt`` and refmount, and that have
    not exited (:func:`has_exited`)."""
    mnt = os.path.abspath(mnt)
    me = os.getpid()
    found = []
    for pid_s in os.listdir("/proc"):
        if not pid_s.isdigit() or int(pid_s) == me:
            continue
        try:
            with open(f"/proc/{pid_s}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.rstrip("/") == mnt for a in args) and any("refmount" in a for a in args):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(int(pid_s))
                if not has_exited(p):
                    found.append(p)
    return found


def has_exited(p: psutil.Process) -> bool:
    """Gone (or its PID taken by another process), or a zombie with no thread left
    (``refmount.base.spawn.has_exited``): not when PID 1 reaps it, on these VMs a second or two
    after the daemon exited."""
    try:
        return not p.is_running() or spawn_has_exited(p.pid)
    except psutil.NoSuchProcess:
        return True


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait for processes to exit (see :func:`has_exited`); return those still running."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not has_exited(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if not has_exited(p)]
    return alive


def fusermount_u(path: str | os.PathLike, lazy: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["fusermount3", "-uz" if lazy else "-u", str(path)],
        capture_output=True, text=True, timeout=30,
    )


def unmount_when_free(path: str | os.PathLike, seconds: float = 15.0) -> subprocess.CompletedProcess:
    """``fusermount3 -u``, retried while the kernel says the mount is busy: on a loaded machine
    a file just closed can keep it busy for a moment. The last attempt's result."""
    deadline = time.monotonic() + seconds
    while True:
        r = fusermount_u(path)
        if r.returncode == 0 or "busy" not in r.stderr.lower() or time.monotonic() > deadline:
            return r
        time.sleep(0.3)


# --- running the CLI ------------------------------------------------------------------------------


@dataclass
class CliResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def cli_env() -> dict[str, str]:
    """The environment for the CLI: this checkout importable even if not pip-installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH", "")) if p
    )
    return env


def run_cli(*args: str, timeout: float = CLI_TIMEOUT, cwd: str | None = None,
            extra_env: dict[str, str] | None = None) -> CliResult:
    """Run ``python -m refmount ARGS`` with stdout/stderr sent to files (not pipes, so that a
    daemon keeping them open cannot hang us) and wait for the command itself to exit.
    ``extra_env``: added to the environment (a daemon it starts inherits it)."""
    import tempfile

    argv = [*CLI, *map(str, args)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                cwd=cwd or str(REPO), env={**cli_env(), **(extra_env or {})})
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            out.seek(0)
            err.seek(0)
            pytest.fail(
                f"{' '.join(argv)} did not return within {timeout}s\n"
                f"stdout: {out.read().decode(errors='replace')}\n"
                f"stderr: {err.read().decode(errors='replace')}",
                pytrace=False,
            )
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return CliResult(argv, rc, out.read().decode(errors="replace"),
                         err.read().decode(errors="replace"), seconds)


def opts_arg(opts: list[str]) -> list[str]:
    return ["-o", ",".join(opts)] if opts else []


# --- mounts ---------------------------------------------------------------------------------------


@dataclass
class Mount:
    path: Path
    log: Path
    source: str
    opts: list[str]
    result: CliResult | None = None
    procs: list[psutil.Process] = field(default_factory=list)

    def __truediv__(self, other) -> Path:
        return self.path / other

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def log_text(self, tail: int = 200) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(lines[-tail:])

    def refresh_procs(self) -> None:
        known = {p.pid for p in self.procs}
        self.procs += [p for p in daemon_procs(self.path) if p.pid not in known]

    def kill_daemons(self, sig=signal.SIGKILL) -> None:
        """Signal only the daemon processes recorded for this mount."""
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.send_signal(sig)

    def unmount(self) -> list[str]:
        """fusermount3 -u (retried while busy), then -uz. Never raises."""
        problems = []
        try:
            self.refresh_procs()
            if is_mounted(self.path):
                for _ in range(10):
                    r = fusermount_u(self.path)
                    if r.returncode == 0 or not is_mounted(self.path):
                        break
                    time.sleep(0.3)
                else:
                    problems.append(f"fusermount3 -u failed: {r.stderr.strip()}; using -uz")
                    fusermount_u(self.path, lazy=True)
        except Exception as e:
            problems.append(f"unmount error: {e!r}")
        return problems

    def reap(self, timeout: float = DAEMON_EXIT_TIMEOUT) -> list[str]:
        """Wait for this mount's daemon to exit; SIGTERM, then SIGKILL, only that PID."""
        problems = []
        try:
            alive = wait_gone(self.procs, timeout)
            if alive:
                problems.append(
                    f"daemon(s) {[p.pid for p in alive]} still running "
                    f"{DAEMON_EXIT_TIMEOUT}s after unmount; sending SIGTERM"
                )
                for p in alive:
                    with contextlib.suppress(psutil.Error):
                        p.terminate()
                alive = wait_gone(alive, 5)
                for p in alive:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                wait_gone(alive, 5)
            if is_mounted(self.path):
                problems.append("still mounted after the daemon exited; fusermount3 -uz")
                fusermount_u(self.path, lazy=True)
        except Exception as e:
            problems.append(f"reap error: {e!r}")
        return problems

    def cleanup(self) -> list[str]:
        """Unmount and make sure the daemon is gone. Returns problems noticed; never raises."""
        return self.unmount() + self.reap()


class Mounter:
    """Creates mounts through the CLI and always cleans them up."""

    def __init__(self, base: Path):
        self.base = base
        self.mounts: list[Mount] = []
        self._n = 0

    def new_mountpoint(self, name: str = "mnt") -> Path:
        self._n += 1
        p = self.base / f"{name}{self._n}"
        p.mkdir(parents=True)
        return p

    def track(self, source, *opts: str, mnt: str | os.PathLike | None = None,
              debug_log: bool = True) -> Mount:
        """A Mount record (mountpoint, log file, full options) that ``cleanup`` will take care
        of, for tests that run the CLI themselves (foreground mode, pipes)."""
        mnt = Path(mnt) if mnt is not None else self.new_mountpoint()
        log = self.base / f"{mnt.name}.log"
        all_opts = [f"log={log}", *(["log_level=debug"] if debug_log else []), *opts]
        if not any(o.startswith("cache_dir=") or o == "no_disk_cache" for o in opts):
            # keep the suite hermetic: never the user's ~/.cache or /var/cache
            all_opts.append(f"cache_dir={self.base / 'cache'}")
        m = Mount(path=Path(os.path.abspath(mnt)), log=log, source=str(source), opts=all_opts)
        self.mounts.append(m)
        return m

    def __call__(self, source, *opts: str, mnt: str | os.PathLike | None = None,
                 extra_args: tuple[str, ...] = ()) -> Mount:
        require_fuse()
        m = self.track(source, *opts, mnt=mnt)
        m.result = run_cli(str(source), str(m.path), *opts_arg(m.opts), *extra_args)
        m.refresh_procs()
        assert m.result.returncode == 0, (
            f"refmount exited {m.result.returncode}\nargs: {m.result.args}\n"
            f"stderr: {m.result.stderr}\nstdout: {m.result.stdout}\nlog:\n{m.log_text()}"
        )
        assert is_mounted(m.path), (
            f"refmount exited 0 but {m.path} is not in /proc/mounts\nlog:\n{m.log_text()}"
        )
        return m

    def cleanup(self) -> list[str]:
        """Unmount everything first, then wait for all the daemons together."""
        problems = []
        for m in self.mounts:
            problems += [f"{m.path}: {p}" for p in m.unmount()]
        procs = [p for m in self.mounts for p in m.procs]
        deadline = time.monotonic() + DAEMON_EXIT_TIMEOUT
        wait_gone(procs, DAEMON_EXIT_TIMEOUT)
        for m in self.mounts:
            problems += [f"{m.path}: {p}"
                         for p in m.reap(max(0.1, deadline - time.monotonic()))]
        return problems


class SharedMounts:
    """Session-wide read-only mounts of the dataset reference sets, made on first use."""

    def __init__(self, mounter: Mounter, datasets: Datasets):
        self.mounter = mounter
        self.datasets = datasets
        self.by_name: dict[str, Mount] = {}

    def get(self, name: str, *opts: str) -> Mount:
        key = name + "|" + ",".join(opts)
        m = self.by_name.get(key)
        if m is not None and not (is_mounted(m.path) and m.procs
                                  and all(p.is_running() for p in m.procs)):
            m.cleanup()  # killed (e.g. by the watchdog) or unmounted by a test: mount afresh
            m = None
        if m is None:
            m = self.mounter(self.datasets.refs[name], *opts,
                             mnt=self.mounter.new_mountpoint(name))
            self.by_name[key] = m
        return m

    @property
    def mounts(self) -> list[Mount]:
        return list(self.by_name.values())


def warn_problems(what: str, problems: list[str]) -> None:
    """Cleanup problems show up in pytest's warnings summary (teardown output is hidden)."""
    if problems:
        warnings.warn(pytest.PytestWarning(f"{what} cleanup: " + "; ".join(problems)),
                      stacklevel=2)


# All live mounters, for conftest's watchdog (a test making its own Mounter registers it here).
LIVE_MOUNTERS: list[Mounter] = []


def assert_cli_error(r: CliResult, mnt: str | os.PathLike, *must_mention: str) -> str:
    """The failure contract: exit non-zero, exactly one stderr line ``refmount: error: ...``,
    no mount and no daemon left at ``mnt``. Returns the error line."""
    lines = r.stderr_lines
    assert r.returncode != 0, f"expected failure, got exit 0; stderr: {r.stderr!r}"
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{r.stderr}"
    line = lines[0]
    assert line.startswith("refmount: error:"), line
    for word in must_mention:
        assert word.lower() in line.lower(), f"error line does not mention {word!r}: {line}"
    assert not is_mounted(mnt), f"{mnt} is mounted after a failed refmount: {mount_entry(mnt)}"
    left = daemon_procs(mnt)
    assert not left, f"processes left behind for {mnt}: {[p.pid for p in left]}"
    return line


class FailingMounter(Mounter):
    """Runs the CLI expecting failure; anything it wrongly mounts is still cleaned up."""

    def __call__(self, source, *opts: str, must_mention: tuple[str, ...] = (),
                 mnt: str | os.PathLike | None = None) -> tuple[CliResult, str]:
        require_fuse()
        mnt = Path(mnt) if mnt is not None else self.new_mountpoint("fail")
        m = self.track(source, *opts, mnt=mnt, debug_log=False)
        m.result = run_cli(str(source), str(mnt), *opts_arg(m.opts))
        m.refresh_procs()
        return m.result, assert_cli_error(m.result, mnt, *must_mention)


def start_foreground(mounter: Mounter, source, *extra: str) -> tuple[Mount, subprocess.Popen, Path]:
    """``refmount SOURCE MNT -f`` with the mounter's options, its output to a file; the mount
    is tracked for cleanup. Returns the mount, the process and the output file."""
    m = mounter.track(source)
    argv = [*CLI, str(source), str(m.path), "-f", *opts_arg(m.opts), *extra]
    err_path = m.log.with_suffix(".stderr")
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                cwd=REPO, env=cli_env())
    m.procs.append(psutil.Process(proc.pid))
    return m, proc, err_path


def stop_foreground(proc: subprocess.Popen, mnt: Path) -> None:
    """Unmount a foreground refmount that still runs and wait for it (killed after 10 s)."""
    if proc.poll() is None:
        fusermount_u(mnt)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
