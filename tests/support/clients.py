"""The non-Python clients the tests read with (ncdump, ncks, cdo, gdalinfo, gdalmdiminfo, …):
found on ``PATH`` (scripts/setup.sh installs them), bounded in time, their standard output
returned; a failure names the command, its exit status and the end of its standard error."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping


def run_client(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    exe = shutil.which(args[0])
    assert exe, f"{args[0]} is not installed (scripts/setup.sh installs it)"
    r = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}"
    return r.stdout


def zarr_url(path: str | os.PathLike[str]) -> str:
    """How netCDF-C tools name a zarr directory: ``file://PATH#mode=zarr,file``."""
    return f"file://{os.fspath(path)}#mode=zarr,file"
