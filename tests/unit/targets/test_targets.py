"""Target rules (refmount/targets/rules.py): parsing and its refusals, the longest prefix, matching
on path-segment boundaries, rewrites and mirrors, options merged over remote_options, the
policy applied after the rewrite, the disk-cache key per rule, redaction, and the fetcher
reading rewritten local targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from refmount.base.errors import FetchError
from refmount.base.stats import Stats
from refmount.cli.cmdline import masked_arguments, secrets_in
from refmount.cli.main import apply_command_options
from refmount.cli.tools import inspect
from refmount.config import MAX_RULES_FILE, ConfigError, MountConfig, apply_options, describe_options
from refmount.core.setcore import disk_cache_key
from refmount.targets.fetch import Fetcher
from refmount.targets.policy import TargetPolicy, TargetRefused, check_targets
from refmount.targets.retries import mirror_down
from refmount.targets.rules import (
    TargetRules,
    load_rules,
    options_for,
    parse_rules,
)

SECRET = "SENTINEL-RULE-SECRET-41c9"


def rules(*raw: dict) -> TargetRules:
    return TargetRules(parse_rules(list(raw)))


# ---- matching ----------------------------------------------------------------------------------


def test_the_longest_matching_prefix_wins_whatever_the_order() -> None:
    r = rules({"prefix": "s3://bkt/", "options": {"anon": True}},
              {"prefix": "s3://bkt/data/deep/", "options": {"anon": False}},
              {"prefix": "s3://bkt/data/"})
    assert r.match("s3://bkt/data/deep/x.nc").number == 2
    assert r.match("s3://bkt/data/x.nc").number == 3
    assert r.match("s3://bkt/other/x.nc").number == 1
    assert r.match("s3://other/x.nc") is None
    assert r.match("gs://bkt/data/x.nc") is None


@pytest.mark.parametrize(("prefix", "url", "matches"), [
    ("s3://bucket/a", "s3://bucket/a", True),
    ("s3://bucket/a", "s3://bucket/a/x", True),
    ("s3://bucket/a", "s3://bucket/ab", False),
    ("s3://bucket/a", "s3://bucket/ab/x", False),
    ("s3://bucket/a/", "s3://bucket/a/x", True),
    ("s3://bucket/a/", "s3://bucket/a", False),
    ("s3://bucket/a", "s3://bucket", False),
    ("s3://", "s3://any/thing", True),
    ("https://host.org", "https://host.org/x", True),
    ("https://host.org", "https://host.organic/x", False),
    # local prefixes match local targets by path, in every local spelling
    ("/glade/campaign", "/glade/campaign/a.nc", True),
    ("/glade/campaign", "file:///glade/campaign/a.nc", True),
    ("file:///glade/campaign/", "/glade/campaign/a.nc", True),
    ("/glade/campaign", "/glade/campaign2/a.nc", False),
    ("/glade/campaign", "s3://glade/campaign/a.nc", False),
    ("file:///glade", "https://x/glade/a", False),
])
def test_prefixes_match_on_path_segment_boundaries(prefix: str, url: str, matches: bool) -> None:
    r = rules({"prefix": prefix, "rewrite": "https://m/" if prefix.endswith("/") else "https://m"})
    assert (r.match(url) is not None) is matches


def test_rewrite_replaces_the_prefix_and_keeps_the_rest() -> None:
    r = rules({"prefix": "/glade/campaign/collections/gdex/data/",
               "rewrite": "https://data.gdex.ucar.edu/"})
    route = r.route("/glade/campaign/collections/gdex/data/d633000/e5.nc")
    assert route.urls == ("https://data.gdex.ucar.edu/d633000/e5.nc",)
    assert route.rewritten and route.rule is not None and route.rule.number == 1
    assert r.route("file:///glade/campaign/collections/gdex/data/x.nc").urls == (
        "https://data.gdex.ucar.edu/x.nc",)


def test_a_list_rewrite_gives_the_mirrors_in_order() -> None:
    r = rules({"prefix": "https://a.org/data", "rewrite": ["https://b.org/d", "https://c.org/e"]})
    assert r.route("https://a.org/data/x/y.nc").urls == ("https://b.org/d/x/y.nc",
                                                         "https://c.org/e/x/y.nc")


def test_a_rule_without_rewrite_or_no_rule_keeps_the_url() -> None:
    r = rules({"prefix": "s3://bkt", "options": {"anon": True}})
    route = r.route("s3://bkt/x")
    assert route.urls == ("s3://bkt/x",) and not route.rewritten and route.rule is not None
    none = r.route("s3://other/x")
    assert none.urls == ("s3://other/x",) and none.rule is None


def test_options_are_merged_over_remote_options_key_by_key() -> None:
    r = rules({"prefix": "s3://b", "options": {"anon": True, "client_kwargs": {"endpoint_url": "x"}}})
    remote = {"anon": False, "client_kwargs": {"region_name": "r"}, "default_block_size": 5}
    merged = options_for(r.match("s3://b/k"), remote)
    assert merged == {"anon": True, "client_kwargs": {"endpoint_url": "x"}, "default_block_size": 5}
    assert options_for(None, remote) == remote
    assert remote["anon"] is False  # not changed in place


# ---- parsing and refusals ------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "says"), [
    ({"prefix": "s3://b"}, "must be a JSON list"),
    ([{"prefix": ""}], "prefix must be a non-empty string"),
    ([{"rewrite": "x"}], 'no "prefix"'),
    (["s3://b"], "must be a JSON object"),
    ([{"prefix": "s3://b", "rewrites": "x"}], "unknown field 'rewrites'"),
    ([{"prefix": "s3://b", "options": ["anon"]}], "options must be a JSON object"),
    ([{"prefix": "s3://b", "rewrite": []}], "non-empty list"),
    ([{"prefix": "s3://b", "rewrite": 3}], "rewrite must be a string"),
    ([{"prefix": "s3://b", "rewrite": ["https://m", ""]}], "rewrite 2 must be a non-empty"),
    ([{"prefix": "s3://b/", "rewrite": "https://m"}], "end with '/'"),
    ([{"prefix": "s3://b", "rewrite": "https://m/"}], "end with '/'"),
    ([{"prefix": "s3://b"}, {"prefix": "s3://b"}], "rules 1 and 2 have the same prefix"),
    ([{"prefix": "/a"}, {"prefix": "file:///a"}], "same prefix"),
    ([{"prefix": "s3://b", "credentials": {"process": []}}], "non-empty list"),
    ([{"prefix": "s3://b", "credentials": {"process": ["x", 1]}}], "non-empty list"),
    ([{"prefix": "s3://b", "credentials": {"env": "X"}}], 'credentials must be {"process"'),
    ([{"prefix": "s3://b", "credentials": ["x"]}], 'credentials must be {"process"'),
])
def test_bad_rules_are_refused_naming_the_problem(raw: object, says: str) -> None:
    with pytest.raises(ConfigError, match=r"^targets") as e:
        parse_rules(raw)
    assert says in str(e.value)


def test_credentials_are_kept_as_argv() -> None:
    (rule,) = parse_rules([{"prefix": "s3://b", "credentials": {"process": ["/bin/cred", "-p", "x"]}}])
    assert rule.credentials == ("/bin/cred", "-p", "x")
    assert TargetRules([rule]).as_json() == [{"prefix": "s3://b",
                                              "credentials": {"process": ["/bin/cred", "-p", "x"]}}]


def test_the_option_takes_inline_json_and_a_file(tmp_path: Path) -> None:
    raw = [{"prefix": "/data/", "rewrite": ["http://a/", "http://b/"], "options": {"key": SECRET}}]
    cfg = MountConfig()
    apply_options(cfg, ["targets=" + json.dumps(raw)])
    assert cfg.targets == raw
    f = tmp_path / "rules.json"
    f.write_text(json.dumps(raw))
    cfg2 = MountConfig()
    apply_options(cfg2, [f"targets=@{f}"])
    assert cfg2.targets == raw
    # the start line of the log names the number of rules, never their options
    shown = describe_options(cfg2)
    assert "targets=1 rule," in shown + "," and SECRET not in shown
    # the configuration goes to the daemon as JSON
    assert json.loads(json.dumps(cfg2.targets)) == raw


@pytest.mark.parametrize(("value", "says"), [
    ('[{"prefix": "s3://b", "options": {"key": "' + SECRET + '"}', "not valid JSON"),
    ("@/nonexistent/rules.json", "cannot read /nonexistent/rules.json"),
    ('{"prefix": "x"}', "must be a JSON list"),
    ("[" * 100_000 + "]" * 100_000, "targets"),
])
def test_bad_option_values_are_one_line_without_the_value(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        apply_command_options(MountConfig(), ["targets=" + value])
    assert says in str(e.value) and SECRET not in str(e.value) and "\n" not in str(e.value)


def test_a_rules_file_is_bounded(tmp_path: Path) -> None:
    f = tmp_path / "big.json"
    f.write_text("[" + " " * MAX_RULES_FILE + "]")
    with pytest.raises(ConfigError, match="larger than"):
        load_rules(f"@{f}")


def test_the_cli_refuses_bad_rules_in_one_line(tmp_path: Path) -> None:
    """refmount SOURCE MOUNTPOINT -o targets=... with a bad rule: one line, exit 1, before
    anything is mounted (the option is parsed before the mountpoint is looked at)."""
    src = tmp_path / "refs.json"
    src.write_text('{"version": 1, "refs": {"a": "x"}}')
    bad = json.dumps([{"prefix": "s3://b", "options": {"secret": SECRET}, "colour": 1}])
    r = subprocess.run([sys.executable, "-m", "refmount", str(src), str(tmp_path / "missing"),
                        "-o", f"targets={bad}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("refmount: error: targets: rule 1: unknown field 'colour'")
    assert len(r.stderr.strip().splitlines()) == 1 and SECRET not in r.stderr + r.stdout


def test_rules_are_shown_redacted() -> None:
    (rule,) = parse_rules([{"prefix": "https://user:" + SECRET + "@host/x", "rewrite": "https://m/y"}])
    assert SECRET not in rule.describe() and rule.describe().startswith("1 https://***@host/x")


# ---- the policy after the rewrite ----------------------------------------------------------


def test_the_policy_applies_to_the_rewritten_url(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    policy = TargetPolicy([str(allowed)], str(allowed), None)
    r = rules({"prefix": "https://pub.org/", "rewrite": "/etc/"},
              {"prefix": "/glade/", "rewrite": str(allowed) + "/"})
    route = policy.route(r, "https://pub.org/shadow")
    assert route.urls == ("/etc/shadow",)
    assert policy.problem(route.urls[0], resolve=False) is not None
    # a forbidden local path rewritten to an allowed one is read from there
    assert policy.route(r, "/glade/a.nc").urls == (str(allowed / "a.nc"),)
    # rewritten relative or un-normalised paths are resolved like any target
    r2 = rules({"prefix": "s3://b/", "rewrite": "file://sub/../"})
    assert policy.route(r2, "s3://b/x.nc").urls == (f"file://{allowed}/x.nc",)


def test_check_targets_refuses_a_rewrite_to_a_forbidden_path(tmp_path: Path) -> None:
    cfg = MountConfig(source=str(tmp_path / "refs.json"), allow_local=[str(tmp_path)])
    cfg.targets = [{"prefix": "https://pub.org/", "rewrite": ["https://m.org/", "/etc/"]}]
    with pytest.raises(TargetRefused) as e:
        check_targets(cfg, [("https://pub.org/shadow", lambda: "a/0")])
    assert "read as /etc/shadow by target rule 1" in str(e.value)
    cfg.targets = [{"prefix": "/elsewhere/", "rewrite": str(tmp_path) + "/"}]
    check_targets(cfg, [("/elsewhere/a.nc", lambda: "a/0")])  # allowed after the rewrite
    cfg.targets = []
    with pytest.raises(TargetRefused):
        check_targets(cfg, [("/elsewhere/a.nc", lambda: "a/0")])


# ---- the fetcher ---------------------------------------------------------------------------


def fetcher(tmp_path: Path, rules_: TargetRules, remote: dict | None = None) -> Fetcher:
    return Fetcher(remote or {}, TargetPolicy([str(tmp_path)], str(tmp_path), None), timeout=5,
                   retries=0, max_connections=4, stats=Stats(), rules=rules_)


def test_the_fetcher_reads_rewritten_local_targets_within_the_policy(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"0123456789")
    f = fetcher(tmp_path, rules({"prefix": "/glade/", "rewrite": str(tmp_path) + "/"},
                                {"prefix": "https://pub.org/", "rewrite": "/etc/"}))

    async def main() -> None:
        assert await f.cat_range("/glade/data.bin", 2, 6) == b"2345"
        assert await f.size("/glade/data.bin") == 10
        with pytest.raises(FetchError) as e:
            await f.cat_range("https://pub.org/passwd", 0, 4)
        assert "outside the allowed directories" in str(e.value)

    trio.run(main)
    assert f.problem("https://pub.org/passwd", resolve=True) is not None
    assert f.problem("/glade/data.bin", resolve=True) is None


def test_xattr_description_of_a_route(tmp_path: Path) -> None:
    f = fetcher(tmp_path, rules({"prefix": "https://a.org/x",
                                 "rewrite": ["https://u:" + SECRET + "@b.org/y", "https://c.org/z"]}))
    d = f.describe("https://a.org/x/k.nc")
    assert d == {"resolved": "https://***@b.org/y/k.nc\nhttps://c.org/z/k.nc", "rule": "1 https://a.org/x"}
    assert f.describe("https://other/k.nc")["rule"] == "none"
    assert fetcher(tmp_path, TargetRules()).describe("https://a.org/x/k.nc") == {}


def test_disk_cache_keys_differ_by_rule_options_and_resolved_url(tmp_path: Path) -> None:
    r = rules({"prefix": "s3://a/", "options": {"client_kwargs": {"endpoint_url": "http://e1"}}},
              {"prefix": "s3://b/", "options": {"client_kwargs": {"endpoint_url": "http://e2"}}},
              {"prefix": "https://old.org/", "rewrite": "https://new.org/"})
    key = disk_cache_key(fetcher(tmp_path, r))
    plain = disk_cache_key(fetcher(tmp_path, TargetRules()))
    # same object name under two endpoints: two keys
    assert key("s3://a/k").split("\0")[0] != key("s3://b/k").split("\0")[0]
    # a target no rule matches keeps the key it has without rules
    assert key("s3://c/k") == plain("s3://c/k")
    # a rewritten target is named by where it is read
    assert "\0https://new.org/k\0" in key("https://old.org/k")
    # rule options are part of the key, not only the URL
    other = disk_cache_key(fetcher(tmp_path, rules(
        {"prefix": "s3://a/", "options": {"client_kwargs": {"endpoint_url": "http://e3"}}})))
    assert other("s3://a/k") != key("s3://a/k")


def test_file_systems_are_kept_per_rule(tmp_path: Path) -> None:
    """Two rules with different options get two file system instances for one protocol."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"abc")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_bytes(b"def")
    r = rules({"prefix": str(tmp_path / "a"), "options": {"auto_mkdir": False}},
              {"prefix": str(tmp_path / "b"), "options": {"auto_mkdir": True}})
    f = fetcher(tmp_path, r)

    async def main() -> None:
        assert await f.cat_range(str(tmp_path / "a" / "x"), 0, 3) == b"abc"
        assert await f.cat_range(str(tmp_path / "b" / "x"), 0, 3) == b"def"

    trio.run(main)
    assert f.static_options(r.match(str(tmp_path / "b" / "x"))) == {"auto_mkdir": True}
    assert f.static_options(None) == {}


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


@pytest.mark.parametrize(("error", "down"), [
    (ConnectionRefusedError(111, "refused"), True),
    (TimeoutError(), True),
    (trio.TooSlowError(), True),
    (_Status(502), True),
    (_Status(503), True),
    (_Status(429), True),
    (_Status(400), False),
    (_Status(416), False),
])
def test_what_counts_as_a_mirror_being_down(error: BaseException, down: bool) -> None:
    assert mirror_down(error) is down


def test_inline_rules_are_masked_on_the_command_line() -> None:
    rule = json.dumps([{"prefix": "s3://b", "options": {"secret": SECRET}}])
    args = ["refmount", "/srv/r.json", "/mnt", "-o", f"ro,targets={rule},allow_other",
            f"-otargets={rule}", "-o", "targets=@/etc/refmount/rules.json"]
    shown = masked_arguments(args)
    assert shown == ["refmount", "/srv/r.json", "/mnt", "-o", "ro,targets=***,allow_other",
                     "-otargets=***", "-o", "targets=@/etc/refmount/rules.json"]
    assert "inline remote_options/target_options JSON" in secrets_in(args)


DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_the_documented_examples_are_valid_rules_without_secrets() -> None:
    import re

    ncar = TargetRules.from_json(load_rules(f"@{DOCS / 'examples/targets-ncar.json'}"))
    route = ncar.route("/glade/campaign/collections/gdex/data/d633000/e5.oper.an.nc")
    assert route.urls == ("https://data.gdex.ucar.edu/d633000/e5.oper.an.nc",
                          "https://osdf-director.osg-htc.org/ncar/gdex/d633000/e5.oper.an.nc")
    buckets = TargetRules.from_json(load_rules(f"@{DOCS / 'examples/targets-s3-buckets.json'}"))
    assert len({json.dumps(r.options, sort_keys=True) for r in buckets.rules}) == len(buckets)
    for rule in buckets.rules:
        assert not {"key", "secret", "token", "password"} & set(rule.options)
    block = re.search(r"## Target rules.*?```json\n(.*?)```", (DOCS / "configuration.md").read_text(), re.S)
    assert block is not None
    assert len(TargetRules.from_json(load_rules(block[1]))) == 3


def test_inspect_shows_each_rule_and_the_targets_no_rule_matches(tmp_path: Path) -> None:
    src = tmp_path / "refs.json"
    src.write_text(json.dumps({"version": 1, "refs": {
        "a/0": ["/glade/campaign/x.nc", 0, 10], "a/1": ["/glade/other/y.nc", 0, 10],
        "b/0": ["s3://bkt/z.nc", 0, 5], "c/0": ["data/rel.nc", 0, 5]}}))
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps([
        {"prefix": "/glade/campaign/", "rewrite": ["https://u:" + SECRET + "@a.org/d/", "https://b.org/"]},
        {"prefix": str(tmp_path / "data"), "rewrite": "https://c.org/rel"},
        {"prefix": "s3://bkt", "options": {"secret": SECRET}}]))
    r = subprocess.run([sys.executable, "-m", "refmount", "inspect", str(src), "--targets",
                        f"@{rules_file}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "rule 1 /glade/campaign/: 1 targets" in out
    assert "-> https://***@a.org/d/x.nc" in out and "-> https://b.org/x.nc" in out
    assert "-> https://c.org/rel/rel.nc" in out  # a relative path, resolved as a mount would
    assert "no rule: 1 targets\n    /glade/other/y.nc" in out
    assert SECRET not in out + r.stderr
    routed = inspect(str(src), {}, TargetRules.from_json(load_rules(f"@{rules_file}")))["target_rules"]
    assert routed["unmatched"] == 1 and [r["targets"] for r in routed["rules"]] == [1, 1, 1]
    bad = subprocess.run([sys.executable, "-m", "refmount", "inspect", str(src), "--targets",
                          '[{"prefix": 1}]'], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith(
        "refmount: error: targets: rule 1: prefix must be")


def test_matching_costs_a_few_lookups_per_url_however_many_rules() -> None:
    import time

    many = rules(*({"prefix": f"s3://bucket-{i}/data/", "rewrite": f"https://m{i}.org/"}
                   for i in range(10_000)))
    urls = [f"s3://bucket-{i % 12_000}/data/y{i}/c{i}.nc" for i in range(100_000)]
    began = time.process_time()
    matched = sum(many.match(u) is not None for u in urls)
    assert matched == sum(1 for i in range(100_000) if i % 12_000 < 10_000)
    assert time.process_time() - began < 5.0  # a scan of the rules per URL takes minutes


def test_a_target_climbing_out_of_a_prefix_is_not_matched_by_it() -> None:
    r = rules({"prefix": "https://pub.org/private/", "options": {"headers": {"Authorization": "x"}}},
              {"prefix": "https://pub.org/", "rewrite": "https://mirror.org/"},
              {"prefix": "https://odd.org/a/../b", "rewrite": "https://m.org/b"})
    assert r.match("https://pub.org/private/x/y.nc").number == 1
    assert r.match("https://pub.org/private/../public/y.nc") is None
    assert r.match("https://pub.org/private/x/../../y.nc") is None
    assert r.match("https://pub.org/private/x/..y.nc").number == 1  # a name, not a segment
    assert r.match("https://odd.org/a/../b/c.nc").number == 3  # ".." of the rule's own prefix


_SEGMENTS = st.lists(st.sampled_from(["a", "ab", "b", "..", "x.nc"]), min_size=0, max_size=4)


@settings(max_examples=300, deadline=None)
@given(prefixes=st.lists(st.tuples(_SEGMENTS, st.booleans()), min_size=1, max_size=6),
       url=_SEGMENTS)
def test_matching_is_the_longest_prefix_on_a_segment_boundary(prefixes, url) -> None:
    """The lookup agrees with the definition: among the prefixes that equal the URL or end
    where one of its segments ends (with or without the '/'), with no '..' segment after
    them, the longest."""
    texts = list(dict.fromkeys("s3://b/" + "/".join(p) + ("/" if slash and p else "")
                               for p, slash in prefixes))
    r = rules(*({"prefix": t} for t in texts))
    target = "s3://b/" + "/".join(url)

    def matches(prefix: str) -> bool:
        if not target.startswith(prefix):
            return False
        if not (len(target) == len(prefix) or prefix.endswith("/") or target[len(prefix)] == "/"):
            return False
        return ".." not in target[len(prefix):].split("/")

    want = max((t for t in texts if matches(t)), key=len, default=None)
    got = r.match(target)
    assert (got.prefix if got is not None else None) == want


def test_rules_without_secret_options_give_no_credentials_warning() -> None:
    plain = json.dumps([{"prefix": "/glade/", "rewrite": ["https://a.org/", "https://b.org/"],
                         "options": {"anon": True}}])
    assert secrets_in(["refmount", "r.json", "/mnt", "-o", f"targets={plain}"]) == []
    keyed = json.dumps([{"prefix": "s3://b", "options": {"profile": "p"}}])
    assert secrets_in(["-o", f"targets={keyed}"]) == ["inline remote_options/target_options JSON"]
    with_password = json.dumps([{"prefix": "/glade/", "rewrite": "https://u:pw@a.org/"}])
    assert secrets_in(["-o", f"targets={with_password}"]) == ["a password, token or signature"]


def test_rules_match_the_url_as_its_client_sends_it() -> None:
    """Escaped dots, dot segments, the case of scheme and host and default ports: a target is
    matched as aiohttp (yarl) or a server would read it, for every protocol; one that would be
    requested outside a prefix is matched by no rule."""
    r = rules({"prefix": "http://H.example/pub/", "options": {"headers": {"Authorization": "x"}}},
              {"prefix": "s3://bkt/pub/", "options": {"key": "k"}},
              {"prefix": "https://m.example/a", "rewrite": "https://n.example/b"})
    for climbing in ("http://H.example/pub/%2e%2e/obj", "http://h.example/pub/.%2e/obj",
                     "http://h.example/pub/%2E%2E/obj", "http://h.example/pub/%2e./obj",
                     "http://h.example/pub/x/%2e%2e/%2e%2e/obj", "http://h.example/pub/..%2fobj",
                     "http://h.example/pub/..%5Cobj", "http://h.example/pub/..\\obj",
                     "s3://bkt/pub/%2e%2e/other", "s3://bkt/pub/..%2Fother"):
        assert r.match(climbing) is None, climbing
    for inside in ("http://h.example/pub/x", "HTTP://H.EXAMPLE/pub/x", "http://h.example:80/pub/x",
                   "http://h.example/p%75b/x", "http://h.example/pub/./x", "http://h.example/pub/%2e/x",
                   "http://h.example/pub/x%2e%2e", "http://h.example/pub/a..b/c"):
        assert r.match(inside).number == 1, inside
    assert r.match("http://h.example:8080/pub/x") is None  # another port: another server
    assert r.match("https://h.example/pub/x") is None  # another scheme
    assert r.match("S3://bkt/pub/x").number == 2
    # a rewrite continues from the URL as it is sent
    assert r.route("HTTPS://M.example:443/a/%7Ex").urls == ("https://n.example/b/~x",)
    assert r.route("https://m.example/a/%2e%2e/x").urls == ("https://m.example/a/%2e%2e/x",)


def test_normal_url_keeps_what_a_client_keeps() -> None:
    from refmount.base.urls import climbs, normal_url

    assert normal_url("HTTPS://user:P%40ss@Host.Example:443/a/%7e%2F%2fb?q=%2e#f") == \
        "https://user:P%40ss@host.example/a/~%2F%2Fb?q=.#f"
    assert normal_url("ftp://h:21/x") == "ftp://h/x" and normal_url("s3://b:21/x") == "s3://b:21/x"
    assert normal_url("/local/%2e%2e/x") == "/local/%2e%2e/x"  # local paths: as they are
    assert climbs("a/%2E%2e") and climbs("..%2f") and not climbs("a..b/c") and not climbs("x?q=/../")
