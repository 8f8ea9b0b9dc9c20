"""Hostile redirects: a target under a ``targets=`` rule whose server
answers ``3xx`` elsewhere. Two fault-injecting servers on loopback record every request: the
first holds the targets under a rule with credentials, the second is another host. A redirect
is a new target: followed only under a rule, then with that rule's options (never the first
rule's); a redirect out of the rule's prefix (same host or another), to a local file, in a
loop or past the hop limit fails that read (EIO in a mount, 502 over ``refmount serve``) with
a log line naming it, and the location is never requested. An Icechunk repository's virtual
chunk is not redirected out of its container."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from support import icechunk_data as ic
from support.faultserver import FaultServer, serving

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

TOKEN_A = "Bearer SENTINEL-RULE-A-5e1d"  # the first rule's credentials
KEY_A = "SENTINEL-KEY-A-0b7c"  # a header of the first rule that no client strips on redirect
TOKEN_B = "Bearer SENTINEL-RULE-B-93aa"  # the destination rule's
INSIDE, OUTSIDE, B_X, SIGNED = (b"INSIDE-A" * 64, b"OUTSIDE-A" * 64, b"HOST-B-X" * 64,
                                b"SIGNED-B" * 64)


@pytest.fixture
def other(tmp_path):
    """A second fault server: another host (port) than ``srv``."""
    with serving(tmp_path / "other") as s:
        yield s


def hostile(srv: FaultServer, other: FaultServer, tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """The set, its rules and, per key that must fail, the redirect its log line names."""
    a, b = srv.url, other.url
    srv.put("pub/inside", INSIDE)
    srv.put("obj", OUTSIDE)
    other.put("x", B_X)
    other.put("signed/obj", SIGNED)
    srv.redirect("/pub/same", f"{a}/obj")  # same host, out of the prefix
    srv.redirect("/pub/cross", f"{b}/x")  # another host no rule covers
    srv.redirect("/pub/file", "file:///etc/passwd")  # a local file
    srv.redirect("/pub/loop1", "/pub/loop2")
    srv.redirect("/pub/loop2", f"{a}/pub/loop1")
    for i in range(6):  # six hops: one too many
        srv.redirect(f"/pub/h{i}", f"/pub/h{i + 1}")
    srv.redirect("/pub/h6", "/pub/inside")
    srv.redirect("/pub/ok", f"{b}/signed/obj?X-Amz-Signature=SENTINEL-SIG")  # allowed by rule 2
    srv.redirect("/pub/c1", "c2", status=307)  # a chain: relative, then to the other host
    srv.redirect("/pub/c2", f"{b}/signed/obj", status=301)
    n = len(INSIDE)
    refs = {"inside": [f"{a}/pub/inside", 0, n], "same": [f"{a}/pub/same", 0, n],
            "cross": [f"{a}/pub/cross", 0, n], "file": [f"{a}/pub/file", 0, n],
            "loop": [f"{a}/pub/loop1", 0, n], "many": [f"{a}/pub/h0", 0, n],
            "ok": [f"{a}/pub/ok", 8, 100], "chain": [f"{a}/pub/c1", 0, len(SIGNED)],
            # whole targets: their size is asked for first (HEAD), redirected alike
            "ok_whole": [f"{a}/pub/ok"], "same_whole": [f"{a}/pub/same"]}
    src = tmp_path / "refs.json"
    src.write_text(json.dumps({"version": 1, "refs": refs}))
    rules = json.dumps([
        {"prefix": f"{a}/pub/", "options": {"headers": {"Authorization": TOKEN_A, "X-Api-Key": KEY_A}}},
        {"prefix": f"{b}/signed/", "options": {"headers": {"Authorization": TOKEN_B}}},
    ])
    names = {"same": f"from {a}/pub/same to {a}/obj not followed: the target is read under "
                     "target rule 1",
             "cross": f"from {a}/pub/cross to {b}/x not followed",
             "file": f"from {a}/pub/file to file:///etc/passwd not followed: only an http",
             "loop": f"from {a}/pub/loop2 to {a}/pub/loop1 not followed: a redirect loop",
             "many": f"from {a}/pub/h5 to {a}/pub/h6 not followed: more than 5 redirects",
             "same_whole": f"from {a}/pub/same to {a}/obj not followed"}
    return src, rules, names


def check_servers(srv: FaultServer, other: FaultServer) -> None:
    """No refused location was requested; the first rule's credentials went to its prefix
    only; the destination got its own rule's header and nothing of the first rule's."""
    assert srv.count("/obj", None) == 0 and other.count("/x", None) == 0
    assert not any(r.path.startswith("/etc") for r in srv.log(method=None))
    sent_a = [r for r in srv.log(method=None) if r.headers.get("Authorization") == TOKEN_A]
    assert sent_a and all(r.path.startswith("/pub/") for r in sent_a)
    signed = other.log("/signed/obj", None)
    assert signed, "the allowed redirect was not followed"
    for r in other.log(method=None):
        assert r.headers.get("Authorization") == TOKEN_B, (r.path, r.headers)
        assert "X-Api-Key" not in r.headers and KEY_A not in json.dumps(r.headers)


REFUSED = ("same", "cross", "file", "loop", "many", "same_whole")


def test_redirects_through_a_mount(mount, srv, other, tmp_path):
    src, rules, names = hostile(srv, other, tmp_path)
    m = mount(src, f"targets={rules}", "no_disk_cache", "retries=0", "timeout=10")
    assert (m / "inside").read_bytes() == INSIDE
    assert (m / "ok").read_bytes() == SIGNED[8:108]
    assert (m / "chain").read_bytes() == SIGNED
    assert (m / "ok_whole").stat().st_size == len(SIGNED)
    assert (m / "ok_whole").read_bytes() == SIGNED
    got: dict[str, object] = {}
    for key in REFUSED:
        try:
            got[key] = (m / key).read_bytes()[:12]
        except OSError as e:
            got[key] = errno.errorcode.get(e.errno or 0, e.errno)
    log = m.log_text(2000)
    assert got == dict.fromkeys(REFUSED, "EIO"), got
    assert [key for key, name in names.items() if name not in log] == []
    assert "SENTINEL" not in log
    check_servers(srv, other)


def test_redirects_through_serve(serve, srv, other, tmp_path):
    src, rules, names = hostile(srv, other, tmp_path)
    s = serve(src, f"targets={rules}", "no_disk_cache", "retries=0", "timeout=10")
    assert s.request("GET", "/inside").body == INSIDE
    assert s.request("GET", "/ok").body == SIGNED[8:108]
    assert s.request("GET", "/chain").body == SIGNED
    r = s.request("GET", "/ok_whole")
    assert r.status == 200 and r.body == SIGNED
    got = {key: s.request("GET", f"/{key}") for key in REFUSED}
    assert {key: r.status for key, r in got.items()} == dict.fromkeys(REFUSED, 502)
    assert not any(b"SENTINEL" in r.body for r in got.values())
    log = s.log_text()
    assert [key for key, name in names.items() if name not in log] == []
    assert "SENTINEL" not in log
    check_servers(srv, other)


def test_a_virtual_chunk_is_not_redirected_out_of_its_container(mount, serve, srv, other, tmp_path):
    """The repository's virtual chunks (a port-less container, as icechunk records it) are read
    from the first server through the rule that authorises the container (with credentials).
    That server redirects them to another host that a rule covers but that is no container of
    the repository's: refused, never requested. A redirect within the container is followed."""
    built = ic.build_repository(tmp_path / "repo", srv.root / "files", "http://127.0.0.1/vc",
                                checksum=False)
    (other.root / "files").mkdir()
    (other.root / "files/virtual.nc").write_bytes(built.netcdf.read_bytes())
    srv.put("files/moved.nc", built.netcdf.read_bytes())
    rules = "targets=" + json.dumps([
        {"prefix": "http://127.0.0.1/vc/", "rewrite": f"{srv.url}/files/",
         "options": {"headers": {"Authorization": TOKEN_A}}},
        {"prefix": f"{other.url}/"},
    ])
    srv.redirect("/files/virtual.nc", f"{other.url}/files/virtual.nc")
    name = (f"from {srv.url}/files/virtual.nc to {other.url}/files/virtual.nc not followed: the "
            "target is a virtual chunk, and the location is outside every virtual chunk container")
    s = serve(built.root, rules, "no_disk_cache", "retries=0", "timeout=10")
    assert s.request("GET", "/native/c/0/0").status == 200
    assert s.request("GET", "/virtual/c/0/0").status == 502
    assert name in s.log_text()
    m = mount(built.root, rules, "no_disk_cache", "retries=0", "timeout=10")
    with pytest.raises(OSError) as info:
        (m / "virtual/c/1/0").read_bytes()
    assert info.value.errno == errno.EIO
    assert name in m.log_text(2000)
    assert other.count(None, None) == 0  # never requested
    assert srv.count("/files/virtual.nc", None) >= 2

    srv.clear_faults()
    srv.redirect("/files/virtual.nc", "/files/moved.nc")  # within the container: followed
    row = ic.COLS * 4
    want = built.expected["first"]["virtual"].tobytes()
    s2 = serve(built.root, rules, "no_disk_cache", "retries=0", "timeout=10")
    assert s2.request("GET", "/virtual/c/1/0").body == want[2 * row: 4 * row]
    moved = srv.log("/files/moved.nc", None)
    assert moved and all(r.headers.get("Authorization") == TOKEN_A for r in moved)
    assert other.count(None, None) == 0


def test_a_data_server_redirecting_to_a_signed_object_store_url(serve, srv, tmp_path):
    """Earthdata's way: the data server wants a bearer token and answers an authorised request
    with a redirect to a presigned URL of an object store (moto's S3 server). A rule with no
    options for the object store's endpoint is what allows it: the bytes come from the store.
    Without that rule the read is a 502 whose log line names the redirect and says to add a
    rule; the token is never sent to the store's host."""
    from urllib.parse import parse_qsl, urlsplit

    import s3fs
    from support.servers import moto_s3

    payload = bytes(range(256)) * 40
    with moto_s3({"granules/g1.nc": payload}) as endpoint:
        store = s3fs.S3FileSystem(key="test", secret="test", skip_instance_cache=True,
                                  client_kwargs={"endpoint_url": endpoint, "region_name": "eu-west-1"})
        signed = store.url("granules/g1.nc", expires=600)
        assert signed.startswith(endpoint) and "Signature" in signed
        srv.put("data/g1.nc", b"never served: the data server only redirects")
        srv.redirect("/data/g1.nc", signed, status=307)
        srv.require_bearer(600)
        token = "Bearer " + str(srv.issue_token()["token"])
        src = tmp_path / "refs.json"
        src.write_text(json.dumps({"version": 1, "refs": {
            "g1": [f"{srv.url}/data/g1.nc", 1000, 5000]}}))
        server_rule = {"prefix": f"{srv.url}/data/", "options": {"headers": {"Authorization": token}}}
        alone = serve(src, "targets=" + json.dumps([server_rule]), "no_disk_cache", "retries=0")
        assert alone.request("GET", "/g1").status == 502
        log = alone.log_text()
        assert f"redirect (307) from {srv.url}/data/g1.nc to {endpoint}/granules/g1.nc" in log
        assert "no rule covers the location" in log
        signature = [v for k, v in parse_qsl(urlsplit(signed).query) if "Signature" in k]
        assert signature and not any(v in log for v in signature)  # redacted
        both = serve(src, "targets=" + json.dumps([server_rule, {"prefix": f"{endpoint}/granules/"}]),
                     "no_disk_cache", "retries=0")
        r = both.request("GET", "/g1")
        assert r.status == 200 and r.body == payload[1000:6000]
        assert all(r.headers.get("Authorization") == token for r in srv.log("/data/g1.nc", None))
