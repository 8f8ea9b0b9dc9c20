"""Icechunk manifests whose chunk references share one stored inline chunk, through a real
mount and ``refmount serve``: each inline chunk is a view of its manifest (a ``stat`` or a GET
copies nothing but what it answers), and a manifest whose references would make more than
``max_source`` is refused when it is loaded (``EIO`` / ``502``), the daemon unharmed."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import psutil
import pytest
from support.icechunkrepos import NodeSpec, RefSpec, build_manifest, build_snapshot, write_built_repo

from refmount.refs.icechunk import ids

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

SID = "1CECHNKREP0F1RSTCMT0"
MID_RAW = bytes(11) + b"\x10"
MID = ids.encode(MID_RAW)
NODE = b"\7" * 8
MiB = 1 << 20


def shared_repo(root: Path, refs: int, size: int) -> bytes:
    """A repository of one array ``arr`` (1 x refs chunks of ``size`` bytes), every chunk
    inline and all of them one stored vector; returns the chunk."""
    chunk = bytes(range(256)) * (size // 256)
    zarr_json = (b'{"zarr_format":3,"node_type":"array","shape":[1,%d],"data_type":"uint8",'
                 b'"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[1,%d]}},'
                 b'"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},'
                 b'"fill_value":0,"codecs":[{"name":"bytes"}]}' % (refs * size, size))
    arr = NodeSpec("/arr", "array", zarr_json, NODE, ndim=2, manifests=[(MID_RAW, [(0, 1), (0, refs)])])
    manifest = build_manifest(MID, [(NODE, [RefSpec((0, i), inline=chunk) for i in range(refs)])], share=True)
    write_built_repo(root, SID, build_snapshot(SID, [NodeSpec("/"), arr]), {MID: manifest})
    return chunk


def daemon_rss(m) -> int:
    m.refresh_procs()
    return sum(p.memory_info().rss for p in m.procs if p.is_running())


def test_stat_and_read_of_chunks_sharing_one_inline_vector_copy_nothing(mount, tmp_path) -> None:
    """100 chunk files share one 8 MiB inline chunk (800 MiB made, within max_source): a stat
    and a 4 KiB read of each leave the daemon's RSS where it was (before: 8 MiB more each)."""
    chunk = shared_repo(tmp_path / "repo", 100, 8 * MiB)
    m = mount(tmp_path / "repo", "no_disk_cache")
    assert (m / "arr/c/0/0").stat().st_size == 8 * MiB
    before = daemon_rss(m)
    for i in range(100):
        assert (m / f"arr/c/0/{i}").stat().st_size == 8 * MiB
        with open(m / f"arr/c/0/{i}", "rb") as f:
            f.seek(i * 4096)
            assert f.read(4096) == chunk[i * 4096:(i + 1) * 4096]
    grown = daemon_rss(m) - before
    assert grown < 64 * MiB, f"{grown:,} bytes"
    assert (m / "arr/c/0/99").read_bytes() == chunk


def test_a_manifest_whose_shared_inline_chunk_makes_gigabytes_is_eio(mount, serve, tmp_path) -> None:
    """The audit's manifest: 200 references share one 60 MiB inline chunk (a 12 GiB manifest
    once each is counted). Its chunks are EIO with the reason in the log, the daemon alive and
    small; over HTTP 502."""
    shared_repo(tmp_path / "repo", 200, 60 * MiB)
    m = mount(tmp_path / "repo", "no_disk_cache")
    for i in (0, 1, 199):
        with pytest.raises(OSError) as e:
            os.stat(m / f"arr/c/0/{i}")
        assert e.value.errno == errno.EIO
    assert "past max_source=2G (references share one stored inline chunk" in m.log_text()
    assert daemon_rss(m) < 600 * MiB
    assert (m / "arr/zarr.json").read_bytes().startswith(b'{"zarr_format":3')
    s = serve(tmp_path / "repo")
    assert s.request("GET", "/arr/c/0/5").status == 502
    assert s.request("GET", "/arr/zarr.json").status == 200
    assert psutil.Process(s.pid).memory_info().rss < 600 * MiB


def test_serve_gets_of_chunks_sharing_one_inline_vector_copy_nothing(serve, tmp_path) -> None:
    chunk = shared_repo(tmp_path / "repo", 100, 8 * MiB)
    s = serve(tmp_path / "repo")
    r = s.request("GET", "/arr/c/0/0", {"Range": "bytes=0-4095"})
    assert r.status == 206 and r.body == chunk[:4096]
    before = s.rss()
    for i in range(100):
        r = s.request("GET", f"/arr/c/0/{i}", {"Range": f"bytes={i * 4096}-{i * 4096 + 4095}"})
        assert r.status == 206 and r.body == chunk[i * 4096:(i + 1) * 4096]
    grown = s.rss() - before
    assert grown < 64 * MiB, f"{grown:,} bytes"


def test_a_reload_to_a_snapshot_past_max_metadata_keeps_the_old_version(mount, tmp_path) -> None:
    """The branch head moves to a snapshot whose 50 nodes share one 64 KiB zarr.json (3.2 MiB
    made, past max_metadata=1M): the mount keeps serving the version it has, says why in its
    log, and is alive (before: such a snapshot was indexed, and at 60 MiB killed the mount)."""
    root = tmp_path / "repo"
    shared_repo(root, 2, 4096)
    m = mount(root, "no_disk_cache", "reload=1", "max_metadata=1M")
    assert os.getxattr(m.path, "user.refmount.snapshot").decode() == SID
    doc = b'{"zarr_format":3,"node_type":"group","attributes":{"x":"' + b"a" * (64 << 10) + b'"}}'
    newer = ids.encode(b"\2" * 12)
    nodes = [NodeSpec("/")] + [NodeSpec(f"/g{i:02}", zarr_json=doc) for i in range(50)]
    write_built_repo(root, newer, build_snapshot(newer, nodes, share=True), {})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "version 1 keeps serving" not in m.log_text():
        time.sleep(0.5)
    log = m.log_text()
    assert "past max_metadata=1M at node /g15" in log and "version 1 keeps serving" in log, log
    assert os.getxattr(m.path, "user.refmount.snapshot").decode() == SID
    assert sorted(os.listdir(m.path)) == ["arr", "zarr.json"]
    assert (m / "arr/c/0/1").stat().st_size == 4096
