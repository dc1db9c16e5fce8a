"""Property tests over random command sequences (hypothesis).

A random leader looks at the engine's state and proposes what a leader, Workers and
clients could: messages (queued, steered, repeated), batched hand-outs (some stale),
results of every shape, failures, heartbeat losses, takeovers, timers (due or not),
decisions and answers (repeated, conflicting), cancels, reconciles and garbage. The log it
produces is then replayed to check determinism, idempotency and snapshots.

Example counts are modest by default; DEX_HA_LONG=1 runs many more.
"""

from __future__ import annotations

import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dex_ha.engine import (
    AnswerQuestion,
    AttemptTimedOut,
    CancelTurn,
    CompleteAttempt,
    CreateSession,
    DecideApproval,
    Engine,
    FailAttempt,
    FailHeldAttempts,
    FireTimer,
    Handout,
    HeartbeatLost,
    ReconcileToolCall,
    SendMessage,
    StartAttempts,
    StartQueuedAttempts,
)
from harness.long_runs import long_runs
from tests.engine.driver import AGENT, DEFAULT_TOOLS, Driver

EXAMPLES = 1000 if long_runs() else 100
SESSIONS = ("s1", "s2", "s3")
TOOL_NAMES = [t["name"] for t in DEFAULT_TOOLS] + ["ask_user", "sleep", "teleport"]


# Weighted: the work that moves turns forward is drawn more often than what ends them.
ACTIONS = (
    ["send"] * 3
    + ["hand_out"] * 2
    + ["poll_hand_out"] * 3
    + ["complete"] * 6
    + ["timers"] * 3
    + ["decide", "answer"] * 2
    + ["fail", "lost", "takeover", "cancel", "reconcile", "garbage"]
)


class RandomLeader:
    def __init__(self, data: st.DataObject, driver: type[Driver] = Driver) -> None:
        self.data = data
        self.d = driver(":memory:")
        self.calls = 0
        self.d.register(compaction={"max_items": 6})
        for sid in SESSIONS:
            self.d.create(sid)

    def draw(self, strategy):
        return self.data.draw(strategy)

    def pick(self, items):
        return self.draw(st.sampled_from(items)) if items else None

    # ------------------------------------------------------------- actions

    def step(self) -> None:
        d = self.d
        d.tick(self.draw(st.sampled_from([0, 10, 1_000, 5_000, 60_000])))
        action = self.draw(st.sampled_from(ACTIONS))
        getattr(self, f"do_{action}")()

    def do_send(self) -> None:
        mode = self.draw(st.sampled_from(["queue", "steer"]))
        message_id = self.draw(st.sampled_from([None, "m1", "m2"]))
        text = self.draw(st.sampled_from(["hi", "more", "x" * 300]))
        self.d.apply(
            SendMessage(at=self.d.at, session_id=self.pick(SESSIONS), text=text, message_id=message_id, mode=mode)
        )

    def do_hand_out(self) -> None:
        queued = self.d.queued()
        if not queued:
            return
        chosen = self.draw(st.lists(st.sampled_from(queued), min_size=1, max_size=4))
        term = self.d.term - self.draw(st.sampled_from([0, 0, 0, 1]))
        self.d.apply(
            StartAttempts(at=self.d.at, handouts=[Handout(step_id=s.step_id, worker_id="w", term=term) for s in chosen])
        )

    def do_poll_hand_out(self) -> None:
        """What the leader proposes for a poll: n steps from the head of the queue, whichever."""
        n = self.draw(st.integers(min_value=1, max_value=4))
        term = self.d.term - self.draw(st.sampled_from([0, 0, 0, 1]))
        self.d.apply(
            StartQueuedAttempts(
                at=self.d.at, worker_id="w", term=term, agents=[AGENT], token_secrets=[f"t{i}" for i in range(n)]
            )
        )

    def do_complete(self) -> None:
        attempt = self.pick(self.d.engine.running_attempts())
        if attempt is None:
            return self.do_late_result()
        self.d.apply(
            CompleteAttempt(
                at=self.d.at,
                step_id=attempt.step_id,
                attempt=attempt.attempt,
                term=attempt.term,
                result=self.result_for(attempt.kind),
            )
        )

    def do_late_result(self) -> None:
        row = self.d.engine._store.row("SELECT step_id, number, term FROM attempts ORDER BY step_id LIMIT 1")
        if row is not None:
            self.d.apply(
                CompleteAttempt(at=self.d.at, step_id=row[0], attempt=row[1], term=row[2], result={"status": "ok"})
            )

    def result_for(self, kind: str) -> dict:
        if kind == "RunModel":
            names = self.draw(st.lists(st.sampled_from(TOOL_NAMES), max_size=3))
            return {"content": "c", "tool_calls": [self.tool_call(n) for n in names]}
        if kind == "CompactContext":
            return self.draw(st.sampled_from([{"summary": "S"}, {"summary": 5}]))
        if kind == "PollToolTask":
            return self.draw(
                st.sampled_from(
                    [
                        {"status": "pending"},
                        {"status": "ok", "output": 1},
                        {"status": "error", "error": "e"},
                        {"status": "??"},
                    ]
                )
            )
        return self.draw(
            st.sampled_from(
                [
                    {"status": "ok", "output": 1},
                    {"status": "error", "error": "e"},
                    {"status": "question", "question": "?"},
                    {"status": "task", "handle": "h", "poll_after_ms": 100},
                    {"status": "bogus"},
                ]
            )
        )

    def tool_call(self, name: str) -> dict:
        self.calls += 1
        call = {"id": f"c{self.calls}", "name": name, "arguments": {"ms": 500} if name == "sleep" else {}}
        if name == "search_inline" and self.draw(st.booleans()):
            call["result"] = {"status": "ok", "output": 1}
        return call

    def do_fail(self) -> None:
        attempt = self.pick(self.d.engine.running_attempts())
        if attempt is not None:
            self.d.apply(
                FailAttempt(
                    at=self.d.at,
                    step_id=attempt.step_id,
                    attempt=attempt.attempt,
                    term=attempt.term,
                    error="x",
                    retryable=self.draw(st.booleans()),
                    not_started=self.draw(st.booleans()),
                )
            )

    def do_lost(self) -> None:
        attempt = self.pick(self.d.engine.running_attempts())
        if attempt is not None:
            cls = self.draw(st.sampled_from([HeartbeatLost, AttemptTimedOut]))
            self.d.apply(cls(at=self.d.at, step_id=attempt.step_id, attempt=attempt.attempt, term=attempt.term))

    def do_takeover(self) -> None:
        self.d.term += 1
        self.d.apply(FailHeldAttempts(at=self.d.at, term=self.d.term))

    def do_timers(self) -> None:
        timers = self.d.engine.due_timers(None, 10)
        if timers:
            timer = self.pick(timers)
            self.d.apply(FireTimer(at=self.d.at, timer_id=timer.timer_id))

    def do_decide(self) -> None:
        rows = self.d.engine._store.rows("SELECT session_id, call_id FROM approvals")
        if rows:
            sid, call_id = self.pick(rows)
            self.d.apply(
                DecideApproval(at=self.d.at, session_id=sid, call_id=call_id, approved=self.draw(st.booleans()))
            )

    def do_answer(self) -> None:
        rows = self.d.engine._store.rows("SELECT session_id, question_id FROM questions")
        if rows:
            sid, qid = self.pick(rows)
            self.d.apply(
                AnswerQuestion(
                    at=self.d.at, session_id=sid, question_id=qid, answer=self.draw(st.sampled_from(["yes", "no"]))
                )
            )

    def do_cancel(self) -> None:
        self.d.apply(CancelTurn(at=self.d.at, session_id=self.pick(SESSIONS)))

    def do_reconcile(self) -> None:
        rows = self.d.engine._store.rows(
            "SELECT session_id, call_id FROM tool_calls WHERE status = 'outcome_unknown' OR reconciled_at IS NOT NULL"
        )
        if rows:
            sid, call_id = self.pick(rows)
            self.d.apply(
                ReconcileToolCall(
                    at=self.d.at,
                    session_id=sid,
                    call_id=call_id,
                    outcome=self.draw(st.sampled_from(["succeeded", "failed"])),
                )
            )

    def do_garbage(self) -> None:
        # Malformed entries are applied as invalid. (An entry naming a command this node does
        # not know is not garbage but a newer release's: it stops the node, see
        # test_state_machine_version.py, so it is not drawn here.)
        malformed = [b"", b"\x00\x01", b"\x93\x01\xaaCancelTurn\x80", b"\x93\x00\xa4Nope\x80"]
        self.d.apply_raw(self.draw(st.sampled_from(malformed)))
        self.d.apply(CreateSession(at=self.d.at, session_id="s1", agent="someone-else"))


# ---------------------------------------------------------------- invariants


def check_invariants(engine: Engine) -> None:
    q = engine._store.rows
    assert q("SELECT step_id FROM attempts WHERE status = 'running' GROUP BY step_id HAVING COUNT(*) > 1") == []
    # A single-attempt call never gets a second attempt, and a write never runs again after
    # an attempt that may have run without completing (polls of its task are not runs).
    assert q("SELECT step_id FROM steps WHERE kind = 'CallSingleAttemptTool' AND attempts_used > 1") == []
    assert (
        q(
            "SELECT a2.step_id FROM steps s1 JOIN attempts a1 ON a1.step_id = s1.step_id "
            "JOIN steps s2 ON s2.session_id = s1.session_id AND s2.call_id = s1.call_id "
            "JOIN attempts a2 ON a2.step_id = s2.step_id "
            "JOIN tool_calls c ON c.session_id = s1.session_id AND c.call_id = s1.call_id "
            "WHERE c.effect = 'write' AND a1.status = 'failed' AND a2.started_at >= a1.ended_at "
            "AND s1.kind = 'CallSingleAttemptTool' AND s2.kind = 'CallSingleAttemptTool' "
            "AND (a2.step_id, a2.number) != (a1.step_id, a1.number)"
        )
        == []
    )
    # Every tool call of a finished turn has exactly one final outcome, seen once by the model.
    assert (
        q(
            "SELECT c.call_id FROM tool_calls c JOIN turns t ON t.turn_id = c.turn_id "
            "WHERE t.status != 'running' AND c.status = 'pending'"
        )
        == []
    )
    for session_id, call_id in q(
        "SELECT c.session_id, c.call_id FROM tool_calls c JOIN turns t "
        "ON t.turn_id = c.turn_id WHERE t.status != 'running'"
    ):
        seen = engine._store.scalar(
            "SELECT COUNT(*) FROM history WHERE session_id = ? AND json_extract(item, '$.type') = 'tool_result' "
            "AND json_extract(item, '$.call_id') = ?",
            (session_id, call_id),
        )
        assert seen == 1, (session_id, call_id, seen)
    # A session runs at most one turn, and says so.
    assert q("SELECT session_id FROM sessions WHERE (status = 'running') != (current_turn_id IS NOT NULL)") == []
    assert q("SELECT session_id FROM turns WHERE status = 'running' GROUP BY session_id HAVING COUNT(*) > 1") == []
    # What a model sees keeps every assistant tool call next to its results.
    for (step_id,) in q("SELECT step_id FROM steps WHERE kind = 'RunModel' AND status IN ('queued', 'running')"):
        model_task = engine.task_for(step_id)
        assert model_task is not None, step_id  # a queued or running step has a task
        history = model_task.input["history"]
        assert calls_split_from_results(history) is None, (step_id, calls_split_from_results(history), history)
    # A queued step has an attempt left; a running tool attempt carries the contract key.
    assert q("SELECT step_id FROM steps WHERE status = 'queued' AND attempts_used >= max_attempts") == []
    for a in engine.running_attempts():
        task = engine.task_for(a.step_id)
        call_id = engine._store.scalar("SELECT call_id FROM steps WHERE step_id = ?", (a.step_id,))
        assert task is not None and task.idempotency_key == (f"{a.session_id}:{call_id}" if call_id else None)


def calls_split_from_results(history: list[dict]) -> str | None:
    """What a model API would refuse in a model input, or None: every assistant message
    with tool calls must be followed at once by exactly its results, in call order, and
    no result may stand anywhere else."""
    i = 0
    while i < len(history):
        item = history[i]
        if item["type"] == "tool_result":
            return f"item {i}: a tool result ({item['call_id']}) that does not follow its call"
        calls = [c["id"] for c in item.get("tool_calls") or []] if item["type"] == "assistant" else []
        following = history[i + 1 : i + 1 + len(calls)]
        found = [r.get("call_id") if r["type"] == "tool_result" else r["type"] for r in following]
        if found != calls:
            return f"item {i}: the calls {calls} are followed by {found}"
        i += 1 + len(calls)
    return None


def replay(log, twice: bool = False) -> Engine:
    engine = Engine(":memory:", durable=False)
    for index, data in log:
        engine.apply(index, data)
        if twice:
            assert engine.apply(index, data).code == "already_applied"
    return engine


PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@PROPERTY
@given(st.data())
def test_random_logs_keep_every_invariant_and_replay_identically(data):
    leader = RandomLeader(data)
    for _ in range(data.draw(st.integers(min_value=5, max_value=100))):
        leader.step()
        check_invariants(leader.d.engine)
    log, final = leader.d.log, leader.d.engine.logical_dump()
    # Two stores fed the same log end identical; applying every entry twice changes nothing.
    assert replay(log).logical_dump() == final
    assert replay(log, twice=True).logical_dump() == final
    # Snapshot + restore + the rest of the log equals the whole log.
    cut = data.draw(st.integers(min_value=0, max_value=len(log)))
    head = replay(log[:cut])
    restored = Engine(":memory:", durable=False)
    restored.restore(head.snapshot(), head.applied_index())
    for index, data_ in log[cut:]:
        restored.apply(index, data_)
    assert restored.logical_dump() == final


class CheckingDriver(Driver):
    """Checks, around every entry, that a refused one changed nothing but the index."""

    rejected = 0

    def apply_raw(self, data: bytes):
        before = self.engine.logical_dump(include_applied_index=False)
        result = super().apply_raw(data)
        if not result.ok:
            self.rejected += 1
            assert result.code and result.reason and result.http_status >= 400
            assert self.engine.logical_dump(include_applied_index=False) == before, result
        return result


@PROPERTY
@given(st.data())
def test_rejected_commands_change_nothing_but_the_index(data):
    leader = RandomLeader(data, CheckingDriver)
    for _ in range(data.draw(st.integers(min_value=5, max_value=40))):
        leader.step()
    leader.do_garbage()
    assert leader.d.rejected > 0


def test_sqlite_json_functions_are_available():
    assert sqlite3.connect(":memory:").execute("SELECT json_extract('{\"a\":1}', '$.a')").fetchone()[0] == 1
