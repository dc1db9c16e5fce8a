"""The Client SDK's typed session (dex_ha.client.results) reads the fields of the snapshot
the server builds (dex_ha.session_protocol.SessionSnapshot, the engine's return type): a
field misspelt or renamed on either side fails here, not at a user's first read."""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

import pytest

from dex_ha.client import Attempt, PendingApproval, PendingQuestion, Session, Step, ToolCallRecord, Turn
from dex_ha.session_protocol import (
    AttemptView,
    CurrentTurnView,
    PendingApprovalView,
    PendingQuestionView,
    SessionSnapshot,
    StepView,
    ToolCallView,
    TurnView,
)

PAIRS: list[tuple[type[Any], type[Any]]] = [
    (Session, SessionSnapshot),
    (Turn, TurnView),
    (Turn, CurrentTurnView),
    (Step, StepView),
    (Attempt, AttemptView),
    (ToolCallRecord, ToolCallView),
    (PendingApproval, PendingApprovalView),
    (PendingQuestion, PendingQuestionView),
]


@pytest.mark.parametrize(("result", "view"), PAIRS, ids=[f"{r.__name__}-{v.__name__}" for r, v in PAIRS])
def test_every_field_the_client_reads_is_one_the_server_sends(result: type[Any], view: type[Any]) -> None:
    read = {f.name for f in dataclasses.fields(result)} - {"raw"}
    assert read <= set(get_type_hints(view)), sorted(read - set(get_type_hints(view)))
