"""refmount.http.cors: the headers of every response and of the OPTIONS preflight."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from refmount.http.cors import cors_headers, cors_problem, origin_allowed, parse_origins, preflight_headers

VIEWER = "https://viewer.example.org"
EXPOSE = "Content-Range, Content-Length, ETag, Accept-Ranges"


def test_off() -> None:
    assert cors_headers(None, VIEWER) == {}
    assert cors_headers("", VIEWER) == {}
    assert preflight_headers(None, VIEWER, "GET", "range") == {}


def test_any_origin() -> None:
    expected = {"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": EXPOSE}
    assert cors_headers("*", VIEWER) == expected
    assert cors_headers("*", None) == expected  # curl sends no Origin: harmless
    assert "Vary" not in cors_headers("*", VIEWER)


def test_origin_list() -> None:
    allowed = "https://a.example.org | https://Viewer.example.org/"
    assert parse_origins(allowed) == {"https://a.example.org", VIEWER}
    assert cors_headers(allowed, VIEWER) == {
        "Access-Control-Allow-Origin": VIEWER, "Vary": "Origin", "Access-Control-Expose-Headers": EXPOSE,
    }
    assert cors_headers(allowed, "https://evil.example.org") == {"Vary": "Origin"}
    assert cors_headers(allowed, None) == {"Vary": "Origin"}
    assert cors_headers(allowed, "null") == {"Vary": "Origin"}
    for sneaky in (VIEWER + "\r\nSet-Cookie: x=1", " " + VIEWER, VIEWER + "\n", VIEWER + "\t"):
        assert cors_headers(allowed, sneaky) == {"Vary": "Origin"}, sneaky
    assert origin_allowed("https://a.example.org https://b.example.org", "https://b.example.org")
    assert not origin_allowed(VIEWER, VIEWER + ".evil.org")
    assert parse_origins("https://a.example.org|*") is None


def test_preflight_for_range() -> None:
    h = preflight_headers("*", VIEWER, "GET", "range")
    assert h["Access-Control-Allow-Origin"] == "*"
    assert h["Access-Control-Allow-Methods"] == "GET, HEAD"
    assert "Range" in h["Access-Control-Allow-Headers"]
    assert "If-None-Match" in h["Access-Control-Allow-Headers"]
    assert int(h["Access-Control-Max-Age"]) > 0
    h = preflight_headers(VIEWER, VIEWER, "HEAD", "Range, If-None-Match, authorization")
    assert h["Access-Control-Allow-Origin"] == VIEWER
    assert h["Vary"] == "Origin"
    assert preflight_headers("*", VIEWER, "GET", None)["Access-Control-Allow-Methods"] == "GET, HEAD"


def test_preflight_refusals() -> None:
    # A write method, an unknown header, an origin not listed: no Allow-Methods, so the
    # browser refuses the actual request.
    for h in (
        preflight_headers("*", VIEWER, "PUT", "range"),
        preflight_headers("*", VIEWER, "GET", "range, x-custom"),
        preflight_headers("https://a.example.org", VIEWER, "GET", "range"),
        preflight_headers("*", VIEWER, None, None),
    ):
        assert "Access-Control-Allow-Methods" not in h
        assert "Access-Control-Allow-Headers" not in h


def test_problem_with_a_cors_value() -> None:
    for good in ("*", VIEWER, "http://127.0.0.1:8080", "https://a.org|https://b.org:8443/",
                 "http://[::1]:9000", "HTTPS://Viewer.Example.org"):
        assert cors_problem(good) is None, good
    for bad in ("", "  ", "viewer.example.org", "https://a.org/path", "ftp://a.org",
                "https://user@a.org", "https://a.org|nope", "https://a.org?x=1"):
        problem = cors_problem(bad)
        assert problem is not None and problem.startswith("cors"), bad
        assert "\n" not in problem


@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=40)), st.text(max_size=40))
def test_any_input_is_answered(allowed: str, origin: str | None, asked: str) -> None:
    headers = preflight_headers(allowed, origin, "GET", asked)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    assert cors_problem(allowed) is None or cors_problem(allowed).startswith("cors")
