"""DecodedView.from_index with ``first``: the sample the CLI's note on encoded arrays reads,
so that a set of very many arrays is not decoded whole for a hint."""

from __future__ import annotations

import json

from refmount.decode.view import DecodedView
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder


def index_of_arrays(n: int) -> KeyIndex:
    b = IndexBuilder()
    b.add_inline(".zgroup", b'{"zarr_format": 2}')
    zarray = {"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<f4", "order": "C",
              "compressor": {"id": "zlib", "level": 1}, "filters": None, "fill_value": None}
    for i in range(n):
        b.add_inline(f"a{i:04d}/.zarray", json.dumps(zarray).encode())
        b.add_inline(f"a{i:04d}/.zattrs", b'{"_ARRAY_DIMENSIONS": ["x"]}')
    return KeyIndex(b.finish())


def test_the_first_keys_only_make_a_sampled_view() -> None:
    index = index_of_arrays(50)
    whole = DecodedView.from_index(index)
    assert len(whole.arrays) == 50 and not whole.sampled
    sample = DecodedView.from_index(index, first=20)
    assert sample.sampled
    assert 0 < len(sample.arrays) <= 10  # a .zarray and a .zattrs each
    assert set(sample.arrays) <= set(whole.arrays)


def test_a_sample_as_large_as_the_set_is_the_whole_view() -> None:
    index = index_of_arrays(5)
    view = DecodedView.from_index(index, first=1000)
    assert len(view.arrays) == 5 and not view.sampled
