"""What `Engine.apply` answers, and how a handler refuses a command.

A handler that finds a command it cannot apply raises `Rejected`; the engine rolls the
command's changes back (a SQLite savepoint), keeps only the applied index, and answers an
`ApplyResult` with `ok=False`. The `code` is machine-readable and maps to an HTTP status,
so the server never has to parse `reason`.

Typed results. Each command class is a `Proposal[V]`: `V` is the frozen dataclass its
handler returns (below: `SessionCreated`, `AttemptsStarted`, ...; `None` for a command
that returns nothing). The engine answers an entry with an `ApplyResult[V]` whose `value`
is that dataclass, and a proposer that is typed with `Propose` gets `ApplyResult[V]` back
for a command of `Proposal[V]`: `(await propose(CreateSession(...))).value` is a
`SessionCreated | None`, with no cast. These results never enter the Raft log (commands
do), so they may change shape freely; the HTTP answers built from them are written out
field by field in the server.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Generic, Never, Protocol, TypeVar

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)

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


class Proposal(Generic[V_co]):
    """The base of every command (commands.py): `V_co` is the type of the value its
    handler returns, so that `propose` can say what a proposer gets back."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class ApplyResult(Generic[V_co]):
    """The outcome of one log entry.

    `value` carries what the proposer needs back (the id of a created session, the
    attempts a StartAttempts handed out, ...): the dataclass of the entry's command (see
    the module docstring); None when it was refused, already applied, or returns nothing.
    `noop=True` marks an accepted command that changed nothing (a repeated message id,
    decision, answer or timer). `event_sessions` are the sessions the entry added events
    to or deleted: the server wakes only their event streams.
    """

    index: int
    ok: bool
    code: str = "ok"
    reason: str = ""
    http_status: int = 200
    value: V_co | None = None
    noop: bool = False
    event_sessions: frozenset[str] = field(default=frozenset(), compare=False)

    def accepted_value(self) -> V_co:
        """The value of an accepted command that returns one; RuntimeError when there is
        none (the entry was applied before, or its command returns nothing)."""
        if self.value is None:
            raise RuntimeError(f"the command applied at index {self.index} returned no value")
        return self.value


class Propose(Protocol):
    """What proposes a command and waits for its result: `ApplyResult[V]` for a command
    of `Proposal[V]` (NodeServer.propose and what it is handed to)."""

    def __call__(self, cmd: Proposal[V], /) -> Awaitable[ApplyResult[V]]: ...


class Rejected(Exception):
    """Raised inside a handler: the command is refused and its changes are rolled back."""

    def __init__(self, code: str, reason: str) -> None:
        assert code in HTTP_STATUS_BY_CODE, code
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason

    def result(self, index: int) -> ApplyResult[Never]:
        return ApplyResult(
            index=index, ok=False, code=self.code, reason=self.reason, http_status=HTTP_STATUS_BY_CODE[self.code]
        )


def accepted(
    index: int,
    value: V | None = None,
    *,
    noop: bool = False,
    event_sessions: frozenset[str] = frozenset(),
) -> ApplyResult[V]:
    return ApplyResult(index=index, ok=True, value=value, noop=noop, event_sessions=event_sessions)


# ---------------------------------------------------------------- the values, by command


@dataclass(frozen=True, slots=True)
class SessionCreated:
    """CreateSession: `created` False when the session existed (a retry or an attach)."""

    session_id: str
    created: bool


@dataclass(frozen=True, slots=True)
class AgentRegistered:
    """RegisterAgent: `policy_changes` (agents.policy_changes), for the server's log only."""

    name: str
    version: int
    changed: bool
    policy_changes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MessageSent:
    """SendMessage: `duplicate` True when the message id was sent before (a no-op)."""

    message_id: str
    duplicate: bool


@dataclass(frozen=True, slots=True)
class TurnCancelled:
    """CancelTurn: the turn cancelled, None when none was running."""

    cancelled: str | None


@dataclass(frozen=True, slots=True)
class SessionDeleted:
    """DeleteSession."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SessionsExpired:
    """ExpireSessions: the sessions deleted (the others had become active, or were gone)."""

    deleted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StartedAttempt:
    """One attempt handed out by an entry, as the leader that proposed it reads it: it
    builds the Worker's task (`Task.from_handout`) and token from this, reading nothing.
    Never sent as it is: it holds the token's secret."""

    step_id: str
    attempt: int
    term: int
    worker_id: str
    session_id: str
    turn_id: str
    agent: str
    kind: str
    idempotency_key: str | None  # "{session_id}:{call_id}" for tool steps
    deadline_at: int | None  # leader wall-clock ms: hand-out + start_to_close
    queued_at: int | None
    token_secret: str | None  # None only for hand-outs written before schema 2
    input: dict[str, Any]  # the task's input, built where the state was warm


@dataclass(frozen=True, slots=True)
class HandoutRefused:
    """A hand-out of a StartAttempts that did not start, and why (a Rejected's code and reason)."""

    step_id: str
    code: str
    reason: str


@dataclass(frozen=True, slots=True)
class AttemptsStarted:
    """StartAttempts, StartQueuedAttempts: the attempts started; for StartAttempts also the
    hand-outs refused and the steps whose retry window was over (they failed instead)."""

    started: tuple[StartedAttempt, ...]
    refused: tuple[HandoutRefused, ...] = ()
    expired: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AttemptCompleted:
    """CompleteAttempt: with eager dispatch, the attempts the same entry handed out."""

    step_id: str
    attempt: int
    started: tuple[StartedAttempt, ...] = ()


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    """FailAttempt, HeartbeatLost, AttemptTimedOut."""

    step_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ReportAnswer:
    """The answer to one report of a ReportResults: HTTP status 200, or a refusal's status,
    code and reason (what POST .../complete or .../fail would have answered)."""

    status: int
    error: str = ""
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        """The ack's fields on the Worker channel: `{"status": 200}`, or the refusal's three."""
        if not self.error:
            return {"status": self.status}
        return {"status": self.status, "error": self.error, "message": self.message}


@dataclass(frozen=True, slots=True)
class ResultsReported:
    """ReportResults: one answer per report, in order, and the attempts the entry handed out."""

    reports: tuple[ReportAnswer, ...]
    started: tuple[StartedAttempt, ...] = ()


@dataclass(frozen=True, slots=True)
class HeldAttemptsFailed:
    """FailHeldAttempts: how many attempts of earlier terms failed, by step kind."""

    failed: int
    by_kind: dict[str, int]


@dataclass(frozen=True, slots=True)
class TimerFired:
    """FireTimer: the timer's status now; `purpose` None when it had fired or was cancelled."""

    timer_id: str
    status: str
    purpose: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalDecided:
    """DecideApproval."""

    call_id: str
    approved: bool


@dataclass(frozen=True, slots=True)
class QuestionAnswered:
    """AnswerQuestion."""

    question_id: str


@dataclass(frozen=True, slots=True)
class ToolCallReconciled:
    """ReconcileToolCall: `status` is the outcome set ("succeeded" or "failed")."""

    call_id: str
    status: str


@dataclass(frozen=True, slots=True)
class ConsistencyAlarmSet:
    """SetConsistencyAlarm: the member's alarm was raised or cleared (replica.py looks for it)."""

    node_id: str
    raised: bool
    index: int


@dataclass(frozen=True, slots=True)
class ClusterVersionSet:
    """SetClusterVersion: the cluster's state-machine version now (replica.py looks for it)."""

    cluster_version: int
