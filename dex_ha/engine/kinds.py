"""The step-kind table: ONE data structure that drives attempts, retry
windows, backoff timers and what happens when a step's attempts are used up.

Every crash-matrix row maps to an entry of `STEP_KINDS`: a failed attempt of a task step
goes through `retry_decision`, and a step with no attempt left goes through
`spec.on_exhaustion` (and, for tool steps, `tool_outcome_on_exhaustion`). No handler
special-cases a kind by name for these decisions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX

# Contract: the `kind` strings.
RUN_MODEL = "RunModel"
CALL_TOOL = "CallTool"
CALL_SINGLE_ATTEMPT_TOOL = "CallSingleAttemptTool"
AWAIT_TOOL_APPROVAL = "AwaitToolApproval"
AWAIT_QUESTION_ANSWER = "AwaitQuestionAnswer"
AWAIT_TIMER = "AwaitTimer"
POLL_TOOL_TASK = "PollToolTask"
COMPACT_CONTEXT = "CompactContext"
AWAIT_USER_MESSAGE = "AwaitUserMessage"

NOT_STARTED = "NOT_STARTED"
NOT_COMPLETED = "NOT_COMPLETED"

# How long a Worker may stay silent before the leader fails its attempt. The server's
# configuration overrides it; the engine only reports it in the task.
DEFAULT_HEARTBEAT_TIMEOUT_MS = 30_000

# The longest duration the engine takes from its input (timeouts, sleeps, poll delays) or
# computes (backoff): ten years. Deadlines and due times are `at` + a duration, and must
# stay 64-bit integers, or SQLite refuses them (and the command could never apply).
MAX_DURATION_MS = 10 * 365 * 24 * 3600 * 1000


class RunsIn(enum.StrEnum):
    WORKER = "worker"  # a task step: handed out to a Worker as attempts
    SERVER = "server"  # a wait step: lives in the state machine until an event ends it


class OnExhaustion(enum.StrEnum):
    FAIL_TURN = "fail_turn"  # the turn fails (with a note when tools already ran)
    TOOL_OUTCOME = "tool_outcome"  # the call records failed / outcome_unknown by progress
    NEVER = "never"  # wait steps have no attempts to use up


@dataclass(frozen=True, slots=True)
class StepKindSpec:
    kind: str
    runs_in: RunsIn
    max_attempts: int | None  # None for wait steps
    retry_window_ms: int | None  # no retry may start later than first hand-out + window
    backoff_initial_ms: int  # delay before attempt 2; each later delay × backoff_factor
    backoff_factor: int
    start_to_close_ms: int | None  # default, when neither tool policy nor agent sets one
    on_exhaustion: OnExhaustion
    policy_may_override_attempts: bool  # a tool's `max_attempts` replaces max_attempts
    ends_when: str  # for readers: what ends a wait step / what exhaustion means

    @property
    def is_task(self) -> bool:
        return self.runs_in is RunsIn.WORKER


_MINUTE = 60_000

STEP_KINDS: Mapping[str, StepKindSpec] = MappingProxyType({
    s.kind: s for s in [
        StepKindSpec(RUN_MODEL, RunsIn.WORKER, 3, 30 * _MINUTE, 1_000, 2, 10 * _MINUTE,
                     OnExhaustion.FAIL_TURN, False,
                     "turn fails; a note lists the tools that already ran"),
        StepKindSpec(CALL_TOOL, RunsIn.WORKER, 3, None, 1_000, 2, 5 * _MINUTE,
                     OnExhaustion.TOOL_OUTCOME, True,
                     "read: failed; idempotent write: outcome_unknown (failed if NOT_STARTED)"),
        StepKindSpec(CALL_SINGLE_ATTEMPT_TOOL, RunsIn.WORKER, 1, None, 0, 1, 5 * _MINUTE,
                     OnExhaustion.TOOL_OUTCOME, False,
                     "outcome_unknown, never run again (failed if NOT_STARTED)"),
        StepKindSpec(POLL_TOOL_TASK, RunsIn.WORKER, 3, None, 1_000, 2, 1 * _MINUTE,
                     OnExhaustion.TOOL_OUTCOME, False,
                     "per poll; polls go on with the same handle, no second task starts"),
        StepKindSpec(COMPACT_CONTEXT, RunsIn.WORKER, 3, 30 * _MINUTE, 1_000, 2, 10 * _MINUTE,
                     OnExhaustion.FAIL_TURN, False,
                     "turn fails; the next user message compacts again"),
        StepKindSpec(AWAIT_TOOL_APPROVAL, RunsIn.SERVER, None, None, 0, 1, None,
                     OnExhaustion.NEVER, False,
                     "approved: the tool step is queued; denied: the call records failed"),
        StepKindSpec(AWAIT_QUESTION_ANSWER, RunsIn.SERVER, None, None, 0, 1, None,
                     OnExhaustion.NEVER, False,
                     "the answer resumes the turn (ask_user) or the tool that asked"),
        StepKindSpec(AWAIT_TIMER, RunsIn.SERVER, None, None, 0, 1, None,
                     OnExhaustion.NEVER, False,
                     "fires once; a timer due during an outage fires when a node is active"),
        StepKindSpec(AWAIT_USER_MESSAGE, RunsIn.SERVER, None, None, 0, 1, None,
                     OnExhaustion.NEVER, False,
                     "the session is idle; the next message starts a turn"),
    ]
})

TASK_KINDS = frozenset(k for k, s in STEP_KINDS.items() if s.is_task)


def spec_of(kind: str) -> StepKindSpec:
    return STEP_KINDS[kind]


def max_attempts_for(kind: str, policy_max_attempts: int | None) -> int | None:
    spec = STEP_KINDS[kind]
    if spec.policy_may_override_attempts and policy_max_attempts is not None:
        return policy_max_attempts
    return spec.max_attempts


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool
    delay_ms: int = 0  # the backoff timer before the step is queued again
    why_not: str = ""


def retry_decision(kind: str, *, max_attempts: int, attempts_used: int, retryable: bool,
                   first_handout_at: int, at: int) -> RetryDecision:
    """Whether a step whose latest attempt just failed at `at` runs again, and when.

    This decides only whether a retry is worth queueing. A queued retry may still wait
    for a Worker past the window: the hand-out and the `retry_window` timer check
    `retry_window_end` again (steps.py), so no retry ever starts after it."""
    spec = STEP_KINDS[kind]
    if not retryable:
        return RetryDecision(False, why_not="the failure is not retryable")
    if attempts_used >= max_attempts:
        return RetryDecision(False, why_not=f"all {max_attempts} attempts used")
    # A tool policy may allow many attempts: the exponent is capped before it grows huge.
    delay = min(MAX_DURATION_MS, spec.backoff_initial_ms * spec.backoff_factor ** min(attempts_used - 1, 64))
    end = retry_window_end(kind, first_handout_at)
    if end is not None and at + delay > end:
        return RetryDecision(False, why_not=window_closed(kind))
    return RetryDecision(True, delay_ms=delay)


def retry_window_end(kind: str, first_handout_at: int | None) -> int | None:
    """The last moment (ms) a retry of a step of `kind` may start; None: no window."""
    window = STEP_KINDS[kind].retry_window_ms
    if window is None or first_handout_at is None:
        return None
    return first_handout_at + window


def window_closed(kind: str) -> str:
    """Why a step of `kind` runs no more once its retry window is over."""
    return f"no attempt left within {STEP_KINDS[kind].retry_window_ms // _MINUTE} min of the first"


def tool_outcome_on_exhaustion(effect: str, progress: str) -> str:
    """The status a tool call records when its step can run no more."""
    if progress == NOT_STARTED:
        return "failed"
    return "failed" if effect == "read" else "outcome_unknown"


def not_run_error(detail: str) -> str:
    """The error of a call whose tool never reached a Worker (contract prefix first)."""
    return f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: {detail}"


def idempotency_key(session_id: str, call_id: str) -> str:
    """Contract: a tool call's key, the same on every attempt."""
    return f"{session_id}:{call_id}"


def tool_step_kind(effect: str) -> str:
    """A write runs at most once; reads and idempotent writes may be retried."""
    return CALL_SINGLE_ATTEMPT_TOOL if effect == "write" else CALL_TOOL
