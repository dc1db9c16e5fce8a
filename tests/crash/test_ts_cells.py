"""The crash matrix's Worker-kill column with the TypeScript Worker (sdk/typescript): rows
R01–R16, the R16 busy variant and R19 (a result in flight, with its write variant), each
cell the Python one's scenario (scenarios.py) with the row's TypeScript agent
(sdk/typescript/test/crash/agents.ts) in a `node` process that is SIGKILLed, or exits at a
Worker failpoint, where the Python Worker would. The assertions are the Python cells' own,
from outside the server: the ledger of tool runs, the snapshot and the event stream.

Cell ids: `test_cell[R07-worker_kill-ts]`, a variant's `test_cell[R16-worker_kill-busy-ts]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.typescript_sdk import ensure_built, node_missing
from tests.crash.columns import Column
from tests.crash.rows import TS_COLUMN, ts_cells
from tests.crash.test_matrix import run_cell

pytestmark = pytest.mark.skipif(node_missing() is not None, reason=str(node_missing()))


def ts_cell_params() -> list[Any]:
    return [pytest.param(cell.scenario, id=cell.test_id) for cell in ts_cells()]


@pytest.fixture(scope="module")
def ts_worker_built() -> None:
    ensure_built()


@pytest.mark.parametrize("row_id", ts_cell_params())
async def test_cell(row_id: str, ts_worker_built: None, columns: dict[str, Column], tmp_path: Path) -> None:
    await run_cell(row_id, columns[TS_COLUMN], tmp_path, language="ts")
