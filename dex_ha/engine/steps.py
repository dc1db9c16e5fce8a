"""Step lifecycle: create, hand out, complete, fail → retry after a backoff timer or
exhaust, and timers. This module is a leaf: it changes steps, attempts and timers only.
What follows once a step is over (a call's outcome, a failed turn, the next poll) is up to
its kind (`STEP_KINDS`) and is done by the caller, `outcomes.py`, from what these functions
return (an `Exhausted` step, a fired timer).

Step statuses: queued → running → done | failed, with `backoff` (waiting for a retry
timer) between two attempts; wait steps are `waiting` until an event ends them; any open
step of a cancelled turn becomes `cancelled`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from dex_ha import session_protocol as events
from dex_ha.engine.context import ApplyContext
from dex_ha.engine.kinds import (
    StepKind,
    idempotency_key,
    retry_decision,
    retry_window_end,
    spec_of,
    window_closed,
)
from dex_ha.engine.results import Rejected, StartedAttempt
from dex_ha.engine.statuses import (
    OPEN_STEP_STATUSES,
    AttemptProgress,
    AttemptStatus,
    StepStatus,
    TimerPurpose,
    TimerStatus,
)
from dex_ha.engine.store import FENCED_TERM, STEP_COLUMNS, to_json


@dataclass(frozen=True, slots=True)
class Exhausted:
    """A step that can run no more (already marked failed): what follows is up to its
    kind's `on_exhaustion`, which the caller applies (`outcomes.follow_exhaustion`)."""

    step: sqlite3.Row
    error: str


def create_step(
    ctx: ApplyContext,
    *,
    session_id: str,
    turn_id: str,
    agent: str,
    kind: StepKind,
    call_id: str | None = None,
    params: dict[str, Any] | None = None,
    max_attempts: int | None = None,
    start_to_close_ms: int | None = None,
) -> str:
    """A new step: queued for a Worker (task kinds) or waiting in the server (wait kinds)."""
    spec = spec_of(kind)
    step_id = ctx.ids.new("st")
    ctx.store.insert(
        "steps",
        step_id=step_id,
        session_id=session_id,
        turn_id=turn_id,
        agent=agent,
        kind=kind,
        call_id=call_id,
        status=StepStatus.QUEUED if spec.is_task else StepStatus.WAITING,
        queue_seq=ctx.ids.queue_position() if spec.is_task else None,
        queued_at=ctx.at if spec.is_task else None,
        max_attempts=max_attempts if max_attempts is not None else spec.max_attempts,
        start_to_close_ms=start_to_close_ms or spec.start_to_close_ms,
        params=None if params is None else to_json(params),
        created_at=ctx.at,
    )
    if call_id is not None:
        ctx.store.update("tool_calls", {"session_id": session_id, "call_id": call_id}, step_id=step_id)
    event = events.StepQueued if spec.is_task else events.StepWaiting
    ctx.emit(session_id, event(step_id=step_id, kind=kind, turn_id=turn_id, call_id=call_id))
    return step_id


def end_wait_step(ctx: ApplyContext, step_id: str) -> None:
    ctx.store.update("steps", {"step_id": step_id}, status=StepStatus.DONE, ended_at=ctx.at)


# ---------------------------------------------------------------- attempts


def start_attempt(
    ctx: ApplyContext, step_id: str, worker_id: str, term: int, fenced_term: int, token_secret: str | None
) -> dict[str, Any] | Exhausted:
    """Start the next attempt of a queued step, for `worker_id`, with the leader's random
    `token_secret` for its task token. Raises Rejected, having changed nothing, when it
    cannot start (every check comes before the first write). The attempt is announced
    separately (`announce_attempt`), once the caller has done what goes before it.

    A retry whose window is over (the step waited for a Worker too long) does not start:
    the step is exhausted instead, and returned as `Exhausted`. That is a change of state,
    so the command is accepted and the leader, seeing the step gone from the queue, moves on."""
    if term >= fenced_term:
        first = _claim_first_attempt(ctx, step_id)
        if first is not None:
            return _record_attempt(ctx, first, 1, worker_id, term, token_secret)
    step = ctx.store.require_step(step_id)
    if step["status"] != StepStatus.QUEUED:
        raise Rejected("conflict", f"step {step_id} is {step['status']}, not queued")
    if term < fenced_term:
        raise Rejected("stale_attempt", f"term {term} ended: attempts of terms before {fenced_term} were failed")
    number = step["attempts_used"] + 1
    if number > 1:
        if _retry_window_over(ctx, step):
            return exhaust(ctx, step, f"attempt {number} was not handed out in time ({window_closed(step['kind'])})")
        _cancel_timers(ctx, step, purpose=TimerPurpose.RETRY_WINDOW)  # the retry starts in time
    ctx.store.update(
        "steps",
        {"step_id": step_id},
        status=StepStatus.RUNNING,
        attempts_used=number,
        queue_seq=None,
        first_handout_at=step["first_handout_at"] or ctx.at,
    )
    return _record_attempt(ctx, step, number, worker_id, term, token_secret)


def _claim_first_attempt(ctx: ApplyContext, step_id: str) -> sqlite3.Row | None:
    """The common hand-out, a queued step's first attempt, needs no check beyond that: the
    step becomes running and gives back what the attempt needs, in one statement. None
    (nothing changed) for any other step: the caller reads it and checks it in full."""
    return ctx.store.row(
        "UPDATE steps SET status = 'running', attempts_used = 1, queue_seq = NULL, "
        "first_handout_at = COALESCE(first_handout_at, ?) "
        f"WHERE step_id = ? AND status = 'queued' AND attempts_used = 0 RETURNING {STEP_COLUMNS}",
        (ctx.at, step_id),
    )


def _record_attempt(
    ctx: ApplyContext, step: sqlite3.Row, number: int, worker_id: str, term: int, token_secret: str | None
) -> dict[str, Any]:
    """Insert attempt `number` of `step` (already marked running); returns the hand-out."""
    deadline = ctx.at + step["start_to_close_ms"] if step["start_to_close_ms"] else None
    key = idempotency_key(step["session_id"], step["call_id"]) if step["call_id"] is not None else None
    ctx.store.insert(
        "attempts",
        step_id=step["step_id"],
        number=number,
        term=term,
        worker_id=worker_id,
        idempotency_key=key,
        status=AttemptStatus.RUNNING,
        started_at=ctx.at,
        deadline_at=deadline,
        token_secret=token_secret,
    )
    if step["call_id"] is not None:
        # From now on the tool may have run: a later failure is NOT_COMPLETED.
        ctx.store.update("tool_calls", {"session_id": step["session_id"], "call_id": step["call_id"]}, ran=1)
    # For the leader that proposed the hand-out: it builds the Worker's task (and token) from this.
    return {
        "step_id": step["step_id"],
        "attempt": number,
        "term": term,
        "worker_id": worker_id,
        "session_id": step["session_id"],
        "turn_id": step["turn_id"],
        "agent": step["agent"],
        "kind": step["kind"],
        "call_id": step["call_id"],
        "idempotency_key": key,
        "params": step["params"],
        "deadline_at": deadline,
        "queued_at": step["queued_at"],
        "token_secret": token_secret,
    }


def announce_attempt(ctx: ApplyContext, attempt: dict[str, Any], task_input: dict[str, Any]) -> StartedAttempt:
    """Emit `attempt_started`; returns the hand-out as the leader reads it (the Worker's
    task, its `task_input` included, is built from it: `Task.from_handout`). The event goes
    to clients: it names the Worker but never carries the token secret."""
    ctx.emit(
        attempt["session_id"],
        events.AttemptStarted(
            step_id=attempt["step_id"],
            kind=attempt["kind"],
            attempt=attempt["attempt"],
            term=attempt["term"],
            worker_id=attempt["worker_id"],
            call_id=attempt["call_id"],
        ),
    )
    return StartedAttempt(
        step_id=attempt["step_id"],
        attempt=attempt["attempt"],
        term=attempt["term"],
        worker_id=attempt["worker_id"],
        session_id=attempt["session_id"],
        turn_id=attempt["turn_id"],
        agent=attempt["agent"],
        kind=attempt["kind"],
        idempotency_key=attempt["idempotency_key"],
        deadline_at=attempt["deadline_at"],
        queued_at=attempt["queued_at"],
        token_secret=attempt["token_secret"],
        input=task_input,
    )


def current_attempt(ctx: ApplyContext, step_id: str, number: int, term: int) -> sqlite3.Row:
    """Fencing: the step, if (step id, attempt number, term) is still running."""
    step = ctx.store.step_and_attempt(step_id, number)
    if step["attempt_status"] is None:
        raise Rejected("stale_attempt", f"attempt {number} of step {step_id} was never handed out")
    if step["attempt_term"] != term:
        raise Rejected(
            "stale_attempt", f"attempt {number} of step {step_id} belongs to term {step['attempt_term']}, not {term}"
        )
    if step["attempt_status"] != AttemptStatus.RUNNING:
        raise Rejected("stale_attempt", f"attempt {number} of step {step_id} already {step['attempt_status']}")
    return step


def complete_attempt(ctx: ApplyContext, step_id: str, number: int, term: int, digest: str) -> sqlite3.Row | None:
    """Fence and record a result: attempt (step id, `number`, `term`), if still running,
    closes as completed and its step is done. Returns the step (STEP_COLUMNS), or None when
    the step no longer wants the result (its turn was cancelled while the attempt ran).
    Raises Rejected("stale_attempt"), having changed nothing, when the attempt is not current.

    The fencing conditions are in the UPDATE itself, so the common case is two statements;
    only a refused result reads the rows, to say why."""
    closed = ctx.store.row(
        "UPDATE attempts SET status = 'completed', ended_at = ?, result_digest = ? "
        "WHERE step_id = ? AND number = ? AND term = ? AND status = 'running' "
        "RETURNING number",
        (ctx.at, digest, step_id, number, term),
    )
    if closed is None:
        current_attempt(ctx, step_id, number, term)  # raises, saying why it is not current
        raise Rejected("stale_attempt", f"attempt {number} of step {step_id} is not running in term {term}")
    return ctx.store.row(
        f"UPDATE steps SET status = 'done', ended_at = ? WHERE step_id = ? AND status = 'running' "
        f"RETURNING {STEP_COLUMNS}",
        (ctx.at, step_id),
    )


def fail_attempt(
    ctx: ApplyContext,
    step: sqlite3.Row,
    number: int,
    error: str,
    retryable: bool,
    *,
    not_started: bool = False,
    backoff_spent_ms: int = 0,
) -> Exhausted | None:
    """The attempt failed, NOT_COMPLETED unless its Worker reports it never called the tool
    (`not_started`); the step retries after a backoff, or is exhausted and returned. The
    backoff counts from when the attempt stopped: `backoff_spent_ms` of it passed already
    (a Worker found silent that long)."""
    progress = AttemptProgress.NOT_STARTED if not_started else AttemptProgress.NOT_COMPLETED
    ctx.store.update(
        "attempts",
        {"step_id": step["step_id"], "number": number},
        status=AttemptStatus.FAILED,
        ended_at=ctx.at,
        error=error,
        attempt_progress=progress,
    )
    ctx.emit(
        step["session_id"],
        events.AttemptFailed(
            step_id=step["step_id"],
            kind=step["kind"],
            attempt=number,
            error=error,
            attempt_progress=progress,
            call_id=step["call_id"],
        ),
    )
    if step["status"] != StepStatus.RUNNING:  # cancelled: the call's outcome is recorded already
        return None
    if not_started and step["call_id"] is not None:
        _recheck_call_ran(ctx, step)
    decision = retry_decision(
        step["kind"],
        max_attempts=step["max_attempts"],
        attempts_used=step["attempts_used"],
        retryable=retryable,
        first_handout_at=step["first_handout_at"],
        at=ctx.at,
    )
    if decision.retry:
        ctx.store.update("steps", {"step_id": step["step_id"]}, status=StepStatus.BACKOFF)
        set_timer(ctx, step, TimerPurpose.BACKOFF, ctx.at + max(0, decision.delay_ms - backoff_spent_ms))
        _watch_retry_window(ctx, step)
        return None
    return exhaust(ctx, step, f"{error} ({decision.why_not})")


def _recheck_call_ran(ctx: ApplyContext, step: sqlite3.Row) -> None:
    """After a not-started report: the call's tool counts as not run only if NO attempt of
    ANY step of the call may have run. The hand-out marked the call as run (conservative);
    one report speaks for its own attempt only, so an earlier attempt that may have run (a
    Worker that died mid-tool, a tool that asked a question) keeps the call NOT_COMPLETED:
    a Worker cannot make a write that ran "safe to call again" through a later attempt."""
    may_have_run = ctx.store.scalar(
        "SELECT 1 FROM attempts a JOIN steps s ON s.step_id = a.step_id "
        "WHERE s.session_id = ? AND s.call_id = ? "
        "AND NOT (a.status = 'failed' AND a.attempt_progress = ?) LIMIT 1",
        (step["session_id"], step["call_id"], AttemptProgress.NOT_STARTED),
    )
    if not may_have_run:
        ctx.store.update("tool_calls", {"session_id": step["session_id"], "call_id": step["call_id"]}, ran=0)


def _retry_window_over(ctx: ApplyContext, step: sqlite3.Row) -> bool:
    end = retry_window_end(step["kind"], step["first_handout_at"])
    return end is not None and ctx.at > end


def _watch_retry_window(ctx: ApplyContext, step: sqlite3.Row) -> None:
    """A retry is on its way: if no Worker takes it before the window ends, a timer fails
    the step then (the turn must not wait for a poll that may come hours later). The
    hand-out of the retry cancels the timer."""
    end = retry_window_end(step["kind"], step["first_handout_at"])
    if end is not None:
        set_timer(ctx, step, TimerPurpose.RETRY_WINDOW, end + 1)  # a hand-out at `end` itself is still in time


def _cancel_timers(ctx: ApplyContext, step: sqlite3.Row, purpose: TimerPurpose | None = None) -> None:
    """Cancel the step's pending timers (of one purpose, or all). The session is in the
    condition so the lookup uses the index of pending timers by session."""
    sql = "UPDATE timers SET status = 'cancelled' WHERE session_id = ? AND step_id = ? AND status = 'pending'"
    params: tuple[Any, ...] = (step["session_id"], step["step_id"])
    if purpose is not None:
        sql, params = sql + " AND purpose = ?", (*params, purpose)
    ctx.store.conn.execute(sql, params)


def exhaust(ctx: ApplyContext, step: sqlite3.Row, error: str) -> Exhausted:
    """The step can run no more: it fails; the caller follows its kind's `on_exhaustion`."""
    ctx.store.update(
        "steps", {"step_id": step["step_id"]}, status=StepStatus.FAILED, ended_at=ctx.at, error=error, queue_seq=None
    )
    _cancel_timers(ctx, step)  # a backoff or window timer must not wake a failed step
    return Exhausted(step, error)


def fence_term(ctx: ApplyContext, term: int) -> list[sqlite3.Row]:
    """Takeover: fence the terms before `term`; returns the attempts they still hold running
    (step_id, number, term), which the caller fails one by one."""
    if term > ctx.store.meta(FENCED_TERM):
        ctx.store.set_meta(FENCED_TERM, term)
    return ctx.store.rows(
        "SELECT step_id, number, term FROM attempts WHERE status = 'running' AND term < ? ORDER BY step_id, number",
        (term,),
    )


# ---------------------------------------------------------------- timers


def set_timer(ctx: ApplyContext, step: sqlite3.Row | dict[str, Any], purpose: TimerPurpose, due_at: int) -> str:
    timer_id = ctx.ids.new("tm")
    ctx.store.insert(
        "timers",
        timer_id=timer_id,
        session_id=step["session_id"],
        turn_id=step["turn_id"],
        step_id=step["step_id"],
        purpose=purpose,
        due_at=due_at,
        status=TimerStatus.PENDING,
    )
    ctx.emit(
        step["session_id"], events.TimerSet(timer_id=timer_id, step_id=step["step_id"], purpose=purpose, due_at=due_at)
    )
    return timer_id


def fire_timer(ctx: ApplyContext, timer: sqlite3.Row) -> sqlite3.Row:
    """A due timer fires once; returns its step. What the firing does (requeue after a
    backoff, end a sleep, poll, close a retry window) is by purpose, in `outcomes.py`."""
    ctx.store.update("timers", {"timer_id": timer["timer_id"]}, status=TimerStatus.FIRED, fired_at=ctx.at)
    ctx.emit(
        timer["session_id"],
        events.TimerFired(timer_id=timer["timer_id"], step_id=timer["step_id"], purpose=timer["purpose"]),
    )
    return ctx.store.require_step(timer["step_id"])


def close_retry_window(ctx: ApplyContext, step: sqlite3.Row) -> Exhausted | None:
    """The retry window's timer fired: a step still waiting for its retry is exhausted.
    (The timer is only pending while the step waits for its retry: the hand-out cancels it.)"""
    if step["status"] not in (StepStatus.QUEUED, StepStatus.BACKOFF):
        return None
    return exhaust(
        ctx, step, f"attempt {step['attempts_used'] + 1} was not handed out in time ({window_closed(step['kind'])})"
    )


def requeue(ctx: ApplyContext, step: sqlite3.Row) -> None:
    """The backoff is over: the step is queued again for its next attempt."""
    ctx.store.update(
        "steps",
        {"step_id": step["step_id"]},
        status=StepStatus.QUEUED,
        queue_seq=ctx.ids.queue_position(),
        queued_at=ctx.at,
    )
    ctx.emit(
        step["session_id"],
        events.StepQueued(step_id=step["step_id"], kind=step["kind"], turn_id=step["turn_id"], call_id=step["call_id"]),
    )


def cancel_open_steps(ctx: ApplyContext, turn_id: str) -> None:
    """Cancel: open steps stop; running attempts are flagged so heartbeats tell Workers."""
    open_steps = ctx.store.rows(
        f"SELECT step_id, status FROM steps WHERE turn_id = ? AND status IN "
        f"({', '.join('?' * len(OPEN_STEP_STATUSES))}) ORDER BY step_id",
        (turn_id, *OPEN_STEP_STATUSES),
    )
    for step in open_steps:
        sid = step["step_id"]
        if step["status"] == StepStatus.RUNNING:
            ctx.store.conn.execute(
                "UPDATE attempts SET cancel_requested = 1 WHERE step_id = ? AND status = 'running'", (sid,)
            )
        ctx.store.update("steps", {"step_id": sid}, status=StepStatus.CANCELLED, ended_at=ctx.at, queue_seq=None)
        ctx.store.conn.execute(
            "UPDATE timers SET status = 'cancelled' WHERE step_id = ? AND status = 'pending'", (sid,)
        )
        ctx.store.conn.execute(
            "UPDATE approvals SET status = 'cancelled', decided_at = ? WHERE step_id = ? AND status = 'pending'",
            (ctx.at, sid),
        )
        ctx.store.conn.execute(
            "UPDATE questions SET status = 'cancelled', answered_at = ? WHERE step_id = ? AND status = 'pending'",
            (ctx.at, sid),
        )
