"""The status and step-kind enums cannot drift from the database, and no module spells
their values as bare strings: each status enum's values are exactly the set the schema
documents for its table's column, the kind table has an entry for every StepKind, and an
AST scan of the engine and the server finds no string constant equal to one of these values
used as a value (compared, assigned, passed, returned) outside the enums' own definitions."""

from __future__ import annotations

import ast
import enum
import re
from pathlib import Path

import pytest

from dex_ha.engine import schema
from dex_ha.engine.kinds import STEP_KINDS, TASK_KINDS, StepKind
from dex_ha.engine.statuses import (
    ApprovalStatus,
    AttemptProgress,
    AttemptStatus,
    CallStatus,
    MessageStatus,
    QuestionStatus,
    SessionStatus,
    StepStatus,
    TimerPurpose,
    TimerStatus,
    TurnStatus,
)
from dex_ha.worker import runner

ENGINE = Path(schema.__file__).parent

STATUS_OF_TABLE: dict[str, type[enum.StrEnum]] = {
    "sessions": SessionStatus,
    "messages": MessageStatus,
    "turns": TurnStatus,
    "steps": StepStatus,
    "attempts": AttemptStatus,
    "tool_calls": CallStatus,
    "approvals": ApprovalStatus,
    "questions": QuestionStatus,
    "timers": TimerStatus,
}


def documented_values(table: str, column: str) -> set[str]:
    """The values the schema's comment lists for `column` of `table`: `-- a | b | c`, each
    value perhaps followed by words that explain it."""
    body = re.search(rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\)", schema.SCHEMA, re.S)
    assert body is not None, f"no table {table} in the schema"
    line = re.search(rf"^\s*{column}\s+TEXT[^\n]*--\s*([^\n]*)$", body.group(1), re.M)
    assert line is not None, f"{table}.{column} documents no values"
    return {re.split(r"[\s,]", value.strip())[0] for value in line.group(1).split("|")}


@pytest.mark.parametrize("table", sorted(STATUS_OF_TABLE))
def test_each_status_enum_is_exactly_what_its_table_stores(table: str) -> None:
    assert {member.value for member in STATUS_OF_TABLE[table]} == documented_values(table, "status")


def test_timer_purposes_are_exactly_what_timers_store() -> None:
    assert {member.value for member in TimerPurpose} == documented_values("timers", "purpose")


def test_attempt_progress_is_exactly_what_tool_calls_store() -> None:
    assert {member.value for member in AttemptProgress} == documented_values("tool_calls", "attempt_progress")


def test_every_status_column_of_the_schema_has_an_enum() -> None:
    """A new table with a status column needs an enum (and a row above) too."""
    tables = set(
        re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((?:(?!\n\)).)*?\n\s*status\s+TEXT", schema.SCHEMA, re.S)
    )
    assert tables == set(STATUS_OF_TABLE)


def test_the_documented_values_are_read_as_they_stand() -> None:
    """The reader of schema comments itself: a wrong parse would make the test above vacuous."""
    assert documented_values("tool_calls", "attempt_progress") == {"NOT_STARTED", "NOT_COMPLETED"}
    assert documented_values("steps", "status") == {
        "queued",
        "running",
        "backoff",
        "waiting",
        "done",
        "failed",
        "cancelled",
    }


def test_the_kind_table_is_keyed_by_every_step_kind() -> None:
    assert len(STEP_KINDS) == len(StepKind) and set(STEP_KINDS) == set(StepKind)
    assert all(type(kind) is StepKind and spec.kind is kind for kind, spec in STEP_KINDS.items())


def test_a_stored_kind_finds_its_entry_as_the_plain_string() -> None:
    assert STEP_KINDS["RunModel"].kind is StepKind.RUN_MODEL and "PollToolTask" in TASK_KINDS


def test_the_python_worker_names_the_task_kinds_as_the_engine_does() -> None:
    """The Worker SDK may not import the engine: its own constants must stay equal."""
    assert {
        runner.RUN_MODEL,
        runner.CALL_TOOL,
        runner.CALL_SINGLE_ATTEMPT_TOOL,
        runner.POLL_TOOL_TASK,
        runner.COMPACT_CONTEXT,
    } == set(TASK_KINDS)


# ---------------------------------------------------------------- no bare statuses

STATUS_ENUMS: tuple[type[enum.StrEnum], ...] = (*STATUS_OF_TABLE.values(), TimerPurpose, AttemptProgress, StepKind)
STATUS_VALUES = frozenset(member.value for enum_type in STATUS_ENUMS for member in enum_type)


def _value_positions(tree: ast.AST) -> list[ast.expr]:
    """The expressions a status would stand in as a value: compared, assigned, passed as an
    argument, put in a dict or a sequence, returned, or a branch of a conditional. Not a dict
    key, a subscript, an annotation or a docstring (a response field named `cancelled` or a
    row's `["status"]` is a name, not a status), nor a member of a StrEnum's definition."""
    members = {
        id(statement)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and any(ast.unparse(base).endswith("StrEnum") for base in node.bases)
        for statement in node.body
    }
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if id(node) in members:
            continue
        if isinstance(node, ast.Compare):
            found += [node.left, *node.comparators]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return)) and node.value is not None:
            found.append(node.value)
        elif isinstance(node, ast.Call):
            found += [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.Dict):
            found += node.values
        elif isinstance(node, ast.arguments):
            found += [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
    expanded: list[ast.expr] = []
    while found:
        expr = found.pop()
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            found += expr.elts
        elif isinstance(expr, ast.IfExp):
            found += [expr.body, expr.orelse]
        else:
            expanded.append(expr)
    return expanded


def bare_statuses(source: str, values: frozenset[str] = STATUS_VALUES) -> list[tuple[int, str]]:
    return sorted(
        (expr.lineno, expr.value)
        for expr in _value_positions(ast.parse(source))
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value in values
    )


def test_the_scan_finds_a_bare_status_and_nothing_else() -> None:
    source = '''
"""A docstring that says pending and failed."""
class Status(enum.StrEnum):
    RUNNING = "running"
def f(row, ctx):
    """pending"""
    if row["status"] == "pending":
        ctx.update("t", status="fired")
    answer = {"cancelled": None, "status": "answered"}
    sql = "SELECT 1 FROM timers WHERE status = 'pending'"
    ok = row["status"] in ("idle", Status.RUNNING)
    step = create(kind="RunModel")
    return "done" if ok else row["failed"]
'''
    assert bare_statuses(source) == [
        (7, "pending"),
        (8, "fired"),
        (9, "answered"),
        (11, "idle"),
        (12, "RunModel"),
        (13, "done"),
    ]


# The same word with another meaning: (module, value) -> what it is there.
NOT_A_STATUS = {
    ("engine/agents.py", "sleep"): "the name of the built-in sleep tool",
    ("server/api_spec.py", "outcome_unknown"): "the name of a session list's query field",
    ("server/api_spec.py", "approved"): "the name of an approval decision's body field",
    ("server/app.py", "outcome_unknown"): "the name of a session list's query field",
}
PACKAGE = ENGINE.parent
MODULES = sorted(
    str(p.relative_to(PACKAGE)) for folder in ("engine", "server") for p in (PACKAGE / folder).rglob("*.py")
)


@pytest.mark.parametrize("path", MODULES)
def test_no_engine_or_server_module_spells_a_status_as_a_bare_string(path: str) -> None:
    found = [
        (line, value)
        for line, value in bare_statuses((PACKAGE / path).read_text())
        if (path, value) not in NOT_A_STATUS
    ]
    assert found == []


def test_each_exception_to_the_scan_is_still_needed() -> None:
    """An exception whose word has gone would later hide a real bare status."""
    for path, value in NOT_A_STATUS:
        assert value in {found for _, found in bare_statuses((PACKAGE / path).read_text())}, (path, value)
