"""An array on a rectilinear chunk grid (zarr-extensions ``rectilinear``, as icechunk 2.x
repositories may hold) is refused alone, with its reason in one warning: its ``zarr.json`` is
served, its chunks are not; the other arrays are served, raw and through ``-o decode``."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from support.rectilinear import rectilinear_repo

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]


def test_a_rectilinear_array_is_refused_alone_and_the_rest_served(mount, tmp_path) -> None:
    regular = rectilinear_repo(tmp_path / "repo")
    m = mount(tmp_path / "repo", "no_disk_cache")
    np.testing.assert_array_equal(zarr.open_array(str(m / "regular"), mode="r", zarr_format=3)[...], regular)
    assert sorted(p.name for p in (m / "rect").iterdir()) == ["zarr.json"]
    assert "array /rect: its chunks are not served: chunk grid 'rectilinear'" in m.log_text()
    d = mount(tmp_path / "repo", "no_disk_cache", "decode")
    np.testing.assert_array_equal(zarr.open_array(str(d / "regular"), mode="r", zarr_format=2)[...], regular)
    assert "rectilinear" in d.log_text()
