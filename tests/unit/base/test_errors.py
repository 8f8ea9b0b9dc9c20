"""refmount's exceptions: one class each, wherever they are imported from, and read errors
carrying the errno the reader gets."""

from __future__ import annotations

import errno

import pytest

import refmount
import refmount.cli.api
import refmount.config
import refmount.fuse.mountpoint
from refmount.base.errors import ConfigError, FetchError, MountError, ReadError
from refmount.config import MountConfig, apply_options
from refmount.decode.codecplan import DecodeError
from refmount.targets.rangeanswers import PastEnd, ShortRead


def test_one_class_for_each_error() -> None:
    assert refmount.MountError is refmount.cli.api.MountError is MountError
    assert refmount.fuse.mountpoint.MountError is MountError
    assert refmount.config.ConfigError is ConfigError
    # the CLI reports both as one line (it catches RuntimeError and ValueError families)
    assert issubclass(MountError, RuntimeError) and issubclass(ConfigError, ValueError)
    assert not issubclass(ReadError, RuntimeError | ValueError)


def test_bad_option_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        apply_options(MountConfig(source="/x", mountpoint="/m"), ["timeout=soon"])


def test_missing_mountpoint_raises_mount_error(tmp_path) -> None:
    with pytest.raises(MountError, match="does not exist"):
        refmount.fuse.mountpoint.check_mountpoint(str(tmp_path / "nowhere"))


def test_read_errors_carry_the_errno_the_reader_gets() -> None:
    refused = FetchError("file:///etc/shadow", "outside the allowed directories", errno.EACCES)
    missing = FetchError("s3://bucket/a.nc", "FileNotFoundError", errno.ENOENT)
    stalled = FetchError("http://127.0.0.1/a.nc", "timed out after 1 s", timed_out=True)
    past = PastEnd("http://127.0.0.1/a.nc", 10, 20, 15, b"12345")
    decode = DecodeError("zlib: error -3")
    for e in (refused, missing, stalled, past, decode):
        assert isinstance(e, ReadError)
        assert e.reply_errno == errno.EIO  # docs/semantics.md: a failing target is EIO
        assert not e.logged
    assert (refused.errno, missing.errno, stalled.errno) == (errno.EACCES, errno.ENOENT, errno.EIO)
    assert stalled.timed_out and not refused.timed_out
    assert past.size == 15 and past.data == b"12345" and past.errno == errno.EIO
    # a short answer is retried, never a read error by itself
    assert not issubclass(ShortRead, ReadError)


def test_fetch_error_text_never_carries_credentials() -> None:
    e = FetchError("s3://AKIAXXXX:s3cr3t@bucket/a.nc", "PermissionError: s3://AKIAXXXX:s3cr3t@bucket/a.nc")
    assert "s3cr3t" not in str(e)
    assert "bucket/a.nc" in str(e)
    assert e.url.startswith("s3://AKIAXXXX:")  # kept for fetching, never in the text
