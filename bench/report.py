"""The report every workload returns: tables of cells (markdown on stdout, and one JSON file
with ``--json``), each with its notes and the details behind its numbers."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Table:
    workload: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # printed under the table
    details: list[str] = field(default_factory=list)  # printed after all tables
    data: dict[str, Any] = field(default_factory=dict)  # only in the JSON (raw values)
    align: str = ""  # "l" or "r" a column; default: leading text columns left, the rest right

    def markdown(self) -> str:
        align = self.align or "l" * self.label_columns() + "r" * len(self.columns)
        align = ["---" if a == "l" else "---:" for a in align[: len(self.columns)]]
        lines = [f"## {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join(align) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join([*lines, *(["", *self.notes] if self.notes else [])])

    def label_columns(self) -> int:
        """Leading columns of text (left-aligned): those whose cells are not numbers."""
        n = 0
        for i in range(len(self.columns)):
            if any(row[i][:1].isdigit() for row in self.rows if i < len(row)):
                break
            n += 1
        return max(n, 1)


def fmt_value(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def write_json(path: Path, command: str, tables: list[Table]) -> None:
    path.write_text(json.dumps({"command": command, "tables": [asdict(t) for t in tables]}, indent=1))
