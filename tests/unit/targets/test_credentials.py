"""Credentials that refresh (refmount/targets/credentials.py), without FUSE: the output formats, the
command's bounds (real processes), and the refresh schedule, single flight, failures and
backoff (a fake command under trio's MockClock, and once with real processes and time)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

from refmount.base.errors import ConfigError, FetchError, ReadError
from refmount.cli.main import apply_command_options
from refmount.cli.tools import format_stats
from refmount.config import MountConfig
from refmount.targets.credentialcommand import run_command, shown_command
from refmount.targets.credentialoutput import merge_options, parse_output
from refmount.targets.credentials import CredentialError, CredentialProcess, RuleCredentials

SECRET = "SENTINEL-s3cr3t-7f1e"  # never in a log record or an error
T0 = 1_800_000_000.0  # the fake wall clock's start (2027-01-15)


def ours(output: dict) -> bytes:
    return json.dumps(output).encode()


# ---- the output formats --------------------------------------------------------------------------

def test_refmount_format_with_each_kind_of_expiry() -> None:
    opts = {"headers": {"Authorization": f"Bearer {SECRET}"}}
    for expiry, want in [
        ("2027-01-15T08:00:00Z", T0),
        ("2027-01-15T09:00:00+01:00", T0),
        ("2027-01-15T08:00:00.250", T0 + 0.25),  # no zone: UTC
        (1_800_003_600, 1_800_003_600.0),
        (1_800_003_600.5, 1_800_003_600.5),
    ]:
        cred = parse_output(ours({"options": opts, "expiry": expiry}), now=T0 - 10**5)
        assert cred.options == opts
        assert cred.expiry == pytest.approx(want), expiry
    never = parse_output(ours({"options": {"anon": False}, "expiry": None}), now=T0)
    assert never.expiry is None and never.valid(T0 + 10**9)
    assert parse_output(ours({"options": {}}), now=T0).expiry is None
    assert SECRET not in repr(cred)


def test_iso_expiries_are_the_same_instant() -> None:
    a = parse_output(ours({"options": {}, "expiry": "2027-01-15T08:00:00Z"}), now=T0 - 10**5)
    b = parse_output(ours({"options": {}, "expiry": "2027-01-15T09:30:00+01:30"}), now=T0 - 10**5)
    assert a.expiry == b.expiry == T0


def test_aws_credential_process_format_maps_to_s3fs_options() -> None:
    out = {"Version": 1, "AccessKeyId": "AKIAEXAMPLE", "SecretAccessKey": SECRET,
           "SessionToken": "tok", "Expiration": "2027-01-15T09:00:00Z"}
    cred = parse_output(ours(out), now=T0 - 10**5)
    assert cred.options == {"key": "AKIAEXAMPLE", "secret": SECRET, "token": "tok"}
    assert cred.expiry == parse_output(ours({"options": {}, "expiry": "2027-01-15T09:00:00Z"}),
                                       now=0).expiry
    static = {"Version": 1, "AccessKeyId": "AKIAEXAMPLE", "SecretAccessKey": SECRET}
    cred = parse_output(ours(static), now=T0)
    assert cred.options == {"key": "AKIAEXAMPLE", "secret": SECRET} and cred.expiry is None


@pytest.mark.parametrize(("output", "says"), [
    (b"", "not JSON"),
    (f"Bearer {SECRET}".encode(), "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (json.dumps([SECRET]).encode(), "not a JSON object"),
    (ours({"token": SECRET}), "neither"),
    (ours({"options": SECRET}), "not a JSON object of storage options"),
    (ours({"options": {}, "expires": SECRET}), "unknown fields: 'expires'"),
    (ours({"options": {}, "expiry": SECRET}), "not an ISO 8601 time"),
    (ours({"options": {}, "expiry": True}), "true or false"),
    (ours({"options": {}, "expiry": -5}), "positive number"),
    (ours({"options": {}, "expiry": [1]}), "JSON list"),
    (ours({"options": {"token": SECRET}, "expiry": T0 - 60}), "expired 60 s ago"),
    (ours({"Version": 2, "AccessKeyId": "a", "SecretAccessKey": SECRET}), "Version"),
    (ours({"Version": 1, "SecretAccessKey": SECRET}), '"AccessKeyId"'),
    (ours({"Version": 1, "AccessKeyId": "a", "SecretAccessKey": SECRET, "Region": "x"}),
     "unknown fields: 'Region'"),
])
def test_bad_output_is_refused_naming_the_problem_never_the_output(output: bytes, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_output(output, now=T0)
    assert says in str(info.value)
    assert SECRET not in str(info.value)


def test_credential_options_merge_into_the_rules_objects() -> None:
    base = {"headers": {"User-Agent": "x"}, "client_kwargs": {"trust_env": True}, "anon": True}
    extra = {"headers": {"Authorization": "Bearer t"}, "anon": False}
    assert merge_options(base, extra) == {
        "headers": {"User-Agent": "x", "Authorization": "Bearer t"},
        "client_kwargs": {"trust_env": True}, "anon": False}
    assert base["headers"] == {"User-Agent": "x"}  # not changed


# ---- the command: real processes, bounded ------------------------------------------------------

def script(tmp_path: Path, body: str, name: str = "cred.py") -> list[str]:
    path = tmp_path / name
    path.write_text("import json, os, sys, time\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_the_command_runs_without_a_shell_with_the_environment(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REFMOUNT_TEST_CRED", "from-env")
    argv = [*script(tmp_path, """
        print(json.dumps({"argv": sys.argv[1:], "env": os.environ["REFMOUNT_TEST_CRED"],
                          "stdin": sys.stdin.read()}))
    """), "$HOME", "a b;c"]
    out = json.loads(trio.run(run_command, argv))
    assert out == {"argv": ["$HOME", "a b;c"], "env": "from-env", "stdin": ""}


def test_a_failing_command_says_its_status_and_the_redacted_end_of_stderr(tmp_path: Path) -> None:
    argv = script(tmp_path, f"""
        print("{SECRET}")  # stdout is never shown
        print("first line", file=sys.stderr)
        print("login failed: token={SECRET} refused", file=sys.stderr)
        sys.exit(3)
    """)
    with pytest.raises(Exception) as info:
        trio.run(run_command, argv)
    assert str(info.value) == f"{shown_command(argv)} failed (exit status 3)"
    detail = info.value.detail  # type: ignore[attr-defined]
    assert detail == "login failed: token=*** refused"


@pytest.mark.parametrize("line, shown", [
    ("curl: (22) 401 for Authorization: Bearer {s}", "curl: (22) 401 for Authorization: ***"),
    ("sent header 'Authorization: token {s}'", "sent header 'Authorization: ***'"),
    ("refusing Bearer {s} (expired)", "refusing Bearer *** (expired)"),
    ("gh: token {s} has no scope", "gh: token *** has no scope"),
    ("proxy said: Basic {s}", "proxy said: Basic ***"),
])
def test_http_credentials_on_stderr_are_redacted(tmp_path: Path, line: str, shown: str) -> None:
    """The last line of stderr reaches the log: Authorization headers and Bearer, Basic and
    token credentials in it are redacted like URL credentials."""
    argv = script(tmp_path, f"""
        print({line.format(s=SECRET)!r}, file=sys.stderr)
        sys.exit(1)
    """)
    with pytest.raises(Exception) as info:
        trio.run(run_command, argv)
    assert info.value.detail == shown  # type: ignore[attr-defined]


def test_a_command_is_named_whole_when_short_and_cut_at_100_characters_when_long() -> None:
    assert shown_command(["/usr/bin/cred", "--profile", "a b"]) == "/usr/bin/cred --profile 'a b'"
    long = shown_command(["/opt/" + "x" * 120, "--flag"])
    assert long == "/opt/" + "x" * 95 + "…"


def test_a_hanging_command_and_its_children_are_killed_at_the_timeout(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    argv = script(tmp_path, f"""
        import subprocess
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(child)!r}, "w").write(str(p.pid))
        print("waiting", file=sys.stderr, flush=True)
        time.sleep(60)
    """)
    began = time.monotonic()
    with pytest.raises(Exception, match=r"did not finish within 1 s: killed") as info:
        trio.run(lambda: run_command(argv, timeout=1.0))
    assert time.monotonic() - began < 4
    assert info.value.detail == "waiting"  # type: ignore[attr-defined]
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() \
            and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]:
        time.sleep(0.05)
    alive = Path(f"/proc/{pid}").exists() and \
        "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert not alive, "the command's child outlived the timeout"


def test_huge_output_is_refused_and_the_command_killed(tmp_path: Path) -> None:
    argv = script(tmp_path, """
        while True:
            sys.stdout.write("x" * 65536)
    """)
    began = time.monotonic()
    with pytest.raises(Exception, match=r"printed more than 65536 bytes: killed"):
        trio.run(lambda: run_command(argv, timeout=20))
    assert time.monotonic() - began < 5


def test_a_missing_command_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"cannot run /.*/nope: No such file"):
        trio.run(run_command, [str(tmp_path / "nope")])


# ---- the refresh schedule: a fake command under MockClock ---------------------------------------

class FakeCommand:
    """Prints a credential valid ``lifetime`` s from the fake clock, or fails while ``broken``."""

    def __init__(self, lifetime: float | None = 3600, seconds: float = 0.0) -> None:
        self.lifetime = lifetime
        self.seconds = seconds
        self.broken = False
        self.runs: list[float] = []  # trio times of the runs

    def clock(self) -> float:
        return T0 + trio.current_time()

    async def __call__(self, argv: object) -> bytes:
        self.runs.append(trio.current_time())
        await trio.sleep(self.seconds)
        if self.broken:
            from refmount.targets.credentialcommand import ProcessFailed
            raise ProcessFailed("fake failed (exit status 1)", f"bad token={SECRET}")
        n = len(self.runs)
        expiry = None if self.lifetime is None else self.clock() + self.lifetime
        return ours({"options": {"headers": {"Authorization": f"Bearer {SECRET}-{n}"}},
                     "expiry": expiry})

    def process(self, **kw: object) -> CredentialProcess:
        return CredentialProcess(["fake"], label="rule 1 (https://example.org/)",
                                 clock=self.clock, runner=self, **kw)  # type: ignore[arg-type]


def mock_run(main) -> None:  # type: ignore[no-untyped-def]
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def token(options: dict) -> str:
    return options["headers"]["Authorization"]


@pytest.mark.parametrize(("lifetime", "margin", "expect"),
                         [(3600, 300, [0, 3300, 6600]), (40, 300, [0, 30, 60, 90])])
def test_refreshes_come_the_margin_before_expiry_and_at_most_a_quarter_of_the_lifetime(
        lifetime: float, margin: float, expect: list[float]) -> None:
    fake = FakeCommand(lifetime)
    creds = fake.process(refresh_margin=margin)
    seen: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(creds.run)
            while trio.current_time() < expect[-1] + lifetime / 10:
                gen, opts = await creds.options()
                assert token(opts) == f"Bearer {SECRET}-{gen}"
                seen.append(gen)
                await trio.sleep(lifetime / 20)
            n.cancel_scope.cancel()

    mock_run(main)
    assert fake.runs == pytest.approx(expect)
    assert seen == sorted(seen) and set(seen) == set(range(1, len(expect) + 1))
    assert creds.describe()["refreshes"] == len(expect)


def test_credentials_that_live_a_moment_are_refreshed_at_most_once_a_second() -> None:
    fake = FakeCommand(lifetime=0.1)
    creds = fake.process()

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(creds.run)
            await trio.sleep(4.5)
            n.cancel_scope.cancel()

    mock_run(main)
    assert fake.runs == pytest.approx([0, 1, 2, 3, 4])


def test_an_unexpected_error_is_a_failed_run_not_the_end_of_the_mount() -> None:
    class Broken(FakeCommand):
        async def __call__(self, argv: object) -> bytes:
            self.runs.append(trio.current_time())
            raise RuntimeError(f"bug holding {SECRET}")

    fake = Broken()
    creds = fake.process()

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(creds.run)
            await trio.sleep(3.5)
            with pytest.raises(CredentialError, match="unexpected RuntimeError in refmount") as e:
                await creds.options()
            assert SECRET not in str(e.value)
            n.cancel_scope.cancel()

    mock_run(main)
    assert fake.runs == pytest.approx([0, 1, 3])


def test_a_credential_without_expiry_is_fetched_once() -> None:
    fake = FakeCommand(lifetime=None)
    creds = fake.process()

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(creds.run)
            await trio.sleep(10**4)
            assert await creds.options() == (1, {"headers": {"Authorization": f"Bearer {SECRET}-1"}})
            n.cancel_scope.cancel()

    mock_run(main)
    assert fake.runs == [0]


def test_concurrent_readers_share_one_run() -> None:
    fake = FakeCommand(seconds=2.0)
    creds = fake.process()
    got: list[int] = []

    async def reader() -> None:
        got.append((await creds.options())[0])

    async def main() -> None:
        async with trio.open_nursery() as n:
            for _ in range(50):
                n.start_soon(reader)

    mock_run(main)
    assert fake.runs == [0] and got == [1] * 50


def test_without_run_a_due_refresh_happens_on_the_next_read() -> None:
    fake = FakeCommand(lifetime=100)
    creds = fake.process(refresh_margin=10)

    async def main() -> None:
        assert (await creds.options())[0] == 1
        await trio.sleep(89)
        assert (await creds.options())[0] == 1
        await trio.sleep(2)  # within the margin
        assert (await creds.options())[0] == 2

    mock_run(main)
    assert fake.runs == [0, 91]


def test_failure_gives_eio_logged_once_then_backoff_then_recovery(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="refmount.targets.credentials")
    fake = FakeCommand(lifetime=40)
    creds = fake.process(refresh_margin=300)
    outcomes: list[tuple[float, str]] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(creds.run)
            await trio.sleep(1)
            fake.broken = True  # the refresh due at 30 fails; the credential is used until 36
            while trio.current_time() < 100:
                try:
                    gen, _ = await creds.options()
                    outcomes.append((trio.current_time(), f"gen {gen}"))
                except CredentialError as e:
                    assert e.reply_errno == errno.EIO and isinstance(e, ReadError)
                    assert e.logged  # the one log line is the credential's own
                    outcomes.append((trio.current_time(), str(e)))
                if trio.current_time() >= 70:
                    fake.broken = False
                await trio.sleep(0.5)
            n.cancel_scope.cancel()

    mock_run(main)
    before = [o for t, o in outcomes if t < 36]  # 40 - a tenth of its lifetime
    during = [o for t, o in outcomes if 36 <= t < 70]
    assert set(before) == {"gen 1"}  # still valid while the refresh fails
    assert during and all(o == "credentials for rule 1 (https://example.org/) unavailable: "
                          "fake failed (exit status 1)" for o in during)
    assert outcomes[-1][1] == "gen 2"
    # backoff: runs at 30, 31, 33, 37, 45, 61, 93 capped to 60 s; reads never ran it early
    broken_runs = [t for t in fake.runs if 30 <= t < 70]
    assert broken_runs == pytest.approx([30, 31, 33, 37, 45, 61])
    recovered = [t for t in fake.runs if t >= 70]
    assert recovered and recovered[0] <= 61 + 32 + 0.5
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "rule 1 (https://example.org/)" in line and "exit status 1" in line
    assert "credential is used until 2027-01-15T08:00:36Z (it expires at" in line
    assert "EIO" in line and "retrying in 1 s" in line
    assert any("works again after 6 failed runs" in r.getMessage() for r in caplog.records)
    for r in caplog.records:
        assert SECRET not in r.getMessage() and SECRET not in str(r.args)


def test_reads_during_the_backoff_fail_at_once_without_running_the_command() -> None:
    fake = FakeCommand()
    fake.broken = True
    creds = fake.process(min_backoff=10)

    async def main() -> None:
        for _ in range(20):
            with pytest.raises(CredentialError):
                await creds.options()
        await trio.sleep(11)
        fake.broken = False
        assert (await creds.options())[0] == 1

    mock_run(main)
    assert fake.runs == [0, 11]


def test_a_cancelled_reader_does_not_fail_the_others() -> None:
    fake = FakeCommand(seconds=2.0)
    creds = fake.process()
    got: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            with trio.move_on_after(1):  # the leader goes away mid-run
                await creds.options()

            async def reader() -> None:
                got.append((await creds.options())[0])

            n.start_soon(reader)
            n.start_soon(reader)

    mock_run(main)
    assert got == [1, 1] and fake.runs == [0, 1]


# ---- end to end: a real command, real time ------------------------------------------------------

def test_a_real_command_refreshes_under_continuous_use_and_never_shows_its_output(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    counter = tmp_path / "runs"
    argv = script(tmp_path, f"""
        from datetime import UTC, datetime
        path = {str(counter)!r}
        n = int(open(path).read()) + 1 if os.path.exists(path) else 1
        open(path, "w").write(str(n))
        print(json.dumps({{"Version": 1, "AccessKeyId": "AKIA" + str(n),
                          "SecretAccessKey": "{SECRET}", "SessionToken": "t" + str(n),
                          "Expiration": datetime.fromtimestamp(time.time() + 2, UTC).isoformat()}}))
    """)
    creds = CredentialProcess(argv, label="s3 rule", refresh_margin=300, timeout=10)
    keys: set[str] = set()

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(creds.run)
            end = trio.current_time() + 8
            while trio.current_time() < end and len(keys) < 3:
                gen, opts = await creds.options()  # never raises
                assert opts["key"] == f"AKIA{gen}" and opts["token"] == f"t{gen}"
                assert opts["secret"] == SECRET
                keys.add(opts["key"])
                await trio.sleep(0.02)
            n.cancel_scope.cancel()

    trio.run(main)
    runs = int(counter.read_text())
    # each credential lives 2 s and is refreshed after 1.5 s: runs at 0, 1.5 and 3 s (one
    # more may have started when the loop stopped)
    assert len(keys) == 3 and runs in (3, 4), (runs, keys)
    for r in caplog.records:
        assert SECRET not in r.getMessage() and "AKIA" not in r.getMessage()


# ---- the fetcher's provider: one process per rule ------------------------------------------------

@dataclass(frozen=True)
class FakeRule:
    number: int
    prefix: str
    credentials: tuple[str, ...] | None

    def describe(self) -> str:
        return f"{self.number} {self.prefix}"


def test_rule_credentials_give_each_rule_its_options_or_a_logged_fetch_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = script(tmp_path, f"""
        print(json.dumps({{"options": {{"headers": {{"Authorization": "Bearer {SECRET}"}}}},
                          "expiry": time.time() + 3600}}))
    """, "good.py")
    bad = script(tmp_path, f"""
        print("no: password={SECRET}", file=sys.stderr)
        sys.exit(2)
    """, "bad.py")
    rules = [FakeRule(1, "https://a.example/", tuple(good)), FakeRule(2, "s3://b", tuple(bad)),
             FakeRule(3, "s3://c", None)]
    shown: dict = {}
    provider = RuleCredentials(rules, shown=shown)
    assert provider and shown["1"]["generation"] == 0 and set(shown) == {"1", "2"}
    assert format_stats({"credentials": shown}).splitlines()[0] == (
        "credentials, rule 1  waiting for the first: no credential yet")

    async def main() -> None:
        assert await provider(rules[0]) == (1, {"headers": {"Authorization": f"Bearer {SECRET}"}})
        for _ in range(3):
            with pytest.raises(FetchError) as info:
                await provider(rules[1])
            e = info.value
            assert e.url == "s3://b" and e.reply_errno == errno.EIO and e.logged
            assert "no valid credentials from the credential process of target rule 2" in str(e)
            assert "exit status 2" in str(e) and SECRET not in str(e)
        with pytest.raises(FetchError, match="no credential process"):
            await provider(rules[2])

    trio.run(main)
    assert shown == provider.describe()  # kept up to date (Stats.credentials)
    text = json.dumps(shown)
    assert SECRET not in text and '"generation": 1' in text and '"failing": true' in text
    table = format_stats({"credentials": shown})
    assert SECRET not in table
    assert "credentials, rule 2  failing (1 failed run): no credential yet" in table
    assert "credentials, rule 1  ok: generation 1, valid until 20" in table
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "target rule 2 s3://b" in errors[0]
    assert "no: password=***" in errors[0] and SECRET not in errors[0]


# ---- the command is checked when the option is read ------------------------------------------------

@pytest.mark.parametrize(("command", "says"), [
    ("bin/get-token", "'bin/get-token' is a relative path: give an absolute path or a command "
                      "name found on PATH"),
    ("/nonexistent/get-token", "/nonexistent/get-token is not an executable file"),
    ("/etc/passwd", "/etc/passwd is not an executable file"),
    ("/etc", "/etc is not an executable file"),
    ("no-such-command-7f1e", "no command 'no-such-command-7f1e' on PATH"),
])
def test_a_command_that_cannot_run_stops_refmount_naming_the_rule(command: str, says: str) -> None:
    rules = [{"prefix": "s3://a"},
             {"prefix": "s3://b", "options": {"secret": SECRET},
              "credentials": {"process": [command, "--token", "x"]}}]
    with pytest.raises(ConfigError) as info:
        apply_command_options(MountConfig(), ["targets=" + json.dumps(rules)])
    assert str(info.value) == f"targets: rule 2: credentials.process: {says}"


def test_commands_by_absolute_path_or_on_path_are_taken(tmp_path: Path) -> None:
    cfg = MountConfig()
    rules = [{"prefix": "s3://a", "credentials": {"process": ["true"]}},
             {"prefix": "s3://b", "credentials": {"process": [sys.executable, "x.py"]}}]
    apply_command_options(cfg, ["targets=" + json.dumps(rules)])
    assert cfg.targets == rules


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _gone_soon(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


SETSID_CHILD = """
    import subprocess
    p = subprocess.Popen([sys.executable, "-c",
                          "import os, time; os.setsid(); time.sleep(60)"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    open({pidfile!r}, "w").write(str(p.pid))
    time.sleep(0.3)  # its setsid done: in a session of its own
    print("{{}}", flush=True)
    time.sleep({sleep})
"""


@pytest.mark.parametrize("how", ["exits", "timeout", "cancelled", "server-killed"])
def test_a_setsid_child_never_outlives_the_command(tmp_path: Path, how: str) -> None:
    """A credential command starts a child that leaves its session and process group
    (``setsid``): the child ends with the command whether it exits, runs past its timeout,
    is cancelled (the server stopping), or the serving process itself is killed."""
    pidfile = str(tmp_path / "child.pid")
    argv = script(tmp_path, SETSID_CHILD.format(pidfile=pidfile, sleep=0 if how == "exits" else 60))
    if how == "exits":
        assert trio.run(run_command, argv).strip() == b"{}"
    elif how == "timeout":
        with pytest.raises(Exception, match="did not finish within 2 s"):
            trio.run(lambda: run_command(argv, timeout=2.0))
    elif how == "cancelled":
        async def cancelled() -> None:
            with trio.move_on_after(2):
                await run_command(argv, timeout=30)
        trio.run(cancelled)
    else:  # a serving process running the command, killed outright meanwhile
        server = subprocess.Popen([sys.executable, "-c", (
            "import sys, trio; from refmount.targets.credentialcommand import run_command; "
            f"trio.run(lambda: run_command({argv!r}, timeout=60))")],
            cwd=Path(__file__).parents[3])
        deadline = time.monotonic() + 20
        while not os.path.exists(pidfile) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        server.kill()
        server.wait()
    pid = int(Path(pidfile).read_text())
    assert _gone_soon(pid), f"the setsid child {pid} outlived the command ({how})"
