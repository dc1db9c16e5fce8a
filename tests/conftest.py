"""Suite-wide: the `process` marker on every test that starts a real process (see
tests/process_marker.py), so that `pytest -m "not process"` runs the fast loop."""

from __future__ import annotations

import pytest

from tests.process_marker import module_starts_processes, symbol_starts_processes


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if starts_processes(item):
            item.add_marker(pytest.mark.process)


def starts_processes(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    if module is not None and module_starts_processes(module.__name__):
        return True
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is None:
        return False
    for definitions in fixture_info.name2fixturedefs.values():
        for definition in definitions:
            func = definition.func
            if symbol_starts_processes(func.__module__, func.__name__):
                return True
    return False
