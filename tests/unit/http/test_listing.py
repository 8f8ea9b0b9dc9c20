"""refmount.http.listing: the HTML index read by fsspec's own listing code, JSON, the choice.

fsspec's ``HTTPFileSystem`` lists a directory with its real code (``_ls``, its async API)
over a session that answers from a dict: no server. GDAL's parser is C++ and is run for real
against nginx serving these pages in tests/fuse/test_listing_clients.py.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import unquote_to_bytes

import pytest
from fsspec.implementations.http import HTTPFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.http.listing import Entry, html_index, iter_html_index, iter_json_index, json_index, wants_json

BASE = "http://127.0.0.1:8080"
# Names may be any bytes but "/": quotes, markup, URL syntax, control bytes, non-UTF-8.
NAMES = [
    b"plain.bin", b".zarray", b"0.0.0", b"a b", "ünï".encode(), b"x&y", b"q?z", b"%41",
    b'a"b', b"it's", b"<b>", b"#frag", b"\xff\xfe", b"new\nline", b"tab\there", b"-Jan-x",
    b"?C=N;O=D", b"http:", b"..a", b"Parent Directory",
]


class _Response:
    def __init__(self, page: bytes) -> None:
        self.status = 200
        self.headers = {"Content-Type": "text/html; charset=utf-8"}
        self._page = page

    async def __aenter__(self) -> _Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def text(self, errors: str = "strict") -> str:
        return self._page.decode("utf-8", errors)

    def raise_for_status(self) -> None:
        return None


class _Session:
    """Answers GET with the page stored for the URL."""

    def __init__(self, pages: dict[str, bytes]) -> None:
        self.pages = pages

    def get(self, url: object, **kwargs: object) -> _Response:
        return _Response(self.pages[str(url)])

    async def close(self) -> None:
        return None


def fsspec_ls(pages: dict[str, bytes], url: str) -> list[dict]:
    async def go() -> list[dict]:
        async def client(**kwargs: object) -> _Session:
            return _Session(pages)

        fs = HTTPFileSystem(asynchronous=True, get_client=client, skip_instance_cache=True)
        return await fs._ls(url, detail=True)

    return asyncio.run(go())


def names_from_fsspec(listing: list[dict], directory: str) -> set[tuple[bytes, bool]]:
    out = set()
    for item in listing:
        assert item["name"].startswith(directory)
        rel = item["name"][len(directory):]
        is_dir = item["type"] == "directory"
        out.add((unquote_to_bytes(rel.rstrip("/")), is_dir))
    return out


def test_fsspec_lists_every_name_exactly() -> None:
    entries = [Entry(n, False, 7) for n in NAMES] + [Entry(b"sub dir", True, None), Entry("d&<", True, None)]
    for path in ("/", "/group/sub/"):
        page = html_index(path, entries, mtime=1_790_000_000)
        url = BASE + path
        got = names_from_fsspec(fsspec_ls({url: page}, url), url)
        expected = {(n, False) for n in NAMES} | {(b"sub dir", True), (b"d&<", True)}
        assert got == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b not in (b".", b"..")),
                min_size=1, max_size=8, unique=True))
def test_fsspec_lists_any_names(names: list[bytes]) -> None:
    url = BASE + "/d/"
    page = html_index("/d/", [Entry(n, False, None) for n in names])
    assert names_from_fsspec(fsspec_ls({url: page}, url), url) == {(n, False) for n in names}


def gdal_like(page: bytes) -> list[str]:
    """The shape GDAL's line parser needs (the real GDAL runs in the serve tier)."""
    lines = page.decode().split("\n")
    assert sum("<table" in line for line in lines) <= 1
    names = []
    for line in lines:
        assert line.count('<a href="') <= 1
        if '<a href="' in line:
            href = line.split('<a href="', 1)[1].split('"', 1)[0]
            if href not in ("../", ".."):
                names.append(href)
    return names


def test_html_shape() -> None:
    page = html_index("/a b/c/", [Entry(b"new\nline", False, 3), Entry(b"z", True, None)], 0)
    text = page.decode()
    assert "<title>Index of /a b/c</title>" in text
    assert gdal_like(page) == ["new%0Aline", "z/"]
    assert "new%0Aline</a> 01-Jan-1970 00:00" in text
    assert html_index("/", [])
    assert "<title>Index of /</title>" in html_index("/", []).decode()
    assert "<title>Index of /%3Cb%3E</title>" in html_index(b"/<b>/", []).decode()
    assert "<title>Index of /%FF</title>" in html_index(b"/\xff/", []).decode()
    assert b"<b>" not in html_index(b"/", [Entry(b"<b>", False, 1)])
    assert "http://" not in html_index("/", [Entry(n, False, 1) for n in NAMES]).decode()


def test_json_index() -> None:
    doc = json.loads(json_index(b"/g", [Entry(b"\xff x", False, 5), Entry("sub", True, None),
                                        Entry(".zattrs", False, None)]))
    assert doc == {
        "path": "/g/",
        "entries": [
            {"name": "\ufffd x", "href": "%FF%20x", "type": "file", "size": 5},
            {"name": "sub", "href": "sub/", "type": "directory", "size": None},
            {"name": ".zattrs", "href": ".zattrs", "type": "file", "size": None},
        ],
    }


def test_streamed_in_bounded_pieces() -> None:
    taken = []

    def entries():
        for i in range(20_000):
            taken.append(i)
            yield Entry(f"c{i}.0", False, i)

    pieces = iter_html_index("/big/", entries(), 0, chunk=4096)
    first = next(pieces)
    assert len(taken) < 200  # entries are read as the page is written, not all at once
    rest = list(pieces)
    assert all(len(p) < 4096 + 200 for p in [first, *rest])
    whole = html_index("/big/", (Entry(f"c{i}.0", False, i) for i in range(20_000)), 0)
    assert b"".join([first, *rest]) == whole
    doc = b"".join(iter_json_index("/big/", (Entry(f"c{i}", False, i) for i in range(5000)), chunk=1024))
    last = {"name": "c4999", "href": "c4999", "type": "file", "size": 4999}
    assert json.loads(doc)["entries"][4999] == last
    assert json.loads(json_index("/", [])) == {"path": "/", "entries": []}


@pytest.mark.parametrize(
    ("accept", "query", "expected"),
    [
        (None, "", False),
        ("*/*", "", False),  # fsspec (aiohttp), GDAL (curl)
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "", False),  # Chromium
        ("application/json", "", True),
        ("application/json, text/html;q=0.5", "", True),
        ("text/html, application/json", "", False),  # a tie goes to HTML
        ("application/*", "", True),
        ("application/json;q=0", "", False),
        ("application/json;q=x", "", False),
        ("text/html", "format=json", True),
        ("application/json", "format=html", False),
        (None, "a=1&format=JSON", True),
        (None, "format=", False),
    ],
)
def test_wants_json(accept: str | None, query: str, expected: bool) -> None:
    assert wants_json(accept, query) is expected


@given(st.text(max_size=80), st.text(max_size=40))
def test_wants_json_answers_any_header(accept: str, query: str) -> None:
    assert wants_json(accept, query) in (True, False)
