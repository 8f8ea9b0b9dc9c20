"""``is_local`` and its neighbours over a table of URLs, and the places that use them: the CLI's
SOURCE, ``allow_local``'s default and the target policy agree on what a local file is."""

from __future__ import annotations

import argparse
import os

import pytest
from fsspec.core import _un_chain

from refmount.base.urls import is_chained, is_local, local_path, protocol
from refmount.cli.main import config_from_args
from refmount.config import MountConfig
from refmount.targets.policy import target_policy

# url, is_local, local_path (None: not local), protocol of the first link
TABLE = [
    ("/data/a.nc", True, "/data/a.nc", "file"),
    ("data/a.nc", True, "data/a.nc", "file"),
    ("a.nc", True, "a.nc", "file"),
    ("~/a.nc", True, "~/a.nc", "file"),
    ("./a b/ü.nc", True, "./a b/ü.nc", "file"),
    ("file:///data/a.nc", True, "/data/a.nc", "file"),
    ("file://data/a.nc", True, "data/a.nc", "file"),
    ("local:///data/a.nc", True, "/data/a.nc", "local"),
    ("s3://bucket/a.nc", False, None, "s3"),
    ("s3://user:secret@bucket/a.nc", False, None, "s3"),
    ("http://127.0.0.1:8080/a.nc", False, None, "http"),
    ("https://host/a.nc?x=file://y", False, None, "https"),
    ("memory://a.nc", False, None, "memory"),
    ("reference://", False, None, "reference"),
    ("simplecache::/data/a.nc", False, None, "simplecache"),
    ("simplecache::file:///data/a.nc", False, None, "simplecache"),
    ("zip://inner.nc::file:///data/a.zip", False, None, "zip"),
    ("simplecache::s3://bucket/a.nc", False, None, "simplecache"),
    ("s3::bucket/a.nc", False, None, "s3"),
    ("/data/a::b.nc", False, None, "file"),  # '::' chains, as fsspec reads it
]


@pytest.mark.parametrize(("url", "local", "path", "proto"), TABLE)
def test_is_local_over_a_table_of_urls(url: str, local: bool, path: str | None, proto: str) -> None:
    assert is_local(url) is local
    assert protocol(url) == proto
    if is_chained(url) or "://" in url:
        assert _un_chain(url, {})[0][1] == proto  # as fsspec reads it
    assert is_chained(url) == ("::" in url)
    if path is None:
        with pytest.raises(ValueError) as e:
            local_path(url)
        assert "secret" not in str(e.value)  # a URL may carry credentials: never repeated
    else:
        assert local_path(url) == path


def test_a_file_url_source_is_local_like_its_path(tmp_path) -> None:
    """The CLI makes a local SOURCE absolute in any spelling (the daemon runs in '/'), and the
    target policy and allow_local's default take its directory for every spelling."""
    refs = tmp_path / "refs.json"
    refs.write_text("{}")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for spelling in (str(refs), "refs.json", f"file://{refs}", "file://refs.json", f"local://{refs}"):
            args = argparse.Namespace(source=spelling, mountpoint=str(tmp_path), options=[],
                                      debug=False, foreground=False)
            cfg = config_from_args(args)
            assert cfg.source == str(refs), spelling
            shared = MountConfig(source=spelling, mountpoint="/mnt", allow_other=True)
            assert shared.local_roots() == [str(tmp_path)], spelling
            assert target_policy(cfg).base_dir == str(tmp_path), spelling
    finally:
        os.chdir(cwd)
    remote = MountConfig(source="s3://bucket/refs.json", mountpoint="/mnt", allow_other=True)
    assert remote.local_roots() == []
    assert target_policy(remote).base_dir is None
    chained = MountConfig(source=f"simplecache::{refs}", mountpoint="/mnt", allow_other=True)
    assert chained.local_roots() == []


@pytest.mark.parametrize(("url", "remote_protocol", "relative"), [
    ("0.bin", None, True), ("a/../0.bin", None, True), ("file://0.bin", None, True),
    ("local://x/0.bin", None, True), ("~x/0.bin", None, True),
    ("/abs/0.bin", None, False), ("file:///abs/0.bin", None, False), ("~/0.bin", None, False),
    ("~", None, False), ("s3://b/0.bin", None, False), ("simplecache::file://0.bin", None, False),
    ("0.bin", "s3", False), ("file://0.bin", "s3", True),
])
def test_policy_relative_is_what_full_url_joins_to_the_base(url, remote_protocol, relative):
    """``TargetPolicy.relative`` (which Parquet records prefix with their own directory) holds
    for exactly the URLs that ``full_url`` resolves against the base directory."""
    from refmount.targets.policy import TargetPolicy

    policy = TargetPolicy([], "/base", remote_protocol)
    assert policy.relative(url) is relative
    if relative:
        assert policy.full_url(url).partition("://")[2 if "://" in url else 0].startswith("/base/")


# An IPv6 literal host: its "::" chains nothing (fsspec's own _un_chain would split it).
IPV6 = [
    ("http://[::1]/a.nc", False, "http"),
    ("http://[::1]:8080/a.nc", False, "http"),
    ("HTTP://[::1]:80/a.nc", False, "HTTP"),
    ("https://user:pw@[fe80::1%25eth0]:443/a.nc", False, "https"),
    ("s3://[2001:db8::7]/bucket/a.nc", False, "s3"),
    ("simplecache::http://[::1]/a.nc", True, "simplecache"),
    ("http://[::1]/a::b.nc", True, "http"),  # a '::' outside the brackets still chains
    ("http://[1:2]/a.nc", False, "http"),
]


@pytest.mark.parametrize(("url", "chained", "proto"), IPV6)
def test_an_ipv6_host_is_not_a_chain(url: str, chained: bool, proto: str) -> None:
    assert is_chained(url) is chained
    assert protocol(url) == proto
    assert not is_local(url)


def test_urls_with_an_ipv6_host_are_normalised() -> None:
    """Rules are matched on the URL as its client sends it: an IPv6 host is too (its case, the
    default port, escaped dots), so a target climbing out of a prefix gets no rule."""
    from refmount.base.urls import normal_url
    from refmount.targets.rules import TargetRules, parse_rules

    assert normal_url("HTTP://[::1]:80/pub/%2e%2e/obj") == "http://[::1]/pub/../obj"
    assert normal_url("http://[FE80::A]:8080/p/%7Ex") == "http://[fe80::a]:8080/p/~x"
    rules = TargetRules(parse_rules([{"prefix": "http://[::1]:8080/pub/",
                                      "options": {"headers": {"Authorization": "x"}}}]))
    assert rules.match("http://[::1]:8080/pub/obj") is not None
    assert rules.match("HTTP://[::1]:8080/pub/obj") is not None
    assert rules.match("http://[::1]:8080/pub/%2e%2e/obj") is None
    assert rules.match("http://[::1]:8080/pub/.%2e/obj") is None


def test_the_policy_reads_an_ipv6_url_as_one_link(tmp_path) -> None:
    policy = target_policy(MountConfig(source=str(tmp_path / "refs.json"), allow_other=True))
    assert policy.problem("http://[::1]:8080/a.nc", resolve=False) is None
    assert not policy.relative("http://[::1]:8080/a.nc")
