"""A Parquet set of a shared catalogue or mount (``Limits.source_roots``): its record files are
opened beneath the allowed directories with no symlink followed, so a record file that is a
symlink into a private set is refused (its keys give EIO), never read; the same set without
the symlink, or unconfined, reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio
from support.parquet_data import lazy_zarr_parquet

from refmount.base.errors import ReadError
from refmount.refs.parquetset import Record, RecordCache, load_parquet_set


def load(records: RecordCache, array: int, record: int = 0) -> Record:
    async def get() -> Record:
        return await records.get(array, record)
    return trio.run(get)


def test_a_record_file_linked_out_of_the_catalogue_is_refused(tmp_path: Path) -> None:
    priv = tmp_path / "priv"
    priv.mkdir(mode=0o700)
    lazy_zarr_parquet(priv / "pq.parq")
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copytree(priv / "pq.parq", cat / "good.parq")
    shutil.copytree(priv / "pq.parq", cat / "evil.parq")
    roots = (str(cat),)
    good = load_parquet_set(str(cat / "good.parq"), {}, "error")
    array = next(i for i, a in enumerate(good.arrays)
                 if (cat / "good.parq" / a.path / "refs.0.parq").exists())
    assert load(RecordCache(good, {}, roots=roots), array).n > 0
    rel = Path(good.arrays[array].path) / "refs.0.parq"
    (cat / "evil.parq" / rel).unlink()
    (cat / "evil.parq" / rel).symlink_to(priv / "pq.parq" / rel)
    evil = load_parquet_set(str(cat / "evil.parq"), {}, "error")
    assert load(RecordCache(evil, {}), array).n > 0  # a private mount follows it
    with pytest.raises(ReadError, match=r"refused.*symlink"):
        load(RecordCache(evil, {}, roots=roots), array)
