"""A confined repository (one of a shared catalogue): each of its objects is opened beneath the
allowed directories with no symlink followed, so a directory whose ``refs/``, ``snapshots/``,
``manifests/``, ``config.yaml`` or ``repo`` is a symlink into a private repository is refused,
never read; the same repository copied without symlinks opens; a private (unconfined) one
still follows them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.icechunkrepos import V1Repo, write_v1_repo

from refmount.refs import detect_format, revision_identity
from refmount.refs.icechunk import IcechunkError, Repository
from refmount.refs.icechunk.format import IcechunkFormat
from refmount.refs.icechunk.storage import Storage
from refmount.refs.limits import Limits

pytest.importorskip("icechunk")

V2 = Path(__file__).parents[3] / "data" / "icechunk" / "test-repo-v2"


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> V1Repo:
    base = tmp_path_factory.mktemp("icechunk-confined")
    priv = base / "priv"
    priv.mkdir(mode=0o700)
    return write_v1_repo(priv / "repo", base / "data")


def read_all(repo: Repository) -> int:
    """Every snapshot node and chunk reference of branch main, and its containers."""
    snap = repo.snapshot(repo.resolve())
    n = 0
    for node in snap.nodes:
        if node.kind == "array":
            n += sum(1 for _ in snap.chunks(node.path))
    repo.virtual_chunk_containers()
    repo.branches()
    repo.tags()
    return n


def linked_copy(private: Path, cat: Path, name: str, component: str) -> Path:
    """A copy of ``private`` in ``cat`` whose ``component`` is a symlink into ``private``."""
    evil = cat / name
    shutil.copytree(private, evil, symlinks=True)
    target = evil / component
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    target.symlink_to(private / component)
    return evil


@pytest.mark.parametrize("component", ["refs", "snapshots", "manifests", "config.yaml",
                                       "refs/branch.main", "refs/branch.main/ref.json"])
def test_a_symlinked_component_of_a_v1_repository_is_refused(v1: V1Repo, tmp_path: Path,
                                                              component: str) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    roots = Limits(source_roots=(str(cat),))
    good = cat / "good"
    shutil.copytree(v1.path, good)
    assert read_all(Repository.open(str(good), {}, roots)) > 0  # the same repository, no symlink
    evil = linked_copy(v1.path, cat, "evil", component)
    assert read_all(Repository.open(str(evil), {})) > 0  # a private mount follows it
    with pytest.raises(IcechunkError, match="refused") as e:
        read_all(Repository.open(str(evil), {}, roots))
    assert "symlink" in str(e.value) or "outside the allowed directories" in str(e.value), e.value


def test_a_symlinked_repo_object_of_a_v2_repository_is_refused(tmp_path: Path) -> None:
    from refmount.refs.icechunk.storage import ObjectRefused

    priv = tmp_path / "priv"
    shutil.copytree(V2, priv)
    cat = tmp_path / "cat"
    cat.mkdir()
    roots = Limits(source_roots=(str(cat),))
    shutil.copytree(V2, cat / "good")
    assert read_all(Repository.open(str(cat / "good"), {}, roots)) > 0
    for component in ("repo", "snapshots", "manifests"):
        evil = linked_copy(priv, cat, f"evil-{component}", component)
        with pytest.raises(IcechunkError, match="refused"):
            read_all(Repository.open(str(evil), {}, roots))
    # detection itself reads no symlinked repo object
    evil = cat / "evil-repo"
    assert IcechunkFormat().detect(str(evil), {})
    with pytest.raises(ObjectRefused):
        IcechunkFormat().detect(str(evil), {}, roots=(str(cat),))
    with pytest.raises(ObjectRefused):
        detect_format(str(evil), {}, roots=(str(cat),))
    with pytest.raises(IcechunkError, match="refused"):
        revision_identity(str(evil), {}, timeout=None, roots=(str(cat),))


def test_a_repository_directory_linked_out_of_the_catalogue_is_refused(v1: V1Repo,
                                                                        tmp_path: Path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    (cat / "evil").symlink_to(v1.path)
    with pytest.raises(IcechunkError, match="outside the allowed directories"):
        Repository.open(str(cat / "evil"), {}, Limits(source_roots=(str(cat),)))


def test_a_confined_listing_follows_no_symlink(v1: V1Repo, tmp_path: Path) -> None:
    from refmount.refs.icechunk.storage import ObjectRefused

    cat = tmp_path / "cat"
    cat.mkdir()
    evil = linked_copy(v1.path, cat, "evil", "refs")
    storage = Storage(str(evil), {}, None, [str(cat)])
    with pytest.raises(ObjectRefused):
        storage.listdir("refs", 100)
    assert Storage(str(evil), {}, None).listdir("refs", 100)  # unconfined: listed
    good = cat / "good"
    shutil.copytree(v1.path, good)
    names = Storage(str(good), {}, None, [str(cat)]).listdir("refs", 100)
    assert sorted(names) == sorted(os.listdir(good / "refs"))


def test_a_fifo_object_is_refused_without_blocking(v1: V1Repo, tmp_path: Path) -> None:
    from refmount.refs.icechunk.storage import ObjectRefused

    cat = tmp_path / "cat"
    shutil.copytree(v1.path, cat / "r")
    (cat / "r" / "config.yaml").unlink()
    os.mkfifo(cat / "r" / "config.yaml")
    repo = Repository.open(str(cat / "r"), {}, Limits(source_roots=(str(cat),)))
    with pytest.raises(ObjectRefused, match="FIFO"):
        repo.virtual_chunk_containers()


def test_an_object_path_goes_before_the_query() -> None:
    from refmount.refs.icechunk.storage import join

    assert join("https://h/r/repo.json?X-Amz-Signature=abc", "repo") == \
        "https://h/r/repo.json/repo?X-Amz-Signature=abc"
    assert join("https://h/r/?a=b/c", "refs/x") == "https://h/r/refs/x?a=b/c"
    assert join("/data/r/", "repo") == "/data/r/repo"
    storage = Storage("https://h.invalid/r?sig=a/b", {}, 5)
    assert storage.url_of("chunks/X") == "https://h.invalid/r/chunks/X?sig=a/b"
    assert storage.full("repo").endswith("/r/repo?sig=a/b")
