"""What follows a step's lifecycle event, for the rest of the session: the follow-ups that
`steps.py` (a leaf) leaves to its caller.

- An exhausted step follows its kind's `on_exhaustion` (`follow_exhaustion`): the turn
  fails, or the tool call records failed / outcome_unknown by whether its tool may have run.
- A fired timer acts by purpose (`fire_timer`): requeue after a backoff, end a sleep, poll
  a tool task again, or close a retry window.
- A RunModel hand-out first delivers the steered messages (`hand_out`); every hand-out
  carries its task's input, built here.
- A cancelled turn stops its steps and records an outcome for each open call (`cancel_turn`).

The engine's modules import one way only: handlers → outcomes → calls → turns → steps →
kinds / store (an import-linter contract in pyproject.toml checks it).
"""

from __future__ import annotations

import sqlite3

from dex_ha.engine import calls, steps, turns
from dex_ha.engine.context import ApplyContext
from dex_ha.engine.kinds import (
    OnExhaustion,
    StepKind,
    not_run_error,
    spec_of,
    tool_outcome_on_exhaustion,
)
from dex_ha.engine.results import StartedAttempt
from dex_ha.engine.statuses import AttemptProgress, CallStatus, TimerPurpose, TurnStatus
from dex_ha.engine.tasks import task_input


def follow_exhaustion(ctx: ApplyContext, exhausted: steps.Exhausted | None) -> None:
    """Apply the exhausted step's `on_exhaustion` (nothing when no step was exhausted)."""
    if exhausted is None:
        return
    step, error = exhausted.step, exhausted.error
    rule = spec_of(step["kind"]).on_exhaustion
    if rule is OnExhaustion.FAIL_TURN:
        turns.fail_turn(ctx, step["session_id"], step["turn_id"], f"{step['kind']} failed: {error}")
    elif rule is OnExhaustion.TOOL_OUTCOME:
        call = ctx.store.require_call(step["session_id"], step["call_id"])
        progress = AttemptProgress.NOT_COMPLETED if call["ran"] else AttemptProgress.NOT_STARTED
        status = tool_outcome_on_exhaustion(call["effect"], progress)
        if progress == AttemptProgress.NOT_STARTED:
            error = not_run_error(error)
        elif status == CallStatus.OUTCOME_UNKNOWN:
            error = f"the outcome is unknown: the tool may have run and will not run again ({error})"
        calls.finish_call(ctx, call, status, error=error, progress=progress)


def hand_out(
    ctx: ApplyContext, step_id: str, worker_id: str, term: int, fenced_term: int, token_secret: str | None
) -> StartedAttempt | None:
    """Start the next attempt of a queued step (see `steps.start_attempt`); None when its
    retry window was over and the step was exhausted instead."""
    attempt = steps.start_attempt(ctx, step_id, worker_id, term, fenced_term, token_secret)
    if isinstance(attempt, steps.Exhausted):
        follow_exhaustion(ctx, attempt)
        return None
    if attempt["kind"] == StepKind.RUN_MODEL:
        # Steered messages join the history at the model call that will see them, before
        # the attempt is announced: clients see them in the order the model does.
        turns.deliver_steered_messages(ctx, attempt["session_id"], attempt["turn_id"])
    # The Worker's task is built here, where the state is warm (the history cache), so the
    # leader answers the Worker without reading the database.
    return steps.announce_attempt(ctx, attempt, task_input(ctx.store, attempt, warm=True))


def fail_attempt(
    ctx: ApplyContext,
    step: sqlite3.Row,
    number: int,
    error: str,
    retryable: bool,
    *,
    not_started: bool = False,
    backoff_spent_ms: int = 0,
) -> None:
    """The attempt failed: the step retries later, or is exhausted and followed up."""
    follow_exhaustion(
        ctx,
        steps.fail_attempt(
            ctx, step, number, error, retryable, not_started=not_started, backoff_spent_ms=backoff_spent_ms
        ),
    )


def fail_held_attempts(ctx: ApplyContext, term: int) -> dict[str, int]:
    """Takeover: fail every running attempt handed out before `term`; fence those terms.
    Returns how many failed, by step kind (for the leader's metrics)."""
    by_kind: dict[str, int] = {}
    for held in steps.fence_term(ctx, term):
        step = ctx.store.require_step(held["step_id"])
        by_kind[step["kind"]] = by_kind.get(step["kind"], 0) + 1
        fail_attempt(
            ctx,
            step,
            held["number"],
            f"the node that handed out this attempt (term {held['term']}) lost its lease",
            True,
        )
    return by_kind


def fire_timer(ctx: ApplyContext, timer: sqlite3.Row) -> None:
    """A due timer fires once: close a retry window, requeue after a backoff, end a sleep, or poll."""
    step = steps.fire_timer(ctx, timer)
    purpose = timer["purpose"]
    if purpose == TimerPurpose.RETRY_WINDOW:
        follow_exhaustion(ctx, steps.close_retry_window(ctx, step))
        return
    if purpose == TimerPurpose.BACKOFF:
        steps.requeue(ctx, step)
        return
    steps.end_wait_step(ctx, step["step_id"])
    call = ctx.store.require_call(step["session_id"], step["call_id"])
    if purpose == TimerPurpose.SLEEP:
        calls.finish_call(ctx, call, CallStatus.SUCCEEDED, output={"slept_ms": timer["due_at"] - step["created_at"]})
    else:  # poll: the task's next poll, on the same handle
        calls.queue_poll(ctx, call)


def cancel_turn(ctx: ApplyContext, session_id: str, turn_id: str, reason: str | None) -> None:
    """Cancel: running attempts are flagged, open steps stop, each open call records an outcome."""
    # Mark the turn first: calls that finish below must not start another model round.
    ctx.store.update("turns", {"turn_id": turn_id}, status=TurnStatus.CANCELLED)
    steps.cancel_open_steps(ctx, turn_id)
    calls.cancel_pending_calls(ctx, turn_id)
    turns.end_turn(ctx, session_id, turn_id, TurnStatus.CANCELLED, reason or "cancelled")
