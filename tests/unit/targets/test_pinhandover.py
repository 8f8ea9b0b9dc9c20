"""A pin file parsed once per start (refmount.targets.pinhandover, pintable's ``save`` and
``map_table``): the table the CLI parsed is saved to a private file, mapped by the check of the
targets and by what serves (in another process: its hashes mean the same there), removed once
mapped; a file that is not such a table is refused, never read as one."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from refmount.base.errors import MountError
from refmount.config import MountConfig, apply_options
from refmount.targets.pinhandover import hand_over_pins, pins_for_check, remove_pins_table, serving_pins
from refmount.targets.pins import PIN_FORMAT, Version, read_pins
from refmount.targets.pintable import PinTableBuilder, PinTableFileError, map_table

PINS = {f"http://h.example/d/{i:05d}.nc": {"size": i, "etag": f'"{i:x}"'} for i in range(2000)}
PINS["/data/ü.nc"] = {"size": 7, "mtime_ns": -5, "version_id": "v1"}


def pin_file(tmp_path) -> str:
    path = tmp_path / "pins.json"
    path.write_text(json.dumps({"format": PIN_FORMAT, "targets": PINS}, ensure_ascii=True))
    return str(path)


def config(tmp_path, monkeypatch, *options: str) -> MountConfig:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    (tmp_path / "runtime").mkdir(exist_ok=True)
    cfg = MountConfig(source=str(tmp_path / "refs.json"), mountpoint="")
    apply_options(cfg, [f"pins={pin_file(tmp_path)}", *options])
    return cfg


def test_the_parsed_table_is_handed_over_in_a_private_file_mapped_once_by_what_serves(
        tmp_path, monkeypatch) -> None:
    cfg = config(tmp_path, monkeypatch)
    hand_over_pins(cfg)
    path = cfg.pins_table
    assert path and os.path.dirname(path) == str(tmp_path / "runtime")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    expected = dict(read_pins(cfg.pins))
    assert dict(pins_for_check(cfg)) == expected and os.path.exists(path)  # the check keeps it
    table = serving_pins(cfg)
    assert not os.path.exists(path) and cfg.pins_table is None  # what serves removes it
    assert dict(table) == expected and table.get("http://h.example/d/00007.nc") == Version(size=7, etag='"7"')
    assert "http://h.example/d/2000.nc" not in table
    assert dict(serving_pins(cfg)) == expected  # made again (reload): the pin file, parsed


def test_a_saved_table_means_the_same_in_another_process(tmp_path) -> None:
    """Python's ``hash`` differs per process; the table's keyed hashes do not."""
    b = PinTableBuilder()
    for url, pin in PINS.items():
        b.add(url, Version(**pin))
    path = tmp_path / "t.table"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    b.build().save(fd)
    os.close(fd)
    code = (f"from refmount.targets.pintable import map_table\nt = map_table({str(path)!r})\n"
            "print(len(t), sum(u in t for u in t), t.get('http://h.example/d/01999.nc'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 2)[:2] == [str(len(PINS)), str(len(PINS))], out.stdout
    assert "size=1999" in out.stdout


def test_a_file_that_is_not_a_saved_table_is_refused(tmp_path) -> None:
    b = PinTableBuilder()
    b.add("http://h/a", Version(size=1))
    good = tmp_path / "good.table"
    fd = os.open(good, os.O_WRONLY | os.O_CREAT, 0o600)
    b.build().save(fd)
    os.close(fd)
    assert dict(map_table(str(good))) == {"http://h/a": Version(size=1)}
    data = good.read_bytes()
    for name, content in (("short", data[:20]), ("cut", data[:-1]), ("magic", b"X" + data[1:]),
                          ("longer", data + b"\0")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(PinTableFileError):
            map_table(str(tmp_path / name))
    os.symlink(good, tmp_path / "link")
    with pytest.raises(OSError):
        map_table(str(tmp_path / "link"))
    os.chown(good, 65534, 65534)  # another user's
    with pytest.raises(PinTableFileError, match="of this user's"):
        map_table(str(good))


def test_a_table_that_cannot_be_mapped_is_one_line_naming_the_pin_file(tmp_path, monkeypatch) -> None:
    cfg = config(tmp_path, monkeypatch)
    hand_over_pins(cfg)
    with open(cfg.pins_table, "r+b") as f:
        f.truncate(30)
    with pytest.raises(MountError, match=r"^pins: the table parsed from .*pins.json cannot be read"):
        serving_pins(cfg)
    remove_pins_table(cfg)
    assert cfg.pins_table is None and not os.listdir(tmp_path / "runtime")


def test_a_catalogue_and_a_malformed_pin_file_hand_over_nothing(tmp_path, monkeypatch) -> None:
    cfg = config(tmp_path, monkeypatch, "catalog")
    hand_over_pins(cfg)  # parsed (checked), but its sets read it when they are opened
    assert cfg.pins_table is None and not os.listdir(tmp_path / "runtime")
    (tmp_path / "pins.json").write_text('{"format": "refmount-pins-1", "targets": []}')
    cfg = config(tmp_path, monkeypatch)
    (tmp_path / "pins.json").write_text('{"format": "refmount-pins-1", "targets": []}')
    with pytest.raises(MountError, match="pins: "):
        hand_over_pins(cfg)
    assert cfg.pins_table is None and not os.listdir(tmp_path / "runtime")
