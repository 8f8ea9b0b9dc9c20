"""The legacy "rooted" layout (keys starting with '/', earth-mover/icechunk#2239) is looked for
only at an object store's bucket root: never for a local directory, an HTTP URL or a
repository under a prefix (no request is made for them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from refmount.refs.icechunk.storage import Storage, rooted_layout


@pytest.mark.parametrize("url", ["s3://bucket/prefix", "s3://bucket/a/b/", "http://127.0.0.1:9/"])
def test_no_probe_outside_a_bucket_root(url: str) -> None:
    storage = Storage(url, {}, 1.0)
    storage.exists = lambda rel: pytest.fail(f"probed {rel}")  # type: ignore[method-assign]
    assert not rooted_layout(storage)


def test_a_local_directory_is_never_rooted(tmp_path: Path) -> None:
    (tmp_path / "repo").write_bytes(b"x")
    assert not rooted_layout(Storage(str(tmp_path), {}, None))
