"""Read side: what the leader needs to dispatch, heartbeat and fire timers, and what the
API shows (get_agent_snapshot, sessions_page, session events). Reads only; no changes.
"""

from __future__ import annotations

import functools
import hmac
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import groupby
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from dex_ha.engine.commands import FIRST_STATE_MACHINE_VERSION
from dex_ha.engine.kinds import DEFAULT_HEARTBEAT_TIMEOUT_MS, TASK_KINDS, StepKind, idempotency_key
from dex_ha.engine.statuses import AttemptStatus, StepStatus
from dex_ha.engine.store import (
    APPLIED_INDEX,
    CLUSTER_VERSION,
    CONSISTENCY_ALARM_PREFIX,
    EVENT_ID_SHIFT,
    Store,
    from_json,
)
from dex_ha.engine.tasks import task_input
from dex_ha.session_protocol import (  # the shapes a client sees, shared with the Client SDK
    CurrentTurnView,
    PendingTimerView,
    SessionEvent,
    SessionSnapshot,
    StepView,
    ToolCallView,
    TurnView,
    WaitingMessageView,
)
from dex_ha.worker_protocol import Task  # the one shape of a task, shared with the Worker SDK

# What a row of a session list costs besides its metadata: ids, status, counts and keys.
SESSION_ROW_BYTES = 256


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: its items, and whether the next page may hold more (the page
    reached its count limit or its byte budget; False: the list ends here)."""

    items: list[Any]
    more: bool


class _PageBuilder:
    """Gathers a page: items until `limit` of them, or until they hold `max_bytes` (None: no
    budget); `add` says when the page is full."""

    def __init__(self, limit: int, max_bytes: int | None) -> None:
        self._limit = limit
        self._max_bytes = max_bytes
        self._items: list[Any] = []
        self._bytes = 0
        self._full = False

    def add(self, item: Any, size: int) -> bool:
        return self.add_all([item], size)

    def add_all(self, items: list[Any], size: int) -> bool:
        """Add `items` (up to the limit) that hold `size` bytes together; True once full."""
        self._items.extend(items[: self._limit - len(self._items)])
        self._bytes += size
        over_budget = self._max_bytes is not None and self._bytes >= self._max_bytes
        self._full = len(self._items) >= self._limit or over_budget
        return self._full

    def done(self) -> Page:
        return Page(self._items, self._full)


@dataclass(frozen=True, slots=True)
class QueuedStep:
    step_id: str
    session_id: str
    turn_id: str
    agent: str
    kind: str
    call_id: str | None
    queued_at: int  # leader wall-clock ms when it last became queued


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    step_id: str
    attempt: int
    term: int
    worker_id: str
    session_id: str
    kind: str
    started_at: int
    deadline_at: int | None  # start_to_close: the leader fails it with AttemptTimedOut after
    cancel_requested: bool  # the leader answers the next heartbeat with cancel=true


@dataclass(frozen=True, slots=True)
class AttemptState:
    """For a Worker's report on an attempt: whose is it, is (step, attempt, term) still
    current, and should it stop?"""

    status: AttemptStatus
    current: bool
    cancel_requested: bool
    worker_id: str  # the Worker it was handed to: the only one that may report on it


@dataclass(frozen=True, slots=True)
class Timer:
    timer_id: str
    due_at: int
    session_id: str
    step_id: str
    purpose: str  # backoff | sleep | poll | retry_window


# Per-session counts for sessions_page (correlated on the outer `sessions` row).
_PENDING_APPROVALS = (
    "SELECT COUNT(*) FROM approvals a WHERE a.session_id = sessions.session_id AND a.status = 'pending'"
)
_OUTCOME_UNKNOWN_CALLS = (
    "SELECT COUNT(*) FROM tool_calls c WHERE c.session_id = sessions.session_id AND c.status = 'outcome_unknown'"
)

# A session whose metadata has the key (the first parameter) with the value (the second):
# a string compares as it is, anything else as its JSON text.
_METADATA_MATCH = (
    "EXISTS (SELECT 1 FROM json_each(sessions.metadata) AS m WHERE m.key = ? AND "
    "(CASE m.type WHEN 'text' THEN m.value WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' "
    "WHEN 'null' THEN 'null' ELSE CAST(m.value AS TEXT) END) = ?)"
)


def _session_filters(
    agent: str | None,
    status: str | None,
    awaiting_approval: bool | None,
    outcome_unknown: bool | None,
    namespace: str | None,
) -> tuple[list[str], list[Any]]:
    """The WHERE conditions (and their parameters) of sessions_page's column and count filters."""
    conds: list[str] = []
    params: list[Any] = []
    for column, value in (("namespace", namespace), ("agent", agent), ("status", status)):
        if value is not None:
            conds.append(f"{column} = ?")
            params.append(value)
    for count, wanted in ((_PENDING_APPROVALS, awaiting_approval), (_OUTCOME_UNKNOWN_CALLS, outcome_unknown)):
        if wanted is not None:
            conds.append(f"({count}) {'>' if wanted else '='} 0")
    return conds, params


def _by_name(cls: Any, row: sqlite3.Row, **converted: Any) -> Any:
    """An instance of the dataclass `cls` from a row whose columns are named as its fields
    (alias them in the SELECT), so the column order of the query does not matter;
    `converted` gives the fields that need a conversion (SQLite has no booleans)."""
    return cls(**{f.name: converted[f.name] if f.name in converted else row[f.name] for f in fields(cls)})


def _call_id_of(step: StepView) -> str:
    """The call of a tool call's step (only those are grouped by call)."""
    return step["call_id"] or ""


def same_token_secret(stored: str | None, given: str) -> bool:
    """Constant-time comparison, so response times do not reveal how much of a guess was
    right. An attempt stored without a secret (handed out before schema 2) matches nothing."""
    return stored is not None and hmac.compare_digest(stored.encode(), given.encode())


P = ParamSpec("P")
R = TypeVar("R")


def read_transaction(query: Callable[Concatenate[Queries, P], R]) -> Callable[Concatenate[Queries, P], R]:
    """Marks a public query: it runs in one read transaction where the reader asks for one
    (EngineReader, on another thread than the applies), so a query of several statements
    never sees half of an apply. Every public method of Queries carries it
    (tests/engine/test_engine.py checks)."""

    def in_transaction(self: Queries, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._in_read_transaction(query, self, *args, **kwargs)

    functools.update_wrapper(in_transaction, query)  # its name and docstring
    in_transaction.is_read_transaction = True  # type: ignore[attr-defined]
    return in_transaction


class Queries:
    """Mixed into Engine and EngineReader: reads over `self._store`."""

    _store: Store

    def _in_read_transaction(self, query: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run a query. The Engine runs it as it is, inside or outside an apply's
        transaction; EngineReader wraps it in a read transaction of its own."""
        return query(*args, **kwargs)

    @read_transaction
    def applied_index(self) -> int:
        """The last log index applied (stored with the changes it covers)."""
        return self._store.meta(APPLIED_INDEX)

    @read_transaction
    def cluster_version(self) -> int:
        """The cluster's state-machine version: the newest every member runs, as the
        latest SetClusterVersion said (the first version before any)."""
        return self._store.meta(CLUSTER_VERSION, FIRST_STATE_MACHINE_VERSION)

    @read_transaction
    def consistency_alarms(self) -> dict[str, int]:
        """The members under the consistency alarm: node id -> the index of the check
        their state hash failed (see SetConsistencyAlarm)."""
        rows = self._store.rows(
            "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ? ORDER BY key",
            (len(CONSISTENCY_ALARM_PREFIX), CONSISTENCY_ALARM_PREFIX),
        )
        return {row[0][len(CONSISTENCY_ALARM_PREFIX) :]: int(row[1]) for row in rows}

    # ---------------------------------------------------------- leader services

    @read_transaction
    def queued_steps(self, agent: str, limit: int = 100) -> list[QueuedStep]:
        """Queued task steps of one agent, first queued first (FIFO)."""
        rows = self._store.rows(
            "SELECT step_id, session_id, turn_id, agent, kind, call_id, queued_at FROM steps "
            "WHERE agent = ? AND status = 'queued' ORDER BY queue_seq LIMIT ?",
            (agent, limit),
        )
        return [_by_name(QueuedStep, r) for r in rows]

    @read_transaction
    def agent_namespace(self, name: str) -> str | None:
        """The namespace that owns agent name `name` (None: nothing names it yet); only
        that namespace's Workers get its steps."""
        return self._store.agent_namespace(name)

    @read_transaction
    def count_queued(self, agent: str, limit: int) -> int:
        """How many task steps of one agent are queued, counting up to `limit`."""
        found: int = self._store.scalar(
            "SELECT COUNT(*) FROM (SELECT 1 FROM steps WHERE agent = ? AND status = 'queued' LIMIT ?)", (agent, limit)
        )
        return found

    @read_transaction
    def running_attempts(self, term_lt: int | None = None, term: int | None = None) -> list[RunningAttempt]:
        """Running attempts; with `term_lt`, only those handed out before that term; with
        `term`, only those handed out in it."""
        sql = (
            "SELECT a.step_id, a.number AS attempt, a.term, a.worker_id, s.session_id, s.kind, a.started_at, "
            "a.deadline_at, a.cancel_requested FROM attempts a JOIN steps s ON s.step_id = a.step_id "
            "WHERE a.status = 'running'"
        )
        params: tuple[Any, ...] = ()
        if term_lt is not None:
            sql, params = sql + " AND a.term < ?", (term_lt,)
        elif term is not None:
            sql, params = sql + " AND a.term = ?", (term,)
        rows = self._store.rows(sql + " ORDER BY a.term, a.step_id", params)
        return [_by_name(RunningAttempt, r, cancel_requested=bool(r["cancel_requested"])) for r in rows]

    @read_transaction
    def attempt_state(self, step_id: str, attempt: int, term: int, token_secret: str) -> AttemptState | None:
        """The attempt a task token names, or None unless it was handed out with `token_secret`
        (so a made-up token learns nothing, not even whether the attempt exists)."""
        row = self._store.attempt(step_id, attempt)
        if row is None or not same_token_secret(row["token_secret"], token_secret):
            return None
        current = row["status"] == AttemptStatus.RUNNING and row["term"] == term
        return AttemptState(AttemptStatus(row["status"]), current, bool(row["cancel_requested"]), row["worker_id"])

    @read_transaction
    def next_timer(self) -> Timer | None:
        """The earliest pending timer (overdue ones included)."""
        timers = self.due_timers(None, 1)
        return timers[0] if timers else None

    @read_transaction
    def due_timers(self, now_ms: int | None, limit: int = 100) -> list[Timer]:
        """Pending timers due at `now_ms` (all pending when None), earliest first."""
        sql = "SELECT timer_id, due_at, session_id, step_id, purpose FROM timers WHERE status = 'pending'"
        params: tuple[Any, ...] = ()
        if now_ms is not None:
            sql, params = sql + " AND due_at <= ?", (now_ms,)
        return [Timer(*r) for r in self._store.rows(sql + " ORDER BY due_at, timer_id LIMIT ?", (*params, limit))]

    @read_transaction
    def task_for(self, step_id: str, heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS) -> Task | None:
        """The task of a task step's current attempt (or of its next one, while queued)."""
        step = self._store.step(step_id)
        if step is None or step["kind"] not in TASK_KINDS:
            return None
        number, deadline = step["attempts_used"] + 1, None
        if step["status"] == StepStatus.RUNNING:
            number = step["attempts_used"]
            deadline = self._store.scalar(
                "SELECT deadline_at FROM attempts WHERE step_id = ? AND number = ?", (step_id, number)
            )
        key = idempotency_key(step["session_id"], step["call_id"]) if step["call_id"] else None
        return Task(
            session_id=step["session_id"],
            turn_id=step["turn_id"],
            step_id=step_id,
            kind=step["kind"],
            attempt=number,
            idempotency_key=key,
            input=task_input(self._store, step, warm=False),
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            deadline_ms=deadline,
            agent=step["agent"],
        )

    # ---------------------------------------------------------- API reads

    @read_transaction
    def sessions_page(
        self,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        after: str | None = None,
        *,
        awaiting_approval: bool | None = None,
        outcome_unknown: bool | None = None,
        namespace: str | None = None,
        max_bytes: int | None = None,
        id_contains: str | None = None,
        metadata: tuple[str, str] | None = None,
        older_than: tuple[int, str] | None = None,
        newest_first: bool = False,
    ) -> Page:
        """Sessions ordered by id; pass the last id seen as `after` for the next page. With
        `newest_first`, ordered by creation time, newest first (ties by id, descending); pass
        the last session's (created_at, session_id) as `older_than` for the next page.
        `namespace`: only that namespace's sessions (None: every namespace's).

        Each row counts the session's pending approvals and its outcome_unknown tool calls
        (what an operator acts on); `awaiting_approval` and `outcome_unknown` filter on
        those counts (True: at least one; False: none; None: no filter). `id_contains`: only
        ids with that text in them; `metadata` (key, value): only sessions whose metadata
        has that top-level key with that value (a string as it is; a number, true, false
        or null as its JSON text).

        The page ends after `limit` sessions, or once they hold `max_bytes` (their stored
        metadata and a fixed amount per row; the first session is always in, however big),
        so a page's size stays about the budget whatever the sessions' metadata. Rows are
        read one at a time, so the ones after the budget are never read.
        """
        conds, params = _session_filters(agent, status, awaiting_approval, outcome_unknown, namespace)
        if id_contains is not None:
            conds.append("instr(session_id, ?) > 0")
            params.append(id_contains)
        if metadata is not None:
            conds.append(_METADATA_MATCH)
            params.extend(metadata)
        if after is not None:
            conds.append("session_id > ?")
            params.append(after)
        if older_than is not None:
            conds.append("(created_at, session_id) < (?, ?)")
            params.extend(older_than)
        where = f"WHERE {' AND '.join(conds)}" if conds else ""
        order = "created_at DESC, session_id DESC" if newest_first else "session_id"
        # The page's ids first, then their counts: the counts are read for the page's rows
        # only, not for every session that the newest-first order has to sort.
        rows = self._store.conn.execute(
            f"SELECT session_id, namespace, agent, status, current_turn_id, turn_count, created_at, updated_at, "
            f"metadata, ({_PENDING_APPROVALS}) AS pending_approvals, "
            f"({_OUTCOME_UNKNOWN_CALLS}) AS outcome_unknown_calls "
            f"FROM sessions WHERE session_id IN (SELECT session_id FROM sessions {where} ORDER BY {order} LIMIT ?) "
            f"ORDER BY {order}",
            (*params, limit),
        )
        page = _PageBuilder(limit, max_bytes)
        for r in rows:
            size = SESSION_ROW_BYTES + len(r["metadata"] or "")
            if page.add({**dict(r), "metadata": from_json(r["metadata"])}, size):
                break
        return page.done()

    @read_transaction
    def events(self, session_id: str, after: int = 0, limit: int = 1000) -> list[SessionEvent]:
        """`events_page` without a byte budget: up to `limit` events."""
        return self.events_page(session_id, after, limit).items

    @read_transaction
    def events_page(self, session_id: str, after: int = 0, limit: int = 1000, max_bytes: int | None = None) -> Page:
        """Committed events of a session with ids greater than `after` (Last-Event-ID): up
        to `limit`, or (with `max_bytes`) until they hold that many bytes of stored JSON
        (the first entry's events are always in); `more` when another read may find more."""
        page = _PageBuilder(limit, max_bytes)
        for index, at, events in self._store.conn.execute(
            "SELECT log_index, at, events FROM events WHERE session_id = ? AND log_index >= ? ORDER BY log_index",
            (session_id, after >> EVENT_ID_SHIFT),
        ):
            found = [
                SessionEvent.committed(str((index << EVENT_ID_SHIFT) + n), type_, data, at)
                for n, (type_, data) in enumerate(from_json(events))
                if (index << EVENT_ID_SHIFT) + n > after
            ]
            if found and page.add_all(found, len(events)):  # a row of events at or before `after` costs nothing
                break
        return page.done()

    @read_transaction
    def get_agent_snapshot(self, session_id: str) -> SessionSnapshot | None:
        """Everything a client sees of a session (`GET /v1/sessions/{sid}`)."""
        s = self._store.session(session_id)
        if s is None:
            return None
        steps_by_call = self._call_steps(session_id)
        return {
            "session_id": session_id,
            "namespace": s["namespace"],
            "agent": s["agent"],
            "status": s["status"],
            "metadata": from_json(s["metadata"]),
            "created_at": s["created_at"],
            "updated_at": s["updated_at"],
            "current_turn": self._turn_view(s["current_turn_id"]) if s["current_turn_id"] else None,
            # An idle session is in the AwaitUserMessage state: the next message starts a turn.
            "waiting_for": None if s["current_turn_id"] else StepKind.AWAIT_USER_MESSAGE,
            "turns": self._turns_with_steps(session_id),
            "history": [
                {"seq": r[0], **from_json(r[1])}
                for r in self._store.rows(
                    "SELECT seq, item FROM history WHERE session_id = ? ORDER BY seq", (session_id,)
                )
            ],
            "summary": None
            if s["summary"] is None
            else {"text": s["summary"], "upto_seq": s["summary_upto_seq"], "at": s["summary_at"]},
            "tool_calls": [
                self._call_view(c, steps_by_call.get(c["call_id"], []))
                for c in self._store.rows(
                    "SELECT * FROM tool_calls WHERE session_id = ? ORDER BY created_at, response_step_id, position",
                    (session_id,),
                )
            ],
            "pending_approvals": [
                {
                    "call_id": r["call_id"],
                    "name": r["name"],
                    "arguments": from_json(r["arguments"]),
                    "requested_at": r["requested_at"],
                }
                for r in self._store.rows(
                    "SELECT a.call_id, a.requested_at, c.name, c.arguments FROM approvals a "
                    "JOIN tool_calls c ON c.session_id = a.session_id AND c.call_id = a.call_id "
                    "WHERE a.session_id = ? AND a.status = 'pending' ORDER BY a.requested_at, a.call_id",
                    (session_id,),
                )
            ],
            "pending_questions": [
                {
                    "question_id": r["question_id"],
                    "call_id": r["call_id"],
                    "source": r["source"],
                    "question": from_json(r["question"]),
                    "asked_at": r["asked_at"],
                }
                for r in self._store.rows(
                    "SELECT * FROM questions WHERE session_id = ? AND status = 'pending' "
                    "ORDER BY asked_at, question_id",
                    (session_id,),
                )
            ],
            "pending_timers": [
                cast(PendingTimerView, dict(r))  # the SELECT names its columns
                for r in self._store.rows(
                    "SELECT timer_id, step_id, purpose, due_at FROM timers WHERE session_id = ? "
                    "AND status = 'pending' ORDER BY due_at, timer_id",
                    (session_id,),
                )
            ],
            "waiting_messages": [
                cast(WaitingMessageView, dict(r))
                for r in self._store.rows(
                    "SELECT message_id, text, mode, at FROM messages WHERE session_id = ? "
                    "AND status = 'waiting' ORDER BY seq",
                    (session_id,),
                )
            ],
        }

    def _turns_with_steps(self, session_id: str) -> list[TurnView]:
        """Every turn with its steps and their attempts: the session's timeline."""
        steps_by_turn: dict[str, list[StepView]] = {}
        # By turn (the steps_by_turn index), not by session: steps has no session index.
        for step in self._steps_with_attempts(
            "WHERE s.turn_id IN (SELECT turn_id FROM turns WHERE session_id = ?)", (session_id,)
        ):
            steps_by_turn.setdefault(step["turn_id"], []).append(step)
        rows = self._store.rows(
            "SELECT turn_id, number, status, message_id, started_at, ended_at, error FROM turns "
            "WHERE session_id = ? ORDER BY number",
            (session_id,),
        )
        # The row's columns are TurnView's: the SELECT names them.
        return [cast(TurnView, {**dict(r), "steps": steps_by_turn.get(r["turn_id"], [])}) for r in rows]

    def _turn_view(self, turn_id: str) -> CurrentTurnView:
        turn = dict(self._store.require_turn(turn_id))  # every column of turns: CurrentTurnView's
        turn["steps"] = self._steps_with_attempts("WHERE s.turn_id = ?", (turn_id,))
        return cast(CurrentTurnView, turn)

    def _call_steps(self, session_id: str) -> dict[str, list[StepView]]:
        steps = self._steps_with_attempts("WHERE s.session_id = ? AND s.call_id IS NOT NULL", (session_id,))
        return {call_id: list(group) for call_id, group in groupby(sorted(steps, key=_call_id_of), key=_call_id_of)}

    def _steps_with_attempts(self, where: str, params: tuple[Any, ...]) -> list[StepView]:
        rows = self._store.rows(
            "SELECT s.step_id, s.turn_id, s.kind, s.status AS step_status, s.call_id, s.attempts_used, s.max_attempts, "
            "s.created_at, s.error AS step_error, a.number, a.term, a.worker_id, a.idempotency_key, "
            "a.status, a.started_at, "
            f"a.ended_at, a.error, a.attempt_progress, a.cancel_requested FROM steps s "
            f"LEFT JOIN attempts a ON a.step_id = s.step_id {where} ORDER BY s.created_at, s.step_id, a.number",
            params,
        )
        steps: list[StepView] = []
        for step_id, grouped in groupby(rows, key=lambda r: r["step_id"]):
            group = list(grouped)
            first = group[0]
            steps.append(
                {
                    "step_id": step_id,
                    "turn_id": first["turn_id"],
                    "kind": first["kind"],
                    "status": first["step_status"],
                    "call_id": first["call_id"],
                    "attempts_used": first["attempts_used"],
                    "max_attempts": first["max_attempts"],
                    "error": first["step_error"],
                    "attempts": [
                        {
                            "number": r["number"],
                            "term": r["term"],
                            "worker_id": r["worker_id"],
                            "idempotency_key": r["idempotency_key"],
                            "status": r["status"],
                            "started_at": r["started_at"],
                            "ended_at": r["ended_at"],
                            "error": r["error"],
                            "attempt_progress": r["attempt_progress"],
                            "cancel_requested": bool(r["cancel_requested"]),
                        }
                        for r in group
                        if r["number"] is not None
                    ],
                }
            )
        return steps

    def _call_view(self, call: Any, steps: list[StepView]) -> ToolCallView:
        current = next((st for st in steps if st["step_id"] == call["step_id"]), None)
        inline = call["step_id"] is not None and call["step_id"] == call["response_step_id"]
        return {
            "call_id": call["call_id"],
            "turn_id": call["turn_id"],
            "name": call["name"],
            "arguments": from_json(call["arguments"]),
            "effect": call["effect"],
            "policy": from_json(call["policy"]),
            "idempotency_key": idempotency_key(call["session_id"], call["call_id"]),
            "status": call["status"],
            "output": from_json(call["output"]),
            "error": call["error"],
            "attempt_progress": call["attempt_progress"],
            "step_kind": StepKind.RUN_MODEL if inline else (current["kind"] if current else None),
            "step_status": current["status"] if current else None,
            "handle": from_json(call["handle"]),
            "reconciled_at": call["reconciled_at"],
            "steps": steps,
        }

    @read_transaction
    def session_namespace(self, session_id: str) -> str | None:
        """The session's namespace; None once it does not exist (or was deleted)."""
        found: str | None = self._store.scalar("SELECT namespace FROM sessions WHERE session_id = ?", (session_id,))
        return found

    @read_transaction
    def expired_sessions(self, cutoff_at: int, limit: int) -> list[str]:
        """Retention: up to `limit` ids of idle sessions (no running turn) last active
        (updated_at) before `cutoff_at`, the oldest first."""
        rows = self._store.rows(
            "SELECT session_id FROM sessions WHERE status = 'idle' AND updated_at < ? "
            "ORDER BY updated_at, session_id LIMIT ?",
            (cutoff_at, limit),
        )
        return [r[0] for r in rows]

    # ---------------------------------------------------------- metrics and tests

    @read_transaction
    def stats(self) -> dict[str, Any]:
        """Gauges for /metrics: queued steps by (agent, kind), pending timers, sessions by status."""
        return {
            "steps_queued": {
                (r[0], r[1]): r[2]
                for r in self._store.rows(
                    "SELECT agent, kind, COUNT(*) FROM steps WHERE status = 'queued' GROUP BY agent, kind"
                )
            },
            "timers_pending": self._store.scalar("SELECT COUNT(*) FROM timers WHERE status = 'pending'"),
            "sessions": {r[0]: r[1] for r in self._store.rows("SELECT status, COUNT(*) FROM sessions GROUP BY status")},
            "attempts_running": self._store.scalar("SELECT COUNT(*) FROM attempts WHERE status = 'running'"),
            # Sessions deleted, by how (deleted: by a request; expired: by retention).
            "sessions_deleted": {
                r[0].removeprefix("sessions."): r[1]
                for r in self._store.rows(
                    "SELECT name, value FROM counters WHERE name IN ('sessions.deleted', 'sessions.expired')"
                )
            },
            # Pages inside the database file that hold nothing (reclaimed after deletions).
            "free_bytes": self._store.scalar("PRAGMA freelist_count") * self._store.scalar("PRAGMA page_size"),
            # Outcomes recorded (only grows; replicated, so it survives failovers).
            "tool_calls": {
                r[0].removeprefix("tool_calls."): r[1]
                for r in self._store.rows("SELECT name, value FROM counters WHERE name LIKE 'tool_calls.%'")
            },
        }

    @read_transaction
    def logical_dump(self, include_applied_index: bool = True) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, sorted: equal dumps mean equal states."""
        dump = {}
        for (table,) in self._store.rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            rows = [tuple(r) for r in self._store.rows(f"SELECT * FROM {table}")]
            if table == "meta" and not include_applied_index:
                rows = [r for r in rows if r[0] != "applied_index"]
            dump[table] = sorted(rows, key=repr)
        return dump
