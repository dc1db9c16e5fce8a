"""The SQL statements a durable step costs the engine: the engine_bench workload (hand-outs,
a model answer with two tool calls, their results, the final answer) run through the engine
with SQLite's trace callback. The count is deterministic, so a statement added to the hot
path fails here, with the statements listed by how often they ran."""

from __future__ import annotations

from bench.engine_bench import (
    COUNTED_SESSIONS,
    STATEMENTS_PER_STEP_LIMIT,
    count_statements,
    format_statements,
    normalise_sql,
)


def test_a_step_runs_at_most_the_allowed_sql_statements() -> None:
    report = count_statements(COUNTED_SESSIONS)
    assert report["steps"] == COUNTED_SESSIONS * 4  # two model steps and two tool steps per session
    assert report["statements_per_step"] <= STATEMENTS_PER_STEP_LIMIT, format_statements(report, top=40)


def test_statements_group_by_their_text_without_values() -> None:
    assert (
        normalise_sql("SELECT a FROM t  WHERE id = 'x''y' AND n = -12 AND v IS NULL AND c2 = 3.5")
        == "SELECT a FROM t WHERE id = ? AND n = ? AND v IS ? AND c2 = ?"
    )
