"""Helpers for the administration tests (test_admin.py, test_systemd.py).

Some of these tests change machine-wide state: ``/etc/fstab``, the system install made by
``scripts/install.sh`` (``/opt/refmount``, ``/usr/local/bin/refmount`` where mount.fuse3 and
systemd find the helper, the unit in /etc/systemd/system, /etc/refmount), a stand-in syslog
socket at ``/dev/log``. Every such change happens under :func:`machine_lock` (an flock on this
file, so two test runs on one machine take turns) and is undone in a ``finally``: the install is
removed with ``install.sh --uninstall`` only if the session installed it (an existing install is
updated to this checkout and kept), the socket only if the test created it, and /etc/fstab gets
its exact original bytes and mode back.

``NotifySocket`` is the receiving end of systemd's notify protocol: an AF_UNIX datagram socket
with SO_PASSCRED, so every message comes with the sender's PID (what systemd checks for
``NotifyAccess=main``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shutil
import socket
import stat
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_DIR = REPO / "systemd"
INSTALL_SH = REPO / "scripts" / "install.sh"
INSTALL_PREFIX = Path("/opt/refmount")
INSTALLED_VENV = INSTALL_PREFIX / "venv"
INSTALLED_UNIT = Path("/etc/systemd/system/refmount@.service")
INSTALLED_SERVE_UNIT = Path("/etc/systemd/system/refmount-serve@.service")
CONF_DIR = Path("/etc/refmount")
PATH_LINK = Path("/usr/local/bin/refmount")
FSTAB = Path("/etc/fstab")
DEV_LOG = Path("/dev/log")
# The PATH systemd gives to services and to the mount(8) it runs for .mount units.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


_lock_depth = 0


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """Serialise changes to machine-wide files between concurrent test runs (re-entrant within
    this process: a fixture and its test may both take it)."""
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    fd = os.open(__file__, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _lock_depth = 1
        yield
    finally:
        _lock_depth = 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def run_install(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``bash scripts/install.sh ARGS`` (as root), output captured."""
    return subprocess.run(["bash", str(INSTALL_SH), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd="/")


@dataclass
class Installation:
    """refmount as ``scripts/install.sh`` installed it; ``fresh``: this test run installed it."""

    bin: Path
    venv: Path
    fresh: bool
    output: str


def installed_paths() -> list[Path]:
    return [p for p in (INSTALL_PREFIX, PATH_LINK, INSTALLED_UNIT, INSTALLED_SERVE_UNIT,
                        CONF_DIR / "refmount.conf.example", CONF_DIR / "refmount-serve.conf.example")
            if os.path.lexists(p)]


@contextlib.contextmanager
def system_install() -> Iterator[Installation]:
    """Run ``scripts/install.sh`` (idempotent) once; afterwards ``install.sh --uninstall`` if
    nothing was installed before, checking that it removes everything it installed and keeps
    an administrator's configuration files."""
    if os.geteuid() != 0:
        raise AssertionError("the system install tests run as root (install.sh writes /opt, /etc)")
    with machine_lock():
        fresh = not installed_paths()
        r = run_install()
        assert r.returncode == 0, f"install.sh failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    try:
        yield Installation(PATH_LINK, INSTALLED_VENV, fresh, r.stdout)
    finally:
        if fresh:
            with machine_lock():
                keep = CONF_DIR / "refmount-test-keep.conf"
                keep.write_text("REFMOUNT_SOURCE=/nonexistent\n")
                try:
                    r = run_install("--uninstall")
                    left = installed_paths()
                    kept = keep.exists()
                finally:
                    keep.unlink(missing_ok=True)
                    with contextlib.suppress(OSError):
                        CONF_DIR.rmdir()
                assert r.returncode == 0, f"install.sh --uninstall failed:\n{r.stdout}\n{r.stderr}"
                assert not left, f"install.sh --uninstall left {left}:\n{r.stdout}"
                assert kept, "install.sh --uninstall removed an administrator's conf file"


@contextlib.contextmanager
def fstab_with(lines: list[str]) -> Iterator[None]:
    """/etc/fstab with ``lines`` appended; the original bytes, mode and owner come back in
    ``finally`` (written in place, same inode). Call under :func:`machine_lock`."""
    original = FSTAB.read_bytes()
    st = FSTAB.stat()
    try:
        text = original.decode()
        if text and not text.endswith("\n"):
            text += "\n"
        with open(FSTAB, "w") as f:
            f.write(text + "".join(line + "\n" for line in lines))
        yield
    finally:
        with open(FSTAB, "wb") as f:
            f.write(original)
        os.chmod(FSTAB, stat.S_IMODE(st.st_mode))
        os.chown(FSTAB, st.st_uid, st.st_gid)
        assert FSTAB.read_bytes() == original, "/etc/fstab was not restored"


class SyslogSocket:
    """A datagram socket bound at /dev/log, standing in for syslog (only when the machine has
    none: a real /dev/log is never touched). Removed by :meth:`close`."""

    def __init__(self) -> None:
        if os.path.lexists(DEV_LOG):
            raise RuntimeError("/dev/log exists: not replacing the machine's syslog socket")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(DEV_LOG))
        os.chmod(DEV_LOG, 0o666)
        self.ino = os.stat(DEV_LOG).st_ino

    def messages(self, timeout: float = 0.0) -> list[str]:
        out = []
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                return out
            out.append(self.sock.recv(65536).decode(errors="replace"))

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            if os.stat(DEV_LOG).st_ino == self.ino:
                os.unlink(DEV_LOG)


# --- systemd's notify protocol ------------------------------------------------------------------

UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass
class Notification:
    fields: dict[str, str]
    pid: int
    received: float  # time.monotonic()
    root_stat: os.stat_result | None = None  # stat of the mountpoint taken on receipt
    root_stat_error: str | None = None


class NotifySocket:
    """``NOTIFY_SOCKET`` for a child: receives its datagrams with the sender's credentials.
    ``stat_on_receipt``: a path stat'ed the moment each message has been received."""

    def __init__(self, directory: Path, stat_on_receipt: str | os.PathLike | None = None):
        self.path = Path(directory) / "notify.sock"
        assert len(str(self.path)) < 100, f"socket path too long: {self.path}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(self.path))
        self.stat_path = stat_on_receipt
        self.received: list[Notification] = []

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "NOTIFY_SOCKET": str(self.path)}

    def _recv(self, timeout: float) -> Notification | None:
        ready, _, _ = select.select([self.sock], [], [], max(timeout, 0.0))
        if not ready:
            return None
        data, ancdata, _flags, _addr = self.sock.recvmsg(65536, socket.CMSG_SPACE(UCRED.size))
        note = Notification({}, -1, time.monotonic())
        if self.stat_path is not None:
            try:
                note.root_stat = os.stat(self.stat_path)
            except OSError as e:
                note.root_stat_error = f"{type(e).__name__}: {e}"
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                note.pid = UCRED.unpack(payload[: UCRED.size])[0]
        for line in data.decode(errors="replace").split("\n"):
            if "=" in line:
                k, _, v = line.partition("=")
                note.fields[k] = v
        self.received.append(note)
        return note

    def wait_for(self, name: str, timeout: float, alive: subprocess.Popen | None = None
                 ) -> Notification:
        """The first message (from now on, or already received) that sets ``name``."""
        for note in self.received:
            if name in note.fields:
                return note
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            note = self._recv(min(0.2, deadline - time.monotonic()))
            if note is not None and name in note.fields:
                return note
            if alive is not None and alive.poll() is not None and note is None:
                raise AssertionError(f"process exited ({alive.returncode}) without sending {name}; "
                                     f"got {[n.fields for n in self.received]}")
        raise AssertionError(f"no {name} within {timeout}s; got {[n.fields for n in self.received]}")

    def drain(self, timeout: float = 0.2) -> list[Notification]:
        out = []
        while (note := self._recv(timeout)) is not None:
            out.append(note)
        return out

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


# Runs a command as a child subreaper and reports, in a file, the exit status of the command and
# of the one process it leaves behind (refmount's detached daemon gets reparented to us).
SUBREAPER = r"""
import ctypes, os, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
report = open(sys.argv[1], "w", buffering=1)
rc = subprocess.call(sys.argv[2:], stdin=subprocess.DEVNULL)
report.write(f"command {rc}\n")
if rc == 0:
    pid, status = os.wait()
    report.write(f"daemon {pid} {os.waitstatus_to_exitcode(status)}\n")
"""


# --- unit files ------------------------------------------------------------------------------------


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A unit file's sections as ordered (key, value) lists (comments and blank lines dropped,
    backslash continuations joined)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
            continue
        assert current is not None, f"{path}: setting outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not key=value: {line}"
        sections[current].append((key.strip(), value.strip()))
    return sections


def unit_values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def read_environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd reads an EnvironmentFile= (comments, optional quotes)."""
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def expand_command(line: str, specifiers: dict[str, str], env: dict[str, str]
                   ) -> tuple[list[str], bool]:
    """An Exec*= line as systemd runs it: (argv, failure_ignored). Handles the ``-`` prefix,
    %-specifiers and ``${VAR}`` (one argument) / ``$VAR`` (split on whitespace)."""
    ignore = False
    while line and line[0] in "-@:+!":
        ignore |= line[0] == "-"
        line = line[1:]
    argv: list[str] = []
    for word in line.split():
        word = re.sub(r"%(.)", lambda m: "%" if m.group(1) == "%" else specifiers[m.group(1)], word)
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            argv.extend(env.get(word[1:], "").split())
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""),
                               word))
    return argv, ignore


def syscall_groups() -> dict[str, list[str]]:
    """systemd's system call groups (``@system-service``: names and ``@group`` references),
    as ``systemd-analyze syscall-filter`` lists them."""
    out = subprocess.run(["systemd-analyze", "syscall-filter", "--no-pager"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif not line.strip():
            current = None
        elif current is not None and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def unit_syscalls(unit: dict[str, list[tuple[str, str]]]) -> set[str]:
    """The system calls the service may make: its SystemCallFilter= lines (an allow list
    first, then ``~`` lists taken out of it) and ProtectClock= (no @clock)."""
    groups = syscall_groups()

    def expand(item: str) -> set[str]:
        if not item.startswith("@"):
            return {item}
        return set().union(*(expand(i) for i in groups[item]))

    allowed: set[str] = set()
    for value in unit_values(unit, "Service", "SystemCallFilter"):
        names = set().union(*(expand(i) for i in value.lstrip("~").split()))
        if value.startswith("~"):
            allowed -= names
        else:
            allowed |= names
    if unit_values(unit, "Service", "ProtectClock") == ["yes"]:
        allowed -= expand("@clock")
    return allowed


def under_syscall_filter(argv: list[str], allowed: set[str], directory: Path) -> list[str]:
    """``argv`` run under a seccomp filter that allows ``allowed`` only (support/seccomp_exec.py,
    with the system's Python and python3-seccomp)."""
    names = directory / "allowed-syscalls.txt"
    names.write_text("\n".join(sorted(allowed)) + "\n")
    return ["/usr/bin/python3", str(Path(__file__).with_name("seccomp_exec.py")), str(names), *argv]


def systemd_escape_path(path: str | os.PathLike) -> str:
    exe = shutil.which("systemd-escape")
    assert exe, "systemd-escape missing (Debian package systemd)"
    return subprocess.run([exe, "--path", str(path)], capture_output=True, text=True,
                          check=True).stdout.strip()


def systemd_unescape_path(instance: str) -> str:
    return subprocess.run(["systemd-escape", "--unescape", "--path", instance],
                          capture_output=True, text=True, check=True).stdout.strip()


# --- a small reference set of our own -------------------------------------------------------------


@dataclass
class HandSet:
    """Version 0 references to the datasets' data files, one of every value form, written next
    to data/ (so the default allow_local of a shared mount covers the targets)."""

    path: Path
    refs: dict
    ds: object  # datasets.Datasets

    def expected(self, key: str) -> bytes:
        return self.ds.expected_bytes(self.refs[key])

    def expected_tree(self) -> dict[str, bytes]:
        return {k: self.expected(k) for k in self.refs}


def write_hand_set(ds, name: str = "admin_hand.json") -> HandSet:
    import base64
    import json

    blob, tiny = str(ds.blob), str(ds.tiny)
    size = ds.blob.stat().st_size
    refs = {
        "hello.txt": "hello world\n",
        "empty.txt": "",
        "b64/all_bytes.bin": "base64:" + base64.b64encode(bytes(range(256)) * 2).decode(),
        "json/obj.json": {"a": 1, "nested": {"b": [1, 2.5, None, True]}},
        ".zgroup": '{"zarr_format":2}',
        "whole/blob.bin": [blob],
        "whole/tiny.bin": [tiny],
        "whole/file-url.bin": ["file://" + tiny],
        "range/first": [blob, 0, 100],
        "range/middle": [blob, 12_345, 4_321],
        "range/large": [blob, 1_000, 700_001],
        "range/last": [blob, size - 10, 10],
        "range/one": [blob, 777, 1],
        "a/b/c/d/e/deep.txt": "deep down\n",
        "a/b/sibling": "sibling",
        "a/top": "top",
    }
    path = Path(ds.root) / name
    path.write_text(json.dumps(refs))
    return HandSet(path, refs, ds)
