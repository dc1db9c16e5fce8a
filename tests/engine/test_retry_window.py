"""The retry window: RunModel and CompactContext run "up to 3 attempts
within 30 minutes" of the first hand-out. No retry may start after first hand-out + window,
however long the step waited in the queue for a Worker; the turn fails instead, with the
usual exhaustion note.

Two places enforce it, both on the command's `at` (the Driver's clock): a `retry_window`
timer at the window's end fails a step still waiting for its retry, and a hand-out
proposed past the end (the timer has not fired yet) fails the step instead of starting it.
"""

from __future__ import annotations

import pytest

from dex_ha.engine import STEP_KINDS, Engine, Handout, StartAttempts
from tests.engine.driver import Driver

HOUR_MS = 3_600_000


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    yield driver
    driver.engine.close()


def turn_after_a_tool(d: Driver) -> str:
    """A turn whose first model round called a tool that ran; returns the next RunModel step."""
    d.register()
    d.create()
    d.send("please help")
    d.run_model("look first", [("c1", "lookup", {"q": "x"})])
    tool = d.hand_out("CallTool")
    assert d.complete(tool, {"status": "ok", "output": 42}).ok
    return d.next_step("RunModel")


def fail_once_and_requeue(d: Driver, step_id: str, kind: str) -> int:
    """Attempt 1 starts and its Worker dies; the backoff fires and the step is queued again.
    Returns the first hand-out time."""
    first_handout_at = d.at
    d.hand_out(kind)
    d.worker_kill(step_id)
    d.tick(STEP_KINDS[kind].backoff_initial_ms)
    assert d.fire_due() == 1  # the backoff timer
    assert step_id in [s.step_id for s in d.queued()]
    return first_handout_at


def window_end(kind: str, first_handout_at: int) -> int:
    window_ms = STEP_KINDS[kind].retry_window_ms
    assert window_ms is not None, f"{kind} steps have no retry window"
    return first_handout_at + window_ms


def assert_failed_with_note(d: Driver, step_id: str) -> None:
    """The turn failed on the window after one attempt, with the note that the tool ran."""
    assert d.turn_status() == "failed" and d.snap()["status"] == "idle"
    assert d.queued() == [] and d.engine.running_attempts() == []
    step = d.engine._store.step(step_id)  # the step row itself: no query shows an ended turn's steps
    assert step is not None and (step["status"], step["attempts_used"]) == ("failed", 1)
    assert "30 min" in (d.snap()["turns"][-1]["error"] or "no error")
    note = d.snap()["history"][-1]
    assert note["type"] == "note" and "c1" in note["text"] and "do not repeat" in note["text"]
    assert d.engine.next_timer() is None  # nothing left to fire for this step


def test_model_retry_not_handed_out_after_the_window(d: Driver) -> None:
    """Seen in production: attempt 1 failed, no Worker polled for 2 h, and attempt 2 was
    handed out 120 min after the first. The window timer fails the turn at 30 min."""
    model = turn_after_a_tool(d)
    first = fail_once_and_requeue(d, model, "RunModel")
    d.tick(2 * HOUR_MS)  # no Worker polls meanwhile
    assert d.fire_due() == 1  # the retry window's timer
    assert_failed_with_note(d, model)
    assert d.snap()["turns"][-1]["ended_at"] == d.at > window_end("RunModel", first)


def test_window_timer_is_due_right_after_the_window(d: Driver) -> None:
    model = turn_after_a_tool(d)
    first = fail_once_and_requeue(d, model, "RunModel")
    timers = [t for t in d.engine.due_timers(None) if t.purpose == "retry_window"]
    assert [(t.step_id, t.due_at) for t in timers] == [(model, window_end("RunModel", first) + 1)]
    d.tick(window_end("RunModel", first) - d.at)  # the last moment a retry may start
    assert d.fire_due() == 0
    d.hand_out("RunModel")
    assert d.running(model).attempt == 2
    # The retry started in time: its window timer is gone, so it cannot fail the step later.
    assert [t for t in d.engine.due_timers(None) if t.purpose == "retry_window"] == []
    d.model(model, "done")
    assert d.turn_status() == "completed"


def test_hand_out_past_the_window_fails_the_turn_instead(d: Driver) -> None:
    """The leader proposes the hand-out before its timer loop fired the window timer: the
    engine, on the command's `at`, fails the step instead of starting attempt 2, and the
    command is accepted (it changed the state), so the leader does not propose it again."""
    model = turn_after_a_tool(d)
    first = fail_once_and_requeue(d, model, "RunModel")
    d.tick(2 * HOUR_MS)
    result = d.apply(
        StartAttempts(at=d.at, handouts=[Handout(step_id=model, worker_id="w2", term=d.term, token_secret="late")])
    )
    assert result.ok and result.accepted_value().started == ()
    assert list(result.accepted_value().expired) == [model]
    assert_failed_with_note(d, model)
    assert d.at > window_end("RunModel", first)
    again = d.apply(
        StartAttempts(at=d.at, handouts=[Handout(step_id=model, worker_id="w2", term=d.term, token_secret="late")])
    )
    assert not again.ok and again.code == "conflict"  # not queued any more: refused, changes nothing


def test_hand_out_one_ms_past_the_window_is_refused(d: Driver) -> None:
    model = turn_after_a_tool(d)
    first = fail_once_and_requeue(d, model, "RunModel")
    d.tick(window_end("RunModel", first) + 1 - d.at)
    result = d.apply(
        StartAttempts(at=d.at, handouts=[Handout(step_id=model, worker_id="w2", term=d.term, token_secret="x")])
    )
    assert result.ok and result.accepted_value().started == ()
    assert d.turn_status() == "failed"


def test_compaction_retry_window(d: Driver) -> None:
    """R14 has the same gap: the summary call is not retried after its window either."""
    d.register(compaction={"max_items": 2})
    d.create()
    d.send("first")
    d.run_model("first answer")
    d.send("second")  # over max_items: compact before the model
    compact = d.next_step("CompactContext")
    fail_once_and_requeue(d, compact, "CompactContext")
    d.tick(2 * HOUR_MS)
    assert d.fire_due() == 1
    assert d.turn_status() == "failed" and d.queued() == []
    assert "30 min" in (d.snap()["turns"][-1]["error"] or "no error")
    d.send("third")  # the next user message compacts again
    assert d.queued_kinds() == ["CompactContext"]


def test_tool_steps_have_no_window(d: Driver) -> None:
    """CallTool has no retry window: a retry queued for hours still runs."""
    d.register()
    d.create()
    d.send("please help")
    d.run_model("calling", [("c1", "put_item", {})])
    step = d.next_step("CallTool")
    fail_once_and_requeue(d, step, "CallTool")
    d.tick(2 * HOUR_MS)
    assert d.fire_due() == 0
    d.hand_out("CallTool")
    assert d.running(step).attempt == 2


def test_window_decisions_replay_to_the_same_state(d: Driver, tmp_path) -> None:
    model = turn_after_a_tool(d)
    fail_once_and_requeue(d, model, "RunModel")
    d.tick(2 * HOUR_MS)
    d.apply(StartAttempts(at=d.at, handouts=[Handout(step_id=model, worker_id="w2", term=d.term, token_secret="late")]))
    d.send("next turn")
    other = Engine(str(tmp_path / "replay.db"), durable=False)
    try:
        other.apply_batch(d.log)
        assert other.logical_dump() == d.engine.logical_dump()
    finally:
        other.close()
