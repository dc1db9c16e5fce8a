"""docs/crash-matrix.md is generated from the row table the crash cells use: the committed
document must match it (fast; it does not run the cells)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crash_matrix_doc.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("crash_matrix_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_document_matches_the_row_table() -> None:
    doc = load_script()
    assert doc.table_part(doc.DOC.read_text()) == doc.render_table(), (
        "docs/crash-matrix.md is stale: run the cells with DEX_HA_CRASH_RESULTS=FILE, then "
        "scripts/crash_matrix_doc.py --results FILE"
    )


def test_a_changed_row_makes_the_document_stale(tmp_path: Path) -> None:
    doc = load_script()
    out = tmp_path / "crash-matrix.md"
    assert doc.main(["--out", str(out)]) == 0 and doc.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("| R05 |", "| R05 (edited) |"))
    assert doc.main(["--check", "--out", str(out)]) == 1


def test_every_cell_has_a_line_with_its_test_id() -> None:
    doc = load_script()
    table = doc.render_table()
    for row_id in doc.ROWS:
        for column in doc.COLUMNS:
            assert f"`test_cell[{row_id}-{column}]`" in table


def test_every_variant_cell_and_case_has_a_line_with_its_test_id() -> None:
    doc = load_script()
    table = doc.render_table()
    for row in doc.ROWS.values():
        for variant in row.variants:
            for column in variant.cells:
                assert f"`test_cell[{row.id}-{column}-{variant.suffix}]`" in table
    for case in (*doc.NEVER_RAN, *doc.KEEPS_RUNNING):
        assert f"`test_case[{case.id}]`" in table


def last_run(tmp_path: Path, seconds_by_cell: dict[str, float]) -> str:
    """The "last run" part of a document written from results in which every cell passed."""
    doc = load_script()
    results = tmp_path / "cells.jsonl"
    lines = [{"cell": cell, "outcome": "passed", "seconds": seconds} for cell, seconds in seconds_by_cell.items()]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "crash-matrix.md"
    assert doc.main(["--results", str(results), "--out", str(out)]) == 0
    return str(out.read_text().split(doc.RUN_HEADING, 1)[1])


def test_a_run_lists_variant_cells_and_cases(tmp_path: Path) -> None:
    run = last_run(tmp_path, {"R19-takeover-write": 1.0, "denied": 1.0})
    assert "| R19-takeover-write | passed |" in run and "| denied | passed |" in run
    assert "| takeover | 1 | 1 |" in run
    assert "1.0" not in run  # no timings: the page changes only when an outcome does


def test_every_typescript_cell_has_a_line_with_its_test_id() -> None:
    doc = load_script()
    table = doc.render_table()
    cells = doc.ts_cells()
    assert [cell.test_id for cell in cells][:2] == ["R01-worker_kill-ts", "R02-worker_kill-ts"]
    assert "R16-worker_kill-busy-ts" in [cell.test_id for cell in cells]
    for cell in cells:
        assert f"`test_cell[{cell.test_id}]`" in table


def test_a_run_lists_typescript_cells_without_timings(tmp_path: Path) -> None:
    run = last_run(tmp_path, {"R07-worker_kill-ts": 2.5, "R07-worker_kill": 1.5})
    assert "| R07-worker_kill-ts | passed |" in run
    assert "| worker_kill (TypeScript) | 1 | 1 |" in run and "| worker_kill | 1 | 1 |" in run
    assert "2.5" not in run and "1.5" not in run
