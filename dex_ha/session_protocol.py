"""The session protocol's types, shared by the engine, the server and the Client SDK.

A session's events (what `GET /v1/sessions/{id}/events` streams) and its snapshot (what
`GET /v1/sessions/{id}` answers). The engine builds both, the server sends them, the Client
SDK reads them: all three use the types below, so a field renamed on one side is a type
error on the others. The contract in plain words is docs/api.md ("Event streams" and
"Event types"). Like dex_ha.worker_protocol (the Worker's side: tasks, reports, channel
frames), this module imports nothing of dex_ha.

- `EventType` lists every event type, and each stored event has a frozen dataclass of its
  data (`TurnStarted`, `AttemptFailed`, ...): the engine emits those, so it cannot emit an
  unknown type or a misspelt field. `delta` events carry what the Worker sent, as it sent it.
- `SessionEvent` is one event as a stream delivers it, on the server and in the SDK alike.
- `SessionSnapshot` and the views it holds are TypedDicts: the snapshot stays plain JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, TypedDict

# ---------------------------------------------------------------- events


class EventType(StrEnum):
    """Every type of session event (the `event:` of the stream and the `type` of its data)."""

    SESSION_CREATED = "session_created"
    MESSAGE_RECEIVED = "message_received"
    MESSAGE_DELIVERED = "message_delivered"
    TURN_STARTED = "turn_started"
    STEP_QUEUED = "step_queued"
    STEP_WAITING = "step_waiting"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_FAILED = "attempt_failed"
    DELTA = "delta"  # live model output; never stored, no id
    ASSISTANT_MESSAGE = "assistant_message"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    QUESTION_ASKED = "question_asked"
    QUESTION_ANSWERED = "question_answered"
    TOOL_TASK_STARTED = "tool_task_started"
    TOOL_CALL_FINISHED = "tool_call_finished"
    TOOL_CALL_RECONCILED = "tool_call_reconciled"
    TIMER_SET = "timer_set"
    TIMER_FIRED = "timer_fired"
    SUMMARY_UPDATED = "summary_updated"
    TURN_COMPLETED = "turn_completed"
    TURN_FAILED = "turn_failed"
    TURN_CANCELLED = "turn_cancelled"
    SESSION_DELETED = "session_deleted"  # the last event of a deleted session's stream; no id


class Event:
    """The data of one event of a known type: a frozen dataclass per type, below."""

    __slots__ = ()
    type: ClassVar[EventType]
    __dataclass_fields__: ClassVar[dict[str, Any]]  # set by @dataclass on each subclass

    def as_json(self) -> dict[str, Any]:
        """The event's `data`: its fields in their order. Shallow on purpose (asdict() would
        deep-copy a model message or a tool's output)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class SessionCreated(Event):
    type = EventType.SESSION_CREATED
    agent: str
    metadata: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class MessageReceived(Event):
    type = EventType.MESSAGE_RECEIVED
    message_id: str
    text: str
    mode: str  # queue | steer


@dataclass(frozen=True, slots=True)
class MessageDelivered(Event):
    """A waiting message joined the history of a turn."""

    type = EventType.MESSAGE_DELIVERED
    message_id: str
    turn_id: str
    mode: str


@dataclass(frozen=True, slots=True)
class TurnStarted(Event):
    type = EventType.TURN_STARTED
    turn_id: str
    number: int
    message_id: str


@dataclass(frozen=True, slots=True)
class StepQueued(Event):
    """A step a Worker runs waits for one."""

    type = EventType.STEP_QUEUED
    step_id: str
    kind: str
    turn_id: str
    call_id: str | None


@dataclass(frozen=True, slots=True)
class StepWaiting(Event):
    """A step that waits for someone else than a Worker (an approval, an answer)."""

    type = EventType.STEP_WAITING
    step_id: str
    kind: str
    turn_id: str
    call_id: str | None


@dataclass(frozen=True, slots=True)
class AttemptStarted(Event):
    type = EventType.ATTEMPT_STARTED
    step_id: str
    kind: str
    attempt: int
    term: int
    worker_id: str
    call_id: str | None


@dataclass(frozen=True, slots=True)
class AttemptFailed(Event):
    """A client drops the deltas of this attempt."""

    type = EventType.ATTEMPT_FAILED
    step_id: str
    kind: str
    attempt: int
    error: str
    attempt_progress: str | None
    call_id: str | None


@dataclass(frozen=True, slots=True)
class AssistantMessage(Event):
    type = EventType.ASSISTANT_MESSAGE
    turn_id: str
    step_id: str
    content: Any
    tool_calls: Any


@dataclass(frozen=True, slots=True)
class ApprovalRequested(Event):
    type = EventType.APPROVAL_REQUESTED
    call_id: str
    name: str
    arguments: Any


@dataclass(frozen=True, slots=True)
class ApprovalDecided(Event):
    type = EventType.APPROVAL_DECIDED
    call_id: str
    approved: bool
    reason: str | None


@dataclass(frozen=True, slots=True)
class QuestionAsked(Event):
    type = EventType.QUESTION_ASKED
    question_id: str
    call_id: str
    source: str
    question: Any


@dataclass(frozen=True, slots=True)
class QuestionAnswered(Event):
    type = EventType.QUESTION_ANSWERED
    question_id: str
    call_id: str
    answer: Any


@dataclass(frozen=True, slots=True)
class ToolTaskStarted(Event):
    """A long-running tool started its task; PollToolTask steps poll it by `handle`."""

    type = EventType.TOOL_TASK_STARTED
    call_id: str
    handle: Any


@dataclass(frozen=True, slots=True)
class ToolCallFinished(Event):
    type = EventType.TOOL_CALL_FINISHED
    call_id: str
    name: str
    status: str
    output: Any
    error: str | None
    attempt_progress: str | None


@dataclass(frozen=True, slots=True)
class ToolCallReconciled(Event):
    type = EventType.TOOL_CALL_RECONCILED
    call_id: str
    outcome: str
    result: Any
    error: str | None


@dataclass(frozen=True, slots=True)
class TimerSet(Event):
    type = EventType.TIMER_SET
    timer_id: str
    step_id: str
    purpose: str
    due_at: int


@dataclass(frozen=True, slots=True)
class TimerFired(Event):
    type = EventType.TIMER_FIRED
    timer_id: str
    step_id: str
    purpose: str


@dataclass(frozen=True, slots=True)
class SummaryUpdated(Event):
    type = EventType.SUMMARY_UPDATED
    turn_id: str
    step_id: str
    upto_seq: int


@dataclass(frozen=True, slots=True)
class TurnCompleted(Event):
    type = EventType.TURN_COMPLETED
    turn_id: str
    error: str | None


@dataclass(frozen=True, slots=True)
class TurnFailed(Event):
    type = EventType.TURN_FAILED
    turn_id: str
    error: str | None


@dataclass(frozen=True, slots=True)
class TurnCancelled(Event):
    type = EventType.TURN_CANCELLED
    turn_id: str
    error: str | None


@dataclass(frozen=True, slots=True)
class SessionDeleted(Event):
    type = EventType.SESSION_DELETED
    session_id: str


# The event that ends a turn, by the turn's final status.
TURN_ENDED: dict[str, type[TurnCompleted | TurnFailed | TurnCancelled]] = {
    "completed": TurnCompleted,
    "failed": TurnFailed,
    "cancelled": TurnCancelled,
}

# The data class of each event type (every type but `delta`, whose data the Worker chose).
EVENT_CLASSES: dict[EventType, type[Event]] = {
    cls.type: cls
    for cls in (
        SessionCreated,
        MessageReceived,
        MessageDelivered,
        TurnStarted,
        StepQueued,
        StepWaiting,
        AttemptStarted,
        AttemptFailed,
        AssistantMessage,
        ApprovalRequested,
        ApprovalDecided,
        QuestionAsked,
        QuestionAnswered,
        ToolTaskStarted,
        ToolCallFinished,
        ToolCallReconciled,
        TimerSet,
        TimerFired,
        SummaryUpdated,
        TurnCompleted,
        TurnFailed,
        TurnCancelled,
        SessionDeleted,
    )
}


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One event of a session's event stream.

    Committed events have an ``id`` (resume after it with ``events(after=id)``) and
    ``at`` (the leader's wall clock, ms). Live ``delta`` events (model output while a
    step runs) have id None, are never replayed, and carry ``step_id`` and ``attempt``
    so that a client can drop the deltas of an attempt that failed; their ``data`` is
    what the Worker sent. Committed events about one attempt (``attempt_started``,
    ``attempt_failed``) carry ``step_id`` and ``attempt`` too (also in ``data``), so
    they can be matched with the deltas: see :class:`~dex_ha.client.StreamText`.
    ``type`` is a string: a newer server may send a type this SDK does not know
    (compare with :class:`EventType`, a ``StrEnum``).
    """

    id: str | None
    type: str
    data: dict[str, Any]
    at: int | None
    step_id: str | None = None
    attempt: int | None = None

    @classmethod
    def committed(cls, event_id: str, type_: str, data: dict[str, Any], at: int | None) -> SessionEvent:
        """A committed event; `step_id` and `attempt` are taken from its data when it names both."""
        step_id, attempt = data.get("step_id"), data.get("attempt")
        names_attempt = isinstance(step_id, str) and isinstance(attempt, int) and not isinstance(attempt, bool)
        return cls(
            event_id,
            type_,
            data,
            at,
            step_id if names_attempt else None,
            attempt if names_attempt else None,
        )

    @property
    def event_id(self) -> int:
        """A committed event's id as the number it is (the server's resume cursor)."""
        if self.id is None:
            raise ValueError(f"a {self.type} event has no id")
        return int(self.id)

    @property
    def committed_at(self) -> int:
        """A committed event's `at` (every committed event has one)."""
        if self.at is None:
            raise ValueError(f"a {self.type} event has no time")
        return self.at

    def as_json(self) -> dict[str, Any]:
        """The `data:` line of a committed event on the stream."""
        return {"id": self.id, "type": self.type, "at": self.at, "data": self.data}

    @classmethod
    def from_json(cls, event_id: str | None, sse_event: str, payload: dict[str, Any]) -> SessionEvent:
        """An event as a stream delivered it: its SSE id and `event:` name, and its JSON data."""
        data = payload.get("data")
        data = data if isinstance(data, dict) else {} if data is None else {"value": data}
        at = payload.get("at")
        at = at if isinstance(at, int) else None
        type_ = str(payload.get("type") or sse_event)
        if event_id is not None:
            return cls.committed(event_id, type_, data, at)
        attempt = payload.get("attempt")  # a live delta names its step and attempt beside its data
        return cls(None, type_, data, at, payload.get("step_id"), attempt if isinstance(attempt, int) else None)


# ---------------------------------------------------------------- the session snapshot


class AttemptView(TypedDict):
    number: int
    term: int
    worker_id: str
    idempotency_key: str | None
    status: str
    started_at: int
    ended_at: int | None
    error: str | None
    attempt_progress: str | None
    cancel_requested: bool


class StepView(TypedDict):
    step_id: str
    turn_id: str
    kind: str
    status: str
    call_id: str | None
    attempts_used: int
    max_attempts: int | None
    error: str | None
    attempts: list[AttemptView]


class TurnView(TypedDict):
    """A turn of `turns`: the work one user message started, with its steps."""

    turn_id: str
    number: int
    status: str
    message_id: str
    started_at: int
    ended_at: int | None
    error: str | None
    steps: list[StepView]


class CurrentTurnView(TurnView):
    """`current_turn`: a turn with every column the server stores of it."""

    session_id: str
    first_seq: int  # the history seq of the message that started it


class SummaryView(TypedDict):
    text: str
    upto_seq: int
    at: int


class ToolCallView(TypedDict):
    call_id: str
    turn_id: str | None
    name: str
    arguments: Any
    effect: str | None
    policy: dict[str, Any] | None
    idempotency_key: str
    status: str
    output: Any
    error: str | None
    attempt_progress: str | None
    step_kind: str | None
    step_status: str | None
    handle: Any
    reconciled_at: int | None
    steps: list[StepView]


class PendingApprovalView(TypedDict):
    call_id: str
    name: str
    arguments: Any
    requested_at: int


class PendingQuestionView(TypedDict):
    question_id: str
    call_id: str
    source: str
    question: Any
    asked_at: int


class PendingTimerView(TypedDict):
    timer_id: str
    step_id: str
    purpose: str
    due_at: int


class WaitingMessageView(TypedDict):
    message_id: str
    text: str
    mode: str
    at: int


class SessionSnapshot(TypedDict):
    """Everything a client sees of a session: the answer of `GET /v1/sessions/{id}`.
    `history` items are the model's conversation (each with its `seq`)."""

    session_id: str
    namespace: str
    agent: str
    status: str
    metadata: dict[str, Any] | None
    created_at: int
    updated_at: int
    current_turn: CurrentTurnView | None
    waiting_for: str | None
    turns: list[TurnView]
    history: list[dict[str, Any]]
    summary: SummaryView | None
    tool_calls: list[ToolCallView]
    pending_approvals: list[PendingApprovalView]
    pending_questions: list[PendingQuestionView]
    pending_timers: list[PendingTimerView]
    waiting_messages: list[WaitingMessageView]
