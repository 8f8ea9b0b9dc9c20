"""refmount verify (refmount.sets.verify, the CLI's verify command) without FUSE or servers: the
furthest byte read per target, the judgement of each target, the table and the JSON, the exit
status, the bound on targets asked at once, and the pin file it writes."""

from __future__ import annotations

import errno
import json
import os

import pytest
import trio

from refmount.base.errors import FetchError
from refmount.cli import main as cli
from refmount.refs.index import KeyIndex
from refmount.refs.indexbuilder import IndexBuilder
from refmount.sets.verify import (
    check_targets,
    exit_status,
    extents_of,
    format_report,
    judge,
    pinnable,
    report_json,
    target_extents,
)
from refmount.targets.pins import Version, read_pins

SECRET = "https://user:hunter2@example.invalid/x.nc?token=s3cr3t"


def test_the_furthest_byte_per_target_comes_from_the_index() -> None:
    b = IndexBuilder()
    b.add_inline(".zgroup", b'{"zarr_format": 2}')
    b.add_range("a/0", "a.nc", 0, 100)
    b.add_range("a/1", "a.nc", 500, 20)
    b.add_range("a/2", "a.nc", 100, 50)
    b.add_range("b/0", "b.nc", 7, 3)
    b.add_whole("c/0", "c.nc")
    index = KeyIndex(b.finish())
    expected = {"a.nc": 520, "b.nc": 10, "c.nc": 0}
    assert target_extents(index) == expected
    assert extents_of((k.decode(), r) for k, r in index.iter_refs()) == expected
    assert target_extents(KeyIndex(IndexBuilder().finish())) == {}


def test_the_furthest_byte_of_many_keys_is_computed_in_one_pass() -> None:
    b = IndexBuilder()
    for i in range(20_000):
        b.add_range(f"v/{i}", f"t{i % 1000}.nc", i * 10, 10)
    extents = target_extents(KeyIndex(b.finish()))
    assert len(extents) == 1000
    assert extents["t999.nc"] == 19_999 * 10 + 10 and extents["t0.nc"] == 19_000 * 10 + 10


@pytest.mark.parametrize("found, status", [
    (Version(size=100), "ok"),
    (Version(size=99), "short"),
    (FetchError("x", "gone", errno.ENOENT), "missing"),
    (FileNotFoundError("x"), "missing"),
    (FetchError("x", "HTTP 403", errno.EACCES), "forbidden"),
    (FetchError("x", "timed out", errno.EIO, timed_out=True), "error"),
])
def test_each_target_is_judged_by_its_version_or_its_error(found, status) -> None:
    assert judge("x", 100, found).status == status


def test_against_pins_a_different_or_unpinned_version_is_changed() -> None:
    pin = Version(size=100, etag='"a"')
    assert judge("x", 10, Version(size=100, etag='"a"'), pin, pinned=True).status == "ok"
    changed = judge("x", 10, Version(size=100, etag='"b"'), pin, pinned=True)
    assert changed.status == "changed" and 'ETag "b"' in changed.reason
    assert judge("x", 10, Version(size=100), None, pinned=True).reason == "not pinned"


def reports():
    return [judge("a.nc", 10, Version(size=10, mtime_ns=5)),
            judge("b.nc", 10, Version(size=4)),
            judge(SECRET, 10, FetchError(SECRET, f"GET {SECRET}: 404", errno.ENOENT))]


def test_the_table_has_a_row_per_problem_and_a_summary_line_without_credentials() -> None:
    text = format_report(reports())
    lines = text.splitlines()
    assert lines[0].split() == ["status", "target", "problem"]
    assert lines[2].startswith("missing") and lines[3].startswith("short  ")
    assert "a.nc" not in text  # ok targets have no row
    assert lines[-1] == "3 targets, 1 ok, 1 missing, 1 short"
    assert "hunter2" not in text and "s3cr3t" not in text
    assert format_report(reports()[:1]) == "1 targets, 1 ok"


def test_the_json_has_every_target_with_its_status_without_credentials() -> None:
    text = report_json(reports(), "refs.json")
    out = json.loads(text)
    assert out["summary"] == {"targets": 3, "ok": 1, "missing": 1, "forbidden": 0, "short": 1,
                              "changed": 0, "error": 0, "unauthorised": 0}
    by_status = {t["status"]: t for t in out["targets"]}
    assert by_status["ok"] == {"url": "a.nc", "status": "ok", "needed": 10, "size": 10, "mtime_ns": 5}
    assert by_status["short"]["size"] == 4
    assert "hunter2" not in text and "s3cr3t" not in text


def test_exit_status_and_what_is_pinned() -> None:
    assert exit_status(reports()) == 1 and exit_status(reports()[:1]) == 0
    assert pinnable(reports()) == [("a.nc", Version(size=10, mtime_ns=5))]


class Store:
    """Answers versions after a short sleep; records how many were asked at once."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.now = self.most = 0

    async def version(self, url: str) -> Version:
        self.asked.append(url)
        self.now += 1
        self.most = max(self.most, self.now)
        await trio.sleep(0.01)
        self.now -= 1
        if url.startswith("missing"):
            raise FetchError(url, "no such file", errno.ENOENT)
        return Version(size=1000)


def test_every_target_is_asked_once_and_at_most_jobs_at_a_time() -> None:
    store = Store()
    extents = {f"t{i}.nc": 10 for i in range(200)} | {"missing.nc": 1, "long.nc": 2000}
    got = trio.run(lambda: check_targets(store, extents, jobs=7))
    assert sorted(store.asked) == sorted(extents) and store.most == 7
    status = {r.url: r.status for r in got}
    assert status["missing.nc"] == "missing" and status["long.nc"] == "short"
    assert sum(s == "ok" for s in status.values()) == 200


@pytest.fixture
def local_set(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    refs = {"version": 1, "refs": {".zgroup": '{"zarr_format": 2}', "v/0": ["a.bin", 0, 500],
                                   "v/1": ["a.bin", 500, 500]}}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    return tmp_path


def test_the_cli_exits_0_when_all_is_well_and_writes_pins(local_set, capsys) -> None:
    pins = local_set / "pins.json"
    assert cli.main(["verify", str(local_set / "refs.json"), "--pin", str(pins)]) == 0
    assert capsys.readouterr().out.strip() == "1 targets, 1 ok"
    st = os.stat(local_set / "a.bin")
    assert read_pins(str(pins)) == {"a.bin": Version(size=1000, mtime_ns=st.st_mtime_ns)}
    assert cli.main(["verify", str(local_set / "refs.json"), "-o", f"pins={pins}"]) == 0


def test_the_cli_exits_1_for_a_problem_target(local_set, capsys) -> None:
    (local_set / "a.bin").write_bytes(b"x" * 999)
    assert cli.main(["verify", str(local_set / "refs.json"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["short"] == 1 and out["targets"][0]["needed"] == 1000


def test_the_cli_exits_2_when_the_set_cannot_be_verified(local_set, capsys) -> None:
    assert cli.main(["verify", str(local_set / "refs.json"), "-o", "no_such_option=1"]) == 2
    assert capsys.readouterr().err.startswith("refmount: error: unknown option")
    assert cli.main(["verify", str(local_set / "absent.json")]) == 2
    assert cli.main(["verify", str(local_set / "refs.json"), "--jobs", "0"]) == 2
    bad = local_set / "bad-pins.json"
    bad.write_text("{}")
    assert cli.main(["verify", str(local_set / "refs.json"), "-o", f"pins={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.count("refmount: error:") == 3 and "not a refmount pin file" in err


def test_unauthorised_virtual_chunks_are_reported_and_fail_the_exit_status(tmp_path, capsys) -> None:
    """An Icechunk repository whose local virtual chunk container the options do not authorise:
    its chunks are not verified, a row names it with the option that would, exit status 1;
    with that option every target is verified, the repository's own chunks included."""
    pytest.importorskip("icechunk")
    from support.icechunkrepos import local_virtual_repo

    built = local_virtual_repo(tmp_path / "repo", tmp_path / "netcdf")
    assert cli.main(["verify", str(built.root)]) == 1
    out = capsys.readouterr().out
    assert "unauthorised" in out and "2 virtual chunks not verified" in out, out
    assert f"-o allow_local={built.files}" in out
    assert out.strip().splitlines()[-1].endswith("1 unauthorised"), out
    assert cli.main(["verify", str(built.root), "-o", f"allow_local={built.files}"]) == 0, \
        capsys.readouterr().out
    assert capsys.readouterr().out.strip() == "3 targets, 3 ok"
