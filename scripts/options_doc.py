#!/usr/bin/env python3
"""Write the options table of docs/configuration.md from refmount's option table.

    .venv/bin/python scripts/options_doc.py           # rewrite the table in place
    .venv/bin/python scripts/options_doc.py --check   # exit 1 if the file is out of date

The table sits between the markers ``<!-- options:begin -->`` and ``<!-- options:end -->``;
the text around it is written by hand. tests/unit/config/test_options.py fails when the table differs from
``refmount --help``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from refmount.config import options_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def render(text: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _old, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise SystemExit(f"{DOC}: markers {BEGIN} and {END} not found")
    return f"{head}{BEGIN}\n{options_markdown()}\n{END}{tail}"


def main() -> int:
    text = DOC.read_text()
    new = render(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print(f"{DOC} is out of date: run scripts/options_doc.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        DOC.write_text(new)
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
