"""docs/security.md's table of bounds states the code's values: each row's default is the
value the code uses (a constant, or the option's default), and its option is the one that
changes it. A bound added to the code without its row, or a row whose value drifted, fails."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from refmount.base.optionfile import MAX_OPTION_FILE
from refmount.config import MAX_RULES_FILE, OPTIONS_BY_NAME
from refmount.config.values import format_size
from refmount.core import consolidated
from refmount.decode import metadatabound, view
from refmount.http.frontend import LISTING_THREADS
from refmount.refs import zmetadata
from refmount.refs.limits import DEFAULT_LIMITS
from refmount.refs.parquetset import RECORD_CACHE_BYTES
from refmount.targets.credentialcommand import MAX_OUTPUT
from refmount.targets.pins import MAX_PIN_FILE

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def size(n: int) -> str:
    return format_size(n)


def count(n: float) -> str:
    return str(int(n)) if n == int(n) else str(n)


# the start of a row's first cell -> (the default it must state, the option named, or None)
ROWS: dict[str, tuple[Callable[[], str], str | None]] = {
    "`max_inline`": (lambda: size(DEFAULT_LIMITS.max_inline), "max_inline"),
    "`max_ratio`": (lambda: count(DEFAULT_LIMITS.max_ratio), "max_ratio"),
    "`max_metadata`": (lambda: size(DEFAULT_LIMITS.max_metadata), "max_metadata"),
    "inline chunks of one Icechunk manifest": (lambda: size(DEFAULT_LIMITS.max_source), "max_source"),
    "`max_source`": (lambda: size(DEFAULT_LIMITS.max_source), "max_source"),
    "`max_nesting`": (lambda: count(DEFAULT_LIMITS.max_nesting), "max_nesting"),
    "`max_key_depth`": (lambda: count(DEFAULT_LIMITS.max_key_depth), "max_key_depth"),
    "`max_key_length`": (lambda: size(DEFAULT_LIMITS.max_key_length), "max_key_length"),
    "`max_keys`": (lambda: count(DEFAULT_LIMITS.max_keys), "max_keys"),
    "`max_generated`": (lambda: size(DEFAULT_LIMITS.max_generated), "max_generated"),
    "`max_template_seconds`": (lambda: count(DEFAULT_LIMITS.max_template_seconds), "max_template_seconds"),
    "`max_record`": (lambda: size(DEFAULT_LIMITS.max_record), "max_record"),
    "decoded Parquet records kept": (lambda: size(RECORD_CACHE_BYTES), None),
    "JSON values of a Parquet set's": (lambda: count(zmetadata.MAX_VALUES), None),
    "`max_chunk_bytes`": (lambda: size(OPTIONS_BY_NAME["max_chunk_bytes"].default), "max_chunk_bytes"),
    "a `.zarray` parsed by the decoded view": (lambda: size(view.MAX_ZARRAY_BYTES), None),
    "a `.zmetadata` parsed by the decoded view": (lambda: size(view.MAX_ZMETADATA_BYTES), None),
    "decoded metadata (`-o decode`): bytes": (lambda: size(metadatabound.MAX_BYTES), None),
    "decoded metadata (`-o decode`): JSON values": (lambda: count(metadatabound.MAX_VALUES), None),
    "synthesized `.zmetadata` (`refmount serve`): bytes": (lambda: size(consolidated.MAX_BYTES), None),
    "synthesized `.zmetadata` (`refmount serve`): JSON values":
        (lambda: count(consolidated.MAX_VALUES), None),
    "a pin file": (lambda: size(MAX_PIN_FILE), None),
    "a JSON option read from a file": (lambda: size(MAX_OPTION_FILE), None),
    "a target rules file": (lambda: size(MAX_RULES_FILE), None),
    "`max_sets`": (lambda: count(OPTIONS_BY_NAME["max_sets"].default), "max_sets"),
    "`max_open_sets`": (lambda: count(OPTIONS_BY_NAME["max_open_sets"].default), "max_open_sets"),
    "`max_open_memory`": (lambda: size(OPTIONS_BY_NAME["max_open_memory"].default), "max_open_memory"),
    "`max_clients`": (lambda: count(OPTIONS_BY_NAME["max_clients"].default), "max_clients"),
    "`client_timeout`": (lambda: count(OPTIONS_BY_NAME["client_timeout"].default), "client_timeout"),
    "pieces of directory listings": (lambda: count(LISTING_THREADS), None),
    "output of a credential process": (lambda: size(MAX_OUTPUT), None),
}


def table() -> list[list[str]]:
    text = DOC.read_text()
    section = text.split("\n## Bounds\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # header, rule
    # cells split at "|" outside backticks
    return [[c.strip() for c in re.split(r"\|(?=(?:[^`]*`[^`]*`)*[^`]*$)", row)[1:-1]] for row in rows]


def test_every_bound_has_its_row_and_every_row_its_bound() -> None:
    firsts = [cells[0] for cells in table()]
    matched = {start: [f for f in firsts if f.startswith(start)] for start in ROWS}
    assert all(len(m) == 1 for m in matched.values()), {s: m for s, m in matched.items() if len(m) != 1}
    assert len(firsts) == len(ROWS), [f for f in firsts if not any(f.startswith(s) for s in ROWS)]


@pytest.mark.parametrize("start", list(ROWS))
def test_the_row_states_the_codes_default_and_option(start: str) -> None:
    cells = next(c for c in table() if c[0].startswith(start))
    assert len(cells) == 4, cells
    expected, option = ROWS[start]
    assert cells[1] == f"`{expected()}`", (start, cells[1], expected())
    if option is None:
        assert cells[2] == "none"
    else:
        assert cells[2].startswith(f"`{option}`")
        shown = OPTIONS_BY_NAME[option].default
        assert f"`{size(shown) if cells[1][-2:-1].isalpha() else count(shown)}`" == cells[1]
    assert cells[3]  # what happens past it
