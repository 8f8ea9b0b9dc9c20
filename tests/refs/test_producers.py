"""The producers' corpus (tests/support/producers.py) through the mount, against fsspec's
``ReferenceFileSystem`` reading the same reference set:

- the mount lists exactly the keys fsspec lists (its mapper's keys: a leading '/' dropped),
  except where fsspec is wrong by the spec (``DISAGREEMENTS``);
- every file's ``st_size`` and bytes equal what fsspec serves;
- ``xarray.open_zarr`` through the mount equals xarray over fsspec's ``reference://`` mapper,
  group by group (the producers' codecs -- kerchunk's ``grib``, ``FITSAscii`` ... -- are
  installed in the test environment).
"""

from __future__ import annotations

import json
import os
import warnings

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from support.paths import walk
from support.producers import Case, build_corpus

pytestmark = [pytest.mark.fuse, pytest.mark.long(90), pytest.mark.timeout(900)]

NAMES = [
    "hdf5-inline0", "hdf5-inline1M", "netcdf3", "grib2-scan_grib", "grib2-grib_tree", "tiff-raw",
    "tiff-zlib", "fits-image", "fits-tables", "multizarr", "multizarr-parquet", "parquet-10k",
    "parquet-100k", "virtualizarr-json", "virtualizarr-parquet",
]

# Keys fsspec lists that the mount does not, and why the mount is right by the spec.
DISAGREEMENTS: dict[str, set[str]] = {
    # LazyReferenceMapper lists the layout file itself as the key .zmetadata: so does the mount.
    "parquet": set(),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, datasets) -> dict[str, Case]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_corpus(tmp_path_factory.mktemp("corpus"), datasets.nc4, datasets.nc3)


def fsspec_fs(case: Case):
    return fsspec.filesystem("reference", fo=str(case.source), remote_protocol="file")


def is_parquet(case: Case) -> bool:
    return case.source.is_dir()


@pytest.mark.parametrize("name", NAMES)
def test_producer_set_mounts_as_fsspec_reads_it(mount, corpus, name):
    case = corpus[name]
    fs = fsspec_fs(case)
    mapper = fs.get_mapper("")
    theirs = set(mapper)
    m = mount(case.source, "no_disk_cache")
    files, _dirs = walk(m)
    extra_theirs = DISAGREEMENTS["parquet"] if is_parquet(case) else set()
    assert files == theirs - extra_theirs, (sorted(files ^ theirs)[:10])
    assert extra_theirs <= theirs
    wanted = mapper.getitems(sorted(files))
    rendered = []  # metadata served by fsspec as other bytes of the same JSON document
    for key in sorted(files):
        data = (m / key).read_bytes()
        want = wanted[key]
        assert os.stat(m / key).st_size == len(data), key
        if data != want and key.rsplit("/", 1)[-1] in (".zarray", ".zattrs", ".zgroup"):
            assert json.loads(data) == json.loads(want), key
            rendered.append(key)
            continue
        assert data == want, key
    print(f"corpus {name}: {len(files)} keys; fsspec also lists {sorted(extra_theirs) or 'nothing'}; "
          f"{len(rendered)} metadata keys rendered otherwise by fsspec {rendered[:3]}")
    if ".zarray" in files:  # a root array (tiff_to_zarr): no group for xarray, compare with zarr
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mounted = zarr.open_array(str(m), mode="r", zarr_format=2)
            original = zarr.open_array(mapper, mode="r", zarr_format=2)
            assert mounted.dtype == original.dtype and mounted.shape == original.shape
            np.testing.assert_array_equal(mounted[...], original[...])
            assert dict(mounted.attrs) == dict(original.attrs)
    if not case.xarray:
        return
    for group in case.groups:
        kw = {"consolidated": False, "zarr_format": 2}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with xr.open_zarr(str(m), group=group, **kw) as mounted, \
                    xr.open_dataset(fs.get_mapper(group or ""), engine="zarr", **kw) as original:
                xr.testing.assert_identical(original.load(), mounted.load())
