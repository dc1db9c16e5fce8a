"""docs/crash-matrix.md is generated from the row table the crash cells use: the committed
document must match it (fast; it does not run the cells)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "crash_matrix_doc.py"


def load_script():  # type: ignore[no-untyped-def]
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
