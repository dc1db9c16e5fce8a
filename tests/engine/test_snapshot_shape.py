"""The snapshot the engine builds has exactly the keys of its TypedDicts in
dex_ha.session_protocol (SessionSnapshot and the views it holds), which the Client SDK reads
too: a key added, dropped or renamed on one side only fails here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

from dex_ha.session_protocol import (
    AttemptView,
    CurrentTurnView,
    PendingApprovalView,
    PendingQuestionView,
    PendingTimerView,
    SessionSnapshot,
    StepView,
    SummaryView,
    ToolCallView,
    TurnView,
    WaitingMessageView,
)
from tests.engine.driver import Driver


def keys_of(view: type[Any]) -> set[str]:
    return set(get_type_hints(view))


def views(snap: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], type[Any]]]:
    """Every object of the snapshot with the TypedDict it should have the keys of."""
    yield "snapshot", snap, SessionSnapshot
    turns: list[tuple[str, dict[str, Any], type[Any]]] = []
    if snap["current_turn"]:
        turns.append(("current_turn", snap["current_turn"], CurrentTurnView))
    turns += [(f"turns[{i}]", turn, TurnView) for i, turn in enumerate(snap["turns"])]
    calls = [(f"tool_calls[{i}]", call, ToolCallView) for i, call in enumerate(snap["tool_calls"])]
    yield from turns + calls
    for where, holder, _ in turns + calls:
        for i, step in enumerate(holder["steps"]):
            yield f"{where}.steps[{i}]", step, StepView
            for j, attempt in enumerate(step["attempts"]):
                yield f"{where}.steps[{i}].attempts[{j}]", attempt, AttemptView
    for name, view in (
        ("pending_approvals", PendingApprovalView),
        ("pending_questions", PendingQuestionView),
        ("pending_timers", PendingTimerView),
        ("waiting_messages", WaitingMessageView),
    ):
        for i, item in enumerate(snap[name]):
            yield f"{name}[{i}]", item, view
    if snap["summary"] is not None:
        yield "summary", snap["summary"], SummaryView


def test_the_snapshot_has_the_keys_of_its_types(tmp_path: Path) -> None:
    d = Driver(str(tmp_path / "engine.db"))
    try:
        d.register()
        d.create()
        d.send("go")
        calls: list[tuple[str, str, dict[str, Any]]] = [
            ("a", "wire_money", {"amount": 10}),
            ("q", "ask_user", {"question": "name?"}),
            ("l", "lookup", {}),
        ]
        d.run_model("", calls)
        d.send("and then", mode="queue")  # waits for the turn to end
        d.fail(d.hand_out("CallTool"), "boom", retryable=True)  # a backoff timer
        snap: dict[str, Any] = dict(d.engine.get_agent_snapshot("s1") or {})
        seen = set()
        for where, value, view in views(snap):
            assert set(value) == keys_of(view), (where, set(value) ^ keys_of(view))
            seen.add(view)
        assert seen == {
            SessionSnapshot,
            CurrentTurnView,
            TurnView,
            ToolCallView,
            StepView,
            AttemptView,
            PendingApprovalView,
            PendingQuestionView,
            PendingTimerView,
            WaitingMessageView,
        }
    finally:
        d.engine.close()
