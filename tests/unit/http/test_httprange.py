"""refmount.http.ranges: the Range header against nginx's answers and against a simple model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refmount.http.ranges import (
    ByteRange,
    RangeNotSatisfiable,
    content_range,
    if_range_matches,
    parse_range,
    unsatisfied_range,
)

WHOLE = "200"
BAD = "416"

# Debian nginx 1.22's static module on a 100-byte and an empty file (curl, status and
# Content-Range), where this module answers the same.
NGINX_100 = {
    "bytes=0-9": (0, 10),
    "bytes=90-": (90, 100),
    "bytes=-10": (90, 100),
    "bytes=-0": BAD,
    "bytes=-200": (0, 100),
    "bytes=100-": BAD,
    "bytes=0-": (0, 100),
    "bytes=-5": (95, 100),
    "bytes= 1 - 2 ": (1, 3),
    "BYTES=0-1": (0, 2),
    "bytes=0-9,200-300": (0, 10),  # the one satisfiable range, single part
    "bytes=200-300,300-400": BAD,
    "items=0-5": WHOLE,
    "bytes=": WHOLE,
    "bytes=99-99": (99, 100),
    "bytes=50-1000": (50, 100),
}
NGINX_EMPTY = {
    "bytes=0-9": WHOLE,
    "bytes=90-": BAD,
    "bytes=-10": WHOLE,
    "bytes=-0": WHOLE,
    "bytes=100-": BAD,
    "bytes=0-9,20-29": WHOLE,
    "bytes=200-300,300-400": BAD,
    "bytes=0-": WHOLE,
    "bytes= 1 - 2 ": BAD,
    "items=0-5": WHOLE,
    "bytes=0-1,": WHOLE,
}
# Where nginx differs, by the documented choice: multipart becomes the whole body, an invalid
# header is ignored instead of 416, an empty list element is skipped (RFC 9110, 5.6.1).
CHOSEN_100 = {
    "bytes=0-9,20-29": WHOLE,  # nginx: multipart/byteranges
    "bytes=0-9,5-15": WHOLE,  # nginx: multipart/byteranges
    "bytes=abc": WHOLE,  # nginx: 416
    "bytes=1-2-3": WHOLE,  # nginx: 416
    "bytes=5-2": WHOLE,  # nginx: 416
    "bytes=0-1,": (0, 2),  # nginx: 416
    "bytes=,0-1": (0, 2),  # nginx: 416
    "bytes=+1-2": WHOLE,
    "bytes=\u0661-2": WHOLE,  # a non-ASCII digit is not a digit here
    "bytes=0x10-": WHOLE,
}


def answer(header: str | None, size: int) -> str | tuple[int, int]:
    try:
        r = parse_range(header, size)
    except RangeNotSatisfiable as e:
        assert e.size == size
        return BAD
    return WHOLE if r is None else (r.start, r.stop)


@pytest.mark.parametrize(("header", "expected"), sorted({**NGINX_100, **CHOSEN_100}.items()))
def test_hundred_bytes(header: str, expected) -> None:
    assert answer(header, 100) == expected


@pytest.mark.parametrize(("header", "expected"), sorted(NGINX_EMPTY.items()))
def test_empty_body(header: str, expected) -> None:
    assert answer(header, 0) == expected


def test_no_header_is_the_whole_body() -> None:
    assert parse_range(None, 10) is None
    assert parse_range(None, 0) is None


def test_huge_numbers_stay_bounded() -> None:
    digits = "9" * 10_000  # int() refuses this many digits
    assert answer(f"bytes=0-{digits}", 10) == (0, 10)
    assert answer(f"bytes=-{digits}", 10) == (0, 10)
    assert answer(f"bytes={digits}-", 10) == BAD
    assert answer("bytes=" + "0" * 5000 + "3-4", 10) == (3, 5)


def test_header_strings() -> None:
    assert content_range(ByteRange(0, 10), 100) == "bytes 0-9/100"
    assert content_range(ByteRange(99, 100), 100) == "bytes 99-99/100"
    assert unsatisfied_range(100) == "bytes */100"
    assert unsatisfied_range(0) == "bytes */0"
    assert len(ByteRange(5, 8)) == 3
    with pytest.raises(ValueError):
        content_range(ByteRange(0, 11), 10)
    with pytest.raises(ValueError):
        ByteRange(3, 3)


def test_if_range() -> None:
    tag = '"abc"'
    assert if_range_matches(None, tag)
    assert if_range_matches('"abc"', tag)
    assert not if_range_matches('"abd"', tag)
    assert not if_range_matches('W/"abc"', tag)
    assert not if_range_matches("Thu, 26 Nov 2026 12:00:00 GMT", tag)


# The model: RFC 9110's satisfiable ranges of a header built from specs, then the choice.
Spec = tuple[int | None, int | None]  # (first, last) or (None, suffix length)

positions = st.integers(min_value=0, max_value=300)
specs = st.one_of(
    st.tuples(positions, st.none()),
    st.tuples(positions, positions).map(lambda t: (min(t), max(t))),
    st.tuples(st.none(), positions),
)


def model(spec_list: list[Spec], size: int) -> str | tuple[int, int]:
    ranges: list[tuple[int, int]] = []
    for first, second in spec_list:
        if first is None:
            assert second is not None
            if size == 0:
                return WHOLE
            if second > 0:
                ranges.append((max(0, size - second), size))
        elif first < size:
            ranges.append((first, size if second is None else min(second + 1, size)))
        elif size == 0 and first == 0:
            return WHOLE
    if len(ranges) == 1:
        return ranges[0]
    return WHOLE if ranges else BAD


def render(spec: Spec) -> str:
    first, second = spec
    if first is None:
        return f"-{second}"
    return f"{first}-" if second is None else f"{first}-{second}"


@given(st.lists(specs, min_size=1, max_size=4), st.integers(min_value=0, max_value=300),
       st.sampled_from([",", ", ", " ,", ",\t"]))
def test_against_model(spec_list: list[Spec], size: int, sep: str) -> None:
    header = "bytes=" + sep.join(render(s) for s in spec_list)
    assert answer(header, size) == model(spec_list, size)


@given(st.text(max_size=40), st.integers(min_value=0, max_value=1000))
def test_any_header_gives_a_valid_answer(header: str, size: int) -> None:
    result = answer(header, size)
    if isinstance(result, tuple):
        start, stop = result
        assert 0 <= start < stop <= size
        assert content_range(ByteRange(start, stop), size).startswith("bytes ")
