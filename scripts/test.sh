#!/usr/bin/env bash
# Set up the machine if needed, lint, and run the test suite (real FUSE mounts).
# Extra arguments go to pytest, e.g. scripts/test.sh -k readdir -x
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

echo "test: ruff check ."
.venv/bin/ruff check .

echo "test: pytest tests -q $*"
exec .venv/bin/python -m pytest tests -q "$@"
