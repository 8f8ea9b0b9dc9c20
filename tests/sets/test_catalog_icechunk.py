"""Icechunk repositories in a catalogue directory, through ``refmount serve -o catalog`` and an
``allow_other`` catalogue mount read by ``nobody``: a repository xarray wrote into an icechunk
1.1 session opens beside a JSON set, its values read by zarr over HTTP and through the mount
equal what was written; a directory of the catalogue whose ``refs/``, ``snapshots/``,
``manifests/``, ``config.yaml``, ``repo`` or ``chunks/`` is a symlink into a root-only
repository is refused (``503`` / ``EIO``), its private inline chunk never served."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.confinement import as_nobody, mkdir_public

pytest.importorskip("icechunk")

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

SECRET = b"SECRET-Q7"
V2 = Path(__file__).parents[1] / "data" / "icechunk" / "test-repo-v2"


def xarray_repository(root: Path):
    """A repository as xarray writes one into an icechunk session (zstd float32 chunks,
    coordinates, CF attributes), committed on branch main."""
    import icechunk
    import xarray as xr

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    session = repo.writable_session("main")
    rng = np.random.default_rng(53)
    temp = (rng.standard_normal((4, 6, 8)) * 10 + 280).astype("f4")
    ds = xr.Dataset({"temp": (("time", "lat", "lon"), temp, {"units": "K"})},
                    coords={"time": ("time", np.arange(4.0)),
                            "lat": ("lat", np.linspace(-50, 50, 6)),
                            "lon": ("lon", np.linspace(0, 350, 8))},
                    attrs={"title": "a catalogue's repository"})
    ds["temp"].encoding = {"chunks": (2, 3, 4)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(session.store, zarr_format=3, consolidated=False, mode="w")
    session.commit("xarray dataset")
    return ds


def secret_repository(root: Path) -> None:
    """A root-only repository whose array ``a`` holds SECRET as one inline chunk."""
    import icechunk
    import zarr

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root)))
    session = repo.writable_session("main")
    group = zarr.group(store=session.store)
    a = group.create_array("a", shape=(len(SECRET),), chunks=(len(SECRET),), dtype="u1",
                           compressors=None, fill_value=0)
    a[:] = np.frombuffer(SECRET, "u1")
    session.commit("secret")


def linked_copy(private: Path, cat: Path, name: str, components: tuple[str, ...]) -> Path:
    """A real directory of ``cat`` holding ``private``'s objects, ``components`` symlinks into
    it, and a ``.zmetadata`` (which let such a directory past the catalogue's check before)."""
    evil = cat / name
    shutil.copytree(private, evil)
    for component in components:
        target = evil / component
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.symlink_to(private / component)
    (evil / ".zmetadata").write_text('{"metadata": {}, "zarr_consolidated_format": 1}')
    return evil


@pytest.fixture
def catalogue(public: Path):
    priv = public / "priv"
    priv.mkdir(mode=0o700)
    secret_repository(priv / "secret")
    shutil.copytree(V2, priv / "v2")
    cat = mkdir_public(public / "cat")
    ds = xarray_repository(cat / "ds.icechunk")
    (cat / "plain.json").write_text(json.dumps({
        ".zgroup": '{"zarr_format": 2}', "k": "base64:" + __import__("base64").b64encode(
            b"plain bytes").decode()}))
    evil = {"evil": ("refs", "snapshots", "manifests")}  # the audit's directory
    for component in ("refs", "snapshots", "manifests", "config.yaml", "refs/branch.main"):
        evil["evil-" + component.replace("/", "-").replace(".", "-")] = (component,)
    for name, components in evil.items():
        if "config.yaml" in components and not (priv / "secret" / "config.yaml").exists():
            (priv / "secret" / "config.yaml").write_text("inline_chunk_threshold_bytes: 512\n")
        linked_copy(priv / "secret", cat, name, components)
    linked_copy(priv / "v2", cat, "evil-repo", ("repo",))
    chunks = linked_copy(priv / "v2", cat, "evil-chunks", ("chunks",))
    for p in [*public.rglob("*")]:
        if not p.is_symlink() and p.is_relative_to(cat):
            p.chmod(0o755 if p.is_dir() else 0o644)
    # manifests are read when a chunk is: such a set opens, and its chunks fail (502 / EIO)
    refused = {n: 502 if n == "evil-manifests" else 503 for n in [*evil, "evil-repo"]}
    return cat, ds, refused, chunks


def check_values(open_array, ds) -> None:
    for name in ("temp", "time", "lat", "lon"):
        np.testing.assert_array_equal(open_array(name)[...], ds[name].values)


def test_repositories_of_a_catalogue_open_beside_a_json_set(serve, mount, catalogue) -> None:
    import xarray as xr
    import zarr

    cat, ds, _, _ = catalogue
    s = serve(cat, "catalog")
    assert s.request("GET", "/plain/k").body == b"plain bytes"
    check_values(lambda name: zarr.open_array(f"{s.url}ds/{name}", mode="r", zarr_format=3), ds)
    assert s.stats()["set_states"]["ds"]["state"] == "open"
    with xr.open_zarr(f"{s.url}ds", consolidated=False, zarr_format=3) as got:
        xr.testing.assert_identical(got.load(), ds)

    m = mount(cat, "catalog", "allow_other", mnt=mkdir_public(cat.parent / "mnt"))
    check_values(lambda name: zarr.open_array(str(m.path / "ds" / name), mode="r", zarr_format=3), ds)
    with xr.open_zarr(m.path / "ds", consolidated=False, zarr_format=3) as got:
        xr.testing.assert_identical(got.load(), ds)
    chunk = next(p for p in sorted((m.path / "ds" / "temp" / "c").rglob("*")) if p.is_file())
    r = as_nobody("cat", str(chunk))
    assert r.returncode == 0 and r.stdout == chunk.read_bytes() and r.stdout, r
    assert as_nobody("cat", str(m.path / "plain" / "k")).stdout == b"plain bytes"


def test_symlinks_into_private_repositories_are_refused(serve, mount, catalogue) -> None:
    from refmount.sets.opensets import OPEN_FAILED

    cat, _, refused, _ = catalogue
    s = serve(cat, "catalog")
    for name, status in refused.items():
        r = s.request("GET", f"/{name}/a/c/0")
        assert SECRET not in r.body, name
        if status == 503:
            assert (r.status, r.body) == (503, f"the set cannot be served: {OPEN_FAILED}\n".encode()), \
                (name, r)
        else:
            assert r.status == status, (name, r)
    # the v2 repository whose chunks/ leads out: it opens, its native chunks are not read
    assert s.request("GET", "/evil-chunks/zarr.json").status == 200
    native = _native_keys()
    assert native, "the v2 test repository has native chunks"
    for k in native[:3]:
        assert s.request("GET", f"/evil-chunks/{k}").status == 502, k
    log = s.log_text()
    assert SECRET.decode() not in log
    assert "not through a symlink leaving it" in log, log

    m = mount(cat, "catalog", "allow_other", mnt=mkdir_public(cat.parent / "mnt"))
    for name, status in refused.items():
        r = as_nobody("cat", str(m.path / name / "a" / "c" / "0"))
        assert r.returncode != 0 and SECRET not in r.stdout, (name, r)
        if status == 503:
            with pytest.raises(OSError):
                os.listdir(m.path / name)
            assert os.getxattr(m.path / name, "user.refmount.set.error").decode() == OPEN_FAILED
        else:
            assert b"Input/output error" in r.stderr, (name, r)
    for k in native[:3]:
        r = as_nobody("cat", str(m.path / "evil-chunks" / k))
        assert r.returncode != 0 and b"Input/output error" in r.stderr, (k, r)
    assert SECRET.decode() not in m.log_text()


def _native_keys() -> list[str]:
    """Keys of native chunks of the v2 test repository (what refmount expand lists)."""
    out = subprocess.run([sys.executable, "-m", "refmount", "expand", str(V2)],
                         capture_output=True, timeout=120, check=True)
    refs = json.loads(out.stdout)
    refs = refs.get("refs", refs)
    return sorted(k for k, v in refs.items() if isinstance(v, list) and "/chunks/" in str(v[0]))


def test_a_shared_mount_or_server_of_one_repository_opens_its_objects_confined(
        serve, mount_fails, catalogue) -> None:
    """A repository served alone (``refmount serve``, an ``allow_other`` mount): its objects
    beneath its own directory, no symlink leaving it followed; the same repository without
    symlinks serves."""
    from support.serving import Served, serve_cli

    cat, _, _, _ = catalogue
    s = serve(cat / "ds.icechunk")
    assert s.request("GET", "/temp/zarr.json").status == 200
    for name in ("evil", "evil-refs", "evil-snapshots", "evil-repo"):
        r = serve_cli(cat / name, "no_disk_cache")
        if r.returncode == 0:  # wrongly started: stopped at teardown, then the test fails
            url, pid = r.stdout.split()
            serve.started.append(Served(url, int(pid), cat / "unused.log", str(cat / name)))
        assert r.returncode != 0, (name, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "not through a symlink leaving it" in lines[0], (name, r.stderr)
        assert SECRET.decode() not in r.stderr
    mount_fails(cat / "evil", "allow_other", must_mention=("not through a symlink leaving it",))
