"""Icechunk repositories as SOURCE, through a real mount and ``refmount serve``.

Repositories written at test time by icechunk 1.1.21 (support/icechunk_data.py): native chunks
(uncompressed and zstd), inline chunks, a scalar, virtual chunks over a netCDF file that nginx
serves; commits on main, a branch and a tag. Read with zarr-python 3 and xarray through the
mount and over HTTP, compared with icechunk's own read of the same snapshot (native and inline
arrays) and with the netCDF file (the virtual array). Virtual chunks are read only when a
target rule authorises their container, and only while their target is the version recorded.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from support import icechunk_data as ic
from support.mounts import run_cli

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

ARRAYS = ("native", "small", "sub/zipped", "sub/scalar", "virtual")


@pytest.fixture(scope="module")
def repo(tmp_path_factory, nginx, nginx_root) -> ic.Built:
    root = tmp_path_factory.mktemp("icechunk") / "repo"
    return ic.build_repository(root, Path(nginx_root) / "icechunk-files")


@pytest.fixture(scope="module")
def authorise(nginx) -> str:
    """The target rule that authorises the virtual chunk container and reads it from nginx."""
    rule = {"prefix": ic.VIRTUAL_BASE + "/", "rewrite": f"{nginx.url}/icechunk-files/"}
    return "targets=" + json.dumps([rule])


def read_all(group: zarr.Group) -> dict[str, np.ndarray]:
    return {path: group[path][...] for path in ARRAYS}


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) >= set(want)
    for path, values in want.items():
        np.testing.assert_array_equal(got[path], values, err_msg=path)
        assert got[path].dtype == values.dtype, path


def test_the_mount_is_the_zarr_v3_tree_of_mains_head(mount, repo, authorise) -> None:
    m = mount(repo.root, authorise, "no_disk_cache")
    names = sorted(str(p.relative_to(m.path)) for p in Path(m.path).rglob("*"))
    assert "zarr.json" in names and "sub/zipped/zarr.json" in names
    assert "native/c/4/1" in names and "sub/scalar/c" in names and "virtual/c/3/0" in names
    assert "small/c/2" not in names  # set back to the fill value: no chunk
    assert json.loads((m / "zarr.json").read_bytes())["attributes"] == {"title": "refmount test"}
    group = zarr.open_group(str(m.path), mode="r", zarr_format=3)
    got = read_all(group)
    assert_same(got, ic.read_with_icechunk(repo.root, repo.snapshots["second"]))
    assert_same(got, repo.expected["second"])
    native_chunk = m / "native/c/0/0"
    assert native_chunk.stat().st_size == 8 * 5 * 4
    ds = xr.open_zarr(str(m.path), zarr_format=3, consolidated=False)
    np.testing.assert_array_equal(ds["virtual"].values, repo.expected["second"]["virtual"])
    np.testing.assert_array_equal(ds["native"].values, repo.expected["second"]["native"])
    assert ds["virtual"].dims == ("y", "x")


@pytest.mark.parametrize(("opt", "name"), [("tag=v1", "tagged"), ("branch=dev", "dev"),
                                           ("branch=main", "second"), ("snapshot", "first")])
def test_branch_tag_and_snapshot_choose_what_is_served(mount, repo, authorise, opt, name) -> None:
    if opt == "snapshot":
        opt = f"snapshot={repo.snapshots['first']}"
    m = mount(repo.root, authorise, "no_disk_cache", opt)
    got = read_all(zarr.open_group(str(m.path), mode="r", zarr_format=3))
    assert_same(got, repo.expected[name])
    assert_same(got, ic.read_with_icechunk(repo.root, repo.snapshots[name]))


def test_two_revisions_or_a_missing_one_are_one_line_errors(mount_fails, repo) -> None:
    mount_fails(repo.root, "branch=dev", "tag=v1", must_mention=("give one of branch=, tag=, snapshot=",))
    mount_fails(repo.root, "branch=nope", must_mention=("nope",))
    mount_fails(repo.root, "tag=v1", "format=json",  # stated as another format: refused
                must_mention=("tag= applies to an Icechunk repository",))
    mount_fails(repo.root / "refs", "format=icechunk", must_mention=("not an Icechunk repository",))


def test_an_unauthorised_virtual_container_is_eio_with_the_reason_in_the_log(mount, repo) -> None:
    m = mount(repo.root, "no_disk_cache")
    assert (m / "native/c/0/0").read_bytes()  # the repository's own chunks need no rule
    with pytest.raises(OSError) as info:
        (m / "virtual/c/0/0").read_bytes()
    assert info.value.errno == errno.EIO
    log = m.log_text()
    assert f"virtual chunk container {ic.VIRTUAL_BASE}/ is not authorised" in log


def test_a_rule_with_only_a_prefix_authorises(mount, repo, nginx) -> None:
    """A rule of its prefix alone: the chunks are read where they are recorded. icechunk 1.1.21
    recorded them without nginx's port, so a rule for the port-less prefix authorises them and
    their reads fail (nothing listens on port 80 of 127.0.0.1 here), while a rule whose prefix
    covers something else leaves them refused."""
    other = json.dumps([{"prefix": "http://127.0.0.1/elsewhere/"}])
    m = mount(repo.root, "no_disk_cache", f"targets={other}", "timeout=5", "retries=0")
    with pytest.raises(OSError):
        (m / "virtual/c/0/0").read_bytes()
    assert "is not authorised" in m.log_text()
    exact = json.dumps([{"prefix": f"{ic.VIRTUAL_BASE}/virtual.nc",
                         "rewrite": f"{nginx.url}/icechunk-files/virtual.nc"}])
    m2 = mount(repo.root, "no_disk_cache", f"targets={exact}")
    values = zarr.open_group(str(m2.path), mode="r", zarr_format=3)["virtual"][...]
    np.testing.assert_array_equal(values, repo.expected["second"]["virtual"])


def test_a_changed_virtual_target_is_eio_unless_pins_are_skipped(mount, tmp_path_factory, nginx,
                                                                 nginx_root) -> None:
    files = Path(nginx_root) / "icechunk-changed"
    built = ic.build_repository(tmp_path_factory.mktemp("icechunk-changed") / "repo", files,
                                base_url="http://127.0.0.1/icechunk-changed")
    rule = json.dumps([{"prefix": "http://127.0.0.1/icechunk-changed/",
                        "rewrite": f"{nginx.url}/icechunk-changed/"}])
    m = mount(built.root, "no_disk_cache", f"targets={rule}")
    np.testing.assert_array_equal(zarr.open_group(str(m.path), mode="r")["virtual"][...],
                                  built.expected["second"]["virtual"])
    # the file rewritten later than the time the repository recorded: another version
    later = time.time() + 60
    os.utime(built.netcdf, (later, later))
    m2 = mount(built.root, "no_disk_cache", f"targets={rule}")
    with pytest.raises(OSError) as info:
        (m2 / "virtual/c/1/0").read_bytes()
    assert info.value.errno == errno.EIO
    assert "is not the version its references recorded" in m2.log_text()
    m3 = mount(built.root, "no_disk_cache", f"targets={rule}", "no_virtual_pins")
    np.testing.assert_array_equal(zarr.open_group(str(m3.path), mode="r")["virtual"][...],
                                  built.expected["second"]["virtual"])


def test_reload_follows_the_branch_head(mount, tmp_path_factory) -> None:
    built = ic.build_repository(tmp_path_factory.mktemp("icechunk-live") / "repo",
                                tmp_path_factory.mktemp("icechunk-live-files"))
    m = mount(built.root, "no_disk_cache", "reload=1")
    first = zarr.open_array(str(m / "native"), mode="r", zarr_format=3)[...]
    np.testing.assert_array_equal(first, built.expected["second"]["native"])
    assert os.getxattr(m.path, "user.refmount.snapshot").decode() == built.snapshots["second"]
    held = open(m / "native/c/4/0", "rb")  # noqa: SIM115  (open across the reload)
    newest = ic.commit_more(built.root, built.container, 11)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = zarr.open_array(str(m / "native"), mode="r", zarr_format=3)[...]
        if (now == 11).all():
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the mount still serves the old head\n{m.log_text()}")
    with held:  # a file open before keeps the snapshot it was opened in
        old = np.frombuffer(held.read(), "<i4").reshape(8, 5)
    np.testing.assert_array_equal(old, built.expected["second"]["native"][32:40, :5])
    # the root's attributes and stats name the snapshot served now
    assert os.getxattr(m.path, "user.refmount.snapshot").decode() == newest
    stats = run_cli("stats", str(m.path))
    assert stats.returncode == 0, stats.stderr
    mounted = [line for line in stats.stdout.splitlines() if line.startswith("snapshot (mounted)")]
    assert len(mounted) == 1 and mounted[0].split()[-1] == newest, stats.stdout
    assert "repository" in stats.stdout
    tagged = mount(built.root, "no_disk_cache", "reload=1", "tag=v1")  # a tag does not move
    time.sleep(3)
    np.testing.assert_array_equal(zarr.open_array(str(tagged / "native"), mode="r")[...],
                                  built.expected["first"]["native"])


def test_serve_gives_zarr_over_http(serve, repo, authorise) -> None:
    s = serve(repo.root, authorise)
    group = zarr.open_group(s.url, mode="r", zarr_format=3)
    got = read_all(group)
    assert_same(got, repo.expected["second"])
    assert s.request("GET", "/native/c/9/9").status == 404
    # lists the group over HTTP (zarr's FsspecStore lists nothing under a URL ending with "/")
    ds = xr.open_zarr(s.url.rstrip("/"), zarr_format=3, consolidated=False)
    np.testing.assert_array_equal(ds["virtual"].values, repo.expected["second"]["virtual"])
    np.testing.assert_array_equal(ds["native"].values, repo.expected["second"]["native"])
    refused = serve(repo.root)
    assert refused.request("GET", "/virtual/c/0/0").status == 502
    assert "is not authorised" in refused.log.read_text()


def test_inspect_names_the_repository_revision_and_snapshot(repo) -> None:
    r = run_cli("inspect", str(repo.root), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "icechunk"
    assert info["revision"]["revision"] == "branch main"
    assert info["revision"]["snapshot"] == repo.snapshots["second"]
    assert info["revision"]["format_version"] == "1"
    r = run_cli("inspect", str(repo.root), "--tag", "v1")
    assert r.returncode == 0, r.stderr
    assert repo.snapshots["first"] in r.stdout and "tag v1" in r.stdout


def test_expand_writes_a_kerchunk_set_fsspec_reads(repo, tmp_path, nginx) -> None:
    out = tmp_path / "refs.json"
    r = run_cli("expand", str(repo.root), "--branch", "dev", "-o", str(out))
    assert r.returncode == 0, r.stderr
    refs = json.loads(out.read_text())
    assert refs["native/c/0/0"][0].startswith(str(repo.root) + "/chunks/")
    assert refs["virtual/c/0/0"][0] == f"{ic.VIRTUAL_BASE}/virtual.nc"
    # the port-less virtual URLs pointed at nginx (as a target rule would) for fsspec
    text = out.read_text().replace(f"{ic.VIRTUAL_BASE}/", f"{nginx.url}/icechunk-files/")
    out.write_text(text)
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
    from fsspec.implementations.reference import ReferenceFileSystem

    local = AsyncFileSystemWrapper(fsspec.filesystem("file"), asynchronous=True)
    http = fsspec.filesystem("http", asynchronous=True, skip_instance_cache=True)
    fs = ReferenceFileSystem(str(out), fs={None: local, "file": local, "http": http}, asynchronous=True)
    group = zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r", zarr_format=3)
    assert_same(read_all(group), repo.expected["dev"])


def test_verify_checks_a_repositorys_targets(repo, authorise) -> None:
    r = run_cli("verify", str(repo.root), "-o", authorise, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.dumps(json.loads(r.stdout))
    assert f"{ic.VIRTUAL_BASE}/virtual.nc" in report and "/chunks/" in report
    r = run_cli("verify", str(repo.root), "--json")  # no rule: the virtual target is not asked
    assert r.returncode == 1, r.stdout + r.stderr  # and its container is reported unauthorised
    assert "virtual.nc" not in r.stdout and "/chunks/" in r.stdout
    out = json.loads(r.stdout)
    assert out["summary"]["unauthorised"] == 1 and out["summary"]["ok"] == out["summary"]["targets"] - 1
    row = next(t for t in out["targets"] if t["status"] == "unauthorised")
    assert row["url"] == f"{ic.VIRTUAL_BASE}/" and "4 virtual chunks not verified" in row["reason"]
    assert f"4 virtual chunks under {ic.VIRTUAL_BASE}/ left out" in r.stderr


def repository_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_repository_on_s3_is_read_with_the_source_options(mount, repo, authorise) -> None:
    """SOURCE's storage options (target_options) read the repository and its chunks; the
    targets' (remote_options) are not needed for them."""
    from support.servers import moto_s3

    objects = {f"icechunk-bucket/repo/{k}": v for k, v in repository_files(repo.root).items()}
    with moto_s3(objects) as endpoint:
        options = {"key": "test", "secret": "test",
                   "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"}}
        m = mount("s3://icechunk-bucket/repo", authorise, "no_disk_cache",
                  f"target_options={json.dumps(options)}", "tag=v1")
        got = read_all(zarr.open_group(str(m.path), mode="r", zarr_format=3))
        assert_same(got, repo.expected["tagged"])
        m.unmount()


def test_a_repository_over_http(mount, repo, authorise, nginx, nginx_root) -> None:
    served = Path(nginx_root) / "icechunk-http" / "repo"
    if not served.exists():
        shutil.copytree(repo.root, served)
    m = mount(f"{nginx.url}/icechunk-http/repo", authorise, "no_disk_cache", "branch=dev")
    got = read_all(zarr.open_group(str(m.path), mode="r", zarr_format=3))
    assert_same(got, repo.expected["dev"])


def test_local_virtual_chunks_are_authorised_by_allow_local_or_a_rule(mount, tmp_path) -> None:
    files = tmp_path / "netcdf"
    container, values = ic.build_local_virtual(tmp_path / "repo", files)
    np.testing.assert_array_equal(ic.read_local_virtual_with_icechunk(tmp_path / "repo", container), values)
    m = mount(tmp_path / "repo", "no_disk_cache")
    with pytest.raises(OSError) as info:
        (m / "virtual/c/0/0").read_bytes()
    assert info.value.errno == errno.EIO
    assert "nor allow_local" in m.log_text()
    for opt in (f"allow_local={files}", "targets=" + json.dumps([{"prefix": container}])):
        m = mount(tmp_path / "repo", "no_disk_cache", opt)
        got = zarr.open_array(str(m / "virtual"), mode="r", zarr_format=3)[...]
        np.testing.assert_array_equal(got, values)


def test_a_catalogue_directory_serves_a_repository_as_a_set(mount, repo, authorise, tmp_path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copytree(repo.root, cat / "era5.icechunk")
    m = mount(cat, "catalog", authorise, "no_disk_cache")
    assert sorted(os.listdir(m.path)) == ["era5"]
    got = read_all(zarr.open_group(str(m / "era5"), mode="r", zarr_format=3))
    assert_same(got, repo.expected["second"])


def test_serve_stats_name_the_snapshot_served_across_a_reload(serve, tmp_path_factory) -> None:
    built = ic.build_repository(tmp_path_factory.mktemp("icechunk-serve-live") / "repo",
                                tmp_path_factory.mktemp("icechunk-serve-live-files"))

    def mounted_row(url: str) -> str:
        r = run_cli("stats", url)
        assert r.returncode == 0, r.stderr
        rows = [line for line in r.stdout.splitlines() if line.startswith("snapshot (mounted)")]
        assert len(rows) == 1, r.stdout
        return rows[0].split()[-1]

    plain = serve(built.root)
    assert mounted_row(plain.url) == built.snapshots["second"]
    s = serve(built.root, "reload=1")
    assert mounted_row(s.url) == built.snapshots["second"]
    newest = ic.commit_more(built.root, built.container, 12)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if (zarr.open_array(s.url + "native", mode="r", zarr_format=3)[...] == 12).all():
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the server still serves the old head\n{s.log.read_text()}")
    assert mounted_row(s.url) == newest
