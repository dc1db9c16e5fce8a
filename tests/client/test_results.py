"""The typed answers of the Client SDK: lenient where safe, strict and named where not."""

from __future__ import annotations

from typing import Any

import pytest

from dex_ha.client import (
    ClusterView,
    DexError,
    MalformedAnswer,
    MessageAccepted,
    Session,
    SessionPage,
)


def snapshot_json() -> dict[str, Any]:
    """An agent snapshot of the shape GET /v1/sessions/{id} answers (dex_ha/engine/queries.py)."""

    def step() -> dict[str, Any]:  # a new one each time: a test changes one place only
        return {
            "step_id": "st-1",
            "turn_id": "t-1",
            "kind": "RunTool",
            "status": "succeeded",
            "call_id": "c-1",
            "attempts_used": 1,
            "max_attempts": 3,
            "error": None,
            "attempts": [dict(attempt)],
        }

    def turn() -> dict[str, Any]:  # the current turn, and again in the list of turns
        return {
            "turn_id": "t-1",
            "number": 1,
            "status": "running",
            "message_id": "m-1",
            "started_at": 5,
            "ended_at": None,
            "error": None,
            "steps": [step()],
        }

    attempt = {
        "number": 1,
        "term": 3,
        "worker_id": "w1",
        "idempotency_key": "k-1",
        "status": "succeeded",
        "started_at": 10,
        "ended_at": 20,
        "error": None,
        "attempt_progress": None,
        "cancel_requested": False,
    }
    return {
        "session_id": "s-1",
        "agent": "shop",
        "status": "running",
        "metadata": {"user": "u1"},
        "created_at": 1,
        "updated_at": 2,
        "waiting_for": None,
        "current_turn": turn(),
        "turns": [turn()],
        "history": [{"seq": 1, "type": "message", "role": "user", "content": "hi"}],
        "summary": None,
        "tool_calls": [
            {
                "call_id": "c-1",
                "turn_id": "t-1",
                "name": "charge",
                "arguments": {"amount": 5},
                "effect": "write",
                "policy": {"approval": True},
                "idempotency_key": "k-1",
                "status": "succeeded",
                "output": {"ok": True},
                "error": None,
                "attempt_progress": None,
                "step_kind": "RunTool",
                "step_status": "succeeded",
                "handle": None,
                "reconciled_at": None,
                "steps": [step()],
            }
        ],
        "pending_approvals": [{"call_id": "c-2", "name": "refund", "arguments": {}, "requested_at": 7}],
        "pending_questions": [
            {"question_id": "q-1", "call_id": None, "source": "model", "question": "which?", "asked_at": 8}
        ],
        "pending_timers": [],
        "waiting_messages": [{"message_id": "m-2", "text": "and then?", "mode": "queue", "at": 9}],
    }


def test_a_session_reads_every_documented_field() -> None:
    session = Session.from_answer(snapshot_json())
    assert (session.session_id, session.agent, session.status, session.metadata) == (
        "s-1",
        "shop",
        "running",
        {"user": "u1"},
    )
    assert session.current_turn is not None and session.current_turn.steps[0].attempts[0].worker_id == "w1"
    assert [t.turn_id for t in session.turns] == ["t-1"]
    call = session.tool_call("c-1")
    assert (call.name, call.effect, call.policy, call.output) == ("charge", "write", {"approval": True}, {"ok": True})
    assert call.steps[0].attempts[0].idempotency_key == "k-1"
    assert [a.call_id for a in session.pending_approvals] == ["c-2"]
    assert [q.question for q in session.pending_questions] == ["which?"]
    assert session.history[0]["content"] == "hi"
    assert not session.is_idle  # running, and a message waits
    with pytest.raises(KeyError):
        session.tool_call("c-9")


def test_a_field_the_sdk_does_not_know_is_kept_in_raw() -> None:
    answer = {**snapshot_json(), "priority": "high"}
    answer["tool_calls"][0]["cost_cents"] = 12
    session = Session.from_answer(answer)
    assert session.raw["priority"] == "high"
    assert session.tool_calls[0].raw["cost_cents"] == 12
    assert session.raw is answer  # the JSON as received, not a copy that could drift


def test_missing_optional_fields_are_none_and_missing_lists_are_empty() -> None:
    session = Session.from_answer({"session_id": "s-1", "agent": "shop", "status": "idle"})
    assert (session.metadata, session.current_turn, session.created_at, session.summary) == (None, None, None, None)
    assert session.turns == () and session.tool_calls == () and session.waiting_messages == ()
    assert session.is_idle


@pytest.mark.parametrize(
    ("change", "field_path"),
    [
        (lambda a: a.pop("status"), "status"),
        (lambda a: a.update(agent=7), "agent"),
        (lambda a: a.update(turns={"t-1": {}}), "turns"),
        (lambda a: a["turns"][0]["steps"][0].update(status=None), "turns[0].steps[0].status"),
        (
            lambda a: a["tool_calls"][0]["steps"][0]["attempts"][0].update(number="1"),
            "tool_calls[0].steps[0].attempts[0].number",
        ),
        (lambda a: a.update(created_at=True), "created_at"),
    ],
)
def test_a_malformed_answer_raises_naming_the_field(change: Any, field_path: str) -> None:
    answer = snapshot_json()
    change(answer)
    with pytest.raises(MalformedAnswer) as caught:
        Session.from_answer(answer)
    assert caught.value.field == field_path
    assert isinstance(caught.value, DexError) and caught.value.code == "malformed_answer"
    assert field_path in str(caught.value) and caught.value.body is answer


def test_an_answer_that_is_not_an_object_is_malformed() -> None:
    with pytest.raises(MalformedAnswer, match="answer: expected a JSON object, got list"):
        Session.from_answer([])


def test_a_page_a_message_and_a_cluster_view() -> None:
    page = SessionPage.from_answer(
        {
            "sessions": [
                {
                    "session_id": "s-1",
                    "agent": "a",
                    "status": "idle",
                    "pending_approvals": 2,
                    "outcome_unknown_calls": 0,
                }
            ],
            "next_after": None,
        }
    )
    assert [(s.session_id, s.pending_approvals, s.outcome_unknown_calls) for s in page.sessions] == [("s-1", 2, 0)]
    assert page.next_after is None
    accepted = MessageAccepted.from_answer({"session_id": "s-1", "message_id": "m-1", "duplicate": True})
    assert (accepted.message_id, accepted.duplicate) == ("m-1", True)
    view = ClusterView.from_answer(
        {
            "node_id": "n1",
            "role": "active",
            "term": 4,
            "leader_id": "n1",
            "members": [{"id": "n2", "voter": False, "url": None, "contacted": False}],
        }
    )
    assert (view.node_id, view.role, view.term, view.commit_index) == ("n1", "active", 4, None)
    assert [(m.id, m.voter, m.contacted) for m in view.members] == [("n2", False, False)]
    with pytest.raises(MalformedAnswer, match=r"members\[0\]\.id"):
        ClusterView.from_answer({"node_id": "n1", "role": "active", "members": [{"voter": True}]})
