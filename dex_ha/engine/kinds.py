"""The step-kind table: ONE data structure that drives attempts, retry
windows, backoff timers and what happens when a step's attempts are used up.

Every crash-matrix row maps to an entry of `STEP_KINDS` (its `rows`), or to
`CROSS_KIND_ROWS` when it is about any step: a failed attempt of a task step
goes through `retry_decision`, and a step with no attempt left goes through
`spec.on_exhaustion` (and, for tool steps, `tool_outcome_on_exhaustion`). No handler
special-cases a kind by name for these decisions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dex_ha import TOOL_CALL_NOT_RUN_ERROR_PREFIX
from dex_ha.engine.statuses import AttemptProgress, CallStatus


class StepKind(enum.StrEnum):
    """Contract: the `kind` strings. A member is its string, as stored in `steps.kind` and
    sent to Workers and clients, so a stored kind finds its `STEP_KINDS` entry as it is."""

    RUN_MODEL = "RunModel"
    CALL_TOOL = "CallTool"
    CALL_SINGLE_ATTEMPT_TOOL = "CallSingleAttemptTool"
    AWAIT_TOOL_APPROVAL = "AwaitToolApproval"
    AWAIT_QUESTION_ANSWER = "AwaitQuestionAnswer"
    AWAIT_TIMER = "AwaitTimer"
    POLL_TOOL_TASK = "PollToolTask"
    COMPACT_CONTEXT = "CompactContext"
    AWAIT_USER_MESSAGE = "AwaitUserMessage"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class StepKindSpec:
    """How the engine runs the steps of one kind: retries, timeouts, and what exhaustion means."""

    kind: StepKind
    """The contract's `kind` string."""
    runs_in: RunsIn
    """WORKER: a task step, handed out as attempts; SERVER: a wait step that an event ends."""
    max_attempts: int | None
    """How many attempts a task step may use before it is exhausted; None for wait steps."""
    retry_window_ms: int | None
    """No retry may start later than the first hand-out + this window; None: no window."""
    backoff_initial_ms: int
    """The delay before attempt 2; each later delay is the previous one × `backoff_factor`."""
    backoff_factor: int
    """What each backoff delay is multiplied by for the next one (1: a constant delay)."""
    start_to_close_ms: int | None
    """An attempt's timeout when neither the tool's policy nor the agent sets one; None for waits."""
    on_exhaustion: OnExhaustion
    """What follows once the step can run no more (applied by `outcomes.follow_exhaustion`)."""
    policy_may_override_attempts: bool
    """Whether a tool policy's `max_attempts` replaces `max_attempts`."""
    ends_when: str
    """For readers: what ends a wait step, or what exhaustion means for a task step."""
    rows: tuple[str, ...]
    """The crash-matrix rows (docs/crash-matrix.md) this kind's behaviour decides."""

    @property
    def is_task(self) -> bool:
        return self.runs_in is RunsIn.WORKER


MINUTE = 60_000


def _model_call_step(kind: StepKind, *, ends_when: str, rows: tuple[str, ...]) -> StepKindSpec:
    """A step that asks the model (a turn's call, or the summary that compacts its
    context): a few attempts within a window, and the turn fails once they are used up."""
    return StepKindSpec(
        kind=kind,
        runs_in=RunsIn.WORKER,
        max_attempts=3,
        retry_window_ms=30 * MINUTE,
        backoff_initial_ms=1_000,
        backoff_factor=2,
        start_to_close_ms=10 * MINUTE,
        on_exhaustion=OnExhaustion.FAIL_TURN,
        policy_may_override_attempts=False,
        ends_when=ends_when,
        rows=rows,
    )


def _wait_step(kind: StepKind, *, ends_when: str, rows: tuple[str, ...]) -> StepKindSpec:
    """A wait step: it lives in the state machine until an event ends it, so it has no
    attempts, no timeout and nothing to use up."""
    return StepKindSpec(
        kind=kind,
        runs_in=RunsIn.SERVER,
        max_attempts=None,
        retry_window_ms=None,
        backoff_initial_ms=0,
        backoff_factor=1,
        start_to_close_ms=None,
        on_exhaustion=OnExhaustion.NEVER,
        policy_may_override_attempts=False,
        ends_when=ends_when,
        rows=rows,
    )


# Keyed by the StepKind members; typed by str, as a kind read from a row is a plain string.
STEP_KINDS: Mapping[str, StepKindSpec] = MappingProxyType(
    {
        s.kind: s
        for s in [
            _model_call_step(
                StepKind.RUN_MODEL,
                ends_when="turn fails; a note lists the tools that already ran",
                # R20, R21: inline tools and a Claude Agent SDK segment run inside RunModel.
                rows=("R01", "R02", "R20", "R21"),
            ),
            StepKindSpec(
                kind=StepKind.CALL_TOOL,
                runs_in=RunsIn.WORKER,
                max_attempts=3,
                retry_window_ms=None,
                backoff_initial_ms=1_000,
                backoff_factor=2,
                start_to_close_ms=5 * MINUTE,
                on_exhaustion=OnExhaustion.TOOL_OUTCOME,
                policy_may_override_attempts=True,
                ends_when="read: failed; idempotent write: outcome_unknown (failed if NOT_STARTED)",
                rows=("R03", "R04", "R05", "R06", "R17"),
            ),
            StepKindSpec(
                kind=StepKind.CALL_SINGLE_ATTEMPT_TOOL,
                runs_in=RunsIn.WORKER,
                max_attempts=1,
                retry_window_ms=None,
                backoff_initial_ms=0,
                backoff_factor=1,
                start_to_close_ms=5 * MINUTE,
                on_exhaustion=OnExhaustion.TOOL_OUTCOME,
                policy_may_override_attempts=False,
                ends_when="outcome_unknown, never run again (failed if NOT_STARTED)",
                rows=("R07", "R08"),
            ),
            StepKindSpec(
                kind=StepKind.POLL_TOOL_TASK,
                runs_in=RunsIn.WORKER,
                max_attempts=3,
                retry_window_ms=None,
                backoff_initial_ms=1_000,
                backoff_factor=2,
                start_to_close_ms=1 * MINUTE,
                on_exhaustion=OnExhaustion.TOOL_OUTCOME,
                policy_may_override_attempts=False,
                ends_when="per poll; polls go on with the same handle, no second task starts",
                rows=("R12", "R13", "R17"),
            ),
            _model_call_step(
                StepKind.COMPACT_CONTEXT,
                ends_when="turn fails; the next user message compacts again",
                rows=("R14", "R17"),
            ),
            _wait_step(
                StepKind.AWAIT_TOOL_APPROVAL,
                ends_when="approved: the tool step is queued; denied: the call records failed",
                rows=("R09", "R18"),
            ),
            _wait_step(
                StepKind.AWAIT_QUESTION_ANSWER,
                ends_when="the answer resumes the turn (ask_user) or the tool that asked",
                rows=("R10", "R18"),
            ),
            _wait_step(
                StepKind.AWAIT_TIMER,
                ends_when="fires once; a timer due during an outage fires when a node is active",
                rows=("R11", "R18"),
            ),
            _wait_step(
                StepKind.AWAIT_USER_MESSAGE,
                ends_when="the session is idle; the next message starts a turn",
                rows=("R15",),
            ),
        ]
    }
)

# Crash-matrix rows about any step, which no kind's settings decide: the step lifecycle
# (steps.py) does, the same way for every kind. Listed here rather than under every kind,
# so a kind's `rows` stay the rows its own settings answer.
CROSS_KIND_ROWS: Mapping[str, str] = MappingProxyType(
    {
        "R16": "a queued step uses no attempt until a hand-out starts one (steps.start_attempt)",
        "R19": "a result in flight is committed by its running attempt, or the attempt fails and "
        "follows its kind's row (steps.current_attempt fences a late one)",
    }
)

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


def retry_decision(
    kind: str, *, max_attempts: int, attempts_used: int, retryable: bool, first_handout_at: int, at: int
) -> RetryDecision:
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
    window = STEP_KINDS[kind].retry_window_ms
    if window is None:
        raise ValueError(f"{kind} steps have no retry window")
    return f"no attempt left within {window // MINUTE} min of the first"


def tool_outcome_on_exhaustion(effect: str, progress: str) -> CallStatus:
    """The status a tool call records when its step can run no more."""
    if progress == AttemptProgress.NOT_STARTED:
        return CallStatus.FAILED
    return CallStatus.FAILED if effect == "read" else CallStatus.OUTCOME_UNKNOWN


def not_run_error(detail: str) -> str:
    """The error of a call whose tool never reached a Worker (contract prefix first)."""
    return f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: {detail}"


def idempotency_key(session_id: str, call_id: str) -> str:
    """Contract: a tool call's key, the same on every attempt."""
    return f"{session_id}:{call_id}"


def tool_step_kind(effect: str) -> StepKind:
    """A write runs at most once; reads and idempotent writes may be retried."""
    return StepKind.CALL_SINGLE_ATTEMPT_TOOL if effect == "write" else StepKind.CALL_TOOL
