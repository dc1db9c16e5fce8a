"""Bad commands are refused with a code, an HTTP status and a reason, and change nothing
but the applied index."""

from __future__ import annotations

import msgpack
import pytest

from dex_ha.engine import (
    AnswerQuestion,
    AttemptTimedOut,
    CancelTurn,
    CompleteAttempt,
    CreateSession,
    DecideApproval,
    FailAttempt,
    FireTimer,
    Handout,
    HeartbeatLost,
    ReconcileToolCall,
    RegisterAgent,
    SendMessage,
    StartAttempts,
    encode_command,
)
from tests.engine.driver import Driver

AT = 1_700_000_000_000


def prepared(tmp_path) -> Driver:
    """A session with a bit of everything: a running attempt, a queued step, waits."""
    d = Driver(str(tmp_path / "engine.db"))
    d.register()
    d.create()
    d.send("go")
    d.run_model(
        "",
        [
            ("run", "lookup", {}),
            ("q", "put_item", {}),
            ("appr", "wire_money", {}),
            ("ask", "ask_user", {"question": "?"}),
            ("z", "sleep", {"ms": 10_000}),
        ],
    )
    d.hand_out(call_id="run")
    d.ok(RegisterAgent(at=d.at, name="other", definition={"tools": []}))
    return d


def running_step(d: Driver) -> str:
    return d.engine.running_attempts()[0].step_id


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# (name, make(driver) -> bytes, expected code)
BAD = [
    ("garbage bytes", lambda d: b"\xc1\xff", "invalid"),
    ("not a list", lambda d: raw({"a": 1}), "invalid"),
    ("version 0", lambda d: raw([0, "CreateSession", {"at": 1, "agent": "x"}]), "invalid"),
    ("missing field", lambda d: raw([1, "SendMessage", {"at": 1, "session_id": "s1"}]), "invalid"),
    ("ill-typed field", lambda d: raw([1, "FireTimer", {"at": "now", "timer_id": "t"}]), "invalid"),
    (
        "bytes in a result",
        lambda d: raw(
            [1, "CompleteAttempt", {"at": 1, "step_id": "x", "attempt": 1, "term": 1, "result": {"b": b"\x00"}}]
        ),
        "invalid",
    ),
    (
        "bad mode",
        lambda d: raw([1, "SendMessage", {"at": 1, "session_id": "s1", "text": "x", "mode": "shout"}]),
        "invalid",
    ),
    (
        "message to unknown session",
        lambda d: encode_command(SendMessage(at=AT, session_id="nope", text="x")),
        "not_found",
    ),
    ("empty message", lambda d: encode_command(SendMessage(at=AT, session_id="s1", text="")), "invalid"),
    (
        "session of another agent",
        lambda d: encode_command(CreateSession(at=AT, session_id="s1", agent="other")),
        "conflict",
    ),
    ("empty session id", lambda d: encode_command(CreateSession(at=AT, session_id="", agent="x")), "invalid"),
    (
        "invalid agent effect",
        lambda d: encode_command(
            RegisterAgent(at=AT, name="a", definition={"tools": [{"name": "t", "effect": "delete"}]})
        ),
        "invalid",
    ),
    (
        "agent redefines a built-in",
        lambda d: encode_command(
            RegisterAgent(at=AT, name="a", definition={"tools": [{"name": "sleep", "effect": "read"}]})
        ),
        "invalid",
    ),
    (
        "agent unknown field",
        lambda d: encode_command(
            RegisterAgent(at=AT, name="a", definition={"tools": [], "compaction": {"max_itemz": 3}})
        ),
        "invalid",
    ),
    ("cancel unknown session", lambda d: encode_command(CancelTurn(at=AT, session_id="nope")), "not_found"),
    ("empty hand-out", lambda d: encode_command(StartAttempts(at=AT, handouts=[])), "invalid"),
    (
        "hand out a running step",
        lambda d: encode_command(
            StartAttempts(at=AT, handouts=[Handout(step_id=running_step(d), worker_id="w", term=1)])
        ),
        "conflict",
    ),
    (
        "hand out an unknown step",
        lambda d: encode_command(StartAttempts(at=AT, handouts=[Handout(step_id="st0", worker_id="w", term=1)])),
        "not_found",
    ),
    (
        "complete with a wrong term",
        lambda d: encode_command(
            CompleteAttempt(at=AT, step_id=running_step(d), attempt=1, term=7, result={"status": "ok"})
        ),
        "stale_attempt",
    ),
    (
        "complete a never handed-out attempt",
        lambda d: encode_command(
            CompleteAttempt(at=AT, step_id=running_step(d), attempt=2, term=1, result={"status": "ok"})
        ),
        "stale_attempt",
    ),
    (
        "complete an unknown step",
        lambda d: encode_command(CompleteAttempt(at=AT, step_id="st0", attempt=1, term=1, result={})),
        "not_found",
    ),
    (
        "complete with a bad tool result",
        lambda d: encode_command(
            CompleteAttempt(at=AT, step_id=running_step(d), attempt=1, term=1, result={"status": "maybe"})
        ),
        "invalid",
    ),
    (
        "fail with a wrong attempt",
        lambda d: encode_command(FailAttempt(at=AT, step_id=running_step(d), attempt=3, term=1, error="x")),
        "stale_attempt",
    ),
    (
        "heartbeat lost, wrong term",
        lambda d: encode_command(HeartbeatLost(at=AT, step_id=running_step(d), attempt=1, term=0)),
        "stale_attempt",
    ),
    (
        "timed out, unknown step",
        lambda d: encode_command(AttemptTimedOut(at=AT, step_id="st0", attempt=1, term=1)),
        "not_found",
    ),
    ("fire an unknown timer", lambda d: encode_command(FireTimer(at=AT, timer_id="tm0")), "not_found"),
    (
        "fire a timer early",
        lambda d: encode_command(FireTimer(at=AT, timer_id=d.engine.next_timer().timer_id)),
        "conflict",
    ),
    (
        "approve a call without approval",
        lambda d: encode_command(DecideApproval(at=AT, session_id="s1", call_id="run", approved=True)),
        "not_found",
    ),
    (
        "approve in an unknown session",
        lambda d: encode_command(DecideApproval(at=AT, session_id="nope", call_id="appr", approved=True)),
        "not_found",
    ),
    (
        "answer an unknown question",
        lambda d: encode_command(AnswerQuestion(at=AT, session_id="s1", question_id="q0", answer=1)),
        "not_found",
    ),
    (
        "answer in another session",
        lambda d: encode_command(
            AnswerQuestion(
                at=AT, session_id="s2", question_id=d.snap()["pending_questions"][0]["question_id"], answer=1
            )
        ),
        "not_found",
    ),
    (
        "reconcile a pending call",
        lambda d: encode_command(ReconcileToolCall(at=AT, session_id="s1", call_id="q", outcome="succeeded")),
        "conflict",
    ),
    (
        "reconcile with a bad outcome",
        lambda d: raw([1, "ReconcileToolCall", {"at": 1, "session_id": "s1", "call_id": "q", "outcome": "maybe"}]),
        "invalid",
    ),
]

HTTP = {"invalid": 400, "not_found": 404, "conflict": 409, "stale_attempt": 409}


@pytest.mark.parametrize("name,make,code", BAD, ids=[b[0] for b in BAD])
def test_bad_command_is_refused_and_changes_nothing(tmp_path, name, make, code):
    d = prepared(tmp_path)
    d.create("s2")
    data = make(d)
    before = d.engine.logical_dump(include_applied_index=False)
    result = d.engine.apply(d.index + 1, data)
    assert (result.ok, result.code, result.http_status) == (False, code, HTTP[code]), result
    assert result.reason
    assert d.engine.logical_dump(include_applied_index=False) == before
    assert d.engine.applied_index() == d.index + 1
