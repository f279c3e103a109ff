"""No import circle inside ``bootstrap_scripts``: dependencies point one way.

Every import counts, wherever it is written: at the top, inside a function (a "lazy"
import only hides a circle until run time) or under ``TYPE_CHECKING`` (a type-only circle
is still two modules that must change together). The graph is read from the source with
``ast``, so nothing is imported to build it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "bootstrap_scripts"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

#: Circles known and accepted, each named with why (none today: keep it that way).
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _targets(node: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules an import statement loads (``from pkg import mod`` is mod)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            stem = ".".join([*base, node.module] if node.module else base)
        else:
            stem = node.module or ""
        names = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem
                 for alias in node.names]
    else:
        return set()
    found = set()
    for name in names:
        while name and name not in known:  # "a.b.c" where c is a class: module "a.b"
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            edges |= _targets(node, name, path.name == "__init__.py", known)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan), as one circle
    through it, ``a -> b -> ... -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
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
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_circle(graph, component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return sorted(component)  # pragma: no cover - a component always closes


def test_the_graph_is_read():
    graph = import_graph()
    assert "bootstrap_scripts.protocol.store" in graph["bootstrap_scripts.protocol.state"]
    assert "bootstrap_scripts.agent.master" in graph["bootstrap_scripts.agent.node_agent"]


def test_the_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_no_import_circle_in_bootstrap_scripts():
    found = [c for c in cycles(import_graph()) if frozenset(c) not in KNOWN]
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)
