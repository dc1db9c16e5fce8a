"""The crash matrix: rows R01–R20 × worker_kill, server_restart, takeover (R21 in test_r21.py),
one test per cell (`test_cell[R05-takeover]`, a row's variants `test_cell[R19-takeover-write]`),
and the cases of a call that never ran and of the exception to at-most-once
(`test_case[denied]`), on real processes.

Every cell and case comes from the row table (rows.py): its id, its xfail mark, the agent
its Worker process runs and its scenario (scenarios.py), which brings on the column's
failure at the row's moment and checks the row's outcome from outside the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.crash.cell import Cell
from tests.crash.columns import Column
from tests.crash.rows import CASES, CELL_RUNS, COLUMNS, ROWS, Failure

THIS_FILE = "tests/crash/test_matrix.py"


def xfail_marks(failure: Failure) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(strict=True, reason=failure.xfail)] if failure.xfail else []


def cell_params() -> list[Any]:
    """Column by column (each column's server starts once), row by row, each row's variants
    after it. The first value is the cell key: the row, or row-suffix."""
    params = []
    for column in COLUMNS:
        for row in (row for row in ROWS.values() if row.cells_in == THIS_FILE):
            params.append(pytest.param(row.id, column, id=f"{row.id}-{column}", marks=xfail_marks(row.failure(column))))
            for variant in row.variants:
                failure = variant.cells.get(column)
                if failure is None:
                    continue
                key, test_id = f"{row.id}-{variant.suffix}", f"{row.id}-{column}-{variant.suffix}"
                params.append(pytest.param(key, column, id=test_id, marks=xfail_marks(failure)))
    return params


def test_every_row_has_its_cells_here_or_names_the_file_that_has_them() -> None:
    assert sorted(ROWS) == [f"R{n:02d}" for n in range(1, 22)]
    assert {row.id: row.cells_in for row in ROWS.values() if row.cell is None} == {"R21": "tests/crash/test_r21.py"}
    assert all(row.cells_in == THIS_FILE for row in ROWS.values() if row.cell is not None)


async def run_cell(key: str, column: Column, tmp_path: Path, language: str = "python") -> None:
    """The scenario of `key` (rows.CELL_RUNS) on a new Cell in `column`, its Worker in `language`."""
    scenario = CELL_RUNS[key].scenario
    assert scenario is not None, f"{key} has no scenario in scenarios.py"
    await column.ready()
    cell = Cell(key, column, tmp_path, language)
    try:
        await cell.open()
        await scenario(cell)
    finally:
        await cell.close()


@pytest.mark.parametrize("row_id, column_name", cell_params())
async def test_cell(row_id: str, column_name: str, columns: dict[str, Column], tmp_path: Path) -> None:
    await run_cell(row_id, columns[column_name], tmp_path)


@pytest.mark.parametrize("case_id", list(CASES))
async def test_case(case_id: str, columns: dict[str, Column], tmp_path: Path) -> None:
    await run_cell(case_id, columns[CASES[case_id].column], tmp_path)
