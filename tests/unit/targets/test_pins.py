"""Pins (refmount.targets.pins) without FUSE or servers: the pin file, the comparison of a version
with its pin, the refusal logged once per target, and local reads checked on their descriptor."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from refmount.base.errors import ConfigError
from refmount.base.stats import Stats
from refmount.config import MountConfig, apply_options
from refmount.targets.httpread import check_response
from refmount.targets.localfile import read_range
from refmount.targets.pins import (
    PIN_FORMAT,
    PinMismatch,
    Pins,
    Version,
    VersionChanged,
    parse_pins,
    read_pins,
    write_pins,
)

SECRET_URL = "https://user:hunter2@example.invalid/a.nc?token=s3cr3t"


def doc(targets: object) -> str:
    return json.dumps({"format": PIN_FORMAT, "targets": targets})


def test_a_pin_file_round_trips_atomically_and_privately(tmp_path) -> None:
    path = tmp_path / "pins.json"
    versions = [("a.nc", Version(size=10, mtime_ns=123)),
                ("http://h/b.nc", Version(size=5, etag='"x-1"',
                                          last_modified="Mon, 01 Jan 2024 00:00:00 GMT")),
                ("s3://b/c.nc", Version(size=7, etag='"e"', version_id="v1"))]
    assert write_pins(str(path), versions, "refs.json") == 3
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_pins(str(path)) == dict(versions)
    assert [p.name for p in tmp_path.iterdir()] == ["pins.json"]  # no temporary file left
    # written again: replaced whole
    write_pins(str(path), versions[:1], "refs.json")
    assert read_pins(str(path)) == dict(versions[:1])


@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"),
    ('{"targets": {}}', "not a refmount pin file"),
    ('[1, 2]', "not a refmount pin file"),
    (json.dumps({"format": PIN_FORMAT, "targets": []}), '"targets" must be an object'),
    (doc({SECRET_URL: {"size": -1}}), "non-negative integer"),
    (doc({SECRET_URL: {"size": True}}), "non-negative integer"),
    (doc({SECRET_URL: {"size": 1, "colour": "red"}}), "must be an object with the fields"),
    (doc({SECRET_URL: {"size": 1, "etag": 5}}), '"etag" must be a string'),
    (doc({SECRET_URL: {"size": 1, "mtime_ns": "x"}}), '"mtime_ns" must be an integer'),
    (doc({SECRET_URL: 3}), "must be an object"),
    (doc({SECRET_URL: {"size": [1]}}), "nested deeper than 3 levels"),
    (doc({SECRET_URL: {"size": {"a": 1}}}), "nested deeper than 3 levels"),
    ('{"format": "' + PIN_FORMAT + '", "targets": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "nested deeper than 3 levels"),
    (doc({SECRET_URL: {"size": 1}})[:-2] + ', "x": ' + "9" * 5000 + "}}", "not valid JSON"),
    ('{"format": "' + PIN_FORMAT + '", "n": ' + "9" * 5000 + ', "targets": {}}', "not valid JSON"),
    ('{"format": "' + PIN_FORMAT + '", "targets": {"u": {"size": 1' + "0" * 5000 + "}}}", "not valid JSON"),
    ('"just text"', "not a refmount pin file"),
])
def test_a_malformed_pin_file_is_one_line_naming_the_problem(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_pins(text, "/etc/pins.json")
    message = str(e.value)
    assert words in message and "/etc/pins.json" in message and "\n" not in message
    assert "hunter2" not in message and "s3cr3t" not in message


def test_an_unreadable_pin_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_pins(str(tmp_path / "absent.json"))


def test_the_pins_option_makes_its_path_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = MountConfig(source="refs.json", mountpoint="/mnt")
    assert cfg.pins is None
    apply_options(cfg, ["pins=p.json"])
    assert cfg.pins == str(tmp_path / "p.json")


PIN = Version(size=100, etag='"abc"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT")


@pytest.mark.parametrize("seen, words", [
    (Version(size=100, etag='"abc"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT"), None),
    (Version(size=None, etag='"abc"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT"), None),
    (Version(size=101, etag='"abc"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT"), "size 101"),
    (Version(size=100, etag='"abd"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT"), 'ETag "abd"'),
    (Version(size=100, etag=None, last_modified="Mon, 01 Jan 2024 00:00:00 GMT"), "reports no ETag"),
    (Version(size=100, etag='"abc"', last_modified="Tue, 02 Jan 2024 00:00:00 GMT"), "modification time"),
])
def test_a_version_is_the_pinned_one_only_if_every_pinned_field_is_reported_equal(
        seen: Version, words: str | None) -> None:
    why = PIN.mismatch(seen)
    assert why is None if words is None else words in (why or ""), why


def test_a_size_alone_is_no_proof_without_an_etag() -> None:
    assert Version(size=5).mismatch(Version(size=None)) is not None
    assert Version(size=5).mismatch(Version(size=5)) is None
    local = Version(size=5, mtime_ns=1)
    assert local.mismatch(Version(size=5, mtime_ns=1)) is None
    assert "modification time (ns) 2" in (local.mismatch(Version(size=5, mtime_ns=2)) or "")


def test_versions_from_what_stores_report() -> None:
    http = Version.from_headers({"ETag": '"1-2"', "Last-Modified": "X"}, 9)
    assert http == Version(size=9, etag='"1-2"', last_modified="X")
    s3 = Version.from_info({"size": 3, "ETag": '"e"', "LastModified": "2024-01-01 00:00:00+00:00",
                            "VersionId": "v7"})
    assert s3 == Version(size=3, etag='"e"', last_modified="2024-01-01 00:00:00+00:00", version_id="v7")
    assert Version.from_info({"size": 3, "VersionId": "null"}).version_id is None  # unversioned bucket
    local = Version.from_info({"size": 4, "mtime_ns": 11, "type": "file"})
    assert local == Version(size=4, mtime_ns=11)
    assert Version(size=1, etag='W/"w"').strong_etag is None
    assert Version(size=1, etag='"s"').strong_etag == '"s"'


def test_a_changed_target_is_refused_from_then_on_and_logged_once(caplog) -> None:
    stats = Stats()
    pins = Pins({"a.nc": Version(size=1, mtime_ns=1)}, "pins.json", stats)
    assert pins.check("a.nc") == Version(size=1, mtime_ns=1)
    with caplog.at_level(logging.ERROR, logger="refmount.targets.pins"):
        first = pins.refuse("a.nc", "size 2, pinned 1")
        for _ in range(5):
            with pytest.raises(PinMismatch) as e:
                pins.check("a.nc")
            assert e.value.logged and "size 2, pinned 1" in str(e.value)
    assert isinstance(first, PinMismatch) and first.logged and first.reply_errno == 5
    assert [r.getMessage().count("a.nc") for r in caplog.records] == [1]
    assert stats.pin_refusals == 6 and stats.pinned_targets_changed == 1
    assert stats.as_dict()["pin_refusals"] == 6


def test_an_unpinned_target_is_refused_and_its_credentials_never_logged(caplog) -> None:
    stats = Stats()
    pins = Pins({}, "pins.json", stats)
    with caplog.at_level(logging.ERROR, logger="refmount.targets.pins"), pytest.raises(PinMismatch) as e:
        pins.check(SECRET_URL)
    assert "not pinned in pins.json" in str(e.value)
    assert "hunter2" not in str(e.value) and "s3cr3t" not in str(e.value)
    assert caplog.records and not any("hunter2" in r.getMessage() for r in caplog.records)
    assert stats.pinned_targets_changed == 1


def test_disk_cache_keys_of_pinned_targets_name_the_version() -> None:
    pins = Pins({"a": Version(size=1, etag='"x"')})
    assert pins.token("a") != Pins({"a": Version(size=1, etag='"y"')}).token("a")
    assert pins.token("b") == "unpinned"


def test_a_local_read_is_checked_on_its_own_descriptor(tmp_path) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"0123456789")
    st = os.stat(path)
    pin = Version(size=st.st_size, mtime_ns=st.st_mtime_ns)
    assert read_range(str(path), 2, 5, None, pin) == b"234"
    path.write_bytes(b"abcdefghij")  # same size, new bytes: a new mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    with pytest.raises(VersionChanged, match="modification time"):
        read_range(str(path), 2, 5, None, pin)
    assert read_range(str(path), 2, 5, None) == b"cde"  # without a pin: as it is now


def test_an_http_response_is_checked_before_its_body_is_read() -> None:
    pin = Version(size=100, etag='"abc"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT")
    same = {"ETag": '"abc"', "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"}
    check_response(pin, same, 100)
    check_response(pin, same, None)  # Content-Range "bytes 0-9/*": the ETag proves it
    check_response(None, {}, 5)  # no pin: nothing to check
    # a server that ignores If-Match and answers with another version
    with pytest.raises(VersionChanged, match='ETag "abd"'):
        check_response(pin, {**same, "ETag": '"abd"'}, 100)
    with pytest.raises(VersionChanged, match="size 101"):
        check_response(pin, same, 101)
    with pytest.raises(VersionChanged, match="no ETag"):
        check_response(pin, {"Last-Modified": same["Last-Modified"]}, 100)


def test_a_pinned_fetcher_refuses_a_rewritten_local_target_and_asks_it_no_more(tmp_path) -> None:
    import trio

    from refmount.targets.fetch import Fetcher
    from refmount.targets.policy import TargetPolicy

    path = tmp_path / "t.bin"
    path.write_bytes(b"0123456789" * 100)
    url = str(path)
    stats = Stats()
    fetcher = Fetcher({}, TargetPolicy(["/"], None, None), timeout=5, retries=2,
                      max_connections=4, stats=stats)

    async def pin_now() -> Pins:
        return Pins({url: await fetcher.version(url)}, "pins.json", stats)

    pins = trio.run(pin_now)
    assert pins.pin(url) == Version(size=1000, mtime_ns=path.stat().st_mtime_ns)
    fetcher.pins = pins

    async def reads() -> list[bytes | str]:
        out: list[bytes | str] = [await fetcher.cat_range(url, 10, 20), await fetcher.size(url)]
        path.write_bytes(b"abcdefghij" * 100)  # the same size, other bytes
        for _ in range(3):
            try:
                out.append(await fetcher.cat_range(url, 10, 20))
            except PinMismatch as e:
                out.append(str(e))
        return out

    got = trio.run(reads)
    assert got[:2] == [b"0123456789", 1000]
    assert all(isinstance(g, str) and "not the pinned version" in g for g in got[2:]), got
    assert stats.pin_refusals == 3 and stats.pinned_targets_changed == 1
    assert stats.retries == 0  # a changed version is not retried


def test_a_pin_file_is_parsed_as_it_streams_within_its_bound(tmp_path, monkeypatch) -> None:
    """Just under the bound (64 MiB, made 16 MiB here to keep the test short): parsed, memory
    the pins (not the text and a parse of it whole); just over: refused before it is read;
    /dev/zero and a FIFO at once."""
    import resource
    import time

    import refmount.targets.pins

    assert refmount.targets.pins.MAX_PIN_FILE == 64 << 20
    MAX_PIN_FILE = 16 << 20
    monkeypatch.setattr(refmount.targets.pins, "MAX_PIN_FILE", MAX_PIN_FILE)

    entry = ', "http://h.example/data/%09d.nc": {"etag": "\\"0123456789abcdef\\"", "size": 123456789}'
    n = (MAX_PIN_FILE - 200) // len(entry % 0)
    path = tmp_path / "pins.json"
    with open(path, "w") as f:
        f.write('{"format": "' + PIN_FORMAT + '", "targets": {"first": {"size": 1}')
        for i in range(n):
            f.write(entry % i)
        f.write("}}")
    size = path.stat().st_size
    assert MAX_PIN_FILE - 400 < size <= MAX_PIN_FILE, size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    pins = read_pins(str(path))
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
    assert len(pins) == n + 1 and pins["http://h.example/data/000000007.nc"].size == 123456789
    # the pins are held compactly (the bound itself: the test below, in a fresh process);
    # the text whole and json.loads' objects of it (as the file used to be read) took 7 times
    assert grown < 5 * size, grown
    with open(path, "a") as f:
        f.write(" " * (MAX_PIN_FILE - size + 1))
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"^pins: .* is larger than 16 MiB \("):
        read_pins(str(path))
    with pytest.raises(ConfigError, match=r"^pins: /dev/zero is not a regular file$"):
        read_pins("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"):
        read_pins(str(fifo))
    assert time.monotonic() - t0 < 1


def _pin_file_just_under_the_bound(path: os.PathLike, entry: str, head: str) -> int:
    """A pin file of entries ``entry % i`` whose size is just under MAX_PIN_FILE; their count."""
    from refmount.targets.pins import MAX_PIN_FILE

    n = (MAX_PIN_FILE - 200 - len(head)) // len(entry % 0)
    with open(path, "w") as f:
        f.write(head)
        step = 10_000
        for at in range(0, n, step):
            f.write("".join(entry % i for i in range(at, min(n, at + step))))
        f.write('\n  "z": {"size": 1}\n }\n}\n')
    return n + 1


def test_a_pin_file_at_its_bound_is_held_in_less_than_one_and_a_half_times_its_size(tmp_path) -> None:
    """Just under 64 MiB, some 560,000 targets as ``verify --pin`` writes them: the pins are held
    compactly (targets/pintable.py). Read in a fresh process, its peak RSS grows by less than
    1.5 times the file's size (the pins, ijson's chunks, one target's pin at a time), what
    is kept is under the file's size, and every pin is there as written."""
    import subprocess
    import sys

    path = tmp_path / "pins.json"
    head = '{\n "format": "' + PIN_FORMAT + '",\n "source": "refs.json",\n "targets": {'
    entry = ('\n  "http://h.example/data/%09d.nc": {\n   "etag": "\\"0123456789abcdef\\"",\n'
             '   "size": 123456789\n  },')
    n = _pin_file_just_under_the_bound(path, entry, head)
    size = path.stat().st_size
    assert (64 << 20) - 2000 < size <= 64 << 20 and n > 500_000
    probe = f"""
import json, resource, sys, time
import ijson, numpy
from refmount.targets.pins import Version, read_pins
before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()  # resident now
cpu = time.process_time()
pins = read_pins({str(path)!r})
cpu = time.process_time() - cpu
# the peak of this process image (VmHWM: ru_maxrss would count the parent's RSS at fork)
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
grown = int(hwm.split()[1]) * 1024 - before
ok = (pins["http://h.example/data/000000007.nc"] == Version(size=123456789, etag='"0123456789abcdef"')
      and pins.get("http://h.example/data/{n - 2:09d}.nc") is not None and "z" in pins
      and pins.get("http://h.example/data/x.nc") is None)
print(json.dumps({{"n": len(pins), "kept": pins.nbytes, "grown": grown, "cpu": cpu, "ok": ok}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    print(f"\n{n:,} targets, file {size:,} bytes: peak RSS grown {got['grown']:,} "
          f"({got['grown'] / size:.2f}x), kept {got['kept']:,}, {got['cpu']:.1f} CPU s")
    assert got["ok"] and got["n"] == n and got["kept"] < size
    assert got["grown"] < 1.5 * size, (got, out.stderr)


def test_the_table_keeps_every_field_and_the_last_pin_of_a_url_listed_twice() -> None:
    from refmount.targets.pintable import PinTableBuilder

    b = PinTableBuilder()
    full = Version(size=(1 << 64) - 1, etag='W/"é\\u0000"', last_modified="Mon, 01 Jan 2024",
                   mtime_ns=-(1 << 63), version_id="v\udcff")
    b.add("http://h/a", Version(size=1))
    b.add("http://h/ü", full)
    b.add("http://h/a", Version(size=2, mtime_ns=5))
    table = b.build()
    assert len(table) == 2 and dict(table) == {"http://h/a": Version(size=2, mtime_ns=5), "http://h/ü": full}
    with pytest.raises(ValueError, match="size"):
        b.add("u", Version(size=1 << 64))
    with pytest.raises(ValueError, match="mtime_ns"):
        b.add("u", Version(size=1, mtime_ns=1 << 63))

