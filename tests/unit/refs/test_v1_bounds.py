"""What a Version 1 set may cost, without FUSE: ``gen`` dimensions evaluated lazily, the keys
of a set bounded by ``max_keys`` before any is made, and all template renderings of a set
bounded together by ``max_template_seconds``."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.cli.tools import expand, inspect
from refmount.refs import ReferenceSetError, build_index
from refmount.refs.index import KeyIndex
from refmount.refs.limits import Limits
from refmount.refs.model import INT64_MAX
from refmount.refs.v1columns import Dimension, range_length
from refmount.refs.v1templates import RenderBudget

BOUND = st.integers(-INT64_MAX, INT64_MAX)
SMALL = st.integers(-50, 50)


def write(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def gen(key: str, dims: dict, url: str = "/d") -> dict:
    return {"key": key, "url": url, "dimensions": dims}


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.tuples(BOUND, BOUND, BOUND), st.tuples(SMALL, SMALL, SMALL)))
def test_range_length_is_len_of_range_for_any_size(spec: tuple[int, int, int]) -> None:
    """Checked by membership, which Python answers for ranges of any size (len() raises
    OverflowError past 2^63 - 1)."""
    start, stop, step = spec
    if step == 0:
        return
    r, n = range(start, stop, step), range_length(start, stop, step)
    if max(abs(start), abs(stop)) < 1000:
        assert n == len(r)
    if n:
        assert start + (n - 1) * step in r and start + n * step not in r
    else:
        assert start not in r


@settings(max_examples=200, deadline=None)
@given(BOUND, BOUND, BOUND, st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=5))
def test_dimension_values_are_the_range_values_without_materialising_it(
        start: int, stop: int, step: int, where: list[float]) -> None:
    if step == 0:
        return
    d = Dimension.parse("s", "gen[0].dimensions.i", {"start": start, "stop": stop, "step": step})
    r = range(start, stop, step)
    assert d.length == range_length(start, stop, step)
    if not d.length:
        return
    positions = np.array([int(w * d.length) for w in where], np.int64)
    assert d.at(positions).tolist() == [r[int(p)] for p in positions]


def test_dimension_of_2_to_the_64_costs_nothing_until_asked() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d = Dimension.parse("s", "gen[0].dimensions.i", {"start": -INT64_MAX, "stop": INT64_MAX})
    assert d.length == 2 * INT64_MAX
    assert d.at(np.array([0, 2 * INT64_MAX - 1], np.uint64).astype(np.int64)).tolist() == [
        -INT64_MAX, INT64_MAX - 1]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB


def test_listed_dimension_keeps_its_order() -> None:
    d = Dimension.parse("s", "w", [5, -3, 7])
    assert d.length == 3 and d.at(np.array([2, 0, 1])).tolist() == [7, 5, -3]


@pytest.mark.parametrize(("dims", "products"), [
    ({"i": {"stop": 2**30}}, "1,073,741,824"),
    ({"i": {"stop": 250_000}, "j": {"stop": 250_000}}, "62,500,000,000"),
    ({"i": {"start": -INT64_MAX, "stop": INT64_MAX}}, "18,446,744,073,709,551,614"),
])
def test_gen_past_max_keys_is_refused_before_any_key_is_made(tmp_path: Path, dims: dict,
                                                             products: str) -> None:
    src = write(tmp_path / "g.json", {"version": 1, "gen": [gen("k/{{i}}", dims)]})
    for read in (lambda: build_index(src, {}), lambda: inspect(src, {}),
                 lambda: expand(src, open("/dev/null", "w"), {})):  # noqa: SIM115
        t = time.process_time()
        with pytest.raises(ReferenceSetError, match=rf"gen\[0\] has {products} products.*"
                                                    r"limit max_keys=20000000\)$"):
            read()
        assert time.process_time() - t < 1.0


def test_max_keys_counts_every_entry_and_the_refs_before_any_is_made(tmp_path: Path) -> None:
    limits = Limits(max_keys=1000)
    three = {"version": 1, "gen": [gen(f"k{n}/{{{{i}}}}", {"i": {"stop": 400}}) for n in range(3)]}
    with pytest.raises(ReferenceSetError, match=r"gen\[2\] has 400 products, a key each "
                       r"\(1,200 keys with the 800 before it\).*max_keys=1000"):
        build_index(write(tmp_path / "three.json", three), {}, limits=limits)
    refs = {"version": 1, "refs": {f"r{n}": "x" for n in range(700)},
            "gen": [gen("k/{{i}}", {"i": {"stop": 400}})]}
    with pytest.raises(ReferenceSetError, match=r"gen\[0\] has 400 products.*1,100 keys with "
                       r"the 700 before it"):
        build_index(write(tmp_path / "refs.json", refs), {}, limits=limits)
    exact = {"version": 1, "refs": {f"r{n}": "x" for n in range(600)},
             "gen": [gen("k/{{i}}", {"i": {"stop": 400}})]}
    b = build_index(write(tmp_path / "exact.json", exact), {}, limits=limits)
    assert KeyIndex(b.finish()).n == 1000


def test_max_keys_bounds_a_version_0_set(tmp_path: Path) -> None:
    src = write(tmp_path / "v0.json", {f"k{n}": "x" for n in range(70_000)})
    with pytest.raises(ReferenceSetError, match=r"more than 65,536 keys \(limit max_keys=65536\)"):
        build_index(src, {}, limits=Limits(max_keys=1 << 16)).finish()
    assert KeyIndex(build_index(src, {}, limits=Limits(max_keys=70_000)).finish()).n == 70_000


def test_gen_expands_in_batches_with_values_of_the_ranges(tmp_path: Path) -> None:
    doc = {"version": 1, "gen": [{
        "key": "g/{{i}}.{{j}}", "url": "/d/{{ '%03d' % i }}", "offset": "{{(j + 5) * 10}}", "length": "10",
        "dimensions": {"i": {"start": 2**40, "stop": 2**40 + 30, "step": 7},
                       "j": {"start": 5, "stop": -5, "step": -3}}}]}
    index = KeyIndex(build_index(write(tmp_path / "g.json", doc), {}).finish())
    refs = {k.decode(): (r.url, r.offset, r.length) for k, r in index.iter_refs()}
    expected = {f"g/{i}.{j}": (f"/d/{i:03d}", (j + 5) * 10, 10)
                for i in range(2**40, 2**40 + 30, 7) for j in range(5, -5, -3)}
    assert refs == expected


# ---- the template budget -----------------------------------------------------------------

LOOP = "{% for i in range(N) %}{% for j in range(1000) %}{% set x = i * j %}{% endfor %}{% endfor %}"


def test_render_budget_counts_cpu_time_once_for_nested_renderings() -> None:
    budget = RenderBudget(0.05)
    with budget.running():
        assert budget.active
        with budget.running():
            t = time.thread_time()
            while time.thread_time() - t < 0.03:
                pass
    assert not budget.active and 0.03 <= budget.spent < 0.2 and not budget.exceeded()
    with budget.running():
        t = time.thread_time()
        while time.thread_time() - t < 0.03:
            pass
    assert budget.exceeded() and "max_template_seconds=0.05" in budget.message()


def test_many_distinct_url_templates_are_refused_past_the_budget(tmp_path: Path) -> None:
    """Each rendering is far below the 2 s watchdog; together they pass the set's budget,
    and the parse stops at it, not after all of them."""
    loop = LOOP.replace("N", "50")  # about 0.05 CPU s
    doc = {"version": 1, "refs": {f"k{n}": [f"/dev/null{loop}{{# {n} #}}", 0, 1] for n in range(200)}}
    src = write(tmp_path / "tpl.json", doc)
    t = time.process_time()
    with pytest.raises(ReferenceSetError, match=r"refs url: the set's templates take more than "
                       r"1 CPU seconds to render in all \(limit max_template_seconds=1\)"):
        build_index(src, {}, limits=Limits(max_template_seconds=1.0))
    assert time.process_time() - t < 3.0


def test_gen_rendered_product_by_product_is_refused_past_the_budget(tmp_path: Path) -> None:
    doc = {"version": 1, "gen": [gen("g/{{ i|string }}", {"i": {"stop": 1_000_000}})]}
    src = write(tmp_path / "gen.json", doc)
    t = time.process_time()
    with pytest.raises(ReferenceSetError, match=r"gen\[0\]\.key: the set's templates take more "
                       r"than 0.5 CPU seconds"):
        build_index(src, {}, limits=Limits(max_template_seconds=0.5))
    assert time.process_time() - t < 3.0
    small = {"version": 1, "gen": [gen("g/{{ i|string }}", {"i": {"stop": 1000}})]}
    index = KeyIndex(build_index(write(tmp_path / "small.json", small), {},
                                 limits=Limits(max_template_seconds=0.5)).finish())
    assert index.n == 1000


# ---- the bytes of keys and URLs a set makes (max_generated) --------------------------------------


def tree(chars: int) -> str:
    """A path of about ``chars`` characters that passes every key check (199-character names)."""
    return "/".join(["d" * 199] * (chars // 200))


def test_gen_whose_fixed_text_passes_max_generated_is_refused_before_any_key_is_made(
        tmp_path: Path) -> None:
    p = tree(60_000)
    doc = {"version": 1, "templates": {"p": p}, "gen": [gen("{{p}}/{{i}}", {"i": {"stop": 10_000}})]}
    src = write(tmp_path / "g.json", doc)
    for read in (lambda: build_index(src, {}), lambda: inspect(src, {})):
        t = time.process_time()
        with pytest.raises(ReferenceSetError, match=r"gen\[0\]: 10,000 keys of at least 60,001 "
                           r"bytes: .*limit max_generated=512M\)$"):
            read()
        assert time.process_time() - t < 1.0
    # counted with the refs before it, and within the bound the set is read
    limits = Limits(max_generated=1 << 20)
    small = {"version": 1, "templates": {"p": "x" * 100}, "refs": {"r": ["/d/" + "u" * 30_000]},
             "gen": [gen("{{p}}/{{i}}", {"i": {"stop": 10_000}})]}
    with pytest.raises(ReferenceSetError, match=r"gen\[0\]: 10,000 keys of at least 102 bytes "
                       r"\(with the 30,004 bytes before it\).*max_generated=1M\)$"):
        build_index(write(tmp_path / "s.json", small), {}, limits=limits)
    assert KeyIndex(build_index(write(tmp_path / "s.json", small), {}).finish()).n == 10_001
    small = {**small, "refs": {}, "gen": [gen("{{p}}/{{i}}", {"i": {"stop": 9_000}})]}
    assert KeyIndex(build_index(write(tmp_path / "s.json", small), {}, limits=limits).finish()).n \
        == 9_000


def test_gen_whose_every_key_is_over_max_key_length_is_refused_before_expanding(
        tmp_path: Path) -> None:
    doc = {"version": 1, "templates": {"p": tree(70_000)},
           "gen": [gen("{{p}}/{{i}}", {"i": {"stop": 1_000_000}})]}
    src = write(tmp_path / "g.json", doc)
    t = time.process_time()
    with pytest.raises(ReferenceSetError, match=r"gen\[0\]\.key: every key is longer than 65,536 "
                       r"bytes \(limit max_key_length=64K\)$"):
        build_index(src, {})
    b = build_index(src, {}, "skip")  # skipped whole, none made
    assert KeyIndex(b.finish()).n == 0 and b.skipped_unnamed == 999_999
    assert b.skipped == ["gen[0]: every one of its 1,000,000 keys is longer than 65,536 bytes "
                         "(limit max_key_length=64K)"]
    assert time.process_time() - t < 1.0


@pytest.mark.parametrize("key", ["{{p}}{{i}}", "{{ p|string }}{{i}}"])  # columns; rendered
def test_keys_over_max_key_length_are_refused_in_the_batch_that_makes_them(
        tmp_path: Path, key: str) -> None:
    """Keys of 98 to 101 characters under max_key_length=100: the shortest fits, so the entry
    is expanded, and the first key over it stops the parse (or is skipped at once)."""
    limits = Limits(max_key_length=100)
    doc = {"version": 1, "templates": {"p": "k" * 97}, "gen": [gen(key, {"i": {"stop": 2000}})]}
    src = write(tmp_path / "g.json", doc)
    with pytest.raises(ReferenceSetError, match=r"gen\[0\](\.key)?: key 'k{77}\.\.\.' is longer than "
                       r"100 bytes \(limit max_key_length=100\)$"):
        build_index(src, {}, limits=limits)
    b = build_index(src, {}, "skip", limits=limits)
    index = KeyIndex(b.finish())
    assert index.n == 1000 and len(b.skipped) == 1000
    assert index.key(999) == ("k" * 97 + "999").encode()


def test_rendered_keys_are_counted_against_max_generated_as_they_are_made(tmp_path: Path) -> None:
    """Only rendering tells how long ``p|string`` is: the fixed text passes the check before
    expanding, the renderings are refused once they pass the bound, not after all of them."""
    doc = {"version": 1, "templates": {"p": tree(60_000)},
           "gen": [gen("{{ p|string }}/{{i}}", {"i": {"stop": 1_000_000}})]}
    t = time.process_time()
    with pytest.raises(ReferenceSetError, match=r"gen\[0\]\.key: the set's keys and URLs come to "
                       r"more than 16,777,216 bytes \(limit max_generated=16M\)$"):
        build_index(write(tmp_path / "g.json", doc), {}, limits=Limits(max_generated=16 << 20))
    assert time.process_time() - t < 2.0


def test_distinct_gen_urls_are_counted_against_max_generated(tmp_path: Path) -> None:
    doc = {"version": 1, "templates": {"p": "u" * 10_000},
           "gen": [gen("k/{{i}}", {"i": {"stop": 1_000_000}}, url="/d/{{p}}{{i}}")]}
    t = time.process_time()
    with pytest.raises(ReferenceSetError, match=r"gen\[0\]: the set's keys and URLs come to more "
                       r"than 16,777,216 bytes \(limit max_generated=16M\)$"):
        build_index(write(tmp_path / "g.json", doc), {}, limits=Limits(max_generated=16 << 20))
    assert time.process_time() - t < 2.0
    same = {"version": 1, "templates": {"p": "u" * 10_000},  # one URL: counted once
            "gen": [gen("k/{{i}}", {"i": {"stop": 100_000}}, url="/d/{{p}}")]}
    b = build_index(write(tmp_path / "same.json", same), {}, limits=Limits(max_generated=16 << 20))
    assert KeyIndex(b.finish()).n == 100_000


def test_rendered_refs_urls_are_counted_against_max_generated(tmp_path: Path) -> None:
    doc = {"version": 1, "refs": {f"k{n}": [f"/d/{{{{ 'x' * 100000 }}}}{n}", 0, 1]
                                  for n in range(100)}}
    with pytest.raises(ReferenceSetError, match=r"the URL of key 'k10': the set's keys and URLs "
                       r"come to more than 1,048,576 bytes \(limit max_generated=1M\)$"):
        build_index(write(tmp_path / "r.json", doc), {}, limits=Limits(max_generated=1 << 20))
    keys = {"version": 1, "refs": {f"{n:0100d}": "x" for n in range(70_000)}}
    with pytest.raises(ReferenceSetError, match=r": refs: the set's keys and URLs come to more "
                       r"than 1,048,576 bytes"):
        build_index(write(tmp_path / "k.json", keys), {}, limits=Limits(max_generated=1 << 20))


def test_urls_rendered_for_refs_are_cached_within_a_bound_of_bytes(tmp_path: Path) -> None:
    """300 URL templates that render the same 1 MB URL: the cache of renderings (keyed by
    template) keeps a few of them, not 300 MB."""
    import tracemalloc

    doc = {"version": 1, "refs": {f"k{n}": [f"/d/{{{{ 'x' * 1000000 }}}}{{# {n} #}}", 0, 1]
                                  for n in range(300)}}
    src = write(tmp_path / "r.json", doc)
    tracemalloc.start()
    try:
        b = build_index(src, {})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert KeyIndex(b.finish()).n == 300
    assert peak < 64 << 20, f"{peak:,} bytes"
