"""Fixtures of the crash matrix: one server (or cluster) per failure column, shared by the
cells of that column (each cell has its own agent, session, worker process and ledger),
and the results file the document generator reads (DEX_HA_CRASH_RESULTS)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crash.columns import COLUMNS, Column

RESULTS_ENV = "DEX_HA_CRASH_RESULTS"


@pytest.fixture(scope="module")
def columns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Column]]:
    """Started on first use, stopped (by pid) at the end of the module."""
    started: dict[str, Column] = {}

    class Lazy(dict[str, Column]):
        def __missing__(self, name: str) -> Column:
            started[name] = COLUMNS[name](tmp_path_factory.mktemp(name))
            self[name] = started[name]
            return started[name]

    try:
        yield Lazy()
    finally:
        for column in started.values():
            column.close()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append each cell's (and case's) outcome and duration to the results file, when one is named."""
    path = os.environ.get(RESULTS_ENV)
    if not path or not ("test_cell[" in report.nodeid or "test_case[" in report.nodeid):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = (
            "xfailed"
            if hasattr(report, "wasxfail") and report.skipped
            else "xpassed"
            if hasattr(report, "wasxfail")
            else report.outcome
        )
        cell = report.nodeid.split("[", 1)[1].rstrip("]")
        with Path(path).open("a") as results:
            results.write(json.dumps({"cell": cell, "outcome": outcome, "seconds": round(report.duration, 1)}) + "\n")
