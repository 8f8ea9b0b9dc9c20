"""Catalogue mounts (``-o catalog``) and reloading (``reload=SEC``, SIGUSR1), through the
kernel and a real server: the root lists the sets without indexing any, a set read with
xarray/zarr equals its original, a rewritten set is swapped in while a file opened before
keeps the old version's bytes, sets added and removed appear and disappear, a set that no
longer parses keeps its last good version with the error shown, a single set with reload
sees its rewrite, max_open_sets closes the least recently used set, and refmount serve
answers /<name>/.zmetadata and a chunk."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from support.datasets import compress_copy
from support.parquet_data import lazy_zarr_parquet
from support.probes import stats, wait_for

SIZE = 300_000  # bytes of the key read across a reload: several FUSE reads


def daemon_pid(m) -> int:
    m.refresh_procs()
    pids = [p.pid for p in m.procs if "refmount.fuse.daemon" in " ".join(p.cmdline())]
    assert len(pids) == 1, m.procs
    return pids[0]


def payload(version: int) -> bytes:
    return bytes([version]) * SIZE


def write_set(path: Path, version: int, *, broken: bool = False) -> None:
    """A small set whose key ``k`` is SIZE bytes of ``version`` (inline), atomically
    replaced as a producer would write it."""
    doc = {".zgroup": '{"zarr_format": 2}',
           "k": "base64:" + base64.b64encode(payload(version)).decode(),
           f"only_in_v{version}": "x"}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc)[: 40 if broken else None])
    os.replace(tmp, path)


def set_state(m, name: str) -> dict:
    return stats(m)["set_states"].get(name, {})


@pytest.fixture(scope="module")
def catalogue(datasets, tmp_path_factory) -> Path:
    """A directory of real sets: kerchunk JSON (nc4), gzip JSON (nc3), Parquet (zarr)."""
    root = tmp_path_factory.mktemp("catalogue")
    shutil.copy(datasets.refs["nc4_local"], root / "nc4.json")
    shutil.copy(compress_copy(datasets.refs["nc3_local"], ".gz"), root / "nc3.json.gz")
    lazy_zarr_parquet(root / "pq.parq")
    return root


def test_catalogue_root_opens_nothing_and_sets_read_as_their_originals(mount, catalogue, datasets) -> None:
    m = mount(catalogue, "catalog", "max_open_sets=2")
    assert sorted(os.listdir(m.path)) == ["nc3", "nc4", "pq"]
    assert all(os.path.isdir(m.path / n) for n in ("nc3", "nc4", "pq"))
    s = stats(m)
    assert (s["sets"], s["sets_open"], s["set_states"]) == (3, 0, {})  # nothing indexed
    with xr.open_dataset(datasets.nc4) as original, \
            xr.open_zarr(str(m.path / "nc4"), consolidated=False) as mounted:
        xr.testing.assert_identical(original.load(), mounted.load())
    with xr.open_dataset(datasets.nc3) as original, \
            xr.open_zarr(str(m.path / "nc3"), consolidated=False) as mounted:
        for name in original.data_vars:
            np.testing.assert_array_equal(original[name].values, mounted[name].values)
    group = zarr.open_group(str(m.path / "pq"), mode="r", zarr_format=2)
    expected = lazy_zarr_parquet_arrays(catalogue)
    for path, values in expected.items():
        np.testing.assert_array_equal(group[path][...], values)
    # max_open_sets=2: opening pq closed the least recently used set, nc4
    assert wait_for(lambda: set_state(m, "nc4").get("state") == "closed", 10), stats(m)
    s = stats(m)
    assert s["sets_open"] == 2 and {n: st["state"] for n, st in s["set_states"].items()} == {
        "nc3": "open", "nc4": "closed", "pq": "open"}
    assert os.getxattr(m.path / "nc4", "user.refmount.set.state") == b"closed"
    with xr.open_zarr(str(m.path / "nc4"), consolidated=False) as again:  # opened on use
        assert set(again.data_vars) == set(xr.open_dataset(datasets.nc4).data_vars)
    assert wait_for(lambda: set_state(m, "nc3").get("state") == "closed", 10), stats(m)
    assert os.getxattr(m.path / "nc4", "user.refmount.set.state") == b"open"


def test_sets_over_http_keep_reading_when_another_set_closes(mount, http_datasets, tmp_path) -> None:
    """Each set has a core of its own; closing one (here the least recently used, at
    ``max_open_sets=1``) must leave the HTTP client of the others open."""
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copy(http_datasets.refs["nc4_http"], cat / "nc4.json")
    shutil.copy(http_datasets.refs["nc3_http"], cat / "nc3.json")
    m = mount(cat, "catalog", "max_open_sets=1")
    with xr.open_dataset(http_datasets.nc4) as original, \
            xr.open_zarr(str(m.path / "nc4"), consolidated=False) as mounted:
        xr.testing.assert_identical(original.load(), mounted.load())
    assert os.listdir(m.path / "nc3")  # opens nc3, which closes nc4
    assert wait_for(lambda: set_state(m, "nc4").get("state") == "closed", 10), stats(m)
    with xr.open_dataset(http_datasets.nc3) as original, \
            xr.open_zarr(str(m.path / "nc3"), consolidated=False) as mounted:
        for name in original.data_vars:
            np.testing.assert_array_equal(original[name].values, mounted[name].values)


def lazy_zarr_parquet_arrays(catalogue: Path) -> dict[str, np.ndarray]:
    """The arrays the Parquet set holds, made again the same way (seeded) elsewhere."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return lazy_zarr_parquet(Path(d) / "again.parq").arrays


def test_reload_swaps_sets_while_open_files_keep_the_old_version(mount, tmp_path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    write_set(cat / "a.json", 1)
    write_set(cat / "b.json", 1)
    m = mount(cat, "catalog")  # no interval: SIGUSR1 checks
    pid = daemon_pid(m)

    def check_and_wait(pred) -> None:
        before = stats(m)["reload_checks"]
        os.kill(pid, signal.SIGUSR1)
        assert wait_for(lambda: stats(m)["reload_checks"] > before and pred(), 30), (
            stats(m), m.log_text())

    with open(m.path / "a" / "k", "rb") as held:
        first = held.read(SIZE // 3)
        write_set(cat / "a.json", 2)  # rewritten while a reader holds a file open
        os.unlink(cat / "b.json")
        write_set(cat / "c.json", 1)
        check_and_wait(lambda: set_state(m, "a").get("version") == 2)
        rest = held.read()
        assert first + rest == payload(1)  # the old version's bytes, never mixed
        assert set_state(m, "a")["open_files"] == 0  # the held file is on the old version
        assert (m.path / "a" / "k").read_bytes() == payload(2)  # a new open: the new version
        assert os.path.exists(m.path / "a" / "only_in_v2")
        assert not os.path.exists(m.path / "a" / "only_in_v1")
        assert sorted(os.listdir(m.path)) == ["a", "c"]
        assert (m.path / "c" / "k").read_bytes() == payload(1)
    # A new version that does not parse: the last good one keeps serving, the error shows.
    write_set(cat / "a.json", 3, broken=True)
    check_and_wait(lambda: "error" in set_state(m, "a"))
    assert (m.path / "a" / "k").read_bytes() == payload(2)
    error = os.getxattr(m.path / "a", "user.refmount.set.error").decode()
    from refmount.sets.opensets import OPEN_FAILED  # a fixed text: why is in the log

    assert error == OPEN_FAILED and set_state(m, "a")["error"] == error
    assert "set a: cannot be opened" in m.log_text() and "a.json" in m.log_text()
    assert set_state(m, "a")["version"] == 2


def test_single_set_with_reload_sees_its_rewrite(mount, tmp_path) -> None:
    source = tmp_path / "one.json"
    write_set(source, 1)
    m = mount(source, "reload=1")
    with open(m.path / "k", "rb") as held:
        assert held.read(10) == payload(1)[:10]
        write_set(source, 2)
        assert wait_for(lambda: os.path.exists(m.path / "only_in_v2"), 30), m.log_text()
        assert (m.path / "k").read_bytes() == payload(2)
        assert held.read() == payload(1)[10:]
    assert not os.path.exists(m.path / "only_in_v1")
    assert stats(m)["set_states"][""]["version"] == 2


def stac_item(item_id: str, href: Path, media: str) -> dict:
    return {"type": "Feature", "stac_version": "1.0.0", "id": item_id, "geometry": None,
            "properties": {"datetime": "2024-01-01T00:00:00Z"}, "links": [],
            "assets": {"refs": {"href": str(href), "type": media, "roles": ["references"]}}}


def test_serve_stac_catalogue_answers_zmetadata_and_chunks_per_set(serve, catalogue, datasets,
                                                                    tmp_path) -> None:
    """A STAC ItemCollection written now, naming the catalogue's three sets."""
    items = tmp_path / "items.json"
    items.write_text(json.dumps({"type": "FeatureCollection", "features": [
        stac_item("nc4", catalogue / "nc4.json", "application/json"),
        stac_item("nc3", catalogue / "nc3.json.gz", "application/json"),
        stac_item("pq", catalogue / "pq.parq", "application/vnd.apache.parquet")]}))
    s = serve(items, "catalog", f"allow_local={catalogue}:{datasets.data_dir}")
    root = json.loads(s.request("GET", "/?format=json").body)
    assert [e["name"] for e in root["entries"]] == ["nc3", "nc4", "pq"]
    assert s.stats()["sets_open"] == 0
    zmeta = s.request("GET", "/nc4/.zmetadata")
    assert zmeta.status == 200 and ".zgroup" in json.loads(zmeta.body)["metadata"]
    expected = datasets.expected_tree("nc4_local")
    key = next(k for k in sorted(expected) if k.endswith("/0") or k.endswith(".0"))
    with urllib.request.urlopen(s.url + "nc4/" + key) as f:
        assert f.read() == expected[key]
    assert s.request("GET", "/nope/x").status == 404
    assert s.stats()["set_states"]["nc4"]["state"] == "open"
    group = zarr.open_group(s.url + "pq", mode="r", zarr_format=2)  # fsspec's HTTP file system
    np.testing.assert_array_equal(group["name"][...], lazy_zarr_parquet_arrays(catalogue)["name"])


def test_set_files_of_a_shared_catalogue_do_not_leave_its_directory(serve, mount, tmp_path) -> None:
    """A user puts symlinks in a catalogue directory that root serves (and mounts with
    allow_other): to a root-only set, to a file that is not JSON, to a Parquet set outside.
    None of them is read; each set's error, in 503 bodies, stats and the xattr, is a fixed text
    that quotes nothing of the file (the reason is in the log); symlinks within the catalogue
    directory and the other sets serve."""
    from refmount.sets.opensets import OPEN_FAILED

    priv = tmp_path / "priv"
    priv.mkdir(mode=0o700)
    secret = "SECRET-VALUE-oaxq"
    (priv / "inline.json").write_text(json.dumps({".zgroup": '{"zarr_format": 2}', "k": secret}))
    (priv / "shadow").write_text(f"root:{secret}:19000:0:99999:7:::\n")
    for p in priv.iterdir():
        p.chmod(0o600)
    lazy_zarr_parquet(priv / "pq.parq")
    cat = tmp_path / "cat"
    (cat / "sub").mkdir(parents=True)
    write_set(cat / "good.json", 1)
    write_set(cat / "sub" / "inner.json", 2)
    (cat / "inside.json").symlink_to(cat / "sub" / "inner.json")  # stays in the directory: fine
    (cat / "x.json").symlink_to(priv / "inline.json")
    (cat / "y.json").symlink_to(priv / "shadow")
    (cat / "p.parq").symlink_to(priv / "pq.parq")
    refused = {"x": "/x/k", "y": "/y/k", "p": "/p/.zmetadata"}

    s = serve(cat, "catalog")
    assert s.request("GET", "/good/k").body == payload(1)
    assert s.request("GET", "/inside/k").body == payload(2)
    for name, path in refused.items():
        for _ in range(2):  # the second answer from the slot's kept error
            r = s.request("GET", path)
            assert (r.status, r.body) == (503, f"the set cannot be served: {OPEN_FAILED}\n".encode()), r
        assert s.stats()["set_states"][name]["error"] == OPEN_FAILED
    assert secret not in json.dumps(s.stats())
    log = s.log_text()
    assert secret not in log
    assert log.count("set x: cannot be opened") == 1 and "symlink leaving it" in log, log

    m = mount(cat, "catalog", "allow_other")
    assert (m.path / "good" / "k").read_bytes() == payload(1)
    for name in refused:
        with pytest.raises(OSError):
            os.listdir(m.path / name)
        assert os.getxattr(m.path / name, "user.refmount.set.error").decode() == OPEN_FAILED
        assert set_state(m, name)["error"] == OPEN_FAILED
    assert secret not in m.log_text()
