"""Readahead across an Icechunk repository's native chunk objects, through a real mount: a reader
going through an array's chunks in key order finds the next ones loaded (and stored in the page
cache at their open, so no READ comes), each object fetched once; a reader in random order
starts nothing. The repository is written at test time by icechunk 1.1.21."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.probes import stats

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

CHUNKS = 400
SIZE = 1000  # bytes of a chunk: over icechunk's inline limit (512), so each is an object


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, np.ndarray]:
    import icechunk

    root = tmp_path_factory.mktemp("icechunk-native") / "repo"
    repository = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    session = repository.writable_session("main")
    values = (np.arange(CHUNKS * SIZE) % 251).astype("u1")
    arr = zarr.group(store=session.store).create_array("a", shape=values.shape, chunks=(SIZE,), dtype="u1",
                                                       compressors=None, fill_value=0)
    arr[:] = values
    session.commit("native chunks")
    return root, values


def test_chunks_read_in_key_order_are_read_ahead_and_pushed_at_open(mount, repo) -> None:
    root, values = repo
    m = mount(str(root), "no_disk_cache")
    got = bytearray()
    for i in range(CHUNKS):
        got += (m.path / "a" / "c" / str(i)).read_bytes()
    assert bytes(got) == values.tobytes()
    s = stats(m)
    assert CHUNKS <= s["requests"] <= CHUNKS + 16, s  # each object fetched once or so
    assert s["pushed"] >= (CHUNKS // 2) * SIZE, s  # most chunks were in memory at their open
    assert s["reads"] < CHUNKS // 2, s


def test_chunks_read_at_random_start_no_readahead(mount, repo) -> None:
    root, values = repo
    m = mount(str(root), "no_disk_cache")
    order = list(range(CHUNKS))
    random.Random(5).shuffle(order)
    for i in order[:100]:
        assert (m.path / "a" / "c" / str(i)).read_bytes() == values[i * SIZE:(i + 1) * SIZE].tobytes()
    s = stats(m)
    assert 100 <= s["requests"] <= 100 + 32 and s["pushed"] < 20 * SIZE, s  # a few chunks in order by chance
