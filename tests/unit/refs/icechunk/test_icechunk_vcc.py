"""Relative virtual chunk locations (``vcc://NAME/path``, also ``_vcc://``): resolved against
the named virtual chunk container's URL prefix (the repository's config, YAML or FlexBuffers),
then authorised, pinned and read as an absolute location would be; a name the repository does
not declare refuses that chunk. The repository is built from the spec (support/vccrepo.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from flatbuffers import flexbuffers
from support.vccrepo import config_yaml, vcc_repo

from refmount.base.errors import ReadError
from refmount.refs import Ref, RefKind
from refmount.refs.icechunk import IcechunkError, Repository
from refmount.refs.icechunk.config import containers_from_flexbuffer, containers_from_yaml
from refmount.refs.icechunk.format import ChunkRefs, snapshot_references
from refmount.refs.icechunk.locations import UnknownContainer, absolute
from refmount.refs.icechunk.records import ChunkRef
from refmount.targets.pins import Pins
from refmount.targets.rules import TargetRules
from refmount.targets.versions import Version
from refmount.targets.virtualaccess import VirtualAccess

NAMES = {"data": "s3://bucket/prefix/"}


@pytest.mark.parametrize(("location", "url"), [
    ("vcc://data/path/to/chunk.nc", "s3://bucket/prefix/path/to/chunk.nc"),  # icechunk's own case
    ("_vcc://data/a.nc", "s3://bucket/prefix/a.nc"),
    ("VCC://data/a.nc", "s3://bucket/prefix/a.nc"),
    ("s3://bucket/prefix/a.nc", "s3://bucket/prefix/a.nc"),  # absolute: as it is
])
def test_a_relative_location_is_its_containers_prefix_and_path(location: str, url: str) -> None:
    assert absolute(location, NAMES) == url


@pytest.mark.parametrize("location", ["vcc://unknown/a.nc", "vcc://a.nc", "vcc:///a.nc", "_vcc://"])
def test_a_location_naming_no_declared_container_is_unknown(location: str) -> None:
    with pytest.raises(UnknownContainer):
        absolute(location, NAMES)


def test_the_config_names_its_containers_yaml_and_flexbuffers() -> None:
    declared = containers_from_yaml(config_yaml("s3://b/p/").encode(), "c")
    assert declared.prefixes == ["s3://b/p/"] and declared.names == {"data": "s3://b/p/"}
    blob = flexbuffers.Dumps({"virtual_chunk_containers": {
        "s3://b/p/": {"name": "data", "url_prefix": "s3://b/p/", "store": {}},
        "s3://c/": {"name": None, "url_prefix": "s3://c/", "store": {}}}})
    declared = containers_from_flexbuffer(blob, "c")
    assert declared.prefixes == ["s3://b/p/", "s3://c/"] and declared.names == {"data": "s3://b/p/"}
    twice = flexbuffers.Dumps({"virtual_chunk_containers": {
        "s3://b/": {"name": "data", "url_prefix": "s3://b/"},
        "s3://c/": {"name": "data", "url_prefix": "s3://c/"}}})
    with pytest.raises(IcechunkError, match="two virtual chunk containers are named 'data'"):
        containers_from_flexbuffer(twice, "c")


class Named:
    root = "s3://bucket/repo"

    def virtual_chunk_containers(self) -> list[str]:
        return ["s3://bucket/prefix/", "s3://other/"]

    def virtual_chunk_container_names(self) -> dict[str, str]:
        return NAMES

    def object_url(self, location: str) -> str:
        return f"{self.root}/{location}"


def virtual(location: str, **kw: object) -> ChunkRef:
    return ChunkRef("virtual", location=location, offset=3, length=4, **kw)  # type: ignore[arg-type]


def test_a_relative_chunk_is_authorised_and_pinned_as_its_absolute_url() -> None:
    pins = Pins({}, "the reference", required=False)
    rules = TargetRules.from_json([{"prefix": "s3://bucket/prefix/"}])
    refs = ChunkRefs(Named(), VirtualAccess(rules, None, pins))  # type: ignore[arg-type]
    got = refs(virtual("vcc://data/a.nc", etag='"e1"'))
    assert got == Ref(RefKind.RANGE, "s3://bucket/prefix/a.nc", 3, 4)
    assert pins.check("s3://bucket/prefix/a.nc") == Version(etag='"e1"')
    with pytest.raises(ReadError, match="does not declare"):
        refs(virtual("vcc://nowhere/a.nc"))
    with pytest.raises(ReadError, match="outside every virtual chunk container"):
        refs(virtual("vcc://data/../../etc/passwd"))
    refused = ChunkRefs(Named(), VirtualAccess(TargetRules(), None, None))  # type: ignore[arg-type]
    with pytest.raises(ReadError, match="container s3://bucket/prefix/ is not authorised"):
        refused(virtual("vcc://data/a.nc"))


def test_a_built_repository_with_relative_locations(tmp_path: Path, caplog) -> None:
    built = vcc_repo(tmp_path / "repo", tmp_path / "files")
    repo = Repository.open(str(built.root), {})
    assert repo.virtual_chunk_container_names() == {"data": built.container}
    snapshot = repo.snapshot(repo.resolve())
    access = VirtualAccess(TargetRules(), [str(built.files)], None)
    refs = ChunkRefs(repo, access)
    v0, v1 = (refs(chunk) for _, chunk in snapshot.chunks("v"))
    assert (v0.url, v0.offset, v0.length) == (f"{built.container}a.bin", 4, 16)
    assert (v1.url, v1.offset) == (f"{built.container}sub/b.bin", 0)
    with caplog.at_level(logging.WARNING):
        got = dict(snapshot_references(repo, snapshot, access))
    assert got["v/c/0"].url == f"{built.container}a.bin"
    assert got["v/c/1"].url == f"{built.container}sub/b.bin"
    assert "w/c/0" not in got and got["w/c/1"].url == f"{built.container}a.bin"
    assert "x/c/0" not in got and "x/c/1" in got
    assert "1 virtual chunks under vcc://nowhere left out" in caplog.text
