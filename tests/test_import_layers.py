"""The layout shows the architecture: no two packages of ``src/adx`` import each other, directly or through
others (imports inside functions and under TYPE_CHECKING count too: a cycle hidden there is still a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: The CLI registers every command (it sits above everything); generated stubs import nothing of ours.
ABOVE_ALL = ("adx.cli", "adx.proto")


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in (SRC / "adx").rglob("*.py"):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        if module.startswith(ABOVE_ALL) or (module.count(".") < 2 and path.name != "__init__.py"):
            continue  # top-level modules (adx.errors, adx._backoff, ...) are the shared base, not packages
        here = _package(module)
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            for target in targets:
                if target.startswith("adx.") and target.count(".") >= 1:
                    there = _package(target)
                    if there != here and not there.startswith(ABOVE_ALL) and (SRC / there.replace(".", "/")).is_dir():
                        graph.setdefault(here, set()).add(there)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])) is not None:
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])) is not None:
            return found
    return None


def test_the_graph_is_read() -> None:
    graph = _imports()
    assert "adx.gateway" in graph["adx.api"] and "adx.gateway" in graph["adx.ingress"]


def test_no_import_cycle_between_packages() -> None:
    cycle = _cycle(_imports())
    assert cycle is None, " -> ".join(cycle or [])
