"""The engine's typed values: status enums that store and serialise as the same strings,
dataclasses built from rows by column name, and require_* reads that reject a missing row."""

from __future__ import annotations

import json

import pytest

from dex_ha.engine import RunningAttempt
from dex_ha.engine.kinds import STEP_KINDS
from dex_ha.engine.results import Rejected
from dex_ha.engine.statuses import CallStatus, StepStatus, TurnStatus
from tests.engine.driver import Driver


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    driver.register()
    driver.create()
    yield driver
    driver.engine.close()


def test_a_status_is_its_string() -> None:
    assert StepStatus.QUEUED == "queued" and CallStatus.OUTCOME_UNKNOWN == "outcome_unknown"
    assert json.dumps({"status": TurnStatus.CANCELLED}) == '{"status": "cancelled"}'
    assert f"turn_{TurnStatus.FAILED}" == "turn_failed"


def test_statuses_are_stored_and_sent_as_plain_strings(d) -> None:
    """A write whose one attempt failed: the call, its step and the stored events carry the
    same strings as before the enums (TEXT in SQLite, plain strings in JSON)."""
    d.send()
    d.run_model(calls=[("c1", "send_email", {"to": "a"})])
    d.fail(d.hand_out("CallSingleAttemptTool"))
    store = d.engine._store
    assert tuple(store.row("SELECT status, typeof(status) FROM tool_calls WHERE call_id = 'c1'")) == (
        "outcome_unknown",
        "text",
    )
    assert tuple(store.row("SELECT status, typeof(status) FROM steps WHERE kind = 'CallSingleAttemptTool'")) == (
        "failed",
        "text",
    )
    finished = [e.data for e in d.engine.events("s1") if e.type == "tool_call_finished"]
    assert [f["status"] for f in finished] == ["outcome_unknown"]
    assert type(finished[0]["status"]) is str
    assert d.call("c1")["status"] == "outcome_unknown"


def test_running_attempt_is_built_by_column_name(d) -> None:
    """Attempt 2 (not 1) of term 1 on Worker w2: a column read into the wrong field shows."""
    d.send()
    step_id = d.hand_out("RunModel")
    d.fail(step_id)
    d.tick(STEP_KINDS["RunModel"].backoff_initial_ms)
    assert d.fire_due() == 1
    d.tick(5)
    d.hand_out("RunModel", worker="w2")
    assert d.engine.running_attempts() == [
        RunningAttempt(
            step_id=step_id,
            attempt=2,
            term=1,
            worker_id="w2",
            session_id="s1",
            kind="RunModel",
            started_at=d.at,
            deadline_at=d.at + STEP_KINDS["RunModel"].start_to_close_ms,
            cancel_requested=False,
        )
    ]
    d.cancel()
    assert d.engine.running_attempts()[0].cancel_requested is True


def test_queued_step_is_built_by_column_name(d) -> None:
    d.send()
    [queued] = d.queued()
    assert (queued.session_id, queued.agent, queued.kind, queued.call_id, queued.queued_at) == (
        "s1",
        "helper",
        "RunModel",
        None,
        d.at,
    )
    assert queued.turn_id == d.snap()["turns"][-1]["turn_id"]


@pytest.mark.parametrize(
    "read, args",
    [
        ("require_step", ("st-none",)),
        ("require_session", ("s-none",)),
        ("require_call", ("s1", "c-none")),
        ("require_timer", ("tm-none",)),
    ],
)
def test_require_rejects_a_missing_row_as_not_found(d, read, args) -> None:
    with pytest.raises(Rejected) as raised:
        getattr(d.engine._store, read)(*args)
    assert raised.value.code == "not_found" and args[-1] in raised.value.reason


def test_require_returns_the_row_that_exists(d) -> None:
    d.send()
    step_id = d.next_step("RunModel")
    assert d.engine._store.require_step(step_id)["status"] == StepStatus.QUEUED
    assert d.engine._store.require_session("s1")["agent"] == "helper"
