"""The verifier's description of Icechunk's tables (schema.py) against the accessors flatc
generated from icechunk's schemas (fbs/): each described field has the slot, and so the vtable
entry, that the generated code reads; and the generated package is what
scripts/gen_icechunk_flatbuffers.sh writes."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from refmount.refs.icechunk import schema
from refmount.refs.icechunk.verify import Table

ROOT = Path(__file__).parents[4]


def tables() -> list[Table]:
    return [v for v in vars(schema).values() if isinstance(v, Table)]


def camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


@pytest.mark.parametrize("table", tables(), ids=lambda t: t.name)
def test_slots_match_generated_code(table: Table) -> None:
    module = importlib.import_module(f"refmount.refs.icechunk.fbs.{table.name}")
    source = inspect.getsource(module)
    def add(field: str) -> re.Match[str] | None:
        return re.search(rf"def {table.name}Add{field}\(builder, \w+\): builder\.Prepend(\w*)Slot\((\d+),",
                         source)

    for name, f in table.fields.items():
        m = add(camel(name))
        assert m is not None, f"{table.name}.{name} is not in the generated code"
        assert int(m.group(2)) == f.slot, f"{table.name}.{name}"
        if f.kind == "union":
            t = add(camel(name) + "Type")
            assert t is not None and int(t.group(2)) == f.slot - 1
        if f.kind == "scalar":
            sizes = {"Uint8": 1, "Bool": 1, "Int32": 4, "Uint32": 4, "Uint64": 8, "Int64": 8, "Uint16": 2}
            assert sizes[m.group(1)] == f.size, f"{table.name}.{name}"


def test_struct_sizes() -> None:
    from refmount.refs.icechunk.fbs import (
        ChunkIndexRange,
        DimensionShape,
        ManifestFileInfo,
        ObjectId8,
        ObjectId12,
    )

    assert ObjectId12.ObjectId12.SizeOf() == schema.ID12
    assert ObjectId8.ObjectId8.SizeOf() == schema.ID8
    assert ManifestFileInfo.ManifestFileInfo.SizeOf() == schema.MANIFEST_FILE_INFO
    assert ChunkIndexRange.ChunkIndexRange.SizeOf() == schema.CHUNK_INDEX_RANGE
    assert DimensionShape.DimensionShape.SizeOf() == schema.DIMENSION_SHAPE


def test_generated_package_records_its_source() -> None:
    init = (ROOT / "refmount" / "refs" / "icechunk" / "fbs" / "__init__.py").read_text()
    assert re.search(r"at commit [0-9a-f]{40}", init)
    script = (ROOT / "scripts" / "gen_icechunk_flatbuffers.sh").read_text()
    assert "flatc --python" in script
    generated = {p.name for p in (ROOT / "refmount" / "refs" / "icechunk" / "fbs").glob("*.py")}
    assert {"Snapshot.py", "Manifest.py", "Repo.py", "ChunkRef.py", "NodeSnapshot.py"} <= generated
    for p in (ROOT / "refmount" / "refs" / "icechunk" / "fbs").glob("*.py"):
        assert "from generated." not in p.read_text(), p.name  # imports rewritten to the package
