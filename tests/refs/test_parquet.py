"""Parquet reference sets (fsspec's LazyReferenceMapper layout) through a real mount.

Sets written by the real tools (kerchunk's ``refs_to_dataframe`` over ``SingleHdf5ToZarr``
references; ``LazyReferenceMapper.create`` + zarr) and by hand with pyarrow (see
parquet_data.py): the tree is the key list (absent rows and never-written record files give no
file), every file's bytes and ``st_size`` are exact, zarr/xarray read the original values;
record files are read only when needed; broken sets fail with one line, broken record files
give EIO for their keys only.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import zlib
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xarray as xr
import zarr
from support import parquet_data as pdata
from support.mounts import LIVE_MOUNTERS, Mounter, fusermount_u, is_mounted
from support.paths import implied_dirs, walk

pytestmark = [
    pytest.mark.fuse,
    pytest.mark.timeout(360),
    # fsspec's LazyReferenceMapper and fastparquet under pandas 3 (not ours)
    pytest.mark.filterwarnings("ignore:The 'fastparquet' engine is deprecated"),
    pytest.mark.filterwarnings("ignore:The 'future.infer_string' option is deprecated"),
]

OPTS = ("no_disk_cache",)


# --- helpers --------------------------------------------------------------------------------------


def assert_absent(mnt, key: str) -> None:
    p = Path(mnt) / key
    with pytest.raises(FileNotFoundError):
        os.stat(p)
    parent = p.parent
    if parent.is_dir():
        assert p.name not in os.listdir(parent), f"{key} listed although its row is null"


def assert_eio(path: Path) -> None:
    with pytest.raises(OSError) as info:
        path.read_bytes()
    assert info.value.errno == errno.EIO, (path, info.value)


def check_files(mnt, expected: dict[str, bytes]) -> None:
    """Exact bytes and st_size of chunk files; metadata files compared as parsed JSON."""
    wrong = []
    for key, want in sorted(expected.items()):
        p = Path(mnt) / key
        st = os.stat(p)
        assert stat.S_ISREG(st.st_mode), key
        got = p.read_bytes()
        if pdata.is_meta_key(key):
            if json.loads(got) != json.loads(want):
                wrong.append((key, "json", got[:80], want[:80]))
            if st.st_size != len(got):
                wrong.append((key, "st_size", st.st_size, len(got)))
            continue
        if got != want:
            wrong.append((key, "bytes", len(got), len(want)))
        if st.st_size != len(want):
            wrong.append((key, "st_size", st.st_size, len(want)))
    assert not wrong, wrong[:20]


def parquet_types(root: Path) -> dict[str, set[str]]:
    """column -> the Arrow types it has across the set's record files."""
    types: dict[str, set[str]] = {}
    for f in root.rglob("refs.*.parq"):
        for fld in pq.read_schema(f):
            types.setdefault(fld.name, set()).add(str(fld.type))
    return types


@pytest.fixture(scope="module")
def pq_mounts(tmp_path_factory):
    """Module-wide mounts for read-only checks (unmounted at the end of the module)."""
    mounter = Mounter(tmp_path_factory.mktemp("pq-mounts"))
    LIVE_MOUNTERS.append(mounter)
    cache: dict[str, object] = {}

    def get(source: Path | str):
        key = str(source)
        if key not in cache:
            cache[key] = mounter(source, *OPTS)
        return cache[key]

    try:
        yield get
    finally:
        LIVE_MOUNTERS.remove(mounter)
        for m in mounter.mounts:  # unmount all first: the daemons then exit in parallel
            m.refresh_procs()
            if is_mounted(m.path):
                fusermount_u(m.path)
        problems = mounter.cleanup()
        if problems:
            print("\nparquet mount cleanup problems:\n  " + "\n  ".join(problems))


# --- 1. kerchunk: SingleHdf5ToZarr refs -> refs_to_dataframe -----------------------------------

# name -> (record_size, engine, categorical_threshold)
KERCHUNK_VARIANTS = {
    "rs7": (7, "pyarrow", 10),
    "rs40-categorical": (40, "pyarrow", 1),  # path column dictionary-encoded
    "rs7-fastparquet": (7, "fastparquet", 10),  # kerchunk's default writer (a test dependency)
}


class KerchunkData:
    def __init__(self, base: Path):
        self.base = base
        self.nc = base / "data.nc"
        pdata.make_nc(self.nc)
        self.refs = pdata.kerchunk_refs(self.nc)
        self.sets: dict[str, Path] = {}

    def parquet(self, variant: str) -> Path:
        if variant not in self.sets:
            record_size, engine, cat = KERCHUNK_VARIANTS[variant]
            out = self.base / f"refs-{variant}.parquet"
            pdata.kerchunk_to_parquet(self.refs, out, record_size, engine=engine,
                                      categorical_threshold=cat)
            self.sets[variant] = out
        return self.sets[variant]

    def expected(self) -> dict[str, bytes]:
        return {k: pdata.expected_bytes(v) for k, v in self.refs.items()}


@pytest.fixture(scope="module")
def kdata(tmp_path_factory) -> KerchunkData:
    d = KerchunkData(tmp_path_factory.mktemp("kerchunk-parquet"))
    # The data really has what the tests are about.
    chunks = {k: v for k, v in d.refs.items() if not pdata.is_meta_key(k)}
    assert any(isinstance(v, str) for v in chunks.values()), "no inlined chunk"
    assert any(isinstance(v, list) for v in chunks.values()), "no range chunk"
    assert "sparse/1.0.0" not in d.refs and "sparse/0.0.0" in d.refs
    assert "scalar/0" in d.refs
    return d


def test_kerchunk_set_layout(kdata):
    """What refs_to_dataframe wrote (independent of refmount): many record files per array, a
    record file that was never written, a (categorical) dictionary-encoded path column."""
    root = kdata.parquet("rs7")
    zmeta = json.loads((root / ".zmetadata").read_text())
    assert zmeta["record_size"] == 7
    assert len(list((root / "cube").glob("refs.*.parq"))) == 9  # 60 chunks
    sparse = sorted(p.name for p in (root / "sparse").glob("refs.*.parq"))
    assert "refs.1.parq" not in sparse and "refs.3.parq" not in sparse, sparse
    assert (root / "grp" / "inner" / "refs.0.parq").exists()
    cat = parquet_types(kdata.parquet("rs40-categorical"))
    assert any(t.startswith("dictionary") for t in cat["path"]), cat


@pytest.mark.parametrize("variant", list(KERCHUNK_VARIANTS))
def test_kerchunk_tree_equals_json_keys(kdata, pq_mounts, variant):
    m = pq_mounts(kdata.parquet(variant))
    keys = set(kdata.refs) | {".zmetadata"}  # the set's own file, as fsspec serves it
    files, dirs = walk(m)
    assert files == keys, (sorted(keys - files)[:10], sorted(files - keys)[:10])
    assert dirs == implied_dirs(keys)
    # chunks HDF5 never wrote: a null row in an existing record file (chunk 6 is row 6 of
    # refs.0), keys of record files that do not exist (refs.1: chunks 7-13, refs.3: 21-27)
    for key in ("sparse/1.0.0", "sparse/1.1.0", "sparse/1.2.1", "sparse/3.2.1", "sparse/4.1.1"):
        assert_absent(m, key)
    # padding rows past the last chunk, and chunk indices outside the grid
    for key in ("cube/5.0.0", "cube/0.3.0", "series/12", "scalar/1", "t/1", "cube/0.0"):
        assert not os.path.exists(m / key), key
    # names that parse as a listed chunk's index but are not its key: no aliases
    for key in ("cube/00.0.0", "cube/+0.0.0", "cube/ 0.0.0", "cube/0.0.0 ", "cube/-0.0.0",
                "cube/0..0.0", "series/011", "series/1_1", "scalar/00", "scalar/0.0",
                "cube/0/0/0", "cube/\u0660.0.0"):
        assert not os.path.exists(m / key), key


@pytest.mark.parametrize("variant", list(KERCHUNK_VARIANTS))
def test_kerchunk_bytes_and_sizes(kdata, pq_mounts, variant):
    m = pq_mounts(kdata.parquet(variant))
    check_files(m, kdata.expected())


def _normalise_group(ds: xr.Dataset) -> xr.Dataset:
    """kerchunk names a group's own dimension by its HDF5 path (``grp/m``)."""
    return ds.rename({d: str(d).rsplit("/", 1)[-1] for d in ds.dims if "/" in str(d)})


@pytest.mark.parametrize("variant", list(KERCHUNK_VARIANTS))
def test_kerchunk_xarray_equals_netcdf(kdata, pq_mounts, variant):
    m = pq_mounts(kdata.parquet(variant))
    with xr.open_dataset(kdata.nc) as original, \
            xr.open_zarr(str(m), consolidated=False) as mounted:
        original, mounted = original.load(), mounted.load()
        assert sorted(original.variables) == sorted(mounted.variables)
        xr.testing.assert_identical(original, mounted)
        assert int(mounted.sparse.isnull().sum()) == 9 * 12 * 14 - 5 * 12 * 14 - 1
        assert float(mounted.sparse[2, 5, 9]) == 42.0
        assert float(mounted.scalar) == 3.25
        assert mounted.cube.encoding["dtype"] == "int32"
    with xr.open_dataset(kdata.nc, group="grp") as original, \
            xr.open_zarr(str(m), consolidated=False, group="grp") as mounted:
        mounted = _normalise_group(mounted.load())
        xr.testing.assert_identical(original.load(), mounted)


# --- 2. LazyReferenceMapper.create + zarr -------------------------------------------------------


@pytest.fixture(scope="module")
def lazy_set(tmp_path_factory) -> pdata.LazyZarrSet:
    s = pdata.lazy_zarr_parquet(tmp_path_factory.mktemp("lazy") / "ref.parquet", record_size=4)
    # the spec's layout
    for rel in (".zmetadata", "name/refs.0.parq", "deep/name/refs.0.parq",
                "deep/deeper/cube/refs.0.parq"):
        assert (s.root / rel).exists(), rel
    assert json.loads((s.root / ".zmetadata").read_text())["record_size"] == 4
    return s


def lazy_expected(s: pdata.LazyZarrSet) -> dict[str, bytes]:
    """Every key and its bytes, read from the set with pyarrow (independently of refmount)."""
    meta = json.loads((s.root / ".zmetadata").read_text())["metadata"]
    out = {k: json.dumps(v).encode() for k, v in meta.items()}
    out[".zmetadata"] = (s.root / ".zmetadata").read_bytes()
    for path in s.arrays:
        grid = pdata.chunk_grid(meta[f"{path}/.zarray"])
        tables: dict[int, dict] = {}
        for idx in np.ndindex(*grid):
            n = pdata.chunk_number(idx, grid)
            rec = n // s.record_size
            if rec not in tables:
                tables[rec] = pq.read_table(s.root / path / f"refs.{rec}.parq").to_pydict()
            raw = tables[rec]["raw"][n % s.record_size]
            assert tables[rec]["path"][n % s.record_size] is None
            if raw is not None:
                out[f"{path}/" + ".".join(map(str, idx))] = raw
    return out


def test_lazy_mapper_tree_and_bytes(lazy_set, pq_mounts):
    m = pq_mounts(lazy_set.root)
    expected = lazy_expected(lazy_set)
    chunk_keys = {k for k in expected if not pdata.is_meta_key(k)}
    written = set().union(*lazy_set.written_chunks.values())
    assert chunk_keys == written  # zarr skipped exactly the all-fill chunks
    files, dirs = walk(m)
    assert files == set(expected), (sorted(set(expected) - files), sorted(files - set(expected)))
    assert dirs == implied_dirs(expected)
    check_files(m, expected)
    for key in ("name/4", "name/5", "deep/name/1.1", "deep/deeper/cube/1.0.0"):
        assert_absent(m, key)


def test_lazy_mapper_zarr_values(lazy_set, pq_mounts):
    m = pq_mounts(lazy_set.root)
    group = zarr.open_group(str(m), mode="r", zarr_format=2)
    assert group.attrs["title"] == "lazy reference mapper"
    for path, values in lazy_set.arrays.items():
        got = group[path][...]
        assert got.dtype == values.dtype, path
        np.testing.assert_array_equal(got, values, err_msg=path)
    # fill_value 0 is a _FillValue to xarray: compare the stored values
    with xr.open_zarr(str(m), consolidated=False, mask_and_scale=False) as ds:
        np.testing.assert_array_equal(ds.name.values, lazy_set.arrays["name"])
        assert ds.attrs["title"] == "lazy reference mapper"
    with xr.open_zarr(str(m), consolidated=False, group="deep") as ds:
        np.testing.assert_array_equal(ds["name"].values, lazy_set.arrays["deep/name"])
        assert ds.attrs["level"] == 1


# --- 3. hand-made with pyarrow ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hand_set(tmp_path_factory) -> pdata.HandSet:
    base = tmp_path_factory.mktemp("hand")
    return pdata.hand_parquet(base / "refs", base / "data")


def test_hand_tree(hand_set, pq_mounts):
    types = parquet_types(hand_set.root)
    assert "null" in types["path"] and "null" in types["raw"], types
    assert any(t.startswith("dictionary") for t in types["path"]), types
    m = pq_mounts(hand_set.root)
    files, dirs = walk(m)
    assert files == set(hand_set.files), (sorted(set(hand_set.files) - files),
                                          sorted(files - set(hand_set.files)))
    assert dirs == implied_dirs(hand_set.files)
    # dimension_separator "/": chunk keys are nested directories
    assert stat.S_ISDIR(os.stat(m / "a" / "1").st_mode)
    assert sorted(os.listdir(m / "a")) == [".zarray", ".zattrs", "0", "1", "2"]
    assert sorted(os.listdir(m / "a" / "1")) == ["1", "2"]  # a/1/0 is null/null
    assert sorted(os.listdir(m / "scalar")) == [".zarray", ".zattrs", "0"]
    for key in hand_set.absent:
        assert_absent(m, key)
    for key in ("a/0.0", "a/00/1", "a/0/01", "a/0/1/0", "a/0/1.0"):  # only the "/" separator
        assert not os.path.exists(m / key), key
    assert os.listdir(m / "empty") == [".zarray"]  # shape [0]: no chunk keys


def test_hand_bytes_and_sizes(hand_set, pq_mounts):
    m = pq_mounts(hand_set.root)
    check_files(m, hand_set.files)
    assert os.stat(m / "blobs/x/0").st_size == 0  # raw b"": an empty file
    assert os.stat(m / "blobs/x/1").st_size == 200_003  # path, size 0: the whole file


def test_hand_zarr_values(hand_set, pq_mounts):
    m = pq_mounts(hand_set.root)
    group = zarr.open_group(str(m), mode="r", zarr_format=2)
    for path, values in hand_set.arrays.items():
        np.testing.assert_array_equal(group[path][...], values, err_msg=path)
    assert group["g1"].attrs["level"] == 1
    assert group["a"].attrs["units"] == "counts"


def test_zmetadata_is_served_as_fsspec_serves_it(kdata, hand_set, pq_mounts):
    """The set's own ``.zmetadata`` file is a key at the root, byte for byte what fsspec's
    ReferenceFileSystem returns for it and lists (``LazyReferenceMapper``)."""
    for root in (kdata.parquet("rs7"), kdata.parquet("rs7-fastparquet")):
        m = pq_mounts(root)
        fs = fsspec.filesystem("reference", fo=str(root), remote_protocol="file", skip_instance_cache=True)
        assert ".zmetadata" in fs.ls("", detail=False)
        assert ".zmetadata" in os.listdir(m)
        theirs = fs.cat(".zmetadata")
        assert (m / ".zmetadata").read_bytes() == theirs
        assert os.stat(m / ".zmetadata").st_size == len(theirs)


def test_zmetadata_with_json_text_values_is_served_parsed(hand_set, pq_mounts):
    """Metadata values written as JSON text (the spec's ``dict[str, str]``) are served parsed
    in ``.zmetadata``, where fsspec serves the file as it is and zarr cannot read it."""
    stored = json.loads((hand_set.root / ".zmetadata").read_bytes())
    assert any(isinstance(v, str) for v in stored["metadata"].values())
    m = pq_mounts(hand_set.root)
    served = json.loads((m / ".zmetadata").read_bytes())
    assert served["record_size"] == stored["record_size"]
    assert served["metadata"] == hand_set.metadata
    group = zarr.open_consolidated(str(m), zarr_format=2)
    assert group["g1"].attrs["level"] == 1
    assert group["scalar"][...] == 6.5


# --- a large array: fsspec's default record_size, listing, lookups across record files -------


@pytest.fixture(scope="module")
def large_set(tmp_path_factory) -> pdata.LargeSet:
    return pdata.large_parquet(tmp_path_factory.mktemp("large") / "big.parquet")


def test_large_array(large_set, mount):
    m = mount(large_set.root, *OPTS)
    rows, cols = large_set.grid
    names = os.listdir(m / "big")
    assert len(names) == len(set(names)), "duplicate directory entries"
    want = {k.split("/", 1)[1] for k in large_set.present} | {".zarray"}
    assert set(names) == want, (sorted(want - set(names))[:10], sorted(set(names) - want)[:10])

    def key(n: int) -> str:
        return "big/{}.{}".format(*divmod(n, cols))

    total = rows * cols
    for n in (0, 7, 9996, 10003, 50001, 59997, total - 1):  # present, around record boundaries
        assert (m / key(n)).read_bytes() == pdata.chunk_bytes(n), n
        assert os.stat(m / key(n)).st_size == 16
    for n in (1, 9999, 10000, 10001, 60004, total - 2):  # null rows
        assert_absent(m, key(n))
    for name in (f"{rows}.0", f"0.{cols}", "0", "0.0.0", "-1.0"):  # not chunk keys of the grid
        assert not os.path.exists(m / "big" / name), name
    # zarr across the boundary between refs.0 and refs.1 (chunk 10000 is in chunk row 24)
    arr = zarr.open_array(str(m / "big"), mode="r", zarr_format=2)
    got = arr[46:52, :]
    expected = np.zeros((6, cols * 2), "<u4")
    for i in range(23, 26):
        for j in range(cols):
            data = large_set.present.get(f"big/{i}.{j}")
            if data is not None:
                value = np.frombuffer(data, "<u4")[0]
                expected[(i - 23) * 2:(i - 22) * 2, j * 2:(j + 1) * 2] = value
    np.testing.assert_array_equal(got, expected)


# --- sources given as URLs ------------------------------------------------------------------------


def test_file_url_source(kdata, pq_mounts):
    m = pq_mounts("file://" + str(kdata.parquet("rs7")))
    files, _dirs = walk(m)
    assert files == set(kdata.refs) | {".zmetadata"}
    assert (m / "cube" / "4.2.3").read_bytes() == pdata.expected_bytes(kdata.refs["cube/4.2.3"])


def test_http_source(kdata, nginx, nginx_root, mount):
    """The set and the netCDF file served over HTTP (no directory listing): mounting fetches
    .zmetadata and no record file; then everything reads as from the original file."""
    served = nginx_root / "parquet"
    src = served / "rs7.parquet"
    if not src.exists():
        served.mkdir(exist_ok=True)
        shutil.copy(kdata.nc, served / "data.nc")
        nc_url = f"{nginx.url}/parquet/data.nc"
        refs = {k: [nc_url, *v[1:]] if isinstance(v, list) else v for k, v in kdata.refs.items()}
        pdata.kerchunk_to_parquet(refs, src, 7)
    url = f"{nginx.url}/parquet/rs7.parquet"
    before = len(nginx.access_lines())
    m = mount(url, *OPTS)
    at_mount = nginx.access_lines()[before:]
    assert any("/rs7.parquet/.zmetadata" in line for line in at_mount), at_mount
    assert not [line for line in at_mount if "/refs." in line], at_mount
    files, _dirs = walk(m)
    assert files == set(kdata.refs) | {".zmetadata"}
    check_files(m, kdata.expected())
    fetched = [line for line in nginx.access_lines()[before:] if "/refs." in line]
    assert any("/sparse/refs.4.parq" in line for line in fetched)


# --- 4. laziness ----------------------------------------------------------------------------------


def test_record_files_read_only_when_needed(kdata, mount, tmp_path):
    """inotify on the set's directories: mounting opens ``.zmetadata`` and no record file;
    metadata access opens none either; a lookup opens its own record file (``i // record_size``)
    and a listing those of its array only."""
    src = tmp_path / "lazy-copy.parquet"
    shutil.copytree(kdata.parquet("rs7"), src)

    def records(paths) -> set[str]:
        return {str(p.relative_to(src)) for p in paths if p.name.startswith("refs.")}

    with pdata.Inotify() as ino:
        ino.watch_tree(src)
        m = mount(src, *OPTS)
        opened = ino.opened()
        assert src / ".zmetadata" in opened, f"the watch saw no open of .zmetadata: {opened}"
        assert records(opened) == set(), "record files read while mounting"

        # metadata only: listings of the root and groups, stat of arrays, every .z* file
        names = os.listdir(m)
        assert "cube" in names
        assert "inner" in os.listdir(m / "grp")
        for key in kdata.refs:
            if pdata.is_meta_key(key):
                (m / key).read_bytes()
                os.stat(Path(m / key).parent)
        assert records(ino.opened()) == set(), "record files read for metadata access"

        # a lookup: cube/2.1.3 is chunk 2*12 + 1*4 + 3 = 31: row 3 of refs.4
        os.stat(m / "cube" / "2.1.3")
        assert records(ino.opened()) == {"cube/refs.4.parq"}
        # the record is kept: more keys of refs.4 (chunks 28-34) open no record file again
        assert (m / "cube" / "2.1.3").read_bytes() == pdata.expected_bytes(kdata.refs["cube/2.1.3"])
        os.stat(m / "cube" / "2.1.0")
        assert not (m / "cube" / "2.1.4").exists()  # not in the grid
        assert records(ino.opened()) == set(), "record file read again"
        # a read: series/11 is row 4 of refs.1
        assert (m / "series" / "11").read_bytes() == pdata.expected_bytes(kdata.refs["series/11"])
        assert records(ino.opened()) == {"series/refs.1.parq"}
        # a listing reads the array's record files, no other array's
        os.listdir(m / "field2d")
        got = records(ino.opened())
        assert got == {"field2d/refs.0.parq", "field2d/refs.1.parq", "field2d/refs.2.parq"}, got


# --- 5. errors -------------------------------------------------------------------------------------


def _write_set(root: Path, zmetadata: bytes | str) -> Path:
    root.mkdir(parents=True)
    (root / ".zmetadata").write_bytes(zmetadata.encode() if isinstance(zmetadata, str)
                                      else zmetadata)
    rows = pa.table({"path": pa.array([None, None], pa.string()),
                     "offset": pa.array([0, 0], pa.int64()),
                     "size": pa.array([0, 0], pa.int64()),
                     "raw": pa.array([b"\x01", b"\x02"], pa.binary())})
    (root / "v").mkdir()
    pq.write_table(rows, root / "v" / "refs.0.parq")
    return root


ZARRAY_V = {"zarr_format": 2, "shape": [2], "chunks": [1], "dtype": "|u1", "compressor": None,
            "filters": None, "fill_value": 0, "order": "C"}


@pytest.mark.parametrize("case, zmetadata, mention", [
    ("malformed-json", '{"metadata": {".zgroup": {"zarr_format": 2}}, "record_size": 2',
     ".zmetadata"),
    ("not-an-object", "[1, 2, 3]", ".zmetadata"),
    ("no-record-size", json.dumps({"metadata": {"v/.zarray": ZARRAY_V}}), "record_size"),
    ("record-size-zero", json.dumps({"metadata": {"v/.zarray": ZARRAY_V}, "record_size": 0}),
     "record_size"),
    ("record-size-string", json.dumps({"metadata": {"v/.zarray": ZARRAY_V},
                                       "record_size": "ten"}), "record_size"),
    ("no-metadata", json.dumps({"record_size": 2}), "metadata"),
    ("zarray-without-chunks", json.dumps({
        "metadata": {"temperature/.zarray": {k: v for k, v in ZARRAY_V.items() if k != "chunks"}},
        "record_size": 2}), "temperature"),
])
def test_bad_zmetadata_fails_with_one_line(mount_fails, tmp_path, case, zmetadata, mention):
    src = _write_set(tmp_path / case, zmetadata)
    mount_fails(src, *OPTS, must_mention=(mention,))


@pytest.fixture
def broken_records(tmp_path) -> Path:
    """Array ``bad`` (8 chunks, record_size 2): refs.0 fine, refs.1 without a ``size`` column,
    refs.2 with an integer ``path`` column, refs.3 not Parquet at all. Array ``good`` fine;
    ``noraw`` and ``rawonly`` lack columns that their rows do not need."""
    root = tmp_path / "broken.parquet"
    root.mkdir()
    target = tmp_path / "target.bin"
    target.write_bytes(bytes(range(256)))
    meta = {
        ".zgroup": {"zarr_format": 2},
        "bad/.zarray": {**ZARRAY_V, "shape": [8]},
        "good/.zarray": ZARRAY_V,
    }
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": 2}))
    (root / "bad").mkdir()
    (root / "good").mkdir()
    pq.write_table(pa.table({
        "path": pa.array([str(target), None], pa.string()),
        "offset": pa.array([10, 0], pa.int64()), "size": pa.array([1, 0], pa.int64()),
        "raw": pa.array([None, b"\x07"], pa.binary())}), root / "bad" / "refs.0.parq")
    pq.write_table(pa.table({  # no "size": the ranges are unknown
        "path": pa.array([str(target), str(target)], pa.string()),
        "offset": pa.array([20, 30], pa.int64()),
        "raw": pa.array([None, None], pa.binary())}), root / "bad" / "refs.1.parq")
    pq.write_table(pa.table({  # "path" is not a string column
        "path": pa.array([1, 2], pa.int64()),
        "offset": pa.array([20, 30], pa.int64()), "size": pa.array([1, 1], pa.int64()),
        "raw": pa.array([None, None], pa.binary())}), root / "bad" / "refs.2.parq")
    (root / "bad" / "refs.3.parq").write_bytes(b"this is not a parquet file\n" * 10)
    # Not errors: fsspec's reader takes an absent "raw" (or path/offset/size) column as null.
    meta["noraw/.zarray"] = meta["rawonly/.zarray"] = ZARRAY_V
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": 2}))
    (root / "noraw").mkdir()
    (root / "rawonly").mkdir()
    pq.write_table(pa.table({
        "path": pa.array([str(target), None], pa.string()),
        "offset": pa.array([200, 0], pa.int64()), "size": pa.array([2, 0], pa.int64())}),
        root / "noraw" / "refs.0.parq")
    pq.write_table(pa.table({"raw": pa.array([None, b"r1"], pa.binary())}),
                   root / "rawonly" / "refs.0.parq")
    pq.write_table(pa.table({
        "path": pa.array([None, str(target)], pa.string()),
        "offset": pa.array([0, 100], pa.int64()), "size": pa.array([0, 3], pa.int64()),
        "raw": pa.array([b"ok", None], pa.binary())}), root / "good" / "refs.0.parq")
    return root


def test_broken_record_files_give_eio(broken_records, mount):
    m = mount(broken_records, *OPTS)
    top = [".zgroup", ".zmetadata", "bad", "good", "noraw", "rawonly"]
    assert sorted(os.listdir(m)) == top
    assert json.loads((m / "bad" / ".zarray").read_bytes())["shape"] == [8]
    for key in ("bad/2", "bad/3", "bad/4", "bad/5", "bad/6", "bad/7"):
        assert_eio(m / key)
    # everything else keeps working, also after the errors
    assert (m / "bad" / "0").read_bytes() == bytes([10])
    assert (m / "bad" / "1").read_bytes() == b"\x07"
    assert (m / "good" / "0").read_bytes() == b"ok"
    assert (m / "good" / "1").read_bytes() == bytes([100, 101, 102])
    assert os.stat(m / "good" / "1").st_size == 3
    assert_eio(m / "bad" / "2")  # still an error, not a cached empty file
    assert sorted(os.listdir(m)) == top
    assert sorted(os.listdir(m / "noraw")) == [".zarray", "0"]
    assert (m / "noraw" / "0").read_bytes() == bytes([200, 201])
    assert sorted(os.listdir(m / "rawonly")) == [".zarray", "1"]
    assert (m / "rawonly" / "1").read_bytes() == b"r1"


def test_bad_array_key_is_skipped_or_refused(mount, mount_fails, tmp_path):
    """An array whose '.zarray' key cannot be a path: refused by default, and with
    bad_keys=skip the array is left out while the rest mounts (it was an AssertionError)."""
    meta = {".zgroup": {"zarr_format": 2}, "v/.zarray": ZARRAY_V, "x/../y/.zarray": ZARRAY_V}
    src = _write_set(tmp_path / "dotdot.parquet", json.dumps({"metadata": meta, "record_size": 2}))
    mount_fails(src, *OPTS, must_mention=("x/../y/.zarray",))
    m = mount(src, *OPTS, "bad_keys=skip")
    assert m.result is not None
    assert "WARNING" in m.result.stderr and "x/../y/.zarray" in m.result.stderr, m.result.stderr
    assert sorted(os.listdir(m)) == [".zgroup", ".zmetadata", "v"]
    assert json.loads((m / ".zmetadata").read_bytes())["metadata"] == {  # what the tree serves
        ".zgroup": {"zarr_format": 2}, "v/.zarray": ZARRAY_V}
    assert sorted(os.listdir(m / "v")) == [".zarray", "0", "1"]
    assert (m / "v" / "1").read_bytes() == b"\x02"


def test_size_zero_is_whole_only_at_offset_zero(mount, tmp_path):
    """As fsspec's LazyReferenceMapper reads a row: offset 0 and size 0 is the whole target;
    size 0 at another offset is an empty range (it served the whole target); a negative
    size or offset is an error for the keys of that record file only."""
    target = tmp_path / "target.bin"
    target.write_bytes(bytes(range(256)) * 4)
    root = tmp_path / "zero.parquet"
    root.mkdir()
    meta = {".zgroup": {"zarr_format": 2}, "v/.zarray": {**ZARRAY_V, "shape": [4]},
            "n/.zarray": ZARRAY_V}
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": 2}))
    (root / "v").mkdir()
    (root / "n").mkdir()
    pq.write_table(pa.table({
        "path": pa.array([str(target), str(target)], pa.string()),
        "offset": pa.array([0, 10], pa.int64()), "size": pa.array([0, 0], pa.int64()),
        "raw": pa.array([None, None], pa.binary())}), root / "v" / "refs.0.parq")
    pq.write_table(pa.table({
        "path": pa.array([str(target), str(target)], pa.string()),
        "offset": pa.array([10, 20], pa.uint64()), "size": pa.array([3, 2], pa.uint64()),
        "raw": pa.array([None, None], pa.binary())}), root / "v" / "refs.1.parq")
    pq.write_table(pa.table({
        "path": pa.array([str(target), str(target)], pa.string()),
        "offset": pa.array([0, 10], pa.int64()), "size": pa.array([4, -5], pa.int64()),
        "raw": pa.array([None, None], pa.binary())}), root / "n" / "refs.0.parq")
    m = mount(root, *OPTS)
    assert (m / "v" / "0").read_bytes() == target.read_bytes()
    assert os.stat(m / "v" / "1").st_size == 0
    assert (m / "v" / "1").read_bytes() == b""
    assert (m / "v" / "2").read_bytes() == bytes([10, 11, 12])
    assert (m / "v" / "3").read_bytes() == bytes([20, 21])
    for key in ("n/0", "n/1"):
        assert_eio(m / key)
    assert (m / "v" / "2").read_bytes() == bytes([10, 11, 12])


# --- bounds: huge grids, a .zmetadata bomb over HTTP ------------------------------------------


def _grid_set(root: Path, arrays: dict[str, tuple[int, int]], record_size: int) -> Path:
    """Arrays ``name: (shape, record files)`` of 1-byte chunks; each record file has
    ``record_size`` rows, every row the inline value ``v``."""
    meta = {".zgroup": {"zarr_format": 2}}
    for name, (shape, records) in arrays.items():
        meta[f"{name}/.zarray"] = {**ZARRAY_V, "shape": [shape], "chunks": [1]}
        (root / name).mkdir(parents=True)
        rows = min(record_size, shape)
        raw = pa.array(np.full(rows, b"v", "S1"), pa.binary())
        table = pa.table({"path": pa.nulls(rows, pa.string()), "offset": pa.array(np.zeros(rows, "i8")),
                          "size": pa.array(np.zeros(rows, "i8")), "raw": raw})
        for record in range(records):
            pq.write_table(table, root / name / f"refs.{record}.parq")
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": record_size}))
    return root


def _ls(path: Path) -> subprocess.Popen:
    """``ls -f PATH`` writing to /dev/null (a pipe nobody reads would stop it in ``write``, not
    in ``readdir``), with SIGINT's default action whatever this process inherited."""
    return subprocess.Popen(["ls", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _process_state(pid: int) -> str:
    """What a process is doing, for a failure's message: its state, signals, kernel stack."""
    out = []
    for name in ("status", "wchan", "stack", "syscall"):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/{name}").read_text()
            if name == "status":
                text = " ".join(line for line in text.splitlines()
                                if line.startswith(("State", "SigIgn", "SigPnd", "ShdPnd", "SigBlk")))
            out.append(f"{name}: {text.strip()}")
    return "; ".join(out)


def test_a_huge_grid_lists_at_once_and_a_long_listing_is_interruptible(mount, tmp_path):
    """shape [2**39], record_size 1, one record file: ``ls`` and ``ls | head`` answer at once.
    A listing of millions of keys stops within seconds when ``ls`` gets SIGINT or SIGKILL
    (every readdir request is bounded work), and the mount then unmounts (nothing busy)."""
    huge = mount(_grid_set(tmp_path / "huge", {"x": (2**39, 1)}, 1), *OPTS)
    r = subprocess.run(["ls", "-f", str(huge / "x")], capture_output=True, text=True, timeout=20)
    assert sorted(r.stdout.split()) == [".", "..", ".zarray", "0"], r
    r = subprocess.run(f"ls {huge / 'x'} | head -1", shell=True, capture_output=True, text=True,
                       timeout=20)
    assert r.stdout.split() == ["0"], r  # ls hides .zarray
    assert (huge / "x" / "0").read_bytes() == b"v"

    dense = mount(_grid_set(tmp_path / "dense", {"d": (4 * 10**6, 4)}, 10**6), *OPTS)
    for sig in (signal.SIGINT, signal.SIGKILL):
        ls = _ls(dense / "d")
        time.sleep(1.5)
        assert ls.poll() is None, "the listing ended too soon to be interrupted"
        began = time.monotonic()
        ls.send_signal(sig)
        try:
            ls.wait(timeout=10)
        except subprocess.TimeoutExpired:
            state = _process_state(ls.pid)
            ls.kill()
            ls.wait()
            pytest.fail(f"ls still running 10 s after {sig.name}: {state}")
        assert time.monotonic() - began < 3, f"ls took {time.monotonic() - began:.1f} s to stop"
    for m in (huge, dense):
        r = fusermount_u(m)
        assert r.returncode == 0 and not is_mounted(m), r.stderr


class _GzipBombHandler(http.server.BaseHTTPRequestHandler):
    """``/set/.zmetadata`` as a gzip ``Content-Encoding`` of 1 GiB of JSON text (1 MB sent)."""

    body = b""

    def _head(self) -> bool:
        if self.path != "/set/.zmetadata":
            self.send_error(404)
            return False
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        return True

    def do_HEAD(self) -> None:
        self._head()

    def do_GET(self) -> None:
        if self._head():
            with contextlib.suppress(OSError):
                self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


def test_a_gzip_encoded_zmetadata_bomb_over_http_is_refused_within_max_inline(mount_fails):
    # One block of 8 MiB of spaces compressed once and repeated 128 times (a full flush
    # between blocks makes each independent), in a gzip member with its own CRC and length.
    comp = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    head, piece = b'{"record_size": 1, "metadata": {"a": "', b" " * (8 << 20)
    first = comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(piece) + comp.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    for _ in range(128):
        crc = zlib.crc32(piece, crc)
    size = len(head) + 128 * len(piece)
    _GzipBombHandler.body = b"".join([b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", first,
                                      block * 128, comp.flush(), crc.to_bytes(4, "little"),
                                      (size & 0xFFFFFFFF).to_bytes(4, "little")])
    assert zlib.decompressobj(31).decompress(_GzipBombHandler.body, 1 << 20).startswith(head)
    assert len(_GzipBombHandler.body) < 2 << 20
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GzipBombHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/set"
        # the ratio guard off, so that max_inline is what stops it (with it on, max_ratio does)
        result, _line = mount_fails(url, *OPTS, "max_ratio=0",
                                    must_mention=(".zmetadata", "max_inline=64M"))
        assert result.seconds < 30
        result, _line = mount_fails(url, *OPTS, must_mention=(".zmetadata", "max_ratio=200"))
        assert result.seconds < 30
    finally:
        server.shutdown()
        thread.join()


def test_a_source_with_a_query_keeps_it_on_the_files_it_names(serve, srv, tmp_path):
    """A SOURCE URL with a query (a signature, a version): the probe for a Parquet set asks for
    ``.zmetadata`` with the query after it, never ``refs.json?v=1/.zmetadata`` (which a server
    ignoring queries answers with the JSON file, making it look like a Parquet set); a
    Parquet set's ``.zmetadata`` and record files are asked for with the query too."""
    from support.refsets import tiny_parquet

    srv.put("refs.json", json.dumps({".zgroup": '{"zarr_format": 2}', "k": "hello"}).encode())
    s = serve(srv.url_for("refs.json", query="v=1"), "no_disk_cache")
    assert s.request("GET", "/k").body == b"hello"
    asked = [(r.path, r.query) for r in srv.log(method=None)]
    assert ("/refs.json/.zmetadata", "v=1") in asked, asked
    assert all(".zmetadata" not in q for _, q in asked), asked

    srv.reset_log()
    tiny_parquet(srv.root / "pq", tmp_path / "pdata")
    s = serve(srv.url_for("pq", query="sig=abc"), "no_disk_cache")
    assert s.request("GET", "/x/0").body == b"raw0"
    asked = [(r.path, r.query) for r in srv.log(method=None)]
    assert ("/pq/.zmetadata", "sig=abc") in asked and ("/pq/x/refs.0.parq", "sig=abc") in asked, asked
