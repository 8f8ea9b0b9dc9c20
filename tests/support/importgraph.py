"""The import graph of a package, read with ``ast`` (nothing is imported), and its cycles.

Every ``import`` and ``from … import`` counts, wherever it stands: at module level, inside a
function (a lazy import), under ``if TYPE_CHECKING:``. An import that runs (not under
``TYPE_CHECKING``) of ``a.b.c`` also runs the ``__init__`` of the packages ``a.b`` and ``a``
on the way, unless the importer lies inside them (then they are already being imported): such
a package is an edge too, so a cycle through a package's ``__init__`` is found as well.
"""

from __future__ import annotations

import ast
from pathlib import Path


def modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package at ``package_dir``, by dotted name (a package by its own)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (see the module's docstring)."""
    mods = modules(package_dir)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _type_checking_nodes(tree)
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = own_package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                # ``from pkg import sub`` imports the module pkg.sub; ``from mod import name``, mod
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module
                           for a in node.names]
            for target in targets:
                while target and target not in mods:  # a name inside a module, or outside
                    target = target.rpartition(".")[0]
                if not target:
                    continue
                deps.add(target)
                if id(node) not in typing_only:
                    inside = set(_ancestors(name)) | {name}
                    deps.update(a for a in _ancestors(target) if a in mods and a not in inside)
        deps.discard(name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, …, a]``) through each strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph of one package is shallow enough to recurse
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, within the group."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {sorted(group)}")
