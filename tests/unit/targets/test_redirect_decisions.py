"""Which HTTP redirects a mount follows (refmount/targets/redirects.py), decided without a
server: a redirect is a new target — within a few hops, no loop, an http(s) location only, under
a rule whose options it then gets when the target was read under one, under a declared and
authorised container for a virtual chunk — and the rule whose options reach a URL
(``TargetRules.reaching``)."""

from __future__ import annotations

import pytest

from refmount.targets.policy import TargetPolicy
from refmount.targets.redirects import MAX_HOPS, Redirected, RedirectPolicy, RedirectRefused
from refmount.targets.rules import TargetRules, parse_rules
from refmount.targets.virtualaccess import VirtualAccess

A = "http://127.0.0.1:8001"
B = "http://127.0.0.1:8002"
TOKEN = {"headers": {"Authorization": "Bearer SENTINEL-REDIR-7d3a"}}


def rules(*raw: dict) -> TargetRules:
    return TargetRules(parse_rules(list(raw)))


def decide(rs: TargetRules, target: str, chain: list[str], location: str | None, *,
           virtual: VirtualAccess | None = None, status: int = 302, confined: bool = True):
    policy = TargetPolicy(["/srv/data"] if confined else ["/"], None, None)
    return RedirectPolicy(rs, policy, virtual).follow(
        target, rs.match(target), chain, Redirected(status, location))


def refused(*args, **kw) -> str:
    with pytest.raises(RedirectRefused) as e:
        decide(*args, **kw)
    return str(e.value)


PUB = rules({"prefix": f"{A}/pub/", "options": TOKEN})


def test_within_the_rules_prefix_is_followed_with_its_rule():
    hop = decide(PUB, f"{A}/pub/a", [f"{A}/pub/a"], "/pub/b?x=1#frag")
    assert hop.url == f"{A}/pub/b?x=1" and hop.rule is PUB.rules[0]


@pytest.mark.parametrize("location", [f"{A}/obj", "/obj", "../obj", f"{B}/pub/a",
                                      f"{A}/pub/../obj", f"{A}/pub/%2e%2e/obj", "//evil.example/x"])
def test_out_of_the_rules_prefix_is_refused(location):
    """Same host outside the prefix, another host, a location that climbs out with dots
    (escaped or not), a scheme-relative one: no rule covers it, the rule's options must not go
    there."""
    why = refused(PUB, f"{A}/pub/a", [f"{A}/pub/a"], location)
    assert "redirect (302) from http://127.0.0.1:8001/pub/a to " in why
    assert "no rule covers the location" in why and "SENTINEL" not in why


def test_a_rule_for_the_destination_allows_it_with_that_rules_options():
    """Earthdata's way: a credentialed rule for the first host, a rule without options for
    the host of the signed URL it redirects to."""
    rs = rules({"prefix": f"{A}/pub/", "options": TOKEN}, {"prefix": f"{B}/signed/"})
    hop = decide(rs, f"{A}/pub/a", [f"{A}/pub/a"], f"{B}/signed/obj?X-Amz-Signature=abc")
    assert hop.url == f"{B}/signed/obj?X-Amz-Signature=abc"
    assert hop.rule is rs.rules[1] and not hop.rule.options


def test_a_rewrite_rule_reaches_its_mirrors_not_its_prefix():
    rs = rules({"prefix": "/glade/data/", "rewrite": f"{A}/data/", "options": TOKEN})
    assert rs.reaching(f"{A}/data/x") is rs.rules[0]
    assert rs.reaching("/glade/data/x") is None  # (a name, never requested)
    assert rs.reaching(f"{A}/data/../x") is None and rs.reaching(f"{A}/database") is None
    hop = decide(rs, "/glade/data/a", [f"{A}/data/a"], "/data/b")
    assert hop.rule is rs.rules[0]


@pytest.mark.parametrize("location", ["file:///etc/passwd", "/etc/passwd::file:///etc/passwd",
                                      "local:///etc/shadow", "s3://bucket/key",
                                      f"simplecache::{A}/pub/b", "ftp://127.0.0.1/x", "gopher:x"])
def test_only_http_locations(location):
    why = refused(PUB, f"{A}/pub/a", [f"{A}/pub/a"], location)
    assert "only an http:// or https:// location" in why


def test_a_file_location_is_refused_even_unconfined_and_without_rules():
    why = refused(TargetRules(), f"{A}/a", [f"{A}/a"], "file:///etc/passwd", confined=False)
    assert "only an http:// or https:// location" in why


def test_loops_and_too_many_hops():
    chain = [f"{A}/pub/a", f"{A}/pub/b"]
    assert "redirect loop" in refused(PUB, chain[0], chain, f"{A}/pub/a")
    assert "redirect loop" in refused(PUB, chain[0], chain, "http://127.0.0.1:8001/p%75b/b")
    long = [f"{A}/pub/{i}" for i in range(MAX_HOPS + 1)]
    assert f"more than {MAX_HOPS} redirects" in refused(PUB, long[0], long, f"{A}/pub/next")
    assert decide(PUB, long[0], long[:-1], f"{A}/pub/next").url == f"{A}/pub/next"


def test_no_location():
    assert "without a Location" in refused(PUB, f"{A}/pub/a", [f"{A}/pub/a"], None)
    assert "without a Location" in refused(PUB, f"{A}/pub/a", [f"{A}/pub/a"], "  ")


def test_a_target_under_no_rule_goes_where_a_target_could():
    rs = rules({"prefix": f"{B}/private/", "options": TOKEN})
    hop = decide(rs, f"{A}/x", [f"{A}/x"], "https://127.0.0.1:8003/y")
    assert hop.url == "https://127.0.0.1:8003/y" and hop.rule is None
    hop = decide(rs, f"{A}/x", [f"{A}/x"], f"{B}/private/y")
    assert hop.rule is rs.rules[0]


def test_the_message_is_redacted():
    why = refused(PUB, f"{A}/pub/a", [f"{A}/pub/a"],
                  "http://user:SENTINEL-PW@127.0.0.1:8002/x?X-Amz-Signature=SENTINEL-SIG")
    assert "SENTINEL" not in why and "127.0.0.1:8002/x" in why


def virtual(rs: TargetRules, *containers: str) -> VirtualAccess:
    access = VirtualAccess(rs, None, None)
    access.declare(list(containers))
    return access


def test_a_virtual_chunk_stays_under_a_declared_authorised_container():
    rs = rules({"prefix": f"{A}/data/", "options": TOKEN}, {"prefix": f"{B}/"},
               {"prefix": "http://127.0.0.1:8003/other/"})
    access = virtual(rs, f"{A}/data/", "http://127.0.0.1:8003/other/", "http://127.0.0.1:8004/")
    target = f"{A}/data/c0"
    # under the container and its rule
    assert decide(rs, target, [target], "/data/c1", virtual=access).rule is rs.rules[0]
    # another declared container that a rule authorises: its rule's options
    hop = decide(rs, target, [target], "http://127.0.0.1:8003/other/c", virtual=access)
    assert hop.rule is rs.rules[2]
    # a host a rule covers, but no container of the repository's
    why = refused(rs, target, [target], f"{B}/c", virtual=access)
    assert "outside every virtual chunk container" in why
    # a declared container that no rule authorises
    why = refused(rs, target, [target], "http://127.0.0.1:8004/c", virtual=access)
    assert "no rule covers" in why or "no targets rule authorises" in why
    # not a virtual chunk: rules alone decide
    assert decide(rs, f"{B}/x", [f"{B}/x"], f"{B}/y", virtual=access).rule is rs.rules[1]


def test_virtual_container_matching():
    access = virtual(TargetRules(), f"{A}/data", "s3://bucket/pre/", "/local/dir")
    assert access.container(f"{A}/data/x") == f"{A}/data"
    assert access.container(f"{A}/database") is None
    assert access.container(f"{A}/data/../x") is None
    assert access.container("S3://bucket/pre/x") == "s3://bucket/pre/"
    assert access.container("/local/dir/x") == "/local/dir"
    assert access.container("/local/dirx") is None


def test_a_virtual_container_read_through_a_rewrite():
    """icechunk records a port-less URL: the rule that authorises the container rewrites it to
    the server. A redirect to that server within the rewrite counts as within the container."""
    rs = rules({"prefix": "http://127.0.0.1/vc/", "rewrite": f"{A}/files/", "options": TOKEN},
               {"prefix": f"{B}/"})
    access = virtual(rs, "http://127.0.0.1/vc/")
    target = "http://127.0.0.1/vc/virtual.nc"
    hop = decide(rs, target, [f"{A}/files/virtual.nc"], "/files/moved.nc", virtual=access)
    assert hop.url == f"{A}/files/moved.nc" and hop.rule is rs.rules[0]
    assert rs.name_of(rs.rules[0], hop.url) == "http://127.0.0.1/vc/moved.nc"
    why = refused(rs, target, [f"{A}/files/virtual.nc"], f"{B}/x", virtual=access)
    assert "outside every virtual chunk container" in why
    why = refused(rs, target, [f"{A}/files/virtual.nc"], f"{A}/elsewhere", virtual=access)
    assert "no rule covers the location" in why


def test_http_links_of_a_chained_url_refuse_redirects():
    from refmount.targets.filesystems import redirects_refused

    options = {"https": {"allow_redirects": True, "headers": {"X": "1"}}, "anon": True}
    out = redirects_refused("simplecache::https://h/x", options)
    assert out == {"https": {"headers": {"X": "1"}, "max_redirects": 1}, "anon": True}
    assert options["https"]["allow_redirects"] is True  # (not changed in place)
    assert redirects_refused("zip://a::http://[::1]/z.zip", {}) == {"http": {"max_redirects": 1}}
    assert redirects_refused("simplecache::s3://b/k", options) is options


def test_requests_never_follow_redirects_whatever_the_options_say():
    from types import SimpleNamespace

    from refmount.targets.httpread import request_options

    fs = SimpleNamespace(kwargs={"allow_redirects": True, "max_redirects": 30,
                                 "headers": {"Authorization": "x"}, "timeout": 5})
    kw, headers = request_options(fs)
    assert kw == {"allow_redirects": False, "timeout": 5} and headers == {"Authorization": "x"}
    headers["Range"] = "bytes=0-1"
    assert fs.kwargs["headers"] == {"Authorization": "x"}


@pytest.mark.parametrize("location", ["http://[invalid/x", "https://[::1/x"])
def test_a_location_that_is_no_url_is_refused_naming_it(location):
    with pytest.raises(RedirectRefused, match=r"redirect \(302\) from http://127.0.0.1:8001/pub/a to "):
        decide(PUB, f"{A}/pub/a", [f"{A}/pub/a"], location)
