"""``listdir_checked``: a directory listed beneath the allowed directories, symlinks resolved
once (one staying inside is fine) and none leaving them followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refmount.base.confinedopen import listdir_checked


def test_a_listing_stays_beneath_the_allowed_directories(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "d" / "secret-name").write_text("x")
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    (root / "inside").symlink_to(root / "a")
    (root / "out").symlink_to(outside / "d")
    (root / "a" / "out").symlink_to(outside)
    roots = [str(root)]
    assert sorted(listdir_checked(str(root), roots)) == ["a", "inside", "out"]
    assert listdir_checked(str(root / "a" / "b"), roots) == ["f"]
    assert sorted(listdir_checked(str(root / "inside"), roots)) == ["b", "out"]
    for leaving in (root / "out", root / "a" / "out" / "d", root / "inside" / "out"):
        with pytest.raises(PermissionError, match="outside the allowed directories"):
            listdir_checked(str(leaving), roots)
    with pytest.raises(FileNotFoundError):
        listdir_checked(str(root / "nope"), roots)
    with pytest.raises(PermissionError, match="non-directory"):
        listdir_checked(str(root / "a" / "b" / "f"), roots)
    with pytest.raises(PermissionError):
        listdir_checked("relative", roots)
    assert os.listdir(root / "out") == ["secret-name"]  # what an unconfined listing shows
