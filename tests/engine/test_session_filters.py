"""list_sessions' operator filters: sessions waiting for an approval, sessions with an
outcome_unknown tool call, and the counts each row carries (the web console's list)."""

from __future__ import annotations

import pytest

from dex_ha.server.api_spec import ROUTES_BY_NAME
from dex_ha.server.validation import InvalidRequest, validate_query
from tests.engine.driver import Driver


@pytest.fixture
def d(tmp_path):
    driver = Driver(str(tmp_path / "engine.db"))
    driver.register()
    yield driver
    driver.engine.close()


def _ids(rows: list[dict]) -> list[str]:
    return [row["session_id"] for row in rows]


def _sessions_in_three_states(d: Driver) -> None:
    """s1: waits for approval of wire_money; s2: a write whose Worker died (outcome_unknown);
    s3: idle, nothing to act on."""
    for sid in ("s1", "s2", "s3"):
        d.create(sid)
    d.send("pay", session_id="s1")
    d.run_model("", [("pay", "wire_money", {"cents": 5})])
    _lose_a_write(d, "s2")


def _lose_a_write(d: Driver, session_id: str) -> None:
    """The session's send_email call is outcome_unknown (its Worker died), and the turn
    then ends: the model answers the tool result."""
    d.send("mail", session_id=session_id)
    d.run_model("", [(f"mail-{session_id}", "send_email", {})])
    d.worker_kill(d.hand_out(call_id=f"mail-{session_id}"))
    d.run_model("the mail may or may not have gone out")


def test_filters_pick_sessions_waiting_for_approval_or_with_outcome_unknown(d):
    _sessions_in_three_states(d)
    assert d.call("mail-s2", "s2")["status"] == "outcome_unknown"
    assert _ids(d.engine.sessions_page(awaiting_approval=True).items) == ["s1"]
    assert _ids(d.engine.sessions_page(outcome_unknown=True).items) == ["s2"]
    assert _ids(d.engine.sessions_page(awaiting_approval=False, outcome_unknown=False).items) == ["s3"]
    assert _ids(d.engine.sessions_page(awaiting_approval=True, outcome_unknown=True).items) == []
    counts = {
        row["session_id"]: (row["pending_approvals"], row["outcome_unknown_calls"])
        for row in d.engine.sessions_page().items
    }
    assert counts == {"s1": (1, 0), "s2": (0, 1), "s3": (0, 0)}


def test_a_session_leaves_the_filters_once_the_operator_acted(d):
    _sessions_in_three_states(d)
    assert d.approve("pay", session_id="s1").ok
    assert d.reconcile("mail-s2", "succeeded", session_id="s2").ok
    assert d.engine.sessions_page(awaiting_approval=True).items == []
    assert d.engine.sessions_page(outcome_unknown=True).items == []


def test_filters_combine_with_the_cursor(d):
    _sessions_in_three_states(d)
    d.create("s4")
    _lose_a_write(d, "s4")
    first = d.engine.sessions_page(limit=1, outcome_unknown=True).items
    second = d.engine.sessions_page(limit=1, after=first[-1]["session_id"], outcome_unknown=True).items
    assert _ids(first) + _ids(second) == ["s2", "s4"]


def test_the_route_takes_the_filters_as_booleans():
    route = ROUTES_BY_NAME["list_sessions"]
    args = validate_query(route, {"awaiting_approval": "true", "outcome_unknown": "false"})
    assert (args["awaiting_approval"], args["outcome_unknown"]) == (True, False)
    assert validate_query(route, {}).get("outcome_unknown") is None
    with pytest.raises(InvalidRequest, match="outcome_unknown"):
        validate_query(route, {"outcome_unknown": "yes"})


def test_the_snapshot_lists_every_turns_steps_and_attempts(d):
    """The console's timeline: turn → step → attempt, for past turns too, not only the current one."""
    _sessions_in_three_states(d)
    [turn] = d.snap("s2")["turns"]
    assert turn["status"] == "completed"
    kinds = [step["kind"] for step in turn["steps"]]
    assert kinds.count("RunModel") == 2 and len(kinds) == 3
    call_step = next(step for step in turn["steps"] if step["call_id"] == "mail-s2")
    assert call_step["turn_id"] == turn["turn_id"]
    [attempt] = call_step["attempts"]
    assert attempt["status"] == "failed" and attempt["idempotency_key"] == "s2:mail-s2"
    assert d.snap("s3")["turns"] == []
