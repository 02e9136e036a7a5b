"""No import cycle in the tree: between modules, and between the subpackages of a package (``harness.engine`` ↔
``harness.instruments`` is a cycle even when no two modules import each other).

The graph is grimp's (the one import-linter checks), built as ``lint-imports`` builds it: imports under
``if TYPE_CHECKING:`` count. A cycle is a strongly connected component of more than one node; the test names each
one with the imports that close it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp
import pytest

PACKAGES = ("harness", "architectures", "claims", "reports", "cli")

# Cycles that remain, each as the set of its nodes. It may only shrink: a cycle not listed fails, and so does a
# listed one that is gone (delete its line).
KNOWN: frozenset[frozenset[str]] = frozenset()


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node (iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_strongly_connected_finds_a_cycle_and_ignores_a_chain():
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": []}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert strongly_connected({"a": ["b"], "b": []}) == []


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    """module → the project modules it imports directly."""
    graph = grimp.build_graph(*PACKAGES)
    ours = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    return {m: graph.find_modules_directly_imported_by(m) & ours for m in ours}


def _package(module: str) -> str:
    """The node of a module in the package graph: its top package's child (``harness.engine.run`` → ``harness.engine``)."""
    return ".".join(module.split(".")[:2])


def _report(components: list[list[str]], edges: dict[str, set[str]], node_of) -> list[str]:
    lines = []
    for component in components:
        lines.append(" ↔ ".join(component))
        members = set(component)
        for module in sorted(edges):
            for target in sorted(edges[module]):
                if node_of(module) in members and node_of(target) in members and node_of(module) != node_of(target):
                    lines.append(f"    {module} -> {target}")
    return lines


def _judge(components: list[list[str]], edges: dict[str, set[str]], node_of) -> None:
    found = {frozenset(c) for c in components}
    new = sorted(sorted(c) for c in found - KNOWN)
    assert not new, "import cycles:\n" + "\n".join(_report(new, edges, node_of))


def test_no_module_imports_itself_through_others(imports):
    _judge(strongly_connected(imports), imports, lambda m: m)


def test_no_subpackage_cycle(imports):
    packages: dict[str, set[str]] = {}
    for module, targets in imports.items():
        packages.setdefault(_package(module), set()).update(_package(t) for t in targets if _package(t) != _package(module))
    _judge(strongly_connected(packages), imports, _package)


def test_known_cycles_still_exist(imports):
    """A cycle listed in KNOWN that is gone must leave the list, so the list says what is left."""
    packages: dict[str, set[str]] = {}
    for module, targets in imports.items():
        packages.setdefault(_package(module), set()).update(_package(t) for t in targets if _package(t) != _package(module))
    found = {frozenset(c) for c in strongly_connected(imports) + strongly_connected(packages)}
    gone = sorted(sorted(c) for c in KNOWN - found)
    assert not gone, f"cycles listed in KNOWN no longer exist, delete them: {gone}"
