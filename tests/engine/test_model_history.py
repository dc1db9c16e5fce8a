"""The history a model sees: model APIs refuse an input where anything stands between an
assistant message's tool calls and their results. A reconcile note that arrives while a
model response's calls are still running must wait until their results are in.
"""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dex_ha.engine import Engine
from dex_ha.engine.schema import SCHEMA_VERSION
from tests.engine.driver import UNDO_SCHEMA_4, Driver
from tests.engine.test_properties import calls_split_from_results


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    yield driver
    driver.engine.close()


def lost_write_then_a_running_call(d: Driver) -> str:
    """Round 1: a write whose Worker died (outcome_unknown). Round 2 of the same turn: a
    read that is still running. Returns the read's step."""
    d.register()
    d.create()
    d.send("pay and check")
    d.run_model("paying", [("pay", "send_email", {"to": "a@b"})])
    d.worker_kill(d.hand_out("CallSingleAttemptTool"))
    assert d.call("pay")["status"] == "outcome_unknown"
    d.run_model("checking", [("check", "lookup", {"q": "x"})])
    return d.hand_out("CallTool")


def model_input(d: Driver) -> list[dict]:
    return d.task(d.next_step("RunModel")).input["history"]


def test_reconcile_during_a_running_call_waits_for_its_result(d: Driver) -> None:
    check = lost_write_then_a_running_call(d)
    assert d.reconcile("pay", "succeeded", result={"sent": True}).ok
    assert d.complete(check, {"status": "ok", "output": "found"}).ok
    history = model_input(d)
    assert calls_split_from_results(history) is None, history
    assert [h["type"] for h in history[-3:]] == ["assistant", "tool_result", "note"]
    assert "reconciled" in history[-1]["text"] and "pay" in history[-1]["text"]


def test_reconcile_between_model_rounds_is_noted_at_once(d: Driver) -> None:
    """No call is running: nothing to split, the note goes into the history right away."""
    d.register()
    d.create()
    d.send("pay")
    d.run_model("paying", [("pay", "send_email", {"to": "a@b"})])
    d.worker_kill(d.hand_out("CallSingleAttemptTool"))
    assert d.reconcile("pay", "failed", error="bounced").ok
    history = model_input(d)
    assert [h["type"] for h in history[-3:]] == ["assistant", "tool_result", "note"]
    assert "bounced" in history[-1]["text"]


def test_a_held_note_is_delivered_when_the_turn_is_cancelled(d: Driver) -> None:
    lost_write_then_a_running_call(d)
    assert d.reconcile("pay", "succeeded").ok
    d.cancel()
    history = d.snap()["history"]
    assert calls_split_from_results(history) is None, history
    assert history[-1]["type"] == "note" and "reconciled" in history[-1]["text"]
    assert d.call("check")["status"] == "failed"  # the cancel gave the running read its result


def test_repeating_a_reconcile_holds_no_second_note(d: Driver) -> None:
    check = lost_write_then_a_running_call(d)
    assert d.reconcile("pay", "succeeded").ok
    assert d.reconcile("pay", "succeeded").noop
    assert d.complete(check, {"status": "ok", "output": "found"}).ok
    notes = [h for h in model_input(d) if h["type"] == "note"]
    assert len(notes) == 1


def test_compaction_never_summarises_a_call_without_its_results(d: Driver) -> None:
    """Found by the property test: with the turn's user message already summarised, the
    summary covered everything but the latest item, and the model's input began with a
    tool result whose call had been summarised away."""
    d.register(compaction={"max_items": 2})
    d.create()
    d.send("go")
    d.run_model("two lookups", [("c1", "lookup", {}), ("c2", "lookup", {})])
    for call_id in ("c1", "c2"):
        assert d.complete(d.hand_out(call_id=call_id), {"status": "ok", "output": call_id}).ok
    compact = d.hand_out("CompactContext")
    assert d.complete(compact, {"summary": "the user said go"}).ok
    history = model_input(d)
    assert calls_split_from_results(history) is None, history
    assert [h["type"] for h in history] == ["assistant", "tool_result", "tool_result"]


def test_a_schema_2_data_dir_and_snapshot_are_migrated(tmp_path) -> None:
    """Schema 3 adds the held_notes table: a data dir or snapshot of schema 2 opens, and a
    reconcile during a running call then holds its note as on a new store."""
    old = tmp_path / "old.db"
    d = Driver(str(old))
    check = lost_write_then_a_running_call(d)
    index = d.engine.applied_index()
    d.engine.close()
    conn = sqlite3.connect(old)
    conn.executescript(UNDO_SCHEMA_4 + "DROP TABLE held_notes; PRAGMA user_version=2;")
    snapshot = old.read_bytes()
    conn.close()

    restored = Engine(str(tmp_path / "restored.db"), durable=False)
    restored.restore(snapshot, index)
    assert restored._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    restored.close()
    d.engine = Engine(str(old), durable=False)  # the data dir itself, reopened
    assert d.engine._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert d.reconcile("pay", "succeeded").ok
    assert d.complete(check, {"status": "ok", "output": "found"}).ok
    assert calls_split_from_results(model_input(d)) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_model_input_keeps_calls_next_to_their_results(data) -> None:
    """Random turns of one session, with tool rounds, lost writes and reconciles at any
    point: every model input keeps each assistant's tool calls next to their results."""
    d = Driver(":memory:")
    d.register(compaction={"max_items": data.draw(st.sampled_from([3, 6, 100]))})
    d.create()
    d.send("start")
    for _ in range(data.draw(st.integers(min_value=1, max_value=40))):
        action = data.draw(
            st.sampled_from(["model", "tool_ok", "tool_ok", "tool_lost", "reconcile", "send", "compact"])
        )
        random_action(d, data, action)
        for step in d.queued():
            if step.kind == "RunModel":
                history = d.task(step.step_id).input["history"]
                assert calls_split_from_results(history) is None, history
    d.engine.close()


def random_action(d: Driver, data, action: str) -> None:
    queued = {s.step_id: s for s in d.queued()}
    tool_steps = [s for s in queued.values() if s.call_id is not None]
    if action == "model" and any(s.kind == "RunModel" for s in queued.values()):
        count = data.draw(st.integers(min_value=0, max_value=3))
        names = [data.draw(st.sampled_from(["send_email", "lookup"])) for _ in range(count)]
        d.run_model("m", [(f"c{d.index}-{i}", name, {}) for i, name in enumerate(names)])
    elif action in ("tool_ok", "tool_lost") and tool_steps:
        step = data.draw(st.sampled_from(tool_steps))
        d.hand_out(call_id=step.call_id)
        if action == "tool_ok":
            assert d.complete(step.step_id, {"status": "ok", "output": 1}).ok
        else:
            d.worker_kill(step.step_id)
    elif action == "reconcile":
        unknown = [c["call_id"] for c in d.snap()["tool_calls"] if c["status"] == "outcome_unknown"]
        if unknown:
            assert d.reconcile(data.draw(st.sampled_from(unknown)), "succeeded").ok
    elif action == "send":
        d.send(f"more {d.index}")
    elif action == "compact" and any(s.kind == "CompactContext" for s in queued.values()):
        assert d.complete(d.hand_out("CompactContext"), {"summary": "S"}).ok
    d.tick(1_000)
    d.fire_due()  # backoffs of lost idempotent calls
