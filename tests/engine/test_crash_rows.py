"""The crash matrix (rows R01–R20 of docs/crash-matrix.md) at the engine level.

Each row of the row table (tests/crash/rows.py) names its engine scenario
(tests/engine/crash_scenarios.py), which drives the commands a failure produces and checks what is
recorded and what is queued next. Every row runs under each failure, each on a fresh store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dex_ha.engine.kinds import CROSS_KIND_ROWS
from tests.crash.rows import COLUMNS, ROWS
from tests.engine.driver import Driver


def assert_key_on_every_attempt(d: Driver) -> None:
    """Every attempt of every tool call carries the contract key {session_id}:{call_id}."""
    for session in d.engine.sessions_page().items:
        for call in d.snap(session["session_id"])["tool_calls"]:
            for step in call["steps"]:
                for attempt in step["attempts"]:
                    assert attempt["idempotency_key"] == f"{session['session_id']}:{call['call_id']}"


def test_rows_r01_to_r20_have_an_engine_scenario() -> None:
    assert [row.id for row in ROWS.values() if row.engine is not None] == [f"R{n:02d}" for n in range(1, 21)]


@pytest.mark.parametrize("row_id", [row.id for row in ROWS.values() if row.engine is not None])
def test_crash_row(row_id: str, tmp_path: Path) -> None:
    row = ROWS[row_id]
    assert row.engine is not None
    assert row.kinds or row_id in CROSS_KIND_ROWS  # the step-kind table decides the row
    for failure in COLUMNS:
        d = Driver(str(tmp_path / f"{failure}.db"))
        try:
            row.engine(d, failure)
            assert_key_on_every_attempt(d)
        except AssertionError as exc:
            raise AssertionError(f"{row_id} ({row.step}, {row.interrupted}) under {failure}: {exc}") from exc
        finally:
            d.engine.close()
