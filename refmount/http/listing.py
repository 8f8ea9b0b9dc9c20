"""Directory listings for the HTTP front end: an autoindex-style HTML page, or JSON.

HTTP has no listing of its own; clients that list a remote directory parse the HTML index
page a server such as Apache or nginx writes. ``html_index`` writes nginx's ``autoindex``
layout, which both parsers in use accept:

* GDAL's ``/vsicurl/`` (``ParseHTMLFileList`` in ``port/cpl_vsil_curl.cpp``) reads the page
  line by line: a ``<title>Index of /dir/</title>`` line marks it a listing, then each line
  holding ``<a href="`` gives one entry, the name up to the closing quote, a trailing ``/``
  for a directory; ``..`` is skipped, as is any line naming ``Parent Directory``, a second
  ``<table`` makes it give up, and an Apache-style ``DD-Mon-YYYY HH:MM`` date on the line is
  the entry's time. So: one entry per line, no table, the title naming the directory's path
  as the client wrote it or unescaped.
* fsspec's ``HTTPFileSystem.ls`` takes every ``<a href="...">`` value (and, with
  ``simple_links``, anything in the text that looks like an ``http://`` URL), joins relative
  ones to the directory's URL, ignores ``..``/``../`` and treats a trailing ``/`` as a
  directory. So: relative links only, no query links (Apache's sort links would be listed as
  files), and no absolute URL anywhere in the text.

Names are any bytes but ``/``: each ``href`` is the name percent-encoded byte for byte (every
byte but ``A-Za-z0-9_.-~``, and the ``h`` of a leading ``http`` as ``%68``, which fsspec
would take for an absolute URL), so it contains no quote and is the URL of the entry relative
to the directory; the link text is the name HTML-escaped, with undecodable bytes shown as U+FFFD
and control characters as ``%XX`` (and the space of ``Parent Directory``, a phrase GDAL
skips lines for, as ``&#32;``). GDAL 3.6 lists the names as the ``href`` values, still
percent-encoded, which is how it then requests them. It accepts the title
``Index of /a/b`` where ``/a/b`` is the path as requested or, when that contains ``%``, the
path unescaped (without a trailing slash): so the title shows the path unescaped and
without its trailing slash (``/`` for the root), and percent-encoded as ``href`` values are
when it contains one of ``<>&"'``, a control character or undecodable bytes (GDAL, walking
the tree from the listing, requests such a directory by the ``href`` it was given).

``json_index`` is the same listing for programs: ``{"path", "entries": [{"name", "href",
"type", "size"}]}``; ``wants_json`` picks it for ``?format=json`` or an ``Accept`` that
prefers ``application/json`` to ``text/html``.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple
from urllib.parse import parse_qs, quote

__all__ = ["Entry", "html_index", "iter_html_index", "iter_json_index", "json_index", "wants_json"]


class Entry(NamedTuple):
    """One name in a directory: ``size`` is ``None`` when unknown (and for directories)."""

    name: str | bytes
    is_dir: bool
    size: int | None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _raw(name: str | bytes) -> bytes:
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


def _href(name: str | bytes, is_dir: bool) -> str:
    href = quote(_raw(name), safe="") + ("/" if is_dir else "")
    if href.startswith("http"):
        href = "%68" + href[1:]  # fsspec takes a link starting with "http" for an absolute URL
    return href


def _text(name: str | bytes) -> str:
    shown = _raw(name).decode("utf-8", "replace")
    text = html.escape(_CONTROL.sub(lambda m: f"%{ord(m.group()):02X}", shown), quote=True)
    # GDAL skips any line that says "Parent Directory" (Apache's link to "..").
    return text.replace("Parent Directory", "Parent&#32;Directory")


def _dir_path(path: str | bytes) -> bytes:
    raw = _raw(path)
    if not raw.startswith(b"/"):
        raw = b"/" + raw
    return raw if raw.endswith(b"/") else raw + b"/"


def _title(path: str | bytes) -> str:
    raw = _dir_path(path)
    if raw != b"/":
        raw = raw[:-1]  # GDAL looks for "Index of /a/b" (the trailing slash is optional)
    shown = raw.decode("utf-8", "replace")
    if _CONTROL.search(shown) or any(c in shown for c in "<>&\"'\ufffd"):
        return quote(raw, safe="/")
    return shown


def html_index(path: str | bytes, entries: Iterable[Entry | tuple], mtime: float | None = None) -> bytes:
    """An nginx-``autoindex``-style page listing ``entries`` of the directory at URL ``path``.

    ``path`` is the directory's decoded URL path (``/``, ``/group/sub/``). ``mtime``, when
    given, is shown as every entry's date (``DD-Mon-YYYY HH:MM``, UTC), followed by the size
    (``-`` for a directory or an unknown size).
    """
    return b"".join(iter_html_index(path, entries, mtime))


def iter_html_index(path: str | bytes, entries: Iterable[Entry | tuple], mtime: float | None = None,
                    *, chunk: int = 64 << 10) -> Iterator[bytes]:
    """``html_index`` in pieces of about ``chunk`` bytes, for streaming a large directory
    while ``entries`` are produced (memory bounded by ``chunk``, not the directory)."""
    title = _title(path)
    date = time.strftime("%d-%b-%Y %H:%M", time.gmtime(mtime)) if mtime is not None else None
    head = (
        "<!DOCTYPE html>\n<html>\n"
        f'<head><meta charset="utf-8"><title>Index of {title}</title></head>\n<body>\n'
        f'<h1>Index of {title}</h1><hr><pre><a href="../">../</a>\n'
    )

    def lines() -> Iterator[str]:
        yield head
        for name, is_dir, size in entries:
            line = f'<a href="{_href(name, is_dir)}">{_text(name)}{"/" if is_dir else ""}</a>'
            if date is not None:
                shown_size = "-" if is_dir or size is None else str(size)
                line += f" {date} {shown_size:>19}"
            yield line + "\n"
        yield "</pre><hr></body>\n</html>\n"

    yield from in_pieces(lines(), chunk)


def in_pieces(parts: Iterable[str], chunk: int, head: bytes = b"",
              errors: str = "strict") -> Iterator[bytes]:
    """``head``, then ``parts`` encoded as UTF-8 (with ``errors``), joined into pieces of about
    ``chunk`` bytes: a document streamed in bounded pieces."""
    buf: list[bytes] = [head] if head else []
    held = len(head)
    for part in parts:
        data = part.encode("utf-8", errors)
        buf.append(data)
        held += len(data)
        if held >= chunk:
            yield b"".join(buf)
            buf, held = [], 0
    if buf:
        yield b"".join(buf)


def _json_entry(name: str | bytes, is_dir: bool, size: int | None) -> str:
    return json.dumps(
        {
            "name": _raw(name).decode("utf-8", "replace"),
            "href": _href(name, is_dir),
            "type": "directory" if is_dir else "file",
            "size": None if is_dir else size,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


def json_index(path: str | bytes, entries: Iterable[Entry | tuple]) -> bytes:
    """The listing as JSON: ``{"path": ..., "entries": [{"name", "href", "type", "size"}]}``.

    ``name`` is the name decoded as UTF-8 (U+FFFD for undecodable bytes), ``href`` its exact
    percent-encoded form relative to the directory, ``type`` ``"directory"`` or ``"file"``,
    ``size`` the size in bytes or ``null``.
    """
    return b"".join(iter_json_index(path, entries))


def iter_json_index(path: str | bytes, entries: Iterable[Entry | tuple], *,
                    chunk: int = 64 << 10) -> Iterator[bytes]:
    """``json_index`` in pieces of about ``chunk`` bytes (see ``iter_html_index``)."""
    shown = json.dumps(_dir_path(path).decode("utf-8", "replace"), ensure_ascii=False)

    def parts() -> Iterator[str]:
        yield f'{{"path":{shown},"entries":['
        for i, (name, is_dir, size) in enumerate(entries):
            yield ("," if i else "") + _json_entry(name, is_dir, size)
        yield "]}"

    yield from in_pieces(parts(), chunk)


def _quality(accept: str, media: str) -> float:
    """The q of ``media`` under ``accept``: from the most specific matching range."""
    kind = media.split("/", 1)[0] + "/*"
    best: tuple[int, float] = (-1, 0.0)
    for item in accept.split(","):
        fields = [f.strip() for f in item.split(";")]
        rng = fields[0].lower()
        specificity = {media: 2, kind: 1, "*/*": 0}.get(rng)
        if specificity is None:
            continue
        q = 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        if specificity > best[0]:
            best = (specificity, q)
    return best[1]


def wants_json(accept: str | None, query: str) -> bool:
    """Whether a listing request asks for JSON rather than HTML.

    ``query`` is the raw query string: ``format=json`` or ``format=html`` decides. Otherwise
    JSON only when ``Accept`` rates ``application/json`` above ``text/html`` (browsers,
    fsspec and GDAL send ``*/*`` or prefer HTML, and get HTML).
    """
    formats = parse_qs(query, keep_blank_values=True).get("format")
    if formats:
        return formats[-1].lower() == "json"
    if not accept:
        return False
    return _quality(accept, "application/json") > _quality(accept, "text/html")
