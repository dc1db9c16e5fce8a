"""What `Engine.apply` answers, and how a handler refuses a command.

A handler that finds a command it cannot apply raises `Rejected`; the engine rolls the
command's changes back (a SQLite savepoint), keeps only the applied index, and answers an
`ApplyResult` with `ok=False`. The `code` is machine-readable and maps to an HTTP status,
so the server never has to parse `reason`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# code -> HTTP status the API answers with (the error list of docs/api.md).
HTTP_STATUS_BY_CODE: dict[str, int] = {
    "ok": 200,
    "already_applied": 200,  # the same log index again: nothing happens
    "invalid": 400,  # undecodable bytes, a missing or ill-typed field, a bad result
    "forbidden": 403,  # the caller's namespace or role may not do this (the reason says which)
    "not_found": 404,  # unknown session, step, call, question, timer
    "conflict": 409,  # a different decision or answer, a step that is not queued...
    "stale_attempt": 409,  # fencing: the attempt is no longer the current one
    "internal": 500,  # a bug in the engine; deterministic, so every node agrees
}


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of one log entry.

    `value` carries what the proposer needs back (the id of a created session, the
    attempts a StartAttempts handed out, ...). `noop=True` marks an accepted command that
    changed nothing (a repeated message id, decision, answer or timer). `event_sessions`
    are the sessions the entry added events to or deleted: the server wakes only their event
    streams.
    """

    index: int
    ok: bool
    code: str = "ok"
    reason: str = ""
    http_status: int = 200
    value: dict[str, Any] | None = None
    noop: bool = False
    event_sessions: frozenset[str] = field(default=frozenset(), compare=False)


class Rejected(Exception):
    """Raised inside a handler: the command is refused and its changes are rolled back."""

    def __init__(self, code: str, reason: str) -> None:
        assert code in HTTP_STATUS_BY_CODE, code
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason

    def result(self, index: int) -> ApplyResult:
        return ApplyResult(
            index=index, ok=False, code=self.code, reason=self.reason, http_status=HTTP_STATUS_BY_CODE[self.code]
        )


def accepted(
    index: int,
    value: dict[str, Any] | None = None,
    *,
    noop: bool = False,
    event_sessions: frozenset[str] = frozenset(),
) -> ApplyResult:
    return ApplyResult(index=index, ok=True, value=value, noop=noop, event_sessions=event_sessions)
