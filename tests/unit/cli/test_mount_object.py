"""The ``Mount`` that ``build_filesystem`` returns, started and stopped without a kernel: the
FUSE operations are called directly in a trio nursery, with the disk cache's writer process
running, a failing target giving EIO to its own read, and nothing left running afterwards."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import psutil
import pyfuse3
import pytest
import trio

from refmount.base.errors import ReadError
from refmount.config import MountConfig, apply_options
from refmount.fuse.daemon import Mount, build_filesystem
from refmount.fuse.operations import RefFS
from refmount.serving.preparation import index_source

DATA = bytes(range(256)) * 1024  # 256 KiB target


def tiny_mount(tmp_path: Path, *options: str) -> Mount:
    target = tmp_path / "target.bin"
    target.write_bytes(DATA)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({
        ".zgroup": '{"zarr_format": 2}',
        "a/part": [str(target), 1000, 100_000],
        "a/whole": [str(target)],
        "gone": [str(tmp_path / "missing.bin"), 0, 10],
    }))
    cfg = MountConfig(source=str(refs), mountpoint=str(tmp_path / "mnt"), cache_dir=str(tmp_path / "cache"))
    apply_options(cfg, ["no_page_push", "timeout=5", "retries=0", *options])
    return build_filesystem(cfg, index_source(cfg))


async def read_key(fs: RefFS, *names: bytes) -> bytes:
    ino = pyfuse3.ROOT_INODE
    for name in names:
        ino = (await fs.lookup(ino, name, None)).st_ino
    if fs.no_open:  # pyfuse3 with patches/pyfuse3-noopen.patch: READs come with the inode
        return bytes(await fs.read(ino, 0, 1 << 20))
    fh = (await fs.open(ino, os.O_RDONLY, None)).fh
    try:
        return bytes(await fs.read(fh, 0, 1 << 20))
    finally:
        await fs.release(fh)


def cache_writers() -> list[psutil.Process]:
    """This process's cache writer children."""
    return [p for p in psutil.Process().children()
            if "refmount.cache.writer" in " ".join(p.cmdline())]


def block_files(cache: Path) -> list[Path]:
    return [p for p in (cache / "blocks").rglob("*") if p.is_file()] if (cache / "blocks").exists() else []


def test_mount_starts_serves_and_stops_cleanly(tmp_path: Path) -> None:
    mount = tiny_mount(tmp_path)
    assert mount.writer is not None and mount.disk is not None
    got: dict[str, object] = {}

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            mount.start(nursery)
            await mount.warm()
            got["writers"] = cache_writers()
            got["part"] = await read_key(mount.fs, b"a", b"part")
            got["whole"] = await read_key(mount.fs, b"a", b"whole")
            with pytest.raises(pyfuse3.FUSEError) as e:
                await read_key(mount.fs, b"gone")
            got["gone"] = e.value.errno
            got["zgroup"] = await read_key(mount.fs, b".zgroup")  # the rest still answers
            nursery.cancel_scope.cancel()  # what an unmount does to the daemon's nursery
        await mount.aclose()

    assert not cache_writers()  # started by warm(), not before
    trio.run(serve)
    writers = got["writers"]
    assert isinstance(writers, list) and len(writers) == 1 and writers[0].is_running()
    mount.close(timeout=10)
    assert got["part"] == DATA[1000:101_000]
    assert got["whole"] == DATA
    assert got["gone"] == errno.EIO
    assert got["zgroup"] == b'{"zarr_format": 2}'
    assert mount.stats.errors == 1
    # close() let the writer process finish the queued blocks and exit
    assert not writers[0].is_running() and not cache_writers()
    assert block_files(tmp_path / "cache"), "the blocks read were not written to the disk cache"
    mount.close()  # idempotent


def test_mount_closes_without_having_started(tmp_path: Path) -> None:
    """A mount that fails before serving (pyfuse3.init refused) is closed without leaving a
    process; closing twice is harmless."""
    mount = tiny_mount(tmp_path)
    mount.close()
    mount.close()
    assert mount.writer is not None and not cache_writers()
    assert not block_files(tmp_path / "cache")


def test_mount_without_disk_cache_has_no_writer(tmp_path: Path) -> None:
    mount = tiny_mount(tmp_path, "no_disk_cache")
    assert mount.writer is None and mount.disk is None

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            mount.start(nursery)
            await mount.warm()
            assert await read_key(mount.fs, b"a", b"whole") == DATA
            nursery.cancel_scope.cancel()
        await mount.aclose()

    trio.run(serve)
    mount.close()
    assert not (tmp_path / "cache" / "blocks").exists()


class _Unavailable(ReadError):
    reply_errno = errno.ENODATA


def test_fs_replies_with_the_errno_of_any_read_error(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """fs.py translates: a ReadError from below becomes its ``reply_errno``, logged once (not
    again when whoever raised it logged it already), and the next read is served."""
    mount = tiny_mount(tmp_path, "no_disk_cache")
    real_read = mount.reader.read
    raised: list[ReadError] = []

    async def failing_read(*args: object) -> bytes:
        raise raised[-1]

    async def serve() -> list[int]:
        codes = []
        async with trio.open_nursery() as nursery:
            mount.start(nursery)
            mount.reader.read = failing_read  # type: ignore[method-assign]
            for e in (_Unavailable("not there yet"), _Unavailable("said already")):
                e.logged = e.args[0] == "said already"
                raised.append(e)
                with pytest.raises(pyfuse3.FUSEError) as got:
                    await read_key(mount.fs, b"a", b"part")
                codes.append(got.value.errno)
            mount.reader.read = real_read  # type: ignore[method-assign]
            assert await read_key(mount.fs, b"a", b"part") == DATA[1000:101_000]
            nursery.cancel_scope.cancel()
        await mount.aclose()
        return codes

    with caplog.at_level("ERROR"):
        codes = trio.run(serve)
    mount.close()
    assert codes == [errno.ENODATA, errno.ENODATA]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "key=a/part" in errors[0] and "not there yet" in errors[0], errors
    assert mount.stats.errors == 2
