"""The daemon's process-wide settings, applied once by ``process.tune``."""

from __future__ import annotations

import asyncio.selector_events
import os
import sys

from refmount.base import process


def test_tune_applies_the_process_settings_once() -> None:
    transport = asyncio.selector_events._SelectorSocketTransport
    saved_size = transport.max_size
    saved_mask = os.umask(0o022)
    saved_switch = sys.getswitchinterval()
    process.tune.cache_clear()
    try:
        transport.max_size = 256 * 1024  # asyncio's default
        trim = process.tune()
        assert os.umask(0o022) == 0o077  # what the daemon creates is the mounting user's only
        assert transport.max_size == process.RECV_SIZE
        assert sys.getswitchinterval() == process.SWITCH_INTERVAL
        assert trim is None or trim(0) in (0, 1)  # glibc's malloc_trim
        os.umask(0o022)
        assert process.tune() is trim  # once: a second call changes nothing
        assert os.umask(0o022) == 0o022
    finally:
        transport.max_size = saved_size
        os.umask(saved_mask)
        sys.setswitchinterval(saved_switch)
        process.tune.cache_clear()


def test_private_dir_and_file_close_ours_and_refuse_others(tmp_path) -> None:
    """``private_dir``/``private_file`` make an existing directory or file of ours 0700/0600
    and create missing ones so; a directory another user owns or may write to (sticky or
    not), or a symlink, is refused with ``UnsafeDirectory`` (an OSError) and left as it is."""
    import stat

    import pytest

    def mode(p) -> int:
        return stat.S_IMODE(os.lstat(p).st_mode)

    old = tmp_path / "old"
    old.mkdir()
    old.chmod(0o755)
    process.private_dir(str(old))
    process.private_dir(str(tmp_path / "new" / "sub"))
    log = tmp_path / "x.log"
    log.write_text("")
    log.chmod(0o644)
    fd = os.open(log, os.O_WRONLY)
    try:
        process.private_file(fd)
    finally:
        os.close(fd)
    assert (mode(old), mode(tmp_path / "new" / "sub"), mode(log)) == (0o700, 0o700, 0o600)

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    shared, group = tmp_path / "shared", tmp_path / "group"
    shared.mkdir()
    shared.chmod(0o1777)
    group.mkdir()
    group.chmod(0o770)
    link = tmp_path / "link"
    link.symlink_to(old)
    for path, why in ((theirs, "owned by uid 65534"), (shared, "writable by others (mode 1777)"),
                      (group, "writable by its group (mode 0770)"), (link, "is a symlink")):
        with pytest.raises(OSError) as e:
            process.private_dir(str(path))
        assert isinstance(e.value, process.UnsafeDirectory)
        message = str(e.value)
        assert why in message and str(path) in message and "\n" not in message, message
        assert "choose another cache_dir" in message
    assert (mode(shared), mode(group), os.stat(theirs).st_uid) == (0o1777, 0o770, 65534)


def test_programs_started_with_user_signals_ignored_inherit_it():
    """A child started in ``user_signals_ignored`` is not killed by SIGUSR1 before it could
    set a handler; the parent's own handler is back afterwards."""
    import signal
    import subprocess
    import sys

    from refmount.base.process import user_signals_ignored

    def mine(signum, frame):
        pass

    before = signal.signal(signal.SIGUSR1, mine)
    try:
        code = ("import signal as s; "
                "print(int(s.getsignal(s.SIGUSR1)), int(s.getsignal(s.SIGUSR2)))")
        with user_signals_ignored():
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=30)
        assert r.stdout.split() == [str(int(signal.SIG_IGN))] * 2, r.stderr
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_user_who_cannot_fix_a_cache_dir_is_told_to_choose_another_first(tmp_path, monkeypatch):
    """root's directory, seen by uid 1000: only root can remove or chown it."""
    theirs = tmp_path / "roots"
    theirs.mkdir(mode=0o700)
    monkeypatch.setattr(process.os, "geteuid", lambda: 1000)
    problem = process.directory_problem(str(theirs), os.lstat(theirs))
    assert problem is not None
    message = str(problem)
    assert message.startswith(f"cache directory {theirs} is owned by uid 0, not by uid 1000 who mounts: "
                              "choose another cache_dir (or have uid 0 remove it"), message
    monkeypatch.setattr(process.os, "geteuid", lambda: 0)
    theirs_too = tmp_path / "nobodys"
    theirs_too.mkdir(mode=0o700)
    os.chown(theirs_too, 65534, 65534)
    message = str(process.directory_problem(str(theirs_too), os.lstat(theirs_too)))
    assert message.endswith(", or choose another cache_dir") and "chown -R 0" in message, message
