"""docs/semantics.md's recipe "A Zarr store as a reference set", run as written (its paths
replaced): the set it writes names each of a zarr-python 3 store's files, metadata inline and
chunks whole, and is refused no more than the store itself is accepted."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from refmount.refs import ReferenceSetError, prepare_index
from refmount.refs.jsonrefs import JsonFormat

DOC = Path(__file__).resolve().parents[3] / "docs" / "semantics.md"


def recipe() -> str:
    text = DOC.read_text()
    section = text[text.index("### A Zarr store as a reference set"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_recipe_makes_a_set_of_the_stores_files(tmp_path: Path) -> None:
    import zarr

    store = tmp_path / "store.zarr"
    values = np.arange(48, dtype="f4").reshape(6, 8)
    zarr.create_array(str(store), shape=values.shape, chunks=(3, 4), dtype="f4", fill_value=0)[:] = values
    try:
        prepare_index(str(store), {})
    except ReferenceSetError as e:
        assert "a Zarr v3 store, not a reference set" in str(e)
    else:
        raise AssertionError("a Zarr store given as SOURCE was accepted")
    exec(recipe().replace("/data/store.zarr", str(store)), {})
    source = str(tmp_path / "store.json")
    prepare_index(source, {})
    refs = dict(JsonFormat().references(source, {}))
    files = {p.relative_to(store).as_posix(): p for p in store.rglob("*") if p.is_file()}
    assert set(refs) == set(files)
    for key, ref in refs.items():
        if key.endswith("zarr.json"):
            assert ref.data == files[key].read_bytes(), key
        else:
            assert ref.url == str(files[key]), key
