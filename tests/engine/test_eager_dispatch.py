"""Eager dispatch: a CompleteAttempt may hand the steps at the head of the agent's queue to
the same Worker in the same entry, in queue order, whichever session they belong to."""

from __future__ import annotations

from pathlib import Path

from dex_ha.engine import Engine
from tests.engine.driver import Driver, running_model_step


def complete_eagerly(d: Driver, step_id: str, result: dict, worker: str = "w1", limit: int = 4):
    completed = d.complete(step_id, result, next_worker_id=worker, next_max=limit)
    assert completed.ok, completed
    return completed


def model_result(*calls: tuple[str, str]) -> dict:
    return {"content": "", "tool_calls": [{"id": cid, "name": name, "arguments": {}} for cid, name in calls]}


def test_the_next_steps_of_the_session_start_in_the_same_entry(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    result = complete_eagerly(d, step, model_result(("c1", "lookup"), ("c2", "put_item")), worker="w9")
    started = result.value.started
    assert [(s.kind, s.worker_id, s.attempt, s.session_id) for s in started] == [
        ("CallTool", "w9", 1, "s1"),
        ("CallTool", "w9", 1, "s1"),
    ]
    assert d.queued() == []  # nothing left for a poll
    assert {a.step_id for a in d.engine.running_attempts()} == {s.step_id for s in started}


def test_the_head_of_the_queue_goes_first_whichever_session_it_belongs_to(tmp_path: Path) -> None:
    """While other sessions' steps wait, the result still brings the Worker a step (no poll,
    no second entry), and it is the one that waited longest: no queued step is overtaken."""
    d = Driver(str(tmp_path / "e.db"))
    d.register()
    for sid in ("s1", "s2"):
        d.create(sid)
    d.send(session_id="s1")
    step = d.hand_out("RunModel")
    d.send(session_id="s2")  # s2's RunModel now waits at the head of the agent's queue
    result = complete_eagerly(d, step, model_result(("c1", "lookup")), worker="w7", limit=1)
    assert [(s.session_id, s.kind, s.worker_id) for s in result.value.started] == [("s2", "RunModel", "w7")]
    assert [(s.session_id, s.kind) for s in d.queued()] == [("s1", "CallTool")]
    assert {a.step_id for a in d.engine.running_attempts()} == {result.value.started[0].step_id}


def test_without_next_max_nothing_is_handed_out_and_the_limit_holds(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    assert d.model(step, calls=[("c1", "lookup", {}), ("c2", "lookup", {})]).accepted_value().started == ()
    assert len(d.queued()) == 2

    d2, step = running_model_step(tmp_path / "e2.db")
    result = complete_eagerly(d2, step, model_result(("c1", "lookup"), ("c2", "lookup"), ("c3", "lookup")), limit=2)
    assert len(result.value.started) == 2 and len(d2.queued()) == 1


def test_a_bad_next_max_is_rejected_and_changes_nothing(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    result = d.refused(d.complete_command(step, model_result(("c1", "lookup")), next_worker_id="w1", next_max=10_000))
    assert result.code == "invalid" and result.http_status == 400


def test_replaying_the_log_gives_the_same_state(tmp_path: Path) -> None:
    d, step = running_model_step(tmp_path / "e.db")
    started = complete_eagerly(d, step, model_result(("c1", "lookup"))).value.started
    complete_eagerly(d, started[0].step_id, {"status": "ok", "output": 1})
    replica = Engine(str(tmp_path / "replica.db"), durable=False)
    replica.apply_batch(d.log)
    assert replica.logical_dump() == d.engine.logical_dump()
