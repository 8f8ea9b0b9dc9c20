"""``refmount inspect``'s table: every label apart from its value, a 0-d array's chunk counted,
and an Icechunk revision named as a mount names it (``-o tag=v1``) or by the flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.icechunkrepos import NodeSpec, RefSpec, build_manifest, build_snapshot, write_built_repo

from refmount.cli.main import main
from refmount.refs.icechunk import ids

SID = "1CECHNKREP0F1RSTCMT0"
MID_RAW = bytes(11) + b"\x10"
MID = ids.encode(MID_RAW)
SCALAR, SERIES = b"\7" * 8, b"\x08" * 8


def v3_array(shape: list[int], chunks: list[int]) -> bytes:
    return (b'{"zarr_format":3,"node_type":"array","shape":%s,"data_type":"int64",'
            b'"chunk_grid":{"name":"regular","configuration":{"chunk_shape":%s}},'
            b'"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},'
            b'"fill_value":0,"codecs":[{"name":"bytes","configuration":{"endian":"little"}}]}'
            % (str(shape).encode(), str(chunks).encode()))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A 0-d array ``crs`` (its one chunk written, 8 bytes) and a 1-d array ``t`` (2 chunks);
    branch main and tag v1 name the snapshot; the repository declares a virtual chunk
    container (its name fills the label column)."""
    nodes = [NodeSpec("/"),
             NodeSpec("/crs", "array", v3_array([], []), SCALAR, ndim=0, manifests=[(MID_RAW, [])]),
             NodeSpec("/t", "array", v3_array([4], [2]), SERIES, ndim=1, manifests=[(MID_RAW, [(0, 2)])])]
    series = [RefSpec((0,), inline=bytes(16)), RefSpec((1,), inline=bytes(16))]
    scalar = [RefSpec((), inline=(7).to_bytes(8, "little"))]
    manifest = build_manifest(MID, [(SCALAR, scalar), (SERIES, series)])
    write_built_repo(tmp_path, SID, build_snapshot(SID, nodes), {MID: manifest})
    (tmp_path / "refs" / "tag.v1").mkdir()
    (tmp_path / "refs" / "tag.v1" / "ref.json").write_text(f'{{"snapshot":"{SID}"}}')
    (tmp_path / "config.yaml").write_text(
        "virtual_chunk_containers:\n  s3://bucket/data/:\n    url_prefix: s3://bucket/data/\n"
        "    store: !s3 {region: x}\n")
    return tmp_path


def inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_labels_stand_apart_from_their_values(repo: Path, capsys) -> None:
    code, out, err = inspect(capsys, str(repo))
    assert code == 0, err
    head = out.split("\n\n")[0].splitlines()
    assert "virtual containers  s3://bucket/data/" in head  # was "virtual containerss3://..."
    width = len("virtual containers  ")
    for line in head:
        label, value = line[:width], line[width:]
        assert label.endswith("  ") and value and not value.startswith(" "), line


def test_a_0d_arrays_chunk_is_counted(repo: Path, capsys) -> None:
    code, out, err = inspect(capsys, str(repo))
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("crs ", "t "))}
    assert rows["crs"][-4:] == ["8", "B", "8", "B"], rows  # stored, decoded (was 0 B)
    assert rows["t"][-4:] == ["32", "B", "32", "B"], rows


@pytest.mark.parametrize("args", [["-o", "tag=v1"], ["--tag", "v1"], ["-o", "tag=v1", "--tag", "v1"],
                                  ["-o", "branch=main"]])
def test_the_revision_as_a_mount_names_it_or_by_flags(repo: Path, capsys, args: list[str]) -> None:
    code, out, err = inspect(capsys, str(repo), *args)
    assert code == 0, err
    kind, name = args[1].split("=") if args[0] == "-o" else (args[0][2:], args[1])
    assert f"revision            {kind} {name}" in out and SID in out


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "bad_keys=skip"], "-o bad_keys=skip: here -o takes branch=NAME, tag=NAME or snapshot=ID"),
    (["-o", "tag=v1", "--tag", "v2"], "--tag v2 and -o tag=v1 name two revisions"),
    (["-o", "tag=v1,branch=main"], "give one of branch=, tag=, snapshot= (not branch= and tag=)"),
    (["-o", "tag=v9"], "no tag 'v9'"),
])
def test_a_wrong_revision_option_is_one_line(repo: Path, capsys, args: list[str], message: str) -> None:
    code, out, err = inspect(capsys, str(repo), *args)
    assert code != 0 and not out
    assert len(err.strip().splitlines()) == 1 and message in err, err
