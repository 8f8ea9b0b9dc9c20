"""The package's layers: the import-linter contract in pyproject.toml refuses an import across
them; and, read from the import graph (``ast``, nothing imported), no two modules import each
other, lazily (inside a function) or through a package's ``__init__``; the front ends reach
reference sets through ``refmount.refs`` and the tree only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.importgraph import cycles, import_graph

import refmount

PACKAGE = Path(refmount.__file__).parent
FRONT_ENDS = ("refmount.fuse.operations", "refmount.http.frontend", "refmount.http.pathplan")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    found = [" -> ".join(cycle) for cycle in cycles(graph)]
    assert found == [], "import cycles: " + "; ".join(found)


def test_front_ends_do_not_reach_into_reference_set_parsing(graph: dict[str, set[str]]) -> None:
    """``fuse/operations.py`` and ``http/frontend.py`` (with ``http/pathplan.py``) only translate:
    references come from ``refmount.refs`` (``Ref``, ``RefKind``) through the tree (``refs/tree.py``,
    what every format yields) and the core, never from a parsing module of ``refs/``."""
    inside = {f: sorted(m for m in graph[f] if m.startswith("refmount.refs.") and m != "refmount.refs.tree")
              for f in FRONT_ENDS}
    assert inside == {f: [] for f in FRONT_ENDS}


def test_the_mount_front_end_does_not_fetch(graph: dict[str, set[str]]) -> None:
    """``fuse/operations.py`` reads through the reader and the decoder; fetching is theirs."""
    fetching = {"refmount.targets.fetch", "refmount.targets.filesystems", "refmount.targets.retries",
                "refmount.targets.httpread", "refmount.targets.rangeanswers"}
    assert fetching <= set(graph)
    assert fetching & graph["refmount.fuse.operations"] == set()



def test_the_http_server_process_does_not_load_fuse() -> None:
    """``http/daemon.py`` shares the serving process's parts (``serving/readiness.py``,
    ``serving/logsetup.py``) with the mount's daemon, not the daemon itself: pyfuse3 stays out of
    the HTTP server."""
    code = ("import sys, refmount.http.daemon; "
            "loaded = sorted({'pyfuse3', 'refmount.fuse.daemon', 'refmount.fuse.operations'}"
            " & set(sys.modules)); "
            "sys.exit(f'loaded: {loaded}' if loaded else None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["refmount.cli.main", "refmount.fuse.daemon",
                                    "refmount.serving.indexer"])
def test_starting_a_mount_does_not_load_the_read_path(module: str) -> None:
    """The command and the serving process start without numpy, pyarrow or aiohttp (a few
    tenths of a second each start): a catalogue mounts before any set needs them, and a set's
    core loads them when it is built (docs/performance.md, "Catalogues")."""
    code = (f"import sys, {module}; "
            "loaded = sorted({'numpy', 'pyarrow', 'aiohttp', 'refmount.core.setcore'}"
            " & set(sys.modules)); "
            "sys.exit(f'loaded: {loaded}' if loaded else None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_indexing_a_json_set_loads_no_other_formats_reader_nor_pandas(tmp_path: Path) -> None:
    """The command's first steps for a JSON set (detecting its format, building the index)
    load neither the Icechunk reader (flatbuffers, yaml), the Parquet tree (trio), aiohttp,
    nor pandas, which pyarrow would import on its first array (``process.without_pandas``);
    a set's core for local targets loads no aiohttp either."""
    (tmp_path / "refs.json").write_text('{"a": "x", "b/c": "y"}')
    code = ("import sys\n"
            "from refmount.base.process import without_pandas\n"
            "without_pandas()\n"
            "from refmount.refs import prepare_index\n"
            f"index = prepare_index({str(tmp_path / 'refs.json')!r}, {{}})\n"
            "loaded = sorted({'pandas', 'flatbuffers', 'yaml', 'aiohttp', 'trio'} & set(sys.modules))\n"
            "import refmount.core.setcore\n"
            "loaded += ['aiohttp (by the core)'] if 'aiohttp' in sys.modules else []\n"
            "sys.exit(f'loaded: {loaded}' if loaded else None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
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


# ---- the layers contract (pyproject.toml, [tool.importlinter]) ---------------------------------


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run([str(lint), "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(root)})


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("fuse/operations.py", "import refmount.http.frontend",
     "refmount.fuse is not allowed to import refmount.http"),
    ("base/lru.py", "import refmount.config", "refmount.base is not allowed to import refmount.config"),
    ("targets/fetch.py", "import refmount.cache.blocks",
     "refmount.targets is not allowed to import refmount.cache"),
])
def test_the_contract_refuses_an_import_across_the_layers(tmp_path: Path, module: str, line: str,
                                                         broken: str) -> None:
    """The contract bites: a copy of the package with one forbidden import fails `lint-imports`,
    naming the two layers; the copy as it is passes."""
    shutil.copytree(PACKAGE, tmp_path / "refmount", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PACKAGE.parent / "pyproject.toml", tmp_path / "pyproject.toml")
    kept = _lint_imports(tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    target = tmp_path / "refmount" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    broke = _lint_imports(tmp_path)
    assert broke.returncode != 0 and broken in broke.stdout, broke.stdout + broke.stderr
