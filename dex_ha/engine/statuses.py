"""The statuses of sessions, messages, turns, steps, attempts, tool calls, approvals,
questions and timers, as the state machine stores them; and the other closed sets of words
a row stores (timer purposes, attempt progress) or a Worker reports (a tool result's status).

Each is a StrEnum: a member is its string (`StepStatus.QUEUED == "queued"`), so it
serialises, binds into SQL and compares with a stored row exactly as the bare string did;
the API and the stored state are unchanged. SQL text keeps its literals ('queued'): a partial
index of the schema (`WHERE status = 'queued'`) serves a query that binds its status as a
parameter only by re-preparing the statement at each bind, on the hottest paths.

Each enum's values are exactly the set its table's column documents in the schema, and no
engine module spells one of them as a bare string outside SQL (tests/engine/test_statuses.py
checks both).
"""

from __future__ import annotations

import enum


class SessionStatus(enum.StrEnum):
    IDLE = "idle"  # no turn: the next message starts one
    RUNNING = "running"  # a turn is running


class MessageStatus(enum.StrEnum):
    WAITING = "waiting"  # queued for a later turn
    DELIVERED = "delivered"  # in the history: a turn took it


class StepStatus(enum.StrEnum):
    QUEUED = "queued"  # a task step waiting for a Worker
    RUNNING = "running"  # an attempt is handed out
    BACKOFF = "backoff"  # between two attempts: a timer requeues it
    WAITING = "waiting"  # a wait step, until an event ends it
    DONE = "done"
    FAILED = "failed"  # exhausted: its kind's on_exhaustion followed
    CANCELLED = "cancelled"  # its turn was cancelled


# A step that may still change: cancelling its turn stops it.
OPEN_STEP_STATUSES = (StepStatus.QUEUED, StepStatus.RUNNING, StepStatus.BACKOFF, StepStatus.WAITING)


class CallStatus(enum.StrEnum):
    PENDING = "pending"  # no outcome yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"  # the tool may have run; it will not run again


# A call records exactly one of these, once.
FINAL_CALL_STATUSES = (CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.OUTCOME_UNKNOWN)


class TurnStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ToolResultStatus(enum.StrEnum):
    """The `status` of a tool's result, as a Worker reports it (docs/worker-protocol.md): a
    CallTool result is ok, error, question or task; a PollToolTask result is pending, ok or
    error; an inline tool's result (inside a RunModel response) is ok or error."""

    OK = "ok"
    ERROR = "error"
    QUESTION = "question"  # the tool asks the user; its answer resumes the tool
    TASK = "task"  # the tool started a long-running task: PollToolTask steps follow
    PENDING = "pending"  # the long-running task is still running: poll again later


class AttemptStatus(enum.StrEnum):
    RUNNING = "running"  # handed out to a Worker
    COMPLETED = "completed"  # its result committed
    FAILED = "failed"  # reported failed, timed out, or lost with its Worker


class AttemptProgress(enum.StrEnum):
    """How far a failed attempt (and a tool call that did not succeed) got."""

    NOT_STARTED = "NOT_STARTED"  # the tool never ran: running it later cannot repeat an effect
    NOT_COMPLETED = "NOT_COMPLETED"  # the tool may have run


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CANCELLED = "cancelled"  # its turn was cancelled before a decision


class QuestionStatus(enum.StrEnum):
    PENDING = "pending"
    ANSWERED = "answered"
    CANCELLED = "cancelled"  # its turn was cancelled before an answer


class TimerStatus(enum.StrEnum):
    PENDING = "pending"
    FIRED = "fired"  # fires once
    CANCELLED = "cancelled"  # its step ended (or started in time) before it was due


class TimerPurpose(enum.StrEnum):
    """What a timer does when it fires (outcomes.fire_timer)."""

    BACKOFF = "backoff"  # requeue a task step for its next attempt
    SLEEP = "sleep"  # end the sleep tool's wait
    POLL = "poll"  # queue the next poll of a long-running tool task
    RETRY_WINDOW = "retry_window"  # a kind's retry window ends while a retry waits for a Worker
