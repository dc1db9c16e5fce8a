"""The HTTP answers the server builds from the engine's typed results (ApplyResult[V]):
exactly the JSON text they were when the results were dicts, key order included, and the
typing of a proposal: each command's handler returns the value its Proposal names."""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from dex_ha.engine import ApplyResult, Proposal
from dex_ha.engine.handlers import HANDLERS, Handled
from dex_ha.engine.results import (
    AgentRegistered,
    ApprovalDecided,
    MessageSent,
    QuestionAnswered,
    SessionDeleted,
    ToolCallReconciled,
    TurnCancelled,
)
from dex_ha.server import app
from dex_ha.server.auth import Caller

Route = Callable[[Any, dict[str, Any], Any], Awaitable[Any]]

ARGS: dict[str, Any] = {
    "session_id": "s1",
    "namespace": "default",
    "text": "hi",
    "message_id": "m1",
    "mode": "queue",
    "call_id": "c1",
    "approved": True,
    "question_id": "q1",
    "answer": "blue",
    "outcome": "succeeded",
    "name": "helper",
    "tools": [],
    app.CALLER: Caller(role="admin", namespaces=None),
}

# (route, the value its command returns, noop, the answer's JSON as the dict-valued results gave it)
ANSWERS: list[tuple[Route, object, bool, str]] = [
    (
        app.send_message,
        MessageSent("m1", duplicate=False),
        False,
        '{"session_id":"s1","message_id":"m1","duplicate":false}',
    ),
    (app.decide_approval, ApprovalDecided("c1", approved=True), False, '{"call_id":"c1","approved":true,"noop":false}'),
    (app.answer_question, QuestionAnswered("q1"), True, '{"question_id":"q1","noop":true}'),
    (app.cancel_turn, TurnCancelled("t1"), False, '{"session_id":"s1","cancelled":"t1"}'),
    (app.cancel_turn, TurnCancelled(None), True, '{"session_id":"s1","cancelled":null}'),
    (app.delete_session, SessionDeleted("s1"), False, '{"session_id":"s1","deleted":true}'),
    (
        app.reconcile_tool_call,
        ToolCallReconciled("c1", "succeeded"),
        False,
        '{"call_id":"c1","status":"succeeded","noop":false}',
    ),
    (
        app.register_agent,
        AgentRegistered("helper", 2, changed=True, policy_changes=[{"tool": "t", "old": None, "new": {}}]),
        False,
        '{"name":"helper","version":2,"changed":true}',  # the policy changes go to the log only
    ),
    (
        app.register_agent,
        AgentRegistered("helper", 2, changed=False),
        True,
        '{"name":"helper","version":2,"changed":false}',
    ),
]


def fake_api(value: object, noop: bool) -> Any:
    """An Api whose every proposal applies with `value` (the engine's answer for it)."""

    async def propose(cmd: Proposal[Any]) -> ApplyResult[Any]:
        return ApplyResult(index=7, ok=True, value=value, noop=noop)

    return SimpleNamespace(propose=propose, node=SimpleNamespace(clock=SimpleNamespace(now_ms=lambda: 1)))


@pytest.mark.parametrize(
    ("route", "value", "noop", "expected"), ANSWERS, ids=[f"{a[0].__name__}-{i}" for i, a in enumerate(ANSWERS)]
)
async def test_an_answer_is_the_json_the_dict_results_gave(
    route: Route, value: object, noop: bool, expected: str
) -> None:
    status, body = await route(fake_api(value, noop), dict(ARGS), None)
    assert status in (200, 202)
    assert app._stdlib_dumps(body) == expected


def test_each_handler_takes_its_command_and_returns_the_value_its_proposal_names() -> None:
    """What lets `propose` type its result: a command of Proposal[V] gets ApplyResult[V]
    back only if its handler (HANDLERS, keyed by the command's class) returns Handled[V]."""
    for command, handler in HANDLERS.items():
        [proposal] = [base for base in getattr(command, "__orig_bases__", ()) if typing.get_origin(base) is Proposal]
        hints = typing.get_type_hints(handler)
        assert hints["cmd"] is command, f"{handler.__name__} takes a {hints['cmd']}, not a {command.__name__}"
        returned = hints["return"]
        assert typing.get_origin(returned) is Handled, handler.__name__
        named = typing.get_args(proposal)[0]
        assert typing.get_args(returned)[0] is (type(None) if named is None else named), command.__name__
