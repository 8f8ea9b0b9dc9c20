"""Relative virtual chunk locations (``vcc://NAME/path``, as icechunk 2.x writes them) through
a mount: resolved against the named container (a local directory, authorised by
``allow_local``), read with zarr-python; a chunk naming a container the repository does not
declare, or climbing out of one, is EIO with the reason in the log. The repository is built from
the spec (support/vccrepo.py)."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import zarr
from support.vccrepo import vcc_repo

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]


def test_relative_virtual_chunks_read_through_a_mount(mount, tmp_path) -> None:
    built = vcc_repo(tmp_path / "repo", tmp_path / "files")
    m = mount(built.root, f"allow_local={built.files}", "no_disk_cache")
    got = zarr.open_array(str(m / "v"), mode="r", zarr_format=3)[...]
    np.testing.assert_array_equal(got, built.v)
    assert np.frombuffer((m / "w/c/1").read_bytes(), "<f4").tolist() == built.a.tolist()
    for key in ("w/c/0", "x/c/0"):
        with pytest.raises(OSError) as info:
            (m / key).read_bytes()
        assert info.value.errno == errno.EIO
    log = m.log_text()
    assert "naming container 'nowhere', which the repository does not declare" in log
    assert "outside every virtual chunk container" in log


def test_relative_virtual_chunks_over_serve(serve, tmp_path) -> None:
    built = vcc_repo(tmp_path / "repo", tmp_path / "files")
    s = serve(built.root, f"allow_local={built.files}")
    reply = s.request("GET", "/v/c/1")
    assert reply.status == 200 and np.frombuffer(reply.body, "<f4").tolist() == built.v[4:].tolist()
    assert s.request("GET", "/w/c/0").status == 502
    assert s.request("GET", "/x/c/0").status == 502
    assert "which the repository does not declare" in s.log_text()
