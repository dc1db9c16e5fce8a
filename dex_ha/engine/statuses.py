"""The statuses of steps, tool calls and turns, as the state machine stores them.

Each is a StrEnum: a member is its string (`StepStatus.QUEUED == "queued"`), so it
serialises, binds into SQL and compares with a stored row exactly as the bare string did;
the API and the stored state are unchanged. SQL text keeps its literals ('queued').
"""

from __future__ import annotations

import enum


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
