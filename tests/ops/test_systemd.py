"""systemd integration:

- the notify protocol against a real ``NOTIFY_SOCKET`` datagram socket opened here: READY=1 only
  once the mount answers (the mountpoint is stat'ed the moment READY arrives), from the main
  process (``NotifyAccess=main``), STOPPING=1 on SIGTERM, exit 0, nothing left mounted; with
  ``-f`` and in daemon mode;
- the unit files in systemd/: ``systemd-analyze verify`` passes without a warning; the service's
  ExecStartPre/ExecStart/ExecStopPost lines, run the way systemd runs them (specifiers,
  EnvironmentFile, ``-`` prefix), clear a stale mount, mount, notify and stop cleanly; the
  ``.mount`` unit's and fstab.example's options work through mount(8) and mount.fuse3.

There is no systemd (PID 1) in the test container, so units are not started by systemd itself:
their commands are run as systemd would run them.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.admin import (
    INSTALLED_VENV,
    SUBREAPER,
    SYSTEMD_DIR,
    SYSTEMD_PATH,
    NotifySocket,
    expand_command,
    parse_unit,
    read_environment_file,
    systemd_escape_path,
    systemd_unescape_path,
    under_syscall_filter,
    unit_syscalls,
    unit_values,
    write_hand_set,
)
from support.mounts import CLI, cli_env, daemon_procs, is_mounted, mount_entry, opts_arg, wait_gone

from refmount.config import ConfigError, MountConfig, apply_options, split_options

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]

SERVICE = SYSTEMD_DIR / "refmount@.service"
SERVE_SERVICE = SYSTEMD_DIR / "refmount-serve@.service"
SERVE_CONF_EXAMPLE = SYSTEMD_DIR / "refmount-serve.conf.example"
MOUNT_UNIT = SYSTEMD_DIR / "mnt-data.mount"
FSTAB_EXAMPLE = SYSTEMD_DIR / "fstab.example"
CONF_EXAMPLE = SYSTEMD_DIR / "refmount.conf.example"


@pytest.fixture(scope="module")
def hand(datasets):
    return write_hand_set(datasets, "systemd_hand.json")


@pytest.fixture
def installed(system_install):
    """``/usr/local/bin/refmount`` and the unit, as scripts/install.sh installs them."""
    return system_install


def short_dir(tmp_path: Path) -> Path:
    """A directory for the notify socket (AF_UNIX paths are limited to 107 bytes)."""
    d = tmp_path / "s"
    d.mkdir(exist_ok=True)
    return d


def assert_fuse_root(note, mnt: Path) -> None:
    """At the moment READY=1 was received, the mountpoint was the FUSE file system's root."""
    assert note.root_stat is not None, f"stat({mnt}) failed when READY=1 arrived: {note.root_stat_error}"
    parent = os.stat(mnt.parent)
    assert note.root_stat.st_dev != parent.st_dev, "READY=1 sent before the mount was there"
    assert note.root_stat.st_ino == 1, "the mountpoint was not the FUSE root when READY=1 arrived"


def stop_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


# --- notify protocol ----------------------------------------------------------------------------------


def test_notify_foreground(mount, hand, tmp_path):
    m = mount.track(hand.path)
    notify = NotifySocket(short_dir(tmp_path), stat_on_receipt=m.path)
    err = m.log.with_suffix(".stderr")
    with open(err, "wb") as f:
        proc = subprocess.Popen([*CLI, str(hand.path), str(m.path), "-f", *opts_arg(m.opts)],
                                stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                env=notify.env(cli_env()))
    m.procs.append(psutil.Process(proc.pid))
    try:
        ready = notify.wait_for("READY", timeout=60, alive=proc)
        assert_fuse_root(ready, m.path)
        assert ready.fields["READY"] == "1"
        assert ready.pid == proc.pid, (
            f"READY=1 came from PID {ready.pid}, not the main process {proc.pid} (NotifyAccess=main)")
        assert ready.fields.get("STATUS"), "no STATUS= with READY=1"
        assert proc.poll() is None
        assert (m / "hello.txt").read_bytes() == b"hello world\n"
        assert not notify.drain(0.3), "more messages after READY=1 while serving"

        proc.send_signal(signal.SIGTERM)
        stopping = notify.wait_for("STOPPING", timeout=15)
        assert stopping.fields["STOPPING"] == "1" and stopping.pid == proc.pid
        rc = proc.wait(timeout=20)
        assert rc == 0, f"exit {rc} after SIGTERM: {err.read_text(errors='replace')}"
        assert not is_mounted(m.path)
        names = [k for n in notify.received for k in n.fields if k in ("READY", "STOPPING")]
        assert names == ["READY", "STOPPING"], [n.fields for n in notify.received]
    finally:
        stop_proc(proc)
        notify.close()


def test_notify_daemon_mode(mount, hand, tmp_path):
    """Daemon mode: READY=1 comes from the detached daemon once the mount answers; SIGTERM to it
    sends STOPPING=1, unmounts, and it exits 0 (seen through a subreaper that inherits it)."""
    m = mount.track(hand.path)
    notify = NotifySocket(short_dir(tmp_path), stat_on_receipt=m.path)
    report = tmp_path / "report"
    err = m.log.with_suffix(".stderr")
    with open(err, "wb") as f:
        wrapper = subprocess.Popen(
            [sys.executable, "-c", SUBREAPER, str(report), *CLI, str(hand.path), str(m.path),
             *opts_arg(m.opts)],
            stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=notify.env(cli_env()))
    try:
        ready = notify.wait_for("READY", timeout=60, alive=wrapper)
        assert_fuse_root(ready, m.path)
        m.refresh_procs()
        daemons = [p.pid for p in m.procs]
        assert ready.pid in daemons, f"READY=1 from PID {ready.pid}, daemons {daemons}"
        deadline = time.monotonic() + 30
        while "command" not in (report.read_text() if report.exists() else ""):
            assert time.monotonic() < deadline, "the CLI did not return after READY=1"
            time.sleep(0.05)
        assert report.read_text().splitlines()[0] == "command 0", err.read_text(errors="replace")
        assert (m / "a/top").read_bytes() == b"top"

        os.kill(ready.pid, signal.SIGTERM)
        stopping = notify.wait_for("STOPPING", timeout=15)
        assert stopping.pid == ready.pid
        wrapper.wait(timeout=30)
        lines = report.read_text().splitlines()
        assert lines[1] == f"daemon {ready.pid} 0", f"daemon exit: {lines}; log:\n{m.log_text()}"
        assert not is_mounted(m.path)
        assert not daemon_procs(m.path)
    finally:
        stop_proc(wrapper)
        notify.close()


def test_notify_abstract_socket(mount, hand, tmp_path):
    """``NOTIFY_SOCKET=@name`` (abstract namespace, as systemd uses in containers) works too."""
    import socket as socketlib

    from support.admin import UCRED

    name = f"refmount-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_DGRAM)
    sock.setsockopt(socketlib.SOL_SOCKET, socketlib.SO_PASSCRED, 1)
    sock.bind("\0" + name)
    sock.settimeout(60)
    m = mount.track(hand.path)
    proc = subprocess.Popen([*CLI, str(hand.path), str(m.path), "-f", *opts_arg(m.opts)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**cli_env(), "NOTIFY_SOCKET": "@" + name})
    m.procs.append(psutil.Process(proc.pid))
    try:
        data, anc, _f, _a = sock.recvmsg(4096, socketlib.CMSG_SPACE(UCRED.size))
        assert os.stat(m.path).st_ino == 1
        assert data.split(b"\n")[0] == b"READY=1"
        assert UCRED.unpack(anc[0][2][: UCRED.size])[0] == proc.pid
        proc.send_signal(signal.SIGTERM)
        assert sock.recv(4096) == b"STOPPING=1"
        assert proc.wait(timeout=20) == 0
        assert not is_mounted(m.path)
    finally:
        stop_proc(proc)
        sock.close()


# --- unit files ---------------------------------------------------------------------------------------


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        policy = subprocess.run(["apt-cache", "policy", "systemd"], capture_output=True, text=True)
        r = subprocess.run(["apt-get", "install", "-y", "-q", "systemd"], capture_output=True,
                           text=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        exe = shutil.which("systemd-analyze")
        assert exe, (f"systemd-analyze missing and apt-get install systemd failed:\n"
                     f"{policy.stdout}\n{r.stderr}")
    return exe


@pytest.mark.timeout(900)  # the first test to use the install waits for install.sh
def test_units_pass_systemd_analyze_verify(installed, tmp_path):
    """``systemd-analyze verify`` (which also checks that /usr/local/bin/refmount exists and that
    the mount unit's name matches Where=) passes with no warning at all."""
    exe = systemd_analyze()
    units = tmp_path / "units"
    units.mkdir()
    for f in (SERVICE, SERVE_SERVICE, MOUNT_UNIT):
        shutil.copy(f, units / f.name)
    instance = systemd_escape_path("/mnt/data")
    assert instance == "mnt-data"
    for unit in (f"refmount@{instance}.service", "refmount@srv-refs-era5.service", MOUNT_UNIT.name,
                 "refmount-serve@era5.service"):
        r = subprocess.run([exe, "verify", unit], capture_output=True, text=True, timeout=120,
                           cwd=units)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (
            f"systemd-analyze verify {unit}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    # and it does catch mistakes (the check is not vacuous)
    bad = units / "refmount@.service"
    bad.write_text(SERVICE.read_text().replace("Type=notify", "Type=notfy"))
    r = subprocess.run([exe, "verify", f"refmount@{instance}.service"], capture_output=True,
                       text=True, timeout=120, cwd=units)
    assert "notfy" in r.stderr, r.stderr


def test_service_settings():
    unit = parse_unit(SERVICE)

    def one(key: str) -> str:
        values = unit_values(unit, "Service", key)
        assert len(values) == 1, f"{key}: {values}"
        return values[0]

    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("EnvironmentFile") == "/etc/refmount/%i.conf"
    # SOURCE and the options reach refmount in its environment, never on its command line
    assert one("ExecStart") == "/usr/local/bin/refmount --env %f -f"
    assert "-/usr/bin/fusermount3 -uz %f" in unit_values(unit, "Service", "ExecStartPre")
    assert one("Restart") == "on-failure"
    assert one("KillSignal") == "SIGTERM"
    assert "/dev/fuse rw" in unit_values(unit, "Service", "DeviceAllow")
    caps = " ".join(unit_values(unit, "Service", "CapabilityBoundingSet")).split()
    assert "CAP_SYS_ADMIN" in caps
    # options that would put the service in its own mount namespace hide the FUSE mount
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "PrivateMounts",
                "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "TemporaryFileSystem",
                "BindPaths", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
                "MountFlags", "RootDirectory"):
        assert not unit_values(unit, "Service", key), f"{key}= would hide the mount from the host"
    for f in (FSTAB_EXAMPLE, CONF_EXAMPLE, MOUNT_UNIT):
        assert f.exists(), f
    # hardening that keeps the mount visible, and bounds a drop-in can raise
    assert unit_values(unit, "Service", "SystemCallFilter")[0].split() == ["@system-service", "@mount"]
    for key in ("ProtectClock", "ProtectHostname", "NoNewPrivileges"):
        assert one(key) == "yes", key
    assert one("MemoryMax") == "2G" and one("TasksMax") == "512"


@pytest.mark.parametrize("service", [SERVICE, SERVE_SERVICE], ids=["mount", "serve"])
def test_service_exposure_is_ok(tmp_path, service):
    """``systemd-analyze security`` rates each unit as written (offline) at most 4.0, "OK"."""
    exe = systemd_analyze()
    shutil.copy(service, tmp_path / service.name)
    r = subprocess.run([exe, "security", "--offline=true", "--no-pager", service.name],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", r.stdout)
    assert found, r.stdout[-2000:] + r.stderr
    assert float(found[1]) <= 4.0 and found[2] == "OK", found[0]


def stale_mount(mount, hand) -> Path:
    """A mountpoint whose daemon was SIGKILLed: every access fails with ENOTCONN."""
    m = mount(hand.path)
    assert (m / "hello.txt").read_bytes() == b"hello world\n"
    m.kill_daemons(signal.SIGKILL)
    assert not wait_gone(m.procs, 10)
    with pytest.raises(OSError) as e:
        os.listdir(m.path)
    assert e.value.errno == errno.ENOTCONN, e.value
    assert is_mounted(m.path)
    return m.path


@pytest.mark.timeout(900)  # the first test to use the install waits for install.sh
def test_service_commands_as_systemd_runs_them(mount, hand, installed, tmp_path):
    """Start (after a crash that left a stale mount), READY, stop, as refmount@.service does it:
    ExecStartPre clears the stale mount, ExecStart mounts with options from the EnvironmentFile
    (refmount.conf.example with our paths), READY=1 from the main PID, SIGTERM (KillSignal)
    gives STOPPING=1 and exit 0, ExecStopPost is harmless."""
    mnt = stale_mount(mount, hand)
    m = mount.track(hand.path, mnt=mnt)  # the same mountpoint, a fresh record for cleanup
    instance = systemd_escape_path(mnt)
    f_spec = systemd_unescape_path(instance)
    assert f_spec == str(mnt)
    spec = {"i": instance, "I": f_spec, "f": f_spec, "n": f"refmount@{instance}.service"}

    conf = tmp_path / f"{instance}.conf"
    example = read_environment_file(CONF_EXAMPLE)
    assert set(example) == {"REFMOUNT_SOURCE", "REFMOUNT_OPTIONS"}, example
    # the example's options, made hermetic (later options win; the example's allow_local names
    # the example's data directory: here, the test's)
    example_opts = split_options(example["REFMOUNT_OPTIONS"])
    assert any(o.startswith("allow_local=") for o in example_opts), example_opts
    data_dirs = sorted({os.path.dirname(v[0].removeprefix("file://"))
                        for v in hand.refs.values() if isinstance(v, list)})
    conf.write_text(
        "# test copy of refmount.conf.example\n"
        f"REFMOUNT_SOURCE={hand.path}\n"
        f"REFMOUNT_OPTIONS='{','.join([*example_opts, *m.opts, 'allow_local=' + ':'.join(data_dirs)])}'\n")

    unit = parse_unit(SERVICE)
    env = {}
    for assignment in unit_values(unit, "Service", "Environment"):
        k, _, v = assignment.partition("=")
        env[k] = v
    assert unit_values(unit, "Service", "EnvironmentFile") == ["/etc/refmount/%i.conf"]
    env.update(read_environment_file(conf))  # EnvironmentFile= wins over Environment=

    service_env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"}
    # Every command runs under the unit's SystemCallFilter= (a call outside it kills); the
    # filter is enforced: a call it leaves out dies with SIGSYS.
    allowed = unit_syscalls(unit)
    assert "mount" in allowed and "setuid" not in allowed and "clock_settime" not in allowed
    r = subprocess.run(under_syscall_filter([sys.executable, "-c", "import os; os.setuid(0)"],
                                            allowed, tmp_path), capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGSYS, (r.returncode, r.stderr)
    for line in unit_values(unit, "Service", "ExecStartPre"):
        argv, ignore = expand_command(line, spec, env)
        argv = under_syscall_filter(argv, allowed, tmp_path)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=service_env)
        assert r.returncode == 0 or ignore, (argv, r.stderr)
    assert os.stat(mnt).st_ino != 1 and not is_mounted(mnt), "ExecStartPre did not clear the stale mount"

    [start] = unit_values(unit, "Service", "ExecStart")
    argv, _ = expand_command(start, spec, env)
    assert argv == ["/usr/local/bin/refmount", "--env", str(mnt), "-f"]
    argv = under_syscall_filter(argv, allowed, tmp_path)
    notify = NotifySocket(short_dir(tmp_path), stat_on_receipt=mnt)
    err = tmp_path / "service.stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                env=notify.env({**service_env, **env}))
    m.procs.append(psutil.Process(proc.pid))
    try:
        ready = notify.wait_for("READY", timeout=60, alive=proc)
        assert_fuse_root(ready, mnt)
        assert ready.pid == proc.pid, "NotifyAccess=main would drop READY=1 from another PID"
        assert psutil.Process(proc.pid).cmdline()[:2] == [str(INSTALLED_VENV / "bin/python"),
                                                          "/usr/local/bin/refmount"]
        assert (mnt / "range/middle").read_bytes() == hand.expected("range/middle")
        assert mount_entry(mnt)[2] == "fuse.refmount"
        kill_signal = unit_values(unit, "Service", "KillSignal")[0]
        proc.send_signal(getattr(signal, kill_signal))
        assert notify.wait_for("STOPPING", timeout=15).pid == proc.pid
        assert proc.wait(timeout=20) == 0, err.read_text(errors="replace")
        assert not is_mounted(mnt)
        for line in unit_values(unit, "Service", "ExecStopPost"):
            argv, ignore = expand_command(line, spec, env)
            argv = under_syscall_filter(argv, allowed, tmp_path)
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=service_env)
            assert r.returncode == 0 or ignore, (argv, r.stderr)
        assert os.path.isdir(mnt) and not is_mounted(mnt)
    finally:
        stop_proc(proc)
        notify.close()


@pytest.mark.timeout(900)  # the first test to use the install waits for install.sh
def test_mount_unit_options_through_mount_fuse3(mount, hand, installed):
    """What systemd runs for mnt-data.mount: mount -t Type What Where -o Options (with our
    source and mountpoint, and hermetic cache/log options appended)."""
    unit = parse_unit(MOUNT_UNIT)
    [what] = unit_values(unit, "Mount", "What")
    [where] = unit_values(unit, "Mount", "Where")
    [fstype] = unit_values(unit, "Mount", "Type")
    [options] = unit_values(unit, "Mount", "Options")
    assert (what, where, fstype) == ("/srv/refs/data.json", "/mnt/data", "fuse.refmount")
    assert MOUNT_UNIT.name == systemd_escape_path(where) + ".mount"
    assert {"ro", "_netdev", "allow_other"} <= set(split_options(options))
    m = mount.track(hand.path)
    r = subprocess.run(["mount", "-t", fstype, str(hand.path), str(m.path), "-o",
                        ",".join([options, *m.opts])],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env={"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"})
    m.refresh_procs()
    assert r.returncode == 0, f"{r.stderr}\n{m.log_text()}"
    assert (m / "whole/tiny.bin").read_bytes() == hand.expected("whole/tiny.bin")
    assert "allow_other" in mount_entry(m.path)[3].split(",")
    r = subprocess.run(["umount", str(m.path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert not wait_gone(m.procs, 15)
    assert not is_mounted(m.path)


def test_fstab_example_lines_are_valid():
    lines = [ln for ln in FSTAB_EXAMPLE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) >= 2
    for line in lines:
        fields = line.split()
        assert len(fields) == 6, line
        _src, mnt, fstype, options, dump, passno = fields
        assert fstype == "fuse.refmount" and mnt.startswith("/") and (dump, passno) == ("0", "0")
        opts = split_options(options)
        assert "ro" in opts and "_netdev" in opts, line
        # every option is one refmount accepts (credential files are not read here)
        cfg = MountConfig(source=_src, mountpoint=mnt)
        try:
            apply_options(cfg, [o for o in opts if "=@" not in o])
        except ConfigError as e:
            pytest.fail(f"fstab.example: {line}: {e}")


def test_operations_doc_links_the_options_and_files():
    """docs/operations.md links docs/configuration.md for the options (instead of a copy of the
    table that could drift), and the files it links to exist."""
    doc_path = SYSTEMD_DIR.parent / "docs" / "operations.md"
    doc = doc_path.read_text()
    assert "(configuration.md)" in doc
    assert not [line for line in doc.splitlines() if line.startswith("| `cache_size")], (
        "operations.md repeats the options table; link configuration.md instead")
    for target in re.findall(r"\]\((\.\./[^)#]+|[a-z]+\.md)\)", doc):
        assert (doc_path.parent / target).resolve().exists(), f"broken link {target}"
    for word in ("user_allow_other", "fusermount3 -uz", "recover", "/usr/local/bin/refmount",
                 "systemd-escape --path", "NOTIFY_SOCKET", "journalctl", "scripts/install.sh"):
        assert word in doc, word


# --- refmount-serve@.service ------------------------------------------------------------------


def test_serve_service_settings():
    unit = parse_unit(SERVE_SERVICE)

    def one(key: str) -> str:
        values = unit_values(unit, "Service", key)
        assert len(values) == 1, f"{key}: {values}"
        return values[0]

    assert (one("Type"), one("NotifyAccess"), one("KillSignal")) == ("notify", "main", "SIGTERM")
    assert one("EnvironmentFile") == "/etc/refmount/serve-%i.conf"
    # SOURCE and the options reach refmount in its environment, never on its command line
    start = one("ExecStart")
    assert start.startswith("/usr/local/bin/refmount serve --env ") and " -f " in start + " "
    assert "REFMOUNT_SOURCE" not in start and "REFMOUNT_OPTIONS" not in start
    # no FUSE: no capability at all, its own user, its own cache directory
    assert one("DynamicUser") == "yes" and one("CapabilityBoundingSet") == ""
    assert one("CacheDirectory") == "refmount-serve/%i"
    assert set(read_environment_file(SERVE_CONF_EXAMPLE)) == {
        "REFMOUNT_SOURCE", "REFMOUNT_LISTEN", "REFMOUNT_OPTIONS"}


NOBODY = 65534


@pytest.mark.timeout(900)  # the first test to use the install waits for install.sh
def test_serve_service_commands_as_systemd_runs_them(datasets, installed, public, tmp_path):
    """refmount-serve@.service as systemd runs it: ExecStart with the specifiers expanded and the
    environment of refmount-serve.conf.example (our paths, our port), as an unprivileged user
    without capabilities (what DynamicUser= gives) owning only its cache directory (what
    CacheDirectory= makes): READY=1 from the main PID once it answers, the set over HTTP,
    SIGTERM (KillSignal) gives STOPPING=1, exit 0 and nothing left listening."""
    import socket as socketlib
    import urllib.request

    data = public / "data"
    data.mkdir()
    shutil.copy(datasets.tiny, data / "tiny.bin")
    (data / "tiny.bin").chmod(0o644)
    source = public / "era5.json"
    tiny = (data / "tiny.bin").read_bytes()
    source.write_text(json.dumps({".zgroup": '{"zarr_format":2}', "hello.txt": "hello world\n",
                                  "whole/tiny.bin": [str(data / "tiny.bin")]}))
    source.chmod(0o644)
    with socketlib.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    unit = parse_unit(SERVE_SERVICE)
    env = {}
    for assignment in unit_values(unit, "Service", "Environment"):
        k, _, v = assignment.partition("=")
        env[k] = v
    example = read_environment_file(SERVE_CONF_EXAMPLE)
    example_opts = [o for o in split_options(example["REFMOUNT_OPTIONS"])
                    if not o.startswith(("allow_local=", "log_level="))]
    conf = tmp_path / "serve-era5.conf"
    conf.write_text(
        "# test copy of refmount-serve.conf.example\n"
        f"REFMOUNT_SOURCE={source}\n"
        f"REFMOUNT_LISTEN=127.0.0.1:{port}\n"
        f"REFMOUNT_OPTIONS='{','.join([*example_opts, 'allow_local=' + str(data), 'log_level=info'])}'\n")
    env.update(read_environment_file(conf))  # EnvironmentFile= wins over Environment=

    cache_root = public / "cache"  # %C; CacheDirectory= makes %C/refmount-serve/era5 for the user
    instance_cache = cache_root / "refmount-serve" / "era5"
    instance_cache.mkdir(parents=True)
    os.chown(instance_cache, NOBODY, NOBODY)
    instance_cache.chmod(0o700)
    spec = {"i": "era5", "I": "era5", "C": str(cache_root), "n": "refmount-serve@era5.service"}
    [start] = unit_values(unit, "Service", "ExecStart")
    argv, _ = expand_command(start, spec, env)
    assert argv == ["/usr/local/bin/refmount", "serve", "--env", "--listen", f"127.0.0.1:{port}",
                    "-f", "-o", f"cache_dir={instance_cache}"], argv
    # DynamicUser=, CapabilityBoundingSet= (empty), NoNewPrivileges=yes
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *argv]
    sock_dir = public / "notify"
    sock_dir.mkdir()
    notify = NotifySocket(sock_dir)
    notify.path.chmod(0o666)  # systemd's socket accepts the service's user
    err = tmp_path / "serve-service.stderr"
    service_env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", "HOME": "/"}
    with open(err, "wb") as f:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                env=notify.env({**service_env, **env}))
    try:
        ready = notify.wait_for("READY", timeout=60, alive=proc)
        assert ready.pid == proc.pid, "NotifyAccess=main would drop READY=1 from another PID"
        assert psutil.Process(proc.pid).uids().real == NOBODY
        cmdline = " ".join(psutil.Process(proc.pid).cmdline())
        assert str(source) not in cmdline, "SOURCE on the command line"
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/whole/tiny.bin", timeout=30) as r:  # answers at READY
            assert r.read() == tiny
            assert r.headers["Access-Control-Allow-Origin"] == "*"  # the example's cors=*
        with urllib.request.urlopen(f"{base}/.zmetadata", timeout=30) as r:
            assert json.loads(r.read())["metadata"][".zgroup"] == {"zarr_format": 2}
        kill_signal = unit_values(unit, "Service", "KillSignal")[0]
        proc.send_signal(getattr(signal, kill_signal))
        assert notify.wait_for("STOPPING", timeout=15).pid == proc.pid
        assert proc.wait(timeout=20) == 0, err.read_text(errors="replace")
        with socketlib.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
    finally:
        stop_proc(proc)
        notify.close()
