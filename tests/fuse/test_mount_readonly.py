"""Every write-type operation on the mount fails with EROFS and changes nothing."""

from __future__ import annotations

import errno
import os
import stat
import subprocess

import pytest

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(360)]


def snapshot(root) -> dict[str, tuple[int, int, bytes | None]]:
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st_ = os.lstat(p)
            data = None
            if stat.S_ISREG(st_.st_mode) and st_.st_size < 100_000:
                with open(p, "rb") as f:
                    data = f.read()
            snap[os.path.relpath(p, root)] = (st_.st_mode, st_.st_size, data)
    return snap


def expect_erofs(what: str, fn, *args) -> str | None:
    try:
        fn(*args)
    except OSError as e:
        if e.errno == errno.EROFS:
            return None
        return f"{what}: {errno.errorcode.get(e.errno, e.errno)} ({e}) instead of EROFS"
    return f"{what}: succeeded instead of failing with EROFS"


def write_ops(m) -> list[tuple[str, object, tuple]]:
    f = str(m / "hello.txt")
    big = str(m / "whole/blob.bin")
    rng = str(m / "range/middle")
    d = str(m / "a")
    deep = str(m / "a/b")
    empty_dir_like = str(m / "a/b/c/d/e")
    new = str(m / "new-file")
    return [
        ("create new file", lambda p: os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)),
         (new,)),
        ("create new file in subdir",
         lambda p: os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)),
         (str(m / "a/b/new"),)),
        ("open O_WRONLY", lambda p: os.close(os.open(p, os.O_WRONLY)), (f,)),
        ("open O_RDWR", lambda p: os.close(os.open(p, os.O_RDWR)), (big,)),
        ("open O_WRONLY|O_APPEND", lambda p: os.close(os.open(p, os.O_WRONLY | os.O_APPEND)),
         (rng,)),
        ("open O_TRUNC", lambda p: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC)), (f,)),
        ("write via open(w)", lambda p: open(p, "w").write("x"), (f,)),
        ("truncate file", os.truncate, (f, 0)),
        ("truncate to larger", os.truncate, (rng, 10**6)),
        ("unlink file", os.unlink, (f,)),
        ("unlink range file", os.unlink, (rng,)),
        ("rename file", os.rename, (f, str(m / "renamed.txt"))),
        ("rename file into dir", os.rename, (f, str(m / "a/hello.txt"))),
        ("rename dir", os.rename, (d, str(m / "a2"))),
        ("mkdir at root", os.mkdir, (str(m / "newdir"),)),
        ("mkdir in subdir", os.mkdir, (str(m / "a/b/newdir"),)),
        ("rmdir dir", os.rmdir, (deep,)),
        ("rmdir leaf dir", os.rmdir, (empty_dir_like,)),
        ("unlink dir", os.unlink, (d,)),
        ("chmod file", os.chmod, (f, 0o666)),
        ("chmod dir", os.chmod, (d, 0o777)),
        ("chown file", os.chown, (f, 1, 1)),
        ("utime file", os.utime, (f, (0, 0))),
        ("symlink", os.symlink, ("hello.txt", str(m / "link"))),
        ("hard link", os.link, (f, str(m / "hardlink"))),
        ("mknod fifo", os.mkfifo, (str(m / "fifo"),)),
        ("setxattr", os.setxattr, (f, "user.test", b"x")),
    ]


@pytest.mark.parametrize("name", ["hand_local", "hand_http"])
def test_write_operations_fail_with_erofs(shared_mounts, name):
    m = shared_mounts.get(name)
    before = snapshot(m.path)
    problems = [p for what, fn, args in write_ops(m) if (p := expect_erofs(what, fn, *args))]
    assert not problems, "\n".join(problems)
    assert snapshot(m.path) == before


def test_shell_write_commands_fail(shared_mounts):
    m = shared_mounts.get("hand_local")
    before = snapshot(m.path)
    for cmd in (
        ["touch", str(m / "newfile")],
        ["sh", "-c", f"echo x > '{m / 'hello.txt'}'"],
        ["rm", "-f", str(m / "hello.txt")],
        ["rm", "-rf", str(m / "a")],
        ["mv", str(m / "hello.txt"), str(m / "x.txt")],
        ["mkdir", str(m / "d")],
        ["chmod", "777", str(m / "json")],
        ["dd", "if=/dev/zero", f"of={m / 'range/first'}", "bs=1", "count=1", "conv=notrunc"],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, cmd
        assert "read-only file system" in r.stderr.lower(), (cmd, r.stderr)
    assert snapshot(m.path) == before


def test_modes(shared_mounts):
    m = shared_mounts.get("nc4_local")
    for dirpath, _dirnames, filenames in os.walk(m.path):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o555, dirpath
        for n in filenames:
            p = os.path.join(dirpath, n)
            mode = os.stat(p).st_mode
            assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o444, (p, oct(mode))
    # and the kernel agrees: no write access, read and search allowed
    assert not os.access(m / ".zgroup", os.W_OK)
    assert os.access(m / ".zgroup", os.R_OK)
    assert not os.access(m.path, os.W_OK)
    assert os.access(m / "sub", os.X_OK)
