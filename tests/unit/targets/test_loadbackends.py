"""``Fetcher.load_backends``: the file systems a set's targets are read through, imported ahead
of the first fetch (a worker thread once the set serves, ``SetCore.warm``), after the target
rules, never for local files, and for the first ``LOAD_AHEAD_TARGETS`` targets only. Run in a
fresh interpreter: whether aiohttp gets imported is the point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = r"""
import sys
from refmount.base.stats import Stats
from refmount.targets.fetch import Fetcher
from refmount.targets.policy import TargetPolicy
from refmount.targets.rules import TargetRules

tmp = sys.argv[1]
rules = TargetRules.from_json([{"prefix": "s3://bucket/", "rewrite": "https://mirror.org/"}])
f = Fetcher({}, TargetPolicy([tmp], tmp, None), timeout=5, retries=0, max_connections=4,
            stats=Stats(), rules=rules)

local = f.load_backends([tmp + "/a.nc", "relative.nc", "file://" + tmp + "/b.nc"])
assert local == [], local
assert "aiohttp" not in sys.modules, "local targets imported aiohttp"

taken = 0
def urls():
    global taken
    for i in range(10**6):
        taken += 1
        yield f"/data/{i}.nc"
    yield "gcs://never/reached"
assert f.load_backends(urls()) == []
assert taken == f.LOAD_AHEAD_TARGETS, taken

loaded = f.load_backends(["s3://bucket/x.nc", "memory://y", "nosuch://z", tmp + "/c.nc"])
assert loaded == ["https", "memory"], loaded  # s3 is read from its https mirror; nosuch: unknown
assert "aiohttp" in sys.modules and "fsspec.implementations.http" in sys.modules
assert "s3fs" not in sys.modules, "a target rule routes s3://bucket/ elsewhere"
"""


def test_backends_are_loaded_for_the_targets_as_routed(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert r.returncode == 0, r.stderr[-2000:]
