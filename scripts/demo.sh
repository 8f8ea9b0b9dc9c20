#!/usr/bin/env bash
# refmount demo: set the machine up if needed, then build a small real dataset, mount its
# kerchunk references with refmount, and read them through the mount (ls, cat, xarray, ncdump).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh --demo
exec .venv/bin/python scripts/demo.py "$@"
