"""The engine's modules import one way only (until import-linter replaces this test).

Each module sits in a layer; a module imports only from layers below its own, so no two
modules can import each other, directly or around a circle. An import inside a function
(the usual way to dodge a circle) fails the test too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dex_ha.engine

ENGINE_DIR = Path(dex_ha.engine.__file__).parent
PACKAGE = "dex_ha.engine"

# Top to bottom. handlers → outcomes → calls → turns → steps → kinds / store is the
# design's order; the rest places the other modules around it.
LAYERS: list[set[str]] = [
    {"__init__"},
    {"engine"},
    {"handlers"},
    {"outcomes"},
    {"calls"},
    {"turns"},
    {"steps"},
    {"queries", "context"},
    {"agents"},
    {"kinds", "commands", "store"},
    {"results", "schema", "statuses"},
]


def engine_modules() -> list[str]:
    return sorted(p.stem for p in ENGINE_DIR.glob("*.py"))


def imported_engine_modules(tree: ast.Module) -> list[tuple[str, int]]:
    """(engine module, line) for each import of an engine module in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == PACKAGE:  # from dex_ha.engine import calls, steps
                found += [(alias.name, node.lineno) for alias in node.names]
            elif node.module.startswith(PACKAGE + "."):
                found.append((node.module.split(".")[2], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found += [((node.module or alias.name).split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name.split(".")[2], node.lineno) for alias in node.names
                      if alias.name.startswith(PACKAGE + ".")]
    modules = set(engine_modules())
    return [(name, line) for name, line in found if name in modules]


def parse(module: str) -> ast.Module:
    return ast.parse((ENGINE_DIR / f"{module}.py").read_text(), filename=f"{module}.py")


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if module in layer)


def import_graph() -> dict[str, set[str]]:
    return {m: {name for name, _ in imported_engine_modules(parse(m))} for m in engine_modules()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports, as the list of modules around it, or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> list[str] | None:
        if module in visiting:
            return visiting[visiting.index(module):] + [module]
        if module in done:
            return None
        visiting.append(module)
        for target in sorted(graph.get(module, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        visiting.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None


def test_every_engine_module_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert set(engine_modules()) - placed == set(), "add the new module to LAYERS"
    assert placed - set(engine_modules()) == set(), "LAYERS names a module that no longer exists"


@pytest.mark.parametrize("module", engine_modules())
def test_imports_go_down_the_layers(module: str) -> None:
    wrong = [f"line {line}: {module} imports {target}"
             for target, line in imported_engine_modules(parse(module))
             if layer_of(target) <= layer_of(module)]
    assert wrong == [], "an import against the order handlers → outcomes → calls → turns → steps → kinds/store"


@pytest.mark.parametrize("module", engine_modules())
def test_no_import_inside_a_function(module: str) -> None:
    tree = parse(module)
    top_level = {id(node) for node in tree.body}
    nested = [f"line {node.lineno}" for node in ast.walk(tree)
              if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top_level
              and imported_engine_modules(ast.Module(body=[node], type_ignores=[]))]
    assert nested == [], f"{module} imports an engine module inside a function"


def test_no_import_circle() -> None:
    assert find_cycle(import_graph()) is None


def test_the_checks_catch_a_circle_and_an_upward_import() -> None:
    """The checks themselves: a known circle is found, and steps importing calls is flagged."""
    assert find_cycle({"calls": {"steps"}, "steps": {"turns"}, "turns": {"calls"}}) == [
        "calls", "steps", "turns", "calls"]
    upward = imported_engine_modules(ast.parse("from dex_ha.engine import calls, turns\n"
                                               "from dex_ha.engine.kinds import RUN_MODEL\n"))
    assert [(m, layer_of(m) <= layer_of("steps")) for m, _ in upward] == [
        ("calls", True), ("turns", True), ("kinds", False)]
