"""The package's layers, read from its import graph (``ast``, nothing imported): no two modules
import each other, lazily (inside a function) or through a package's ``__init__``; the front
ends reach reference sets through ``refmount.refs`` and the tree only."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.importgraph import cycles, import_graph

import refmount

PACKAGE = Path(refmount.__file__).parent
FRONT_ENDS = ("refmount.fs", "refmount.httpserve")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    found = [" -> ".join(cycle) for cycle in cycles(graph)]
    assert found == [], "import cycles: " + "; ".join(found)


def test_front_ends_do_not_reach_into_reference_set_parsing(graph: dict[str, set[str]]) -> None:
    """``fs.py`` and ``httpserve.py`` only translate: references come from ``refmount.refs``
    (``Ref``, ``RefKind``) through the tree and the core, never from a module of ``refs/``."""
    inside = {f: sorted(m for m in graph[f] if m.startswith("refmount.refs.")) for f in FRONT_ENDS}
    assert inside == {f: [] for f in FRONT_ENDS}


def test_the_mount_front_end_does_not_fetch(graph: dict[str, set[str]]) -> None:
    """``fs.py`` reads through the reader and the decoder; fetching is theirs."""
    fetching = {"refmount.fetch", "refmount.filesystems", "refmount.retries", "refmount.httpread",
                "refmount.rangeanswers"}
    assert fetching <= set(graph)
    assert fetching & graph["refmount.fs"] == set()



def test_the_http_server_process_does_not_load_fuse() -> None:
    """``httpdaemon.py`` shares the serving process's parts (``readiness.py``, ``logsetup.py``)
    with the mount's daemon, not the daemon itself: pyfuse3 stays out of the HTTP server."""
    code = ("import sys, refmount.httpdaemon; "
            "loaded = sorted({'pyfuse3', 'refmount.daemon', 'refmount.fs'} & set(sys.modules)); "
            "sys.exit(f'loaded: {loaded}' if loaded else None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["refmount.cli", "refmount.daemon", "refmount.indexer"])
def test_starting_a_mount_does_not_load_the_read_path(module: str) -> None:
    """The command and the serving process start without numpy, pyarrow or aiohttp (a few
    tenths of a second each start): a catalogue mounts before any set needs them, and a set's
    core loads them when it is built (docs/performance.md, "Catalogues")."""
    code = (f"import sys, {module}; "
            "loaded = sorted({'numpy', 'pyarrow', 'aiohttp', 'refmount.core'} & set(sys.modules)); "
            "sys.exit(f'loaded: {loaded}' if loaded else None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ---- the check itself, on packages made here ----------------------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


# Importing ``sub.index`` runs ``sub/__init__``, which imports ``sub.fmt``, which imports ``tree``.
_SUB = {"sub/__init__.py": "from .fmt import Fmt\n", "sub/index.py": "class Index: ...\n",
        "sub/fmt.py": "from ..tree import Tree\n"}


@pytest.mark.parametrize(("files", "found"), [
    pytest.param({"a.py": "from .b import B\nA = 1\n",
                  "b.py": "B = 2\ndef later():\n    from .a import A\n    return A\n",
                  "c.py": "from . import a, b\n"},
                 [["pkg.a", "pkg.b", "pkg.a"]], id="lazy-import"),
    pytest.param({"tree.py": "from .sub.index import Index\n", **_SUB},
                 [["pkg.sub", "pkg.sub.fmt", "pkg.tree", "pkg.sub"]], id="through-package-init"),
    pytest.param({"tree.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from .sub.index import Index\n", **_SUB},
                 [], id="type-checking-runs-no-package-init"),
])
def test_the_check_finds_circles(tmp_path: Path, files: dict[str, str], found: list[list[str]]) -> None:
    pkg = _package(tmp_path, {"__init__.py": "", **files})
    assert cycles(import_graph(pkg)) == found
