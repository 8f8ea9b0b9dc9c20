"""The cache directory is the mounting user's alone: ``check_cache_dir`` (at mount) refuses
one another user could change, with one line naming the directory and what to do; the disk
cache and the index never read or write through a symlink or another user's file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from refmount.base.errors import MountError
from refmount.cache.blocks import DiskCache, aligned_buffer, round_up
from refmount.cache.directory import check_cache_dir
from refmount.refs import ReferenceSetError
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.indexfiles import write_index, write_temporary_index

OTHER = 65534  # nobody: root (the tests' user) can make files of another user with chown

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


def refused(cache: Path) -> str:
    with pytest.raises(MountError) as e:
        check_cache_dir(str(cache))
    message = str(e.value)
    assert "\n" not in message and "choose another cache_dir" in message, message
    return message


def test_a_missing_cache_dir_is_made_private_and_ours_is_accepted(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # a shared parent like /tmp is fine
    check_cache_dir(str(sticky / "a" / "cache"))
    assert stat.S_IMODE((sticky / "a" / "cache").stat().st_mode) == 0o700
    ours = tmp_path / "ours"
    (ours / "blocks" / "00").mkdir(parents=True)
    (ours / "index").mkdir()
    for d in (ours, ours / "blocks", ours / "blocks" / "00", ours / "index"):
        d.chmod(0o755)  # readable by others only: made private
    check_cache_dir(str(ours))
    assert {stat.S_IMODE(d.stat().st_mode) for d in (ours, ours / "blocks" / "00", ours / "index")} == {0o700}
    link = tmp_path / "link"
    link.symlink_to(ours)  # a symlink of ours (or root's) to a directory of ours
    check_cache_dir(str(link))


@pytest.mark.parametrize("sub", ["", "index", "blocks", "blocks/7f", "log"])
def test_a_directory_another_user_made_is_refused(tmp_path: Path, sub: str) -> None:
    """What user B prepares before the first mount: the directory itself or any directory
    refmount uses under it, owned by B (mode 0777, as B would leave it)."""
    cache = tmp_path / "cache"
    target = cache / sub
    target.mkdir(parents=True)
    os.chown(target, OTHER, OTHER)
    target.chmod(0o777)
    message = refused(cache)
    assert f"cache directory {target.as_posix().rstrip('/')} " in message + " ", message
    assert "owned by uid 65534" in message or "writable by others" in message, message


def test_ours_but_writable_by_others_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "blocks" / "aa").mkdir(parents=True)
    (cache / "blocks" / "aa").chmod(0o777)
    assert "blocks/aa is writable by others (mode 0777)" in refused(cache)
    (cache / "blocks" / "aa").chmod(0o770)
    assert "writable by its group" in refused(cache)


def test_parents_and_symlinks_of_another_user_are_refused(tmp_path: Path) -> None:
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # anyone may rename our cache away and put theirs in its place
    assert "writable by others without the sticky bit" in refused(open_parent / "cache")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    assert f"{theirs} (above the cache directory) is owned by uid 65534" in refused(theirs / "cache")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    planted = sticky / "cache"
    planted.symlink_to(ours)
    os.chown(planted, OTHER, OTHER, follow_symlinks=False)
    assert f"{planted} (above the cache directory) is owned by uid 65534" in refused(planted)


def _block(disk: DiskCache, data: bytes) -> tuple[bytes, memoryview]:
    buf = aligned_buffer(round_up(len(data), 4096))
    buf[: len(data)] = data
    buf[len(data) :] = bytes(len(buf) - len(data))
    return disk.key_digest("s3://b/k", 0, len(data)), buf


def test_disk_cache_writes_nothing_through_another_users_directory(tmp_path: Path) -> None:
    """A block directory planted by another user: the write is refused (counted, one
    warning); nothing is created in it."""
    disk = DiskCache(str(tmp_path / "cache"), 2**30, direct_io=False)
    digest, buf = _block(disk, b"x" * 100)
    planted = Path(disk.block_path(digest)).parent
    planted.mkdir(parents=True)
    os.chown(planted, OTHER, OTHER)
    planted.chmod(0o777)
    disk.put_digest(digest, 100, buf)
    assert disk.write_errors == 1 and list(planted.iterdir()) == []
    assert disk.get("s3://b/k", 0, 100) is None


def test_disk_cache_temporary_names_are_unpredictable_and_created_exclusively(tmp_path: Path) -> None:
    """No writer names its temporary file after its process and thread any more: a symlink
    planted at the old predictable name (``<digest>.<pid>.<tid>.tmp``) is never written
    through, and the block still lands."""
    import threading

    disk = DiskCache(str(tmp_path / "cache"), 2**30, direct_io=False)
    digest, buf = _block(disk, b"y" * 100)
    victim = tmp_path / "root-only"
    victim.write_bytes(b"keep me")
    path = disk.block_path(digest)
    os.makedirs(os.path.dirname(path), mode=0o700)
    os.symlink(victim, f"{path}.{os.getpid()}.{threading.get_ident()}.tmp")
    disk.put_digest(digest, 100, buf)
    assert victim.read_bytes() == b"keep me"
    assert disk.get("s3://b/k", 0, 100) == b"y" * 100


def test_disk_cache_reads_no_symlink_and_no_file_of_another_user(tmp_path: Path) -> None:
    """A valid block (checksum and all) that is a symlink, or a file of another user, is a
    miss: the bytes are fetched again."""
    disk = DiskCache(str(tmp_path / "cache"), 2**30, direct_io=False)
    digest, buf = _block(disk, b"z" * 100)
    disk.put_digest(digest, 100, buf)
    path = Path(disk.block_path(digest))
    assert disk.get("s3://b/k", 0, 100) == b"z" * 100
    elsewhere = tmp_path / "elsewhere"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert disk.get("s3://b/k", 0, 100) is None
    path.unlink(missing_ok=True)
    elsewhere.rename(path)
    os.chown(path, OTHER, OTHER)
    assert disk.get("s3://b/k", 0, 100) is None


def test_index_files_are_read_only_if_ours_and_not_through_a_symlink(tmp_path: Path) -> None:
    builder = IndexBuilder()
    builder.add_items([("a", ["s3://x/y", 5, 6])])
    table = builder.finish()
    path = tmp_path / "i.arrow"
    write_index(table, str(path), {"keys": "1"})
    assert KeyIndex.open(str(path)).metadata["keys"] == "1"
    link = tmp_path / "link.arrow"
    link.symlink_to(path)
    with pytest.raises(OSError):
        KeyIndex.open(str(link))
    os.chown(path, OTHER, OTHER)
    with pytest.raises(ReferenceSetError, match="not an index file of this user's"):
        KeyIndex.open(str(path))
    temporary = write_temporary_index(table, {"keys": "1"})
    try:
        assert os.path.basename(temporary).startswith("refmount-index-")
        assert stat.S_IMODE(os.stat(temporary).st_mode) == 0o600
        assert write_temporary_index(table, {}) != temporary
    finally:
        os.unlink(temporary)


def test_an_unusable_cache_dir_is_not_refused(tmp_path: Path) -> None:
    """A file of ours in the way is unusable, not unsafe: the mount goes on and caches in
    memory only (the writer warns once); a symlink in its place is refused."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "blocks").write_text("not a directory\n")
    check_cache_dir(str(cache))
    (tmp_path / "file").write_text("")
    check_cache_dir(str(tmp_path / "file"))
    (cache / "blocks").unlink()
    (cache / "blocks").symlink_to(tmp_path)
    assert "blocks is a symlink" in refused(cache)
