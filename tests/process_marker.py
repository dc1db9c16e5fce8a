"""Which tests start a real process (a server, a Worker, haproxy, chromium, node, ...), for
the `process` marker that tests/conftest.py puts on them: `pytest -m "not process"` is the
fast loop.

A test module starts processes when it imports something that does:
- a module that starts processes itself (`subprocess`, `multiprocessing`, playwright, the
  CLI's local cluster), or uses `asyncio.create_subprocess_*`;
- anything from a harness module that does, or imports one that does (harness.processes,
  harness.dev_process, ...: the whole module counts);
- a name from the test helpers (tests.*) whose definition uses such a thing, followed
  through the names it uses in its module and the names those import: importing `running`
  from tests/e2e/conftest.py, which also starts clusters, does not mark a test.
A test also starts processes when one of its fixtures is such a name (a conftest fixture
that starts a node).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Modules that start processes, whatever is imported from them.
PROCESS_MODULES = (
    "subprocess",
    "multiprocessing",
    "playwright",
    "dex_ha.cli.cluster",
    "dex_ha.local_cluster",
    "dex_ha.cli.demo",
    "dex_ha.adapters.claude_launcher",
)
SUBPROCESS_CALLS = ("create_subprocess_exec", "create_subprocess_shell")
OUR_PACKAGES = ("tests", "harness")


def is_process_module(name: str) -> bool:
    return any(name == root or name.startswith(root + ".") for root in PROCESS_MODULES)


def module_starts_processes(module: str) -> bool:
    """Whether the module `module` (a dotted name under tests/ or harness/) imports
    anything that starts a process (see the module doc)."""
    return _module(module, frozenset())


def _module(module: str, seen: frozenset[tuple[str, str]]) -> bool:
    if (module, "") in seen:
        return False  # a cycle of imports: the other imports decide
    seen = seen | {(module, "")}
    parsed = _parse(module)
    if parsed is None:
        return is_process_module(module)
    imports, definitions = parsed
    for definition in definitions.values():
        if any(isinstance(node, ast.Attribute) and node.attr in SUBPROCESS_CALLS for node in ast.walk(definition)):
            return True
    return any(_import_starts_processes(target, name, seen) for target, name in imports.values())


@functools.cache
def symbol_starts_processes(module: str, name: str) -> bool:
    """Whether `name`, defined in or imported by `module`, starts a process when used."""
    return _symbol(module, name, frozenset())


def _symbol(module: str, name: str, seen: frozenset[tuple[str, str]]) -> bool:
    if (module, name) in seen:
        return False  # a cycle: its other names decide
    seen = seen | {(module, name)}
    parsed = _parse(module)
    if parsed is None:
        return is_process_module(module)
    imports, definitions = parsed
    if name in imports:
        target, attr = imports[name]
        return _import_starts_processes(target, attr, seen)
    node = definitions.get(name)
    if node is None:
        return False
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and child.attr in SUBPROCESS_CALLS:
            return True
        if isinstance(child, ast.Name) and child.id != name and (child.id in imports or child.id in definitions):
            if _symbol(module, child.id, seen):
                return True
    return False


def _import_starts_processes(target: str, attr: str | None, seen: frozenset[tuple[str, str]] = frozenset()) -> bool:
    if is_process_module(target) or (attr is not None and is_process_module(f"{target}.{attr}")):
        return True
    package = target.split(".")[0]
    if package not in OUR_PACKAGES:
        return False
    if attr is not None and _parse(f"{target}.{attr}") is not None:  # `from harness import processes`
        target, attr = f"{target}.{attr}", None
    if attr is None or package == "harness":
        return _module(target, seen)
    return _symbol(target, attr, seen)


@functools.cache
def _parse(module: str) -> tuple[dict[str, tuple[str, str | None]], dict[str, ast.AST]] | None:
    """The module's imports (local name -> (module, name or None for the module itself))
    and its top-level definitions (name -> node); None when it is not a file of ours."""
    if module.split(".")[0] not in OUR_PACKAGES:
        return None
    base = REPO.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text(), str(path))
    imports: dict[str, tuple[str, str | None]] = {}
    definitions: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for alias in node.names:
                imports[alias.asname or alias.name] = (node.module, alias.name)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    definitions[target.id] = node
    return imports, definitions
