"""Catalogues without FUSE or servers: the three forms (a directory of sets, a list file, STAC),
set names and their collisions, per-set options, the bounds on hostile catalogues, and
``source_identity`` of JSON files and Parquet directories. Remote catalogues are exercised
over fsspec's in-memory file system (a protocol that is not local)."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import lzma
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zstandard
from support.refsets import tiny_json, tiny_parquet, write_record

from refmount.base.errors import CatalogError, ConfigError
from refmount.config import OPTIONS_BY_NAME, MountConfig, apply_options
from refmount.refs import prepare_index
from refmount.sets.catalog import PROBES, CatalogEntry, name_problem, read_catalog
from refmount.sets.setidentity import source_identity
from refmount.sets.setoptions import PER_SET_OPTIONS

BOUNDS: dict[str, Any] = {"max_sets": 1000, "max_bytes": 1 << 20, "timeout": 10.0}


def read(url: str | Path, **kw: Any) -> dict[str, CatalogEntry]:
    return read_catalog(str(url), {}, **{**BOUNDS, **kw})


def one_line_error(url: str | Path, **kw: Any) -> str:
    with pytest.raises(CatalogError) as e:
        read(url, **kw)
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture
def set_dir(tmp_path: Path) -> Path:
    """A directory holding one tiny JSON set (and its targets) to copy into catalogues."""
    tiny_json(tmp_path / "src")
    return tmp_path / "src"


def write_list(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


# --- a directory of reference sets --------------------------------------------------------------


def test_directory_every_format_and_name(tmp_path: Path, set_dir: Path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    data = (set_dir / "refs.json").read_bytes()
    (cat / "plain.json").write_bytes(data)
    (cat / "era5.json.gz").write_bytes(gzip.compress(data))
    (cat / "b.json.bz2").write_bytes(bz2.compress(data))
    (cat / "x.json.xz").write_bytes(lzma.compress(data))
    (cat / "z.json.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    tiny_parquet(cat / "run.parq", tmp_path / "pdata")
    tiny_parquet(cat / "other.parquet", tmp_path / "pdata")
    tiny_parquet(cat / "bare", tmp_path / "pdata")
    # not sets: hidden entries, other files, a directory without .zmetadata, a record file
    (cat / ".hidden.json").write_bytes(data)
    tiny_parquet(cat / ".hidden.parq", tmp_path / "pdata")
    (cat / "notes.txt").write_text("hello")
    (cat / "table.parq").write_bytes(b"PAR1")
    (cat / "data.gz").write_bytes(gzip.compress(b"x"))
    (cat / ".json").write_text("{}")
    (cat / "sub").mkdir()
    (cat / "sub" / "inner.json").write_bytes(data)

    entries = read(cat)
    assert list(entries) == ["b", "bare", "era5", "other", "plain", "run", "x", "z"]
    assert entries["era5"] == CatalogEntry("era5", str(cat / "era5.json.gz"), {})
    assert entries["run"].source == str(cat / "run.parq")
    assert all(e.options == {} for e in entries.values())
    # every source is a set refmount reads as it is named (compression from the suffix)
    for entry in entries.values():
        prepare_index(entry.source, {}, cache_dir=None)


def test_directory_as_file_url(tmp_path: Path, set_dir: Path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copy(set_dir / "refs.json", cat / "a.json")
    assert list(read(f"file://{cat}")) == ["a"]


def test_directory_collision_is_an_error(tmp_path: Path, set_dir: Path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copy(set_dir / "refs.json", cat / "era5.json")
    (cat / "era5.json.gz").write_bytes(gzip.compress((set_dir / "refs.json").read_bytes()))
    text = one_line_error(cat)
    assert "'era5'" in text and "era5.json" in text and "era5.json.gz" in text
    assert "rename one" in text


def test_directory_parquet_and_json_collision(tmp_path: Path, set_dir: Path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copy(set_dir / "refs.json", cat / "run.json")
    tiny_parquet(cat / "run.parq", tmp_path / "pdata")
    assert "two sets are named 'run'" in one_line_error(cat)


def test_directory_bad_name_skipped(tmp_path: Path, set_dir: Path, caplog) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    shutil.copy(set_dir / "refs.json", cat / "good.json")
    shutil.copy(set_dir / "refs.json", cat / "bad\nname.json")
    shutil.copy(set_dir / "refs.json", os.fsdecode(bytes(cat) + b"/\xff.json"))
    with caplog.at_level(logging.WARNING, logger="refmount.sets.catalog"):
        assert list(read(cat)) == ["good"]
    assert "control character" in caplog.text and "not UTF-8" in caplog.text


def test_directory_too_many_sets(tmp_path: Path) -> None:
    cat = tmp_path / "cat"
    cat.mkdir()
    for i in range(6):
        (cat / f"s{i}.json").write_text("{}")
    assert len(read(cat, max_sets=6)) == 6
    text = one_line_error(cat, max_sets=5)
    assert "more than 5 reference sets" in text and "max_sets" in text


def test_directory_probes_bounded(tmp_path: Path) -> None:
    """Each subdirectory is asked for a .zmetadata: max_sets bounds those questions too."""
    cat = tmp_path / "cat"
    for i in range(4):
        (cat / f"d{i}").mkdir(parents=True)
    assert read(cat, max_sets=4) == {}
    assert "more than 3 directories" in one_line_error(cat, max_sets=3)


def test_relative_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert read("cat")["a"].source == str(tmp_path / "cat" / "a.json")


def test_one_parquet_set_is_not_a_catalogue(tmp_path: Path) -> None:
    tiny_parquet(tmp_path / "run.parq", tmp_path / "pdata")
    assert "mount it without -o catalog" in one_line_error(tmp_path / "run.parq")


def test_missing_catalogue(tmp_path: Path) -> None:
    assert "no such file or directory" in one_line_error(tmp_path / "nothing")


def test_remote_directory(tmp_path: Path, set_dir: Path) -> None:
    """A directory on storage that is not local (fsspec's memory file system): JSON files
    and Parquet directories listed, named and given as full URLs."""
    mem = fsspec.filesystem("memory")
    root = "/catsrc-dir"
    try:
        mem.pipe(f"{root}/a.json.gz", gzip.compress((set_dir / "refs.json").read_bytes()))
        mem.pipe(f"{root}/run.parq/.zmetadata", b'{"metadata": {}, "record_size": 1}')
        mem.pipe(f"{root}/run.parq/x/refs.0.parq", b"PAR1")
        mem.pipe(f"{root}/notaset/file.bin", b"x")
        mem.pipe(f"{root}/.hidden.json", b"{}")
        entries = read(f"memory://{root}")
        assert {n: e.source for n, e in entries.items()} == {
            "a": f"memory://{root}/a.json.gz", "run": f"memory://{root}/run.parq"}
    finally:
        mem.rm(root, recursive=True)


def test_remote_directories_are_probed_a_bounded_number_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each remote subdirectory costs a round trip to ask for its .zmetadata: they are asked
    ``PROBES`` at a time, never more; a probe that fails fails the catalogue in one line."""
    mem = fsspec.filesystem("memory")
    root = "/catsrc-probes"
    lock = threading.Lock()
    now = peak = 0
    original = type(mem).isfile

    def slow_isfile(self: Any, path: str) -> bool:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.02)
        with lock:
            now -= 1
        if "d07" in path and fail:
            raise PermissionError(13, "denied")
        return original(self, path)

    fail = False
    monkeypatch.setattr(type(mem), "isfile", slow_isfile)
    try:
        for i in range(40):
            name = f"{root}/d{i:02d}.parq/.zmetadata" if i % 2 else f"{root}/d{i:02d}/x.bin"
            mem.pipe(name, b'{"metadata": {}, "record_size": 1}')
        entries = read(f"memory://{root}")
        assert sorted(entries) == [f"d{i:02d}" for i in range(1, 40, 2)]
        assert 1 < peak <= PROBES
        fail = True
        assert "permission denied" in one_line_error(f"memory://{root}")
    finally:
        fail = False
        mem.rm(root, recursive=True)


# --- a list file ------------------------------------------------------------------------------


def test_list_file_json(tmp_path: Path, set_dir: Path) -> None:
    sub = tmp_path / "lists"
    sub.mkdir()
    path = write_list(sub / "sets.json", {"sets": {
        "plain": "../src/refs.json",
        "abs": str(set_dir / "refs.json"),
        "with_text": {"source": "../src/refs.json", "options": "decode,timeout=30,retries=1"},
        "with_object": {"source": "../src/refs.json",
                        "options": {"decode": True, "timeout": 12.5, "bad_keys": "skip",
                                    "remote_options": {"anon": True}}},
        "flag_off": {"source": "../src/refs.json", "options": {"decode": False}},
    }})
    entries = read(path)
    assert list(entries) == ["abs", "flag_off", "plain", "with_object", "with_text"]
    assert entries["plain"].source == str(set_dir / "refs.json")
    assert entries["abs"].source == str(set_dir / "refs.json")
    assert entries["with_text"].options == {"decode": "", "timeout": "30", "retries": "1"}
    assert entries["with_object"].options == {
        "decode": "", "timeout": "12.5", "bad_keys": "skip", "remote_options": '{"anon": true}'}
    assert entries["flag_off"].options == {}
    # the options are -o items the option table takes
    cfg = MountConfig()
    apply_options(cfg, entries["with_object"].option_args())
    assert (cfg.decode, cfg.timeout, cfg.bad_keys, cfg.remote_options) == (
        True, 12.5, "skip", {"anon": True})
    assert entries["with_text"].option_args() == ["decode", "timeout=30", "retries=1"]


def test_list_file_yaml(tmp_path: Path, set_dir: Path) -> None:
    path = tmp_path / "sets.yaml"
    path.write_text(
        "sets:\n"
        "  one: src/refs.json\n"
        "  two:\n"
        "    source: src/refs.json\n"
        "    options: {decode: true, timeout: 30}\n")
    entries = read(path)
    assert entries["one"].source == str(set_dir / "refs.json")
    assert entries["two"].options == {"decode": "", "timeout": "30"}


def test_list_file_yaml_alias_refused(tmp_path: Path) -> None:
    path = tmp_path / "sets.yml"
    path.write_text("base: &b {source: a.json}\nsets:\n  one: *b\n")
    text = one_line_error(path)
    assert "YAML aliases are not allowed" in text and str(path) in text


def test_list_file_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "sets.yaml"
    path.write_text("sets: {a: [\n")
    assert "not valid YAML" in one_line_error(path)


def test_list_file_bad_names_skipped(tmp_path: Path, caplog) -> None:
    names = ["ok", "a/b", ".", "..", "x\x00y", "é" * 200, "", "tab\there"]
    path = write_list(tmp_path / "sets.json", {"sets": {n: "a.json" for n in names}})
    with caplog.at_level(logging.WARNING, logger="refmount.sets.catalog"):
        assert list(read(path)) == ["ok"]
    assert caplog.text.count("skipped the set named") == len(names) - 1


@pytest.mark.parametrize(("options", "message"), [
    ("colour=red", "unknown option 'colour'"),
    ("decod", "did you mean 'decode'"),
    ("allow_other", "option 'allow_other' applies to the whole mount"),
    ("cache_dir=/tmp", "option 'cache_dir' applies to the whole mount"),
    ("max_keys=5", "option 'max_keys' applies to the whole mount"),
    ("allow_local=/", "option 'allow_local' applies to the whole mount"),
    ("uid=0", "option 'uid' applies to the whole mount"),
    ("decode=yes", "option 'decode' takes no value"),
    ("timeout", "option 'timeout' needs a value"),
    ("timeout=soon", "timeout must be a number of seconds"),
    ("bad_keys=ignore", "bad_keys must be error or skip"),
    ("remote_options=@/etc/shadow", "must be a JSON object given inline"),
    ("remote_options={nope", "remote_options is not valid JSON"),
    ({"timeout": True}, "option 'timeout' needs a value"),
    ({"retries": [1]}, "option 'retries' must be text or a number"),
    ({"decode": "yes"}, "option 'decode' takes no value"),
    ({"target_options": [1]}, "must be a JSON object given inline"),
    (["decode"], "\"options\" must be text"),
])
def test_list_file_options_validated(tmp_path: Path, options: Any, message: str) -> None:
    path = write_list(tmp_path / "sets.json",
                      {"sets": {"s": {"source": "a.json", "options": options}}})
    text = one_line_error(path)
    assert message in text and "set 's'" in text


def test_per_set_options_are_options() -> None:
    assert set(OPTIONS_BY_NAME) >= PER_SET_OPTIONS


@pytest.mark.parametrize(("doc", "message"), [
    ({"sets": ["a.json"]}, '"sets" must map names to sources'),
    ({"sets": {"a": 5}}, "expected a source"),
    ({"sets": {"a": {"options": "decode"}}}, '"source" must be a URL or path'),
    ({"sets": {"a": {"source": "a.json", "extra": 1}}}, "unknown field 'extra'"),
    ({"sets": {"a": "x\x00.json"}}, "NUL"),
    ({"refs": {}, "version": 1}, "mount it without -o catalog"),
    ({".zgroup": "{}"}, "mount it without -o catalog"),
    ({"temp/.zarray": "{}", "temp/0": ["a.nc", 0, 4]}, "mount it without -o catalog"),
    ({"type": "Feature"}, "not a catalogue"),
    ([1, 2], "not a catalogue"),
])
def test_list_file_malformed(tmp_path: Path, doc: Any, message: str) -> None:
    assert message in one_line_error(write_list(tmp_path / "sets.json", doc))


def test_remote_list_file_resolves_and_confines(tmp_path: Path, caplog) -> None:
    """In a remote list file, relative sources are relative to it; local and chained ones are
    skipped (a catalogue on a server does not get to name this machine's files)."""
    mem = fsspec.filesystem("memory")
    try:
        mem.pipe("/catsrc-list/dir/sets.json", json.dumps({"sets": {
            "rel": "a.json", "up": "../b.json", "abs": "memory:///elsewhere/c.json",
            "local": "/etc/d.json", "file": "file:///etc/e.json",
            "chained": "simplecache::memory:///x.json"}}).encode())
        with caplog.at_level(logging.WARNING, logger="refmount.sets.catalog"):
            entries = read("memory:///catsrc-list/dir/sets.json")
        assert {n: e.source for n, e in entries.items()} == {
            "abs": "memory:///elsewhere/c.json",
            "rel": "memory:///catsrc-list/dir/a.json",
            "up": "memory:///catsrc-list/b.json"}
        assert caplog.text.count("may name only remote sets") == 3
    finally:
        mem.rm("/catsrc-list", recursive=True)


# --- STAC ---------------------------------------------------------------------------------------


def ref_asset(href: str, **extra: Any) -> dict[str, Any]:
    return {"href": href, "type": "application/json", "roles": ["references"], **extra}


def item(item_id: str, assets: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Feature", "stac_version": "1.0.0", "id": item_id, "geometry": None,
            "properties": {"datetime": "2024-01-01T00:00:00Z"}, "links": [], "assets": assets}


def test_stac_collection(tmp_path: Path, set_dir: Path) -> None:
    (tmp_path / "items").mkdir()
    thumbnail = {"href": "t.png", "type": "image/png", "roles": ["thumbnail"]}
    (tmp_path / "items" / "a.json").write_text(json.dumps(item("item-a", {
        "refs": ref_asset("../src/refs.json", **{
            "xarray:open_kwargs": {"engine": "kerchunk", "storage_options": {
                "remote_protocol": "s3", "remote_options": {"anon": True}}}}),
        "thumbnail": thumbnail})))
    (tmp_path / "items" / "b.json").write_text(json.dumps(item("item-b", {
        "hist": ref_asset(str(set_dir / "refs.json")),
        "ssp": {"href": "p.parq", "type": "application/x-parquet", "roles": ["references"],
                "xarray:storage_options": {"target_options": {"anon": True}}},
        "data": {"href": "d.nc", "type": "application/netcdf", "roles": ["data"]},
        "index-role": {"href": "i.json", "type": "application/json; charset=utf-8",
                       "roles": ["index"]}})))
    collection = {
        "type": "Collection", "stac_version": "1.0.0", "id": "c", "description": "d",
        "license": "CC0-1.0", "extent": {},
        "assets": {"whole": ref_asset("src/refs.json"), "readme": {"href": "r.md"}},
        "links": [{"rel": "self", "href": "collection.json"},
                  {"rel": "item", "href": "items/a.json"},
                  {"rel": "item", "href": "items/b.json"}],
    }
    path = write_list(tmp_path / "collection.json", collection)
    entries = read(path)
    assert list(entries) == ["item-a", "item-b.hist", "item-b.index-role", "item-b.ssp", "whole"]
    assert entries["whole"].source == str(set_dir / "refs.json")
    assert entries["item-a"].source == str(set_dir / "refs.json")
    assert entries["item-a"].options == {"remote_protocol": "s3",
                                         "remote_options": '{"anon": true}'}
    assert entries["item-b.ssp"] == CatalogEntry(
        "item-b.ssp", str(tmp_path / "items" / "p.parq"), {"target_options": '{"anon": true}'})
    assert entries["item-b.index-role"].source == str(tmp_path / "items" / "i.json")


def test_stac_item_collection_and_item(tmp_path: Path) -> None:
    features = [item("one", {"k": ref_asset("one.json")}),
                item("two", {"k": ref_asset("https://example.org/two.json")}),
                item("none", {"cog": {"href": "x.tif", "type": "image/tiff",
                                      "roles": ["data"]}})]
    path = write_list(tmp_path / "items.json", {"type": "FeatureCollection",
                                                "features": features})
    entries = read(path)
    assert {n: e.source for n, e in entries.items()} == {
        "one": str(tmp_path / "one.json"), "two": "https://example.org/two.json"}
    single = write_list(tmp_path / "item.json", features[0])
    assert list(read(single)) == ["one"]


def test_stac_collision_and_bounds(tmp_path: Path) -> None:
    features = [item("same", {"k": ref_asset("a.json")}), item("same", {"k": ref_asset("b.json")})]
    path = write_list(tmp_path / "items.json", {"type": "FeatureCollection", "features": features})
    assert "two sets are named 'same'" in one_line_error(path)
    links = [{"rel": "item", "href": f"i{n}.json"} for n in range(11)]
    path = write_list(tmp_path / "c.json", {"type": "Collection", "stac_version": "1.0.0",
                                            "links": links})
    assert "more than 10 item links" in one_line_error(path, max_sets=10)
    bad = write_list(tmp_path / "bad.json", {"type": "FeatureCollection", "features": [5]})
    assert 'with "type": "Feature"' in one_line_error(bad)


def test_stac_links_share_the_byte_bound(tmp_path: Path) -> None:
    """max_bytes bounds every document the catalogue reads, together."""
    big = item("big", {"k": ref_asset("a.json", description="x" * 3000)})
    for n in range(4):
        write_list(tmp_path / f"i{n}.json", {**big, "id": f"i{n}"})
    path = write_list(tmp_path / "c.json", {
        "type": "Collection", "stac_version": "1.0.0",
        "links": [{"rel": "item", "href": f"i{n}.json"} for n in range(4)]})
    assert len(read(path, max_bytes=20_000)) == 4
    assert "bytes of catalogue documents" in one_line_error(path, max_bytes=8_000)


# --- hostile catalogues -------------------------------------------------------------------------


def test_huge_list_file(tmp_path: Path) -> None:
    path = tmp_path / "sets.json"
    path.write_text(json.dumps({"sets": {f"s{i}": "a.json" for i in range(50_000)}}))
    text = one_line_error(path, max_bytes=100_000, max_sets=10**6)
    assert "more than 100,000 bytes" in text


def test_max_bytes_zero_is_no_limit(tmp_path: Path) -> None:
    path = write_list(tmp_path / "sets.json", {"sets": {f"s{i}": "a.json" for i in range(100)}})
    assert len(read(path, max_bytes=0)) == 100
    assert "bytes" in one_line_error(path, max_bytes=100)


def test_compressed_bomb(tmp_path: Path) -> None:
    path = tmp_path / "sets.json.gz"
    path.write_bytes(gzip.compress(b" " * (16 << 20), 1))
    assert "bytes" in one_line_error(path, max_bytes=1 << 20)


def test_deep_json(tmp_path: Path) -> None:
    path = tmp_path / "sets.json"
    path.write_text('{"sets": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "not valid JSON" in one_line_error(path, max_bytes=1 << 20)


@pytest.mark.parametrize(("depth", "message"), [
    (200, "nested deeper than 64 levels"),
    (5_000, "not valid YAML"),  # libyaml's own bound (1000)
])
def test_deep_yaml(tmp_path: Path, depth: int, message: str) -> None:
    path = tmp_path / "sets.yaml"
    path.write_text("sets: " + "[" * depth + "]" * depth + "\n")
    assert message in one_line_error(path, max_bytes=1 << 20)


@pytest.mark.parametrize(("text", "message"), [
    ("a: 1\n---\nsets: {{}}\n", "more than one YAML document"),
    ("? [1]\n: 2\n", "a YAML mapping key must be a scalar"),
    ("sets: !!python/object/apply:os.system ['touch {marker}']\n", '"sets" must map names'),
])
def test_yaml_refusals(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sets.yml"
    marker = tmp_path / "ran"
    path.write_text(text.format(marker=marker))
    assert message in one_line_error(path)
    assert not marker.exists()  # tags are never constructed


def test_yaml_scalars(tmp_path: Path) -> None:
    """Plain true/false are booleans (flags), numbers are text, quoted text stays text."""
    path = tmp_path / "sets.yaml"
    path.write_text("sets:\n"
                    "  2020: a.json\n"
                    "  b: {source: b.json, options: {decode: yes, timeout: 3.5}}\n"
                    "  c: {source: c.json, options: {decode: off, bad_keys: 'skip'}}\n"
                    "  d: {source: d.json, options: {decode: 'true'}}\n")
    with pytest.raises(CatalogError, match="option 'decode' takes no value"):
        read(path)
    path.write_text(path.read_text().replace("  d: {source: d.json, options: {decode: 'true'}}\n",
                                             ""))
    entries = read(path)
    assert list(entries) == ["2020", "b", "c"]
    assert entries["b"].options == {"decode": "", "timeout": "3.5"}
    assert entries["c"].options == {"bad_keys": "skip"}


def test_too_many_sets_in_a_list(tmp_path: Path) -> None:
    path = write_list(tmp_path / "sets.json", {"sets": {f"s{i}": "a.json" for i in range(11)}})
    assert "more than 10 reference sets" in one_line_error(path, max_sets=10)


def test_garbage(tmp_path: Path) -> None:
    path = tmp_path / "sets.json"
    path.write_bytes(os.urandom(4096))
    assert "not valid JSON" in one_line_error(path)


def test_credentials_not_echoed(tmp_path: Path) -> None:
    text = one_line_error("memory://user:hunter2@nowhere/sets.json")
    assert "hunter2" not in text


@pytest.mark.parametrize(("name", "ok"), [
    ("era5", True), ("a b", True), ("é", True), ("x" * 255, True), (".hidden", True),
    ("x" * 256, False), ("é" * 128, False), ("", False), (".", False), ("..", False),
    ("a/b", False), ("a\x00b", False), ("a\nb", False), (5, False), ("\udcff", False),
])
def test_name_problem(name: Any, ok: bool) -> None:
    assert (name_problem(name) is None) == ok


# --- source_identity ----------------------------------------------------------------------------


def ident(source: str | Path) -> str:
    return source_identity(str(source), {}, timeout=10.0)


def test_identity_of_a_json_set(tmp_path: Path, set_dir: Path) -> None:
    path = set_dir / "refs.json"
    first = ident(path)
    assert first == ident(path) and len(first) <= 32
    data = path.read_bytes()
    path.write_bytes(data + b" ")  # another size
    second = ident(path)
    assert second != first
    # the same size, other content, another mtime
    st = path.stat()
    path.write_bytes(data.replace(b"AAEC", b"AAED") + b" ")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert path.stat().st_size == st.st_size
    assert ident(path) != second
    assert ident(f"file://{path}") == ident(path)


def test_identity_of_a_replaced_file(tmp_path: Path, set_dir: Path) -> None:
    """Replaced by rename (as producers publish), with the old size and mtime kept."""
    path = set_dir / "refs.json"
    before = ident(path)
    st = path.stat()
    new = set_dir / "new.json"
    new.write_bytes(path.read_bytes())
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(new, path)
    assert ident(path) != before


def test_identity_of_a_parquet_set(tmp_path: Path) -> None:
    root = tmp_path / "run.parq"
    tiny_parquet(root, tmp_path / "data")
    first = ident(root)
    assert ident(root) == first
    assert ident(root / ".zmetadata") == first  # the set named by its .zmetadata
    write_record(root / "x" / "refs.9.parq", [(None, 0, 0, b"new")])  # gains a record file
    second = ident(root)
    assert second != first
    (root / "x" / "refs.9.parq").unlink()
    assert ident(root) != second
    meta = root / ".zmetadata"
    st = meta.stat()
    meta.write_bytes(meta.read_bytes().replace(b'"zarr_format": 2', b'"zarr_format":  2'))
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert ident(root) not in (first, second)


def test_identity_of_a_remote_set() -> None:
    mem = fsspec.filesystem("memory")
    try:
        mem.pipe("/catsrc-id/a.json", b"{}")
        mem.pipe("/catsrc-id/run.parq/.zmetadata", b"{}")
        mem.pipe("/catsrc-id/run.parq/x/refs.0.parq", b"PAR1")
        a, run = ident("memory:///catsrc-id/a.json"), ident("memory:///catsrc-id/run.parq")
        assert ident("memory:///catsrc-id/a.json") == a
        mem.pipe("/catsrc-id/a.json", b'{"a": 1}')
        assert ident("memory:///catsrc-id/a.json") != a
        mem.pipe("/catsrc-id/run.parq/x/refs.1.parq", b"PAR1")
        assert ident("memory:///catsrc-id/run.parq") != run
    finally:
        mem.rm("/catsrc-id", recursive=True)


def test_identity_of_a_missing_set(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ident(tmp_path / "gone.json")
    (tmp_path / "dir").mkdir()
    with pytest.raises(FileNotFoundError):
        ident(tmp_path / "dir")  # a directory that is not a Parquet set
    with pytest.raises(FileNotFoundError):
        ident("memory:///catsrc-nothing/gone.json")


# --- the options catalogues add to the table ----------------------------------------------------


def test_catalog_options_declared() -> None:
    cfg = MountConfig()
    assert (cfg.catalog, cfg.max_open_sets, cfg.max_sets, cfg.reload) == (False, 64, 100_000, 0.0)
    apply_options(cfg, ["catalog", "max_open_sets=8", "reload=0", "max_sets=10"])
    assert (cfg.catalog, cfg.max_open_sets, cfg.reload, cfg.max_sets) == (True, 8, 0.0, 10)
    apply_options(cfg, ["reload=2.5"])
    assert cfg.reload == 2.5
    with pytest.raises(ConfigError, match="reload must be 0 or more"):
        apply_options(cfg, ["reload=-1"])
    with pytest.raises(ConfigError, match="timeout must be positive"):
        apply_options(cfg, ["timeout=0"])


def test_a_directory_holds_icechunk_repositories_too(tmp_path: Path, set_dir: Path) -> None:
    import icechunk
    import zarr

    cat = tmp_path / "cat"
    cat.mkdir()
    (cat / "plain.json").write_bytes((set_dir / "refs.json").read_bytes())
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(cat / "era5.icechunk")))
    session = repo.writable_session("main")
    zarr.group(store=session.store).create_array("t", shape=(4,), chunks=(2,), dtype="i1")[:] = 1
    session.commit("one")
    (cat / "notes").mkdir()  # a directory that is no set
    entries = read(cat)
    assert list(entries) == ["era5", "plain"]
    assert entries["era5"].source == str(cat / "era5.icechunk")
    assert prepare_index(entries["era5"].source, {}, cache_dir=None).kind == "icechunk"
