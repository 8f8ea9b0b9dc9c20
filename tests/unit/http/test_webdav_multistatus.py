"""The WebDAV multistatus entries of ``http/webdav.py`` without a server: escaped, parsed by an
XML parser into the properties clients read."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from refmount.http.webdav import FINITE_DEPTH, HEAD, TAIL, multistatus_entry

D = "{DAV:}"


def test_entries_parse_with_their_properties():
    body = HEAD + multistatus_entry("/a%26b/", "a&b<", True, None, "Mon, 01 Jan 2024 00:00:00 GMT", None)
    body += multistatus_entry("/f", "f", False, 12, "Mon, 01 Jan 2024 00:00:00 GMT", '"t&"') + TAIL
    doc = ET.fromstring(body.encode())
    d, f = doc.findall(f"{D}response")
    assert d.find(f"{D}href").text == "/a%26b/"
    assert d.find(f"{D}propstat/{D}prop/{D}displayname").text == "a&b<"
    assert d.find(f"{D}propstat/{D}prop/{D}resourcetype/{D}collection") is not None
    assert d.find(f"{D}propstat/{D}prop/{D}getcontentlength") is None
    prop = f.find(f"{D}propstat/{D}prop")
    assert prop.find(f"{D}getcontentlength").text == "12" and prop.find(f"{D}getetag").text == '"t&"'
    assert prop.find(f"{D}resourcetype/{D}collection") is None
    assert f.find(f"{D}propstat/{D}status").text == "HTTP/1.1 200 OK"
    assert ET.fromstring(FINITE_DEPTH).find(f"{D}propfind-finite-depth") is not None
