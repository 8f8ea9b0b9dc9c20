"""Naming a revision of an Icechunk repository: branch and tag names are checked before any
storage is asked (``/``, ``..``, also percent-encoded, never reach a path outside ``refs/``,
over HTTP too); a missing one is named with the branches and tags there are; a snapshot id is
read case-insensitively; a directory given as SOURCE that is part of a repository, or a Zarr
store, says what to give instead."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.icechunkrepos import V1Repo, write_v1_repo

from refmount.refs import ReferenceSetError, prepare_index
from refmount.refs.icechunk import IcechunkError, Repository
from refmount.refs.limits import Limits

pytest.importorskip("icechunk")


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> V1Repo:
    base = tmp_path_factory.mktemp("icechunk-revisions")
    return write_v1_repo(base / "site" / "repo", base / "data")


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def http_root(v1: V1Repo) -> Iterator[tuple[str, list[str]]]:
    """The directory holding the repository, served by Python's http.server (which decodes
    percent-escapes and removes dot segments, as many servers do); the paths it was asked."""
    handler = functools.partial(_Handler, directory=str(v1.path.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.paths  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("name", ["a%2F..%2Fbranch.main", "a%252F..%252Fbranch.main", "..",
                                  "x/../branch.main", "a%2e%2e", "a\\..\\b", "tab\there"])
def test_a_ref_name_that_could_leave_refs_is_refused_before_any_request(
        v1: V1Repo, http_root: tuple[str, list[str]], name: str) -> None:
    url, paths = http_root
    repo = Repository.open(f"{url}/repo", {}, Limits(source_timeout=30))
    before = len(paths)
    for kind in ("branch", "tag"):
        with pytest.raises(IcechunkError, match=f"not a {kind} name"):
            repo.resolve(**{kind: name})
        with pytest.raises(IcechunkError, match=f"not a {kind} name"):
            Repository.open(str(v1.path), {}).resolve(**{kind: name})
    assert paths[before:] == []


def test_a_missing_ref_names_the_ones_there_are(v1: V1Repo) -> None:
    repo = Repository.open(str(v1.path), {})
    with pytest.raises(IcechunkError) as e:
        repo.resolve(tag="main")
    text = str(e.value)
    assert "no tag 'main'; did you mean branch=main?" in text, text
    assert "branches 'dev', 'main'" in text and "tags 'v1.0'" in text, text
    assert "\n" not in text
    with pytest.raises(IcechunkError, match=r"did you mean tag=v1\.0") as e:
        repo.resolve(branch="v1.0")
    with pytest.raises(IcechunkError) as e:
        repo.resolve(branch="nope")
    assert "did you mean" not in str(e.value) and "branches 'dev', 'main'" in str(e.value)


def test_a_missing_ref_of_a_repository_with_many_names_is_bounded(tmp_path: Path, v1: V1Repo) -> None:
    import shutil

    from refmount.refs.icechunk.repository import KNOWN_SHOWN

    root = tmp_path / "r"
    shutil.copytree(v1.path, root)
    for i in range(KNOWN_SHOWN + 5):
        shutil.copytree(root / "refs" / "tag.v1.0", root / "refs" / f"tag.t{i:03d}")
    with pytest.raises(IcechunkError) as e:
        Repository.open(str(root), {}).resolve(tag="nope")
    text = str(e.value)
    assert "and 6 more" in text and "'t009'" in text and "'t010'" not in text, text
    assert "'gone'" not in text  # a deleted tag


def test_a_snapshot_id_is_read_case_insensitively(v1: V1Repo) -> None:
    repo = Repository.open(str(v1.path), {})
    sid = v1.snapshots["structure"]
    assert repo.resolve(snapshot=sid.lower()) == sid
    assert repo.resolve(snapshot=sid) == sid
    index = prepare_index(str(v1.path), {}, revision={"snapshot": sid.lower()})
    assert index.revision == sid
    with pytest.raises(IcechunkError, match="not a snapshot id"):
        repo.resolve(snapshot=sid[:-1] + "U")  # U is no Crockford digit


def test_a_directory_given_as_source_says_what_to_give(v1: V1Repo, tmp_path: Path) -> None:
    for part in ("refs", "refs/branch.main", "snapshots"):
        with pytest.raises(ReferenceSetError) as e:
            prepare_index(str(v1.path / part), {})
        text = str(e.value)
        assert "is a directory" in text and f"inside the Icechunk repository {v1.path}" in text, text
    import zarr

    zarr.create_array(str(tmp_path / "v3.zarr"), shape=(4,), dtype="i2")
    with pytest.raises(ReferenceSetError, match="a Zarr v3 store, not a reference set") as e:
        prepare_index(str(tmp_path / "v3.zarr"), {})
    assert "docs/semantics.md" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReferenceSetError, match="nor an Icechunk repository"):
        prepare_index(str(tmp_path / "empty"), {})


def test_the_probe_path_goes_before_the_query(http_root: tuple[str, list[str]]) -> None:
    from refmount.refs.icechunk.format import IcechunkFormat
    from refmount.refs.icechunk.storage import is_repository

    url, paths = http_root
    before = len(paths)
    assert is_repository(f"{url}/repo?X-Amz-Signature=abc", {})
    asked = paths[before:]
    assert asked and all(p.startswith("/repo/") and p.endswith("?X-Amz-Signature=abc")
                         for p in asked), asked
    repo = Repository.open(f"{url}/repo?X-Amz-Signature=abc", {}, Limits(source_timeout=30))
    assert repo.resolve() and repo.object_url("chunks/X").endswith("/repo/chunks/X?X-Amz-Signature=abc")
    before = len(paths)
    assert not IcechunkFormat().detect(f"{url}/refs.json?X-Amz-Signature=abc", {})
    assert paths[before:] == []  # a reference file by its name: not probed


def test_a_version_2_repository_names_its_refs_and_checks_names_too() -> None:
    repo = Repository.open(str(Path(__file__).parents[3] / "data" / "icechunk" / "test-repo-v2"), {})
    with pytest.raises(IcechunkError) as e:
        repo.resolve(tag="main")
    text = str(e.value)
    assert "did you mean branch=main?" in text and "branches 'main', 'my-branch'" in text, text
    assert "'it works!'" in text and "'deleted'" not in text, text
    with pytest.raises(IcechunkError, match="not a branch name"):
        repo.resolve(branch="a%2F..%2Fmain")
    sid = repo.resolve()
    assert repo.resolve(snapshot=sid.lower()) == sid
