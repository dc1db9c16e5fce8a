"""The task a hand-out carries is built inside its apply, from the history cache; it must
equal the task built from the tables (`task_for`) at every point, whatever happened
before: random command sequences (compaction, steered messages, notes, failures, cancels),
a cache too small to hold every session, rolled-back entries and restored snapshots."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex_ha.engine import ApplyResult, CreateSession, DeleteSession, Engine, SendMessage, Task, encode_command
from dex_ha.engine import handlers as engine_handlers
from dex_ha.engine.kinds import DEFAULT_HEARTBEAT_TIMEOUT_MS
from dex_ha.engine.results import AttemptCompleted, AttemptsStarted, ResultsReported
from tests.engine.driver import AGENT, Driver
from tests.engine.test_properties import PROPERTY, SESSIONS, RandomLeader


def cached_sessions_match_the_tables(engine: Engine) -> None:
    """Every session and agent definition the cache holds is as the tables have it."""
    store = engine._store
    cache = store.history_cache
    assert cache is not None
    for session_id in list(cache._sessions):
        assert cache._sessions[session_id] == store.session_history(session_id), session_id
    for name, definition in cache._definitions.items():
        assert definition == store.agent_definition(name), name


def handed_out_tasks_match_the_tables(engine: Engine, result: ApplyResult[Any]) -> int:
    """Each hand-out of `result` carries the task `task_for` reads from the tables; how many."""
    started = (
        result.value.started if isinstance(result.value, (AttemptsStarted, AttemptCompleted, ResultsReported)) else ()
    )
    for handout in started:
        from_apply = Task.from_handout(handout, DEFAULT_HEARTBEAT_TIMEOUT_MS)
        assert from_apply == engine.task_for(handout.step_id, DEFAULT_HEARTBEAT_TIMEOUT_MS)
    return len(started)


class ComparingDriver(Driver):
    """After every entry: the hand-outs' tasks and the cached histories equal the tables'."""

    handouts = 0

    def apply_raw(self, data: bytes) -> ApplyResult:
        result = super().apply_raw(data)
        self.handouts += handed_out_tasks_match_the_tables(self.engine, result)
        cached_sessions_match_the_tables(self.engine)
        return result


@PROPERTY
@given(st.data())
def test_a_task_built_in_its_apply_equals_the_task_read_from_the_tables(data):
    leader = RandomLeader(data, ComparingDriver)
    # A budget from "holds one short session at most" to "holds everything".
    leader.d.engine._store.history_cache.budget_chars = data.draw(st.sampled_from([300, 1_000, 16 << 20]))
    for _ in range(data.draw(st.integers(min_value=5, max_value=100))):
        leader.step()


def test_the_property_test_hands_out_model_and_tool_tasks() -> None:
    """The random sequences reach what the comparison is about (a guard on the generator)."""
    d = ComparingDriver(":memory:")
    d.register(compaction={"max_items": 2})
    d.create("s1")
    d.send("one")
    d.run_model(calls=[("c1", "lookup", {})])
    d.complete(d.hand_out("CallTool"), {"status": "ok", "output": 1})
    d.send("two", mode="steer")
    d.complete(d.hand_out("CompactContext"), {"summary": "S"})  # three items are over the limit
    task = d.task(d.hand_out("RunModel"))
    assert d.handouts == 4
    assert task.input["summary"] == "S" and task.input["history"][-1] == {"type": "user", "text": "two"}


def _send_fails_after_its_writes(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    send_message = engine_handlers.HANDLERS[SendMessage]

    def send_then_fail(ctx: Any, cmd: SendMessage) -> Any:
        send_message(ctx, cmd)  # on an idle session: a turn starts with the message in the history
        raise error

    monkeypatch.setitem(engine_handlers.HANDLERS, SendMessage, send_then_fail)


def test_a_changed_agent_definition_reaches_the_next_model_task() -> None:
    d = ComparingDriver(":memory:")
    d.register(tools=[{"name": "lookup", "effect": "read"}])
    d.create("s1")
    d.send("one")
    d.run_model(calls=[("c1", "lookup", {})])  # the definition is read (and cached) here
    d.register(tools=[{"name": "search", "effect": "read"}])
    d.complete(d.hand_out("CallTool"), {"status": "ok", "output": 1})
    task = d.task(d.hand_out("RunModel"))
    assert [tool["name"] for tool in task.input["tools"] if not tool.get("builtin")] == ["search"]


def test_an_entry_undone_in_its_savepoint_leaves_nothing_in_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """One transaction: a new session (cached at once), then a message to it that fails
    after writing its history item. The entry is undone, so is what it cached."""
    d = Driver(":memory:")
    d.register()
    _send_fails_after_its_writes(monkeypatch, RuntimeError("a bug after the writes"))
    created, lost = d.engine.apply_batch(
        [
            (d.index + 1, encode_command(CreateSession(at=d.at, session_id="s9", agent=AGENT))),
            (d.index + 2, encode_command(SendMessage(at=d.at, session_id="s9", text="lost"))),
        ]
    )
    assert created.ok and not lost.ok and lost.code == "internal"
    assert d.engine._store.session_history("s9").items == []
    cached_sessions_match_the_tables(d.engine)


def test_a_transaction_rolled_back_whole_leaves_nothing_in_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error of the database (a full disk) rolls the whole batch back and stops the
    apply; what the batch cached goes with it."""
    d = Driver(":memory:")
    d.register()
    d.create("s9")
    _send_fails_after_its_writes(monkeypatch, sqlite3.OperationalError("database or disk is full"))
    with pytest.raises(sqlite3.OperationalError):
        d.engine.apply(d.index + 1, encode_command(SendMessage(at=d.at, session_id="s9", text="lost")))
    cache = d.engine._store.history_cache
    assert cache is not None and len(cache) == 0  # s9 was cached, and touched by the batch
    cached_sessions_match_the_tables(d.engine)


def test_a_restored_snapshot_replaces_what_the_cache_held(tmp_path) -> None:
    """After a snapshot of an earlier state is installed, the cache holds nothing newer."""
    d = ComparingDriver(str(tmp_path / "engine.db"))
    d.register()
    for session_id in SESSIONS:
        d.create(session_id)
    d.send("before the snapshot")
    snapshot, index = d.engine.snapshot(), d.engine.applied_index()
    d.run_model(content="after the snapshot", calls=[])
    d.engine.restore(snapshot, index)
    cached_sessions_match_the_tables(d.engine)
    d.index = index
    step = d.hand_out("RunModel")
    assert [item["type"] for item in d.task(step).input["history"]] == ["user"]


def test_a_session_deleted_and_created_again_starts_from_an_empty_history() -> None:
    d = ComparingDriver(":memory:")
    d.register()
    d.create("s1")
    d.send("before")
    d.run_model(calls=[("c1", "lookup", {})])  # the history is cached here
    d.cancel("s1")
    d.ok(DeleteSession(at=d.at, session_id="s1"))
    cache = d.engine._store.history_cache
    assert cache is not None and cache.session("s1") is None
    d.create("s1")
    d.send("after")
    task = d.task(d.hand_out("RunModel"))
    assert task.input["history"] == [{"type": "user", "text": "after"}]
