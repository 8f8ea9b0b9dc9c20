#!/usr/bin/env bash
# Set up the machine if needed, lint, and run the test suite: the unit tier first (tests/unit,
# no FUSE, well under a minute: a broken core fails fast), then the mount tests (real FUSE,
# real servers), each module in one of two worker processes (pytest-xdist): most of their time
# is spent waiting for daemons, servers and clients, so two run side by side on two cores.
# Extra arguments go to one pytest run instead, e.g. scripts/test.sh -k readdir -x
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

echo "test: ruff check ."
.venv/bin/ruff check .

echo "test: lint-imports (the layers contract in pyproject.toml)"
.venv/bin/lint-imports --no-cache

if [ $# -gt 0 ]; then
    echo "test: pytest tests -q $*"
    exec .venv/bin/python -m pytest tests -q "$@"
fi

echo "test: pytest tests/unit -q -n 2"
.venv/bin/python -m pytest tests/unit -q -n 2

echo "test: pytest tests -q --ignore=tests/unit -n 2 --dist loadfile --no-loadscope-reorder"
exec .venv/bin/python -m pytest tests -q --ignore=tests/unit -n 2 --dist loadfile --no-loadscope-reorder
