"""Target rules (-o targets=) on real mounts: two S3 buckets on two moto servers (endpoints)
with their own options; a set of absolute POSIX paths (Version 1 JSON and Parquet) read from
the loopback nginx, the local copies forbidden by the policy; a mirror that fails mid-read;
xattrs and ``refmount inspect`` naming original, resolved and rule; a secret in a rule's
options nowhere to be seen."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio
from support.confinement import parquet_set, write_json
from support.faultserver import Fault, FaultServer
from support.mounts import CLI, cli_env, mount_entry
from support.servers import moto_s3

from refmount.base.errors import FetchError
from refmount.base.stats import Stats
from refmount.cli.tools import format_inspect, inspect
from refmount.targets.fetch import Fetcher
from refmount.targets.policy import TargetPolicy
from refmount.targets.rules import TargetRules

SECRET = "SENTINEL-RULE-OPT-6b2e"
ALPHA, BETA = os.urandom(70_000), os.urandom(90_000)


@pytest.fixture(scope="module")
def two_endpoints():
    """Bucket ``alpha`` only on one moto server, ``beta`` only on another."""
    with moto_s3({"alpha/x.bin": ALPHA}) as a, moto_s3({"beta/y.bin": BETA}) as b:
        yield a, b


def xattrs(path: Path) -> dict[str, str]:
    return {n: os.getxattr(path, n).decode() for n in os.listxattr(path)}


@pytest.mark.fuse
def test_two_buckets_two_endpoints_and_no_secret_anywhere(mount, two_endpoints, tmp_path):
    """Each bucket is read with its rule's endpoint (the other endpoint has no such bucket,
    and remote_options name none: any other options fail the read); a secret in a rule's
    options, given inline on the command line, appears in no command line, /proc/mounts,
    log, xattr, stats or inspect output."""
    a, b = two_endpoints
    src = write_json(tmp_path / "refs.json", {"version": 1, "refs": {
        "a/0": ["s3://alpha/x.bin", 100, 50_000], "b/0": ["s3://beta/y.bin"],
        "c/0": ["s3://gamma/z.bin", 0, 10]}})
    rules = [
        {"prefix": "s3://alpha", "options": {"key": "ka", "secret": SECRET,
                                              "client_kwargs": {"endpoint_url": a}}},
        {"prefix": "s3://beta/", "options": {"key": "kb", "secret": "other",
                                              "client_kwargs": {"endpoint_url": b}}},
    ]
    remote = {"client_kwargs": {"region_name": "eu-west-1"}, "key": "k0", "secret": "s0"}
    m = mount(src, f"remote_options={json.dumps(remote)}", f"targets={json.dumps(rules)}",
              "retries=0", "timeout=5")
    assert (m / "a/0").read_bytes() == ALPHA[100:50_100]
    assert (m / "b/0").read_bytes() == BETA
    x = xattrs(m / "a/0")
    assert x["user.refmount.url"] == "s3://alpha/x.bin"
    assert x["user.refmount.resolved"] == "s3://alpha/x.bin"
    assert x["user.refmount.rule"] == "1 s3://alpha"
    assert xattrs(m / "c/0")["user.refmount.rule"] == "none"

    # (the CLI's inspect --targets: tests/unit/targets/test_targets.py)
    shown = format_inspect(inspect(str(src), {}, TargetRules.from_json(rules)))
    assert "rule 1 s3://alpha: 1 targets" in shown
    assert "no rule: 1 targets" in shown and "s3://gamma/z.bin" in shown

    seen = []
    for p in m.procs:
        seen.append(Path(f"/proc/{p.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    seen.append(Path("/proc/mounts").read_text())
    seen.append(m.log.read_text())
    seen.append(subprocess.run(["getfattr", "-d", "-m", "-", "-R", str(m.path)],
                               capture_output=True, text=True).stdout)
    seen.append(subprocess.run([*CLI, "stats", str(m.path)], capture_output=True, text=True,
                               env=cli_env()).stdout)
    seen.append(shown)
    assert mount_entry(m.path) is not None
    assert all(SECRET not in text for text in seen), next(t for t in seen if SECRET in t)[:500]
    assert "s3://alpha" in seen[-1]  # (the texts are the real ones)


@pytest.mark.fuse
def test_posix_paths_rewritten_to_https(mount, nginx, nginx_root, tmp_path):
    """NCAR style: the sets name /glade/... paths; the local copies hold other bytes and lie
    outside allow_local, so that only the rewrite to nginx can give the right bytes — for a
    Version 1 JSON set (checked before mounting) and a Parquet set (checked when read)."""
    served = nginx_root / "gdex-data"
    served.mkdir(exist_ok=True)
    data = os.urandom(200_000)
    (served / "e5.bin").write_bytes(data)
    posix = tmp_path / "glade" / "campaign" / "gdex" / "data"
    posix.mkdir(parents=True)
    (posix / "e5.bin").write_bytes(b"\0" * len(data))  # the wrong bytes, and forbidden
    allowed = tmp_path / "sets"
    allowed.mkdir()
    src = write_json(allowed / "refs.json", {
        "version": 1, "templates": {"g": str(posix)},
        "refs": {"v/0": ["{{g}}/e5.bin", 1000, 100_000], "v/1": ["{{g}}/e5.bin"]}})
    rules = json.dumps([{"prefix": str(posix.parent) + "/", "rewrite": f"{nginx.url}/"},
                        {"prefix": str(posix), "rewrite": f"{nginx.url}/gdex-data"}])
    opts = (f"allow_local={allowed}", "no_disk_cache")
    m = mount(src, *opts, f"targets={rules}")
    assert (m / "v/0").read_bytes() == data[1000:101_000]
    assert (m / "v/1").read_bytes() == data
    x = xattrs(m / "v/0")
    assert x["user.refmount.url"] == f"{posix}/e5.bin"
    assert x["user.refmount.resolved"] == f"{nginx.url}/gdex-data/e5.bin"
    assert x["user.refmount.rule"] == f"2 {posix}"  # the longest prefix
    # (Without the rules the policy refuses the set, a rule to a forbidden path too:
    # tests/unit/targets/test_targets.py::test_check_targets_refuses_a_rewrite_to_a_forbidden_path.)

    pq = allowed / "set.parquet"
    pq.mkdir()
    parquet_set(pq, [(f"{posix}/e5.bin", 5, 64, None), (f"{posix}/e5.bin", 0, 1000, None)])
    p = mount(pq, *opts, f"targets={rules}")
    assert (p / "v/0").read_bytes() == data[5:69]
    assert (p / "v/1").read_bytes() == data[:1000]
    assert xattrs(p / "v/1")["user.refmount.resolved"] == f"{nginx.url}/gdex-data/e5.bin"


@pytest.mark.fuse
def test_a_mirror_that_fails_mid_read(mount, srv, nginx, nginx_root, tmp_path):
    """Mirrors [fault server, nginx] hold different bytes (to see where each block came
    from). The first blocks come from the first mirror; then it drops a response half-way
    and answers 503: that block and the rest come whole from nginx, each block wholly from
    one mirror; one log line says so; the failed mirror is not asked first for the next target."""
    block = 64 * 1024
    first, second = os.urandom(16 * block), os.urandom(16 * block)
    srv.put("m/big.bin", first)
    srv.put("m/other.bin", first)
    (nginx_root / "mirror2").mkdir(exist_ok=True)
    (nginx_root / "mirror2" / "big.bin").write_bytes(second)
    (nginx_root / "mirror2" / "other.bin").write_bytes(second)
    src = write_json(tmp_path / "refs.json", {"k": ["https://gone.example/d/big.bin"],
                                              "o": ["https://gone.example/d/other.bin", 0, 5000]})
    rules = json.dumps([{"prefix": "https://gone.example/d",
                         "rewrite": [f"{srv.url}/m", f"{nginx.url}/mirror2"]}])
    m = mount(src, f"targets={rules}", f"block_size={block}", "max_readahead=0",
              "whole_fetch_limit=4096", "no_disk_cache", "retries=2",
              "timeout=10")
    got = bytearray()
    with open(m / "k", "rb", buffering=0) as f:
        got += f.read(3 * block)
        srv.set_faults("m/big.bin", [Fault("drop", times=1, fraction=0.5),
                                     Fault("status", status=503, times=None)])
        while piece := f.read(block):
            got += piece
    blocks = [bytes(got[i:i + block]) for i in range(0, len(got), block)]
    assert len(got) == len(first)
    origin = ["1" if b == first[i * block:(i + 1) * block] else
              "2" if b == second[i * block:(i + 1) * block] else "mixed"
              for i, b in enumerate(blocks)]
    # (the kernel may have read a few blocks ahead before the fault: those are the first's)
    assert origin[:3] == ["1"] * 3 and origin == sorted(origin) and origin[-1] == "2", origin
    # Remembered as down: another target of the rule goes to the second mirror first.
    asked = srv.count()
    assert (m / "o").read_bytes() == second[:5000]
    assert srv.count() == asked
    log = m.log.read_text()
    switches = [ln for ln in log.splitlines() if "mirror" in ln and "failed" in ln]
    assert len(switches) == 1 and f"reading from mirror {nginx.url}/mirror2" in switches[0], switches
    assert xattrs(m / "k")["user.refmount.resolved"] == (f"{srv.url}/m/big.bin\n"
                                                         f"{nginx.url}/mirror2/big.bin")


# ---- the fetcher's mirrors against real HTTP servers (no FUSE) -------------------------------


def mirrored(first: FaultServer, second: FaultServer, timeout: float = 4.0,
             retries: int = 1) -> Fetcher:
    rules = TargetRules.from_json([{"prefix": "https://pub.example/d",
                                    "rewrite": [f"{first.url}/d", f"{second.url}/d"]}])
    return Fetcher({}, TargetPolicy(["/"], None, None), timeout=timeout, retries=retries,
                   max_connections=4, stats=Stats(), rules=rules)


@pytest.fixture
def two_servers(tmp_path):
    one, two = FaultServer(tmp_path / "one"), FaultServer(tmp_path / "two")
    with one, two:
        one.put("d/t.bin", b"1" * 4096)
        two.put("d/t.bin", b"2" * 4096)
        yield one, two


def test_a_stalled_mirror_costs_its_share_of_the_timeout(two_servers):
    """The first mirror answers nothing: after timeout / 2 the block comes from the second."""
    one, two = two_servers
    one.add_fault("d/t.bin", "stall", times=None, seconds=20)
    f = mirrored(one, two, timeout=4)

    async def main() -> tuple[bytes, float]:
        began = trio.current_time()
        data = await f.cat_range("https://pub.example/d/t.bin", 0, 100)
        return data, trio.current_time() - began

    data, took = trio.run(main)
    assert data == b"2" * 100 and 1.9 < took < 3.5, took


@pytest.mark.parametrize("status", [404, 403])
def test_404_and_403_are_answers_not_a_mirror_down(two_servers, status):
    one, two = two_servers
    one.add_fault("d/t.bin", "status", times=None, status=status)
    f = mirrored(one, two)

    async def main() -> None:
        await f.cat_range("https://pub.example/d/t.bin", 0, 100)

    with pytest.raises(FetchError) as e:
        trio.run(main)
    assert f"{one.url}/d/t.bin" in str(e.value)
    assert two.count() == 0


def test_every_mirror_down_fails_within_the_timeout(two_servers):
    one, two = two_servers
    for s in (one, two):
        s.add_fault("d/t.bin", "status", times=None, status=503)
    f = mirrored(one, two, timeout=3, retries=2)

    async def main() -> float:
        began = trio.current_time()
        with pytest.raises(FetchError, match="after 3 attempts"):
            await f.cat_range("https://pub.example/d/t.bin", 0, 100)
        return trio.current_time() - began

    assert trio.run(main) < 3.5
    assert one.count() == 3 and two.count() == 3  # each round asks each mirror once


def test_a_mirror_refusing_connections_is_left_at_once(two_servers):
    one, two = two_servers
    f = mirrored(one, two, timeout=4, retries=0)
    one.stop()  # its port now refuses connections

    async def main() -> tuple[bytes, float]:
        began = trio.current_time()
        data = await f.cat_range("https://pub.example/d/t.bin", 10, 20)
        return data, trio.current_time() - began

    data, took = trio.run(main)
    assert data == b"2" * 10 and took < 1.0, took


@pytest.mark.fuse
def test_a_rules_header_never_reaches_a_path_outside_its_prefix(mount, serve, srv, tmp_path):
    """A rule for ``/pub/`` with an ``Authorization`` header; targets that climb out of it
    however the dots are escaped. Read through refmount serve and through a mount, the
    recording server sees the header on requests under ``/pub/`` only, whatever path each
    request names once decoded and normalised."""
    import posixpath
    import urllib.parse

    srv.put("pub/a", b"PUBLIC-A" * 100)
    srv.put("obj", b"OUTSIDE" * 100)
    token = "Bearer RULE-TOKEN-9f1c"
    base = srv.url
    refs = {"inside": [f"{base}/pub/a"], "dot": [f"{base}/pub/./a"], "esc": [f"{base}/p%75b/a"],
            "e1": [f"{base}/pub/%2e%2e/obj"], "e2": [f"{base}/pub/.%2e/obj"],
            "e3": [f"{base}/pub/%2E%2E/obj"], "e4": [f"{base}/pub/x/%2e%2e/%2e%2e/obj"]}
    src = write_json(tmp_path / "refs.json", refs)
    rules = json.dumps([{"prefix": f"{base}/pub/", "options": {"headers": {"Authorization": token}}}])

    def check() -> None:
        with_header = [r for r in srv.log(method=None) if r.headers.get("Authorization") == token]
        assert with_header, "the rule's header was never sent"
        for r in srv.log(method=None):
            sent = posixpath.normpath(urllib.parse.unquote(urllib.parse.urlsplit(r.raw_target).path))
            if r.headers.get("Authorization") == token:
                assert sent.startswith("/pub/"), (r.raw_target, sent)

    s = serve(src, f"targets={rules}", "no_disk_cache", "retries=0")
    for key in refs:
        r = s.request("GET", f"/{key}")
        assert r.status == 200 and r.body == (b"PUBLIC-A" * 100 if key in ("inside", "dot", "esc")
                                              else b"OUTSIDE" * 100), (key, r)
    check()
    srv.reset_log()
    m = mount(src, f"targets={rules}", "no_disk_cache", "retries=0")
    for key in refs:
        assert (m / key).read_bytes()[:6] in (b"PUBLIC", b"OUTSID")
    check()
