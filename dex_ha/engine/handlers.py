"""One handler per command: check the command against the state (raising `Rejected`),
then hand over to the step, call and turn logic. A handler returns `Handled`; the engine
turns it into an `ApplyResult`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from dex_ha import session_protocol as events
from dex_ha.engine import calls, outcomes, steps, turns
from dex_ha.engine.agents import lowered_approvals, normalize_definition, policy_changes
from dex_ha.engine.commands import (
    FIRST_STATE_MACHINE_VERSION,
    AnswerQuestion,
    AttemptTimedOut,
    CancelTurn,
    CheckStateHash,
    CompleteAttempt,
    CreateSession,
    DecideApproval,
    DeleteSession,
    ExpireSessions,
    FailAttempt,
    FailHeldAttempts,
    FireTimer,
    HeartbeatLost,
    ReconcileToolCall,
    RegisterAgent,
    ReportItem,
    ReportResults,
    SendMessage,
    SetClusterVersion,
    SetConsistencyAlarm,
    StartAttempts,
    StartQueuedAttempts,
)
from dex_ha.engine.context import ApplyContext, NeedsSavepoints
from dex_ha.engine.kinds import StepKind
from dex_ha.engine.results import (
    HTTP_STATUS_BY_CODE,
    AgentRegistered,
    ApprovalDecided,
    AttemptCompleted,
    AttemptFailed,
    AttemptsStarted,
    ClusterVersionSet,
    ConsistencyAlarmSet,
    HandoutRefused,
    HeldAttemptsFailed,
    MessageSent,
    QuestionAnswered,
    Rejected,
    ReportAnswer,
    ResultsReported,
    SessionCreated,
    SessionDeleted,
    SessionsExpired,
    StartedAttempt,
    TimerFired,
    ToolCallReconciled,
    TurnCancelled,
)
from dex_ha.engine.statuses import AttemptStatus, MessageStatus, SessionStatus, TimerStatus
from dex_ha.engine.store import CLUSTER_VERSION, CONSISTENCY_ALARM_PREFIX, FENCED_TERM, to_json

T = TypeVar("T")
V = TypeVar("V")

MAX_ID_LENGTH = 200
MAX_EAGER_HANDOUTS = 16
# Hand-outs one StartQueuedAttempts may carry: an entry is applied whole, so it stays short
# (the leader proposes fewer, see HANDOUTS_PER_PROPOSAL in dex_ha.server.leader).
MAX_QUEUED_HANDOUTS = 256
# Sessions one ExpireSessions may delete: an entry is applied whole, and a session may hold
# thousands of rows, so retention deletes in entries of this many (see dex_ha.server.retention).
MAX_EXPIRED_PER_ENTRY = 100


@dataclass(frozen=True, slots=True)
class Handled(Generic[V]):
    """What a handler returns: `value` is the typed value of its command (results.py),
    which the engine hands to the proposer in the entry's ApplyResult."""

    value: V
    noop: bool = False  # accepted, but it changed nothing (a repeat)
    # Sessions deleted by the entry: their event streams must look again (and end).
    deleted: tuple[str, ...] = ()


# ---------------------------------------------------------------- sessions and agents


def create_session(ctx: ApplyContext, cmd: CreateSession) -> Handled[SessionCreated]:
    session_id = cmd.session_id if cmd.session_id is not None else f"s{ctx.index}"
    _check_id(session_id, "session_id")
    _check_id(cmd.agent, "agent")
    _check_id(cmd.namespace, "namespace")
    existing = ctx.store.session(session_id)
    if existing is not None:
        if existing["namespace"] != cmd.namespace:  # ids are unique across namespaces
            raise Rejected("conflict", f"session_id: {session_id!r} is taken; choose another id")
        if existing["agent"] != cmd.agent:
            raise Rejected("conflict", f"agent: session {session_id} belongs to agent {existing['agent']}")
        # Omitted metadata matches any: a retry or a "create or attach" need not repeat it.
        if cmd.metadata is not None and existing["metadata"] != to_json(cmd.metadata):
            raise Rejected("conflict", f"metadata: session {session_id} exists with other metadata")
        return Handled(SessionCreated(session_id, created=False), noop=True)
    _check_agent_owner(ctx, cmd.agent, cmd.namespace, "agent")
    ctx.store.insert(
        "sessions",
        session_id=session_id,
        namespace=cmd.namespace,
        agent=cmd.agent,
        status=SessionStatus.IDLE,
        metadata=None if cmd.metadata is None else to_json(cmd.metadata),
        created_at=ctx.at,
        updated_at=ctx.at,
    )
    ctx.store.session_created(session_id)
    ctx.emit(session_id, events.SessionCreated(agent=cmd.agent, metadata=cmd.metadata))
    return Handled(SessionCreated(session_id, created=True))


def register_agent(ctx: ApplyContext, cmd: RegisterAgent) -> Handled[AgentRegistered]:
    """The answer's `policy_changes` (agents.policy_changes) let the server log each change
    of a tool's policy; a caller that may not lower approval is refused before any."""
    _check_id(cmd.name, "name")
    _check_id(cmd.namespace, "namespace")
    _check_agent_owner(ctx, cmd.name, cmd.namespace, "name")
    normalized = normalize_definition(cmd.definition)
    definition = to_json(normalized)
    row = ctx.store.row("SELECT definition, version FROM agents WHERE name = ?", (cmd.name,))
    if row is not None and row["definition"] == definition:
        return Handled(AgentRegistered(cmd.name, row["version"], changed=False), noop=True)
    changes = policy_changes(ctx.store.parsed_definition(row["definition"]) if row else None, normalized)
    lowered = lowered_approvals(changes)
    if lowered and not cmd.may_lower_approval:
        raise Rejected(
            "forbidden",
            f"tools: tool {lowered[0]!r} of agent {cmd.name!r} needs approval; only an admin token may "
            "remove the tool or its approval",
        )
    version = 1 if row is None else row["version"] + 1
    ctx.store.conn.execute(
        "INSERT INTO agents(name, definition, version, updated_at, namespace) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET definition = excluded.definition, "
        "version = excluded.version, updated_at = excluded.updated_at",
        (cmd.name, definition, version, ctx.at, cmd.namespace),
    )
    ctx.store.agent_changed(cmd.name)
    return Handled(AgentRegistered(cmd.name, version, changed=True, policy_changes=changes))


def _check_agent_owner(ctx: ApplyContext, name: str, namespace: str, field: str) -> None:
    """An agent name belongs to one namespace (Store.agent_namespace): the Workers of that
    namespace alone run its steps, so no other may register it or start sessions of it."""
    owner = ctx.store.agent_namespace(name)
    if owner is not None and owner != namespace:
        raise Rejected("forbidden", f"{field}: agent {name!r} belongs to another namespace")


def send_message(ctx: ApplyContext, cmd: SendMessage) -> Handled[MessageSent]:
    session = ctx.store.require_session(cmd.session_id, cmd.namespace)
    message_id = cmd.message_id if cmd.message_id is not None else f"m{ctx.index}"
    _check_id(message_id, "message_id")
    if not cmd.text:
        raise Rejected("invalid", "text must not be empty")
    existing = ctx.store.message(cmd.session_id, message_id)
    if existing is not None:
        if existing["text"] != cmd.text:
            raise Rejected("conflict", f"text: message {message_id} was already sent with another text")
        if existing["mode"] != cmd.mode:
            raise Rejected(
                "conflict", f"mode: message {message_id} was already sent with mode {existing['mode']} (got {cmd.mode})"
            )
        return Handled(MessageSent(message_id, duplicate=True), noop=True)
    seq = session["message_count"] + 1
    ctx.store.update("sessions", {"session_id": cmd.session_id}, message_count=seq, updated_at=ctx.at)
    ctx.store.insert(
        "messages",
        session_id=cmd.session_id,
        message_id=message_id,
        seq=seq,
        text=cmd.text,
        mode=cmd.mode,
        status=MessageStatus.WAITING,
        at=ctx.at,
    )
    ctx.emit(cmd.session_id, events.MessageReceived(message_id=message_id, text=cmd.text, mode=cmd.mode))
    turns.start_next_turn_if_idle(ctx, session)  # the message changed none of what it reads
    return Handled(MessageSent(message_id, duplicate=False))


def cancel_turn(ctx: ApplyContext, cmd: CancelTurn) -> Handled[TurnCancelled]:
    session = ctx.store.require_session(cmd.session_id, cmd.namespace)
    turn_id = session["current_turn_id"]
    if turn_id is None:
        return Handled(TurnCancelled(None), noop=True)
    outcomes.cancel_turn(ctx, cmd.session_id, turn_id, cmd.reason)
    return Handled(TurnCancelled(turn_id))


def delete_session(ctx: ApplyContext, cmd: DeleteSession) -> Handled[SessionDeleted]:
    """Only an ended session (idle: no running turn) may go: deleting a running one would
    drop the record of tool calls that may still be running on a Worker. Cancel it first."""
    session = ctx.store.require_session(cmd.session_id, cmd.namespace)
    if session["status"] != SessionStatus.IDLE:
        raise Rejected(
            "conflict",
            f"session {cmd.session_id} is {session['status']} (turn {session['current_turn_id']}); "
            "cancel the turn first (POST /v1/sessions/{session_id}/cancel), then delete the session",
        )
    ctx.store.delete_session(cmd.session_id)
    ctx.bump("sessions.deleted")
    return Handled(SessionDeleted(cmd.session_id), deleted=(cmd.session_id,))


def expire_sessions(ctx: ApplyContext, cmd: ExpireSessions) -> Handled[SessionsExpired]:
    """Each named session that is still idle and last active before the cutoff is deleted;
    one that became active meanwhile, or is gone, stays as it is (never a refusal)."""
    if len(cmd.session_ids) > MAX_EXPIRED_PER_ENTRY:
        raise Rejected("invalid", f"session_ids: at most {MAX_EXPIRED_PER_ENTRY} sessions per entry")
    deleted = []
    for session_id in dict.fromkeys(cmd.session_ids):  # a repeated id counts once
        session = ctx.store.session(session_id)
        if session is None or session["status"] != SessionStatus.IDLE or session["updated_at"] >= cmd.cutoff_at:
            continue
        ctx.store.delete_session(session_id)
        deleted.append(session_id)
    if deleted:
        ctx.bump("sessions.expired", len(deleted))
    return Handled(SessionsExpired(tuple(deleted)), noop=not deleted, deleted=tuple(deleted))


# ---------------------------------------------------------------- attempts


def start_attempts(ctx: ApplyContext, cmd: StartAttempts) -> Handled[AttemptsStarted]:
    """Each hand-out starts or is refused on its own; a refused one changes nothing."""
    if not cmd.handouts:
        raise Rejected("invalid", "handouts must not be empty")
    started: list[StartedAttempt] = []
    refused: list[HandoutRefused] = []
    expired: list[str] = []
    fenced_term = ctx.store.meta(FENCED_TERM)
    for h in cmd.handouts:
        try:
            attempt = outcomes.hand_out(ctx, h.step_id, h.worker_id, h.term, fenced_term, h.token_secret)
        except Rejected as r:
            refused.append(HandoutRefused(h.step_id, r.code, r.reason))
            continue
        if attempt is None:  # its retry window was over: the step failed instead
            expired.append(h.step_id)
        else:
            started.append(attempt)
    if not started and not expired:
        first = refused[0]
        raise Rejected(first.code, "no hand-out started: " + "; ".join(r.reason for r in refused))
    return Handled(AttemptsStarted(tuple(started), tuple(refused), tuple(expired)))


def start_queued_attempts(ctx: ApplyContext, cmd: StartQueuedAttempts) -> Handled[AttemptsStarted]:
    """A poll's hand-outs, taken from the heads of its agents' queues now (see the command).
    Fewer steps than asked may be queued by now (results took them): the rest is not handed
    out, and `started` may be empty."""
    if not 1 <= len(cmd.token_secrets) <= MAX_QUEUED_HANDOUTS:
        raise Rejected("invalid", f"token_secrets must hold 1 to {MAX_QUEUED_HANDOUTS} secrets")
    if not cmd.agents:
        raise Rejected("invalid", "agents must not be empty")
    for agent in cmd.agents:
        _check_id(agent, "agents")
    # A Worker runs the steps of its namespace's agents only (the leader asks for no other).
    agents = [agent for agent in cmd.agents if ctx.store.agent_namespace(agent) == cmd.namespace]
    started = _hand_out_from_queue_heads(ctx, agents, cmd.worker_id, cmd.term, cmd.token_secrets)
    return Handled(AttemptsStarted(started))


def complete_attempt(ctx: ApplyContext, cmd: CompleteAttempt) -> Handled[AttemptCompleted]:
    digest = hashlib.sha256(to_json(cmd.result).encode()).hexdigest()
    if not 0 <= cmd.next_max <= MAX_EAGER_HANDOUTS:
        raise Rejected("invalid", f"next_max must be between 0 and {MAX_EAGER_HANDOUTS}")
    if cmd.next_token_secrets and len(cmd.next_token_secrets) != cmd.next_max:
        raise Rejected("invalid", "next_token_secrets must hold one secret per step of next_max")
    try:
        step = steps.complete_attempt(ctx, cmd.step_id, cmd.attempt, cmd.term, digest)
    except Rejected:
        # A Worker retrying a completion that did commit gets ok, not 409.
        done = ctx.store.attempt(cmd.step_id, cmd.attempt)
        if (
            done is not None
            and done["status"] == AttemptStatus.COMPLETED
            and done["term"] == cmd.term
            and done["result_digest"] == digest
        ):
            return Handled(AttemptCompleted(cmd.step_id, cmd.attempt), noop=True)
        raise
    started: tuple[StartedAttempt, ...] = ()
    if step is not None:  # None: the turn was cancelled while the attempt ran
        RESULT_HANDLERS[step["kind"]](ctx, step, cmd.result)
        if cmd.next_max and cmd.next_worker_id:
            # None: an entry written before schema 2, whose hand-outs have no secret.
            token_secrets: Sequence[str | None] = cmd.next_token_secrets or [None] * cmd.next_max
            # Eager dispatch: the head of the agent's queue goes to the Worker that just
            # completed one of its steps. While a backlog waits, each result still brings
            # a step (no poll, no second entry).
            started = _hand_out_from_queue_heads(ctx, [step["agent"]], cmd.next_worker_id, cmd.term, token_secrets)
    return Handled(AttemptCompleted(cmd.step_id, cmd.attempt, started))


def _hand_out_from_queue_heads(
    ctx: ApplyContext, agents: Sequence[str], worker_id: str, term: int, token_secrets: Sequence[str | None]
) -> tuple[StartedAttempt, ...]:
    """Hand the steps at the heads of the agents' queues (agent by agent, each in queue
    order, whichever session they belong to) to `worker_id`, one token secret each; the
    hand-outs that started. Eager dispatch and polls both take from the head, so first in,
    first out holds for every session and neither can take a step the other took.

    Stops at the first step that does not start: a refused one (a fenced term) changed
    nothing and waits for a later hand-out; one whose retry window was over has failed
    instead (and left the queue)."""
    fenced_term = ctx.store.meta(FENCED_TERM)
    started: list[StartedAttempt] = []
    for agent in agents:
        rows = ctx.store.rows(
            "SELECT step_id FROM steps WHERE agent = ? AND status = 'queued' ORDER BY queue_seq LIMIT ?",
            (agent, len(token_secrets) - len(started)),
        )
        for row in rows:
            try:
                attempt = outcomes.hand_out(
                    ctx, row["step_id"], worker_id, term, fenced_term, token_secrets[len(started)]
                )
            except Rejected:
                return tuple(started)
            if attempt is None:
                return tuple(started)
            started.append(attempt)
        if len(started) == len(token_secrets):
            break
    return tuple(started)


# What a completed task step does with its result, by kind.
RESULT_HANDLERS: dict[str, Callable[[ApplyContext, Any, dict[str, Any]], None]] = {
    StepKind.RUN_MODEL: calls.record_model_response,
    StepKind.COMPACT_CONTEXT: turns.record_summary,
    StepKind.CALL_TOOL: calls.record_tool_result,
    StepKind.CALL_SINGLE_ATTEMPT_TOOL: calls.record_tool_result,
    StepKind.POLL_TOOL_TASK: calls.record_poll_result,
}


def fail_attempt(ctx: ApplyContext, cmd: FailAttempt) -> Handled[AttemptFailed]:
    step = steps.current_attempt(ctx, cmd.step_id, cmd.attempt, cmd.term)
    outcomes.fail_attempt(
        ctx, step, cmd.attempt, cmd.error or "the Worker reported a failure", cmd.retryable, not_started=cmd.not_started
    )
    return Handled(AttemptFailed(cmd.step_id, cmd.attempt))


def report_results(ctx: ApplyContext, cmd: ReportResults) -> Handled[ResultsReported]:
    """A channel frame's reports, in order, each fenced and refused on its own; then the
    hand-out of the frame's credit (see the command). The value holds one answer per
    report (HTTP status 200, or the refusal's status, code and reason) and the hand-outs
    that started."""
    if not 1 <= len(cmd.reports) + len(cmd.next_token_secrets) <= 2 * MAX_QUEUED_HANDOUTS:
        raise Rejected("invalid", "a ReportResults carries 1 to 512 reports and token secrets")
    answers = []
    for item in cmd.reports:
        _, refused = _on_its_own(ctx, partial(_apply_report, ctx, cmd.at, item))
        answers.append(ReportAnswer(200) if refused is None else _refusal(refused))
    started: tuple[StartedAttempt, ...] = ()
    if cmd.next_token_secrets and cmd.next_worker_id is not None:
        hand_out = StartQueuedAttempts(
            at=cmd.at,
            worker_id=cmd.next_worker_id,
            term=cmd.next_term,
            agents=cmd.next_agents,
            token_secrets=cmd.next_token_secrets,
            namespace=cmd.namespace,
        )
        handled, _ = _on_its_own(ctx, partial(start_queued_attempts, ctx, hand_out))
        started = handled.value.started if handled is not None else ()
    return Handled(ResultsReported(tuple(answers), started))


def _apply_report(ctx: ApplyContext, at: int, item: ReportItem) -> None:
    """One report, through the very handler its HTTP route's command goes through."""
    if item.outcome == "complete":
        if item.result is None:
            raise Rejected("invalid", "result: a complete report carries a result")
        complete_attempt(
            ctx, CompleteAttempt(at=at, step_id=item.step_id, attempt=item.attempt, term=item.term, result=item.result)
        )
    else:
        fail_attempt(
            ctx,
            FailAttempt(
                at=at,
                step_id=item.step_id,
                attempt=item.attempt,
                term=item.term,
                error=item.error,
                retryable=item.retryable,
                not_started=item.not_started,
            ),
        )


def _on_its_own(ctx: ApplyContext, part: Callable[[], T]) -> tuple[T | None, Rejected | None]:
    """Apply one part of an entry so that its refusal undoes only its own changes and
    events; (what it returned, None) or (None, its refusal). On the fast path (no savepoints) a part that wrote before
    refusing makes the engine apply the batch again with savepoints (NeedsSavepoints), so
    both paths reach the same state on every node."""
    events, counts, changes = len(ctx.events), dict(ctx.counts), ctx.store.conn.total_changes
    try:
        if not ctx.careful:
            return part(), None
        with ctx.store.savepoint("part"):
            return part(), None
    except Rejected as refused:
        if not ctx.careful and ctx.store.conn.total_changes != changes:
            raise NeedsSavepoints() from None
        del ctx.events[events:]
        ctx.counts = counts
        return None, refused


def _refusal(refused: Rejected) -> ReportAnswer:
    return ReportAnswer(HTTP_STATUS_BY_CODE[refused.code], refused.code, refused.reason)


def heartbeat_lost(ctx: ApplyContext, cmd: HeartbeatLost) -> Handled[AttemptFailed]:
    step = steps.current_attempt(ctx, cmd.step_id, cmd.attempt, cmd.term)
    outcomes.fail_attempt(
        ctx, step, cmd.attempt, "the Worker stopped sending heartbeats", True, backoff_spent_ms=max(0, cmd.silent_ms)
    )
    return Handled(AttemptFailed(cmd.step_id, cmd.attempt))


def attempt_timed_out(ctx: ApplyContext, cmd: AttemptTimedOut) -> Handled[AttemptFailed]:
    step = steps.current_attempt(ctx, cmd.step_id, cmd.attempt, cmd.term)
    outcomes.fail_attempt(ctx, step, cmd.attempt, "the attempt ran past its start_to_close timeout", True)
    return Handled(AttemptFailed(cmd.step_id, cmd.attempt))


def fail_held_attempts(ctx: ApplyContext, cmd: FailHeldAttempts) -> Handled[HeldAttemptsFailed]:
    by_kind = outcomes.fail_held_attempts(ctx, cmd.term)
    failed = sum(by_kind.values())
    return Handled(HeldAttemptsFailed(failed, by_kind), noop=failed == 0)


# ---------------------------------------------------------------- waits


def fire_timer(ctx: ApplyContext, cmd: FireTimer) -> Handled[TimerFired]:
    timer = ctx.store.require_timer(cmd.timer_id)
    if timer["status"] != TimerStatus.PENDING:  # fires once; a cancelled one never fires
        return Handled(TimerFired(cmd.timer_id, timer["status"]), noop=True)
    if cmd.at < timer["due_at"]:
        raise Rejected("conflict", f"timer {cmd.timer_id} is not due until {timer['due_at']}")
    outcomes.fire_timer(ctx, timer)
    return Handled(TimerFired(cmd.timer_id, TimerStatus.FIRED, timer["purpose"]))


def decide_approval(ctx: ApplyContext, cmd: DecideApproval) -> Handled[ApprovalDecided]:
    ctx.store.require_session(cmd.session_id, cmd.namespace)
    changed = calls.decide_approval(ctx, cmd.session_id, cmd.call_id, cmd.approved, cmd.reason)
    return Handled(ApprovalDecided(cmd.call_id, cmd.approved), noop=not changed)


def answer_question(ctx: ApplyContext, cmd: AnswerQuestion) -> Handled[QuestionAnswered]:
    ctx.store.require_session(cmd.session_id, cmd.namespace)
    changed = calls.answer_question(ctx, cmd.session_id, cmd.question_id, cmd.answer)
    return Handled(QuestionAnswered(cmd.question_id), noop=not changed)


def reconcile_tool_call(ctx: ApplyContext, cmd: ReconcileToolCall) -> Handled[ToolCallReconciled]:
    ctx.store.require_session(cmd.session_id, cmd.namespace)
    changed = calls.reconcile(ctx, cmd.session_id, cmd.call_id, cmd.outcome, cmd.result, cmd.error)
    return Handled(ToolCallReconciled(cmd.call_id, cmd.outcome), noop=not changed)


# ---------------------------------------------------------------- helpers


# ---------------------------------------------------------------- replica checks


def check_state_hash(ctx: ApplyContext, cmd: CheckStateHash) -> Handled[None]:
    return Handled(None, noop=True)  # the engine ends the transaction here (Engine.on_state_check)


def set_consistency_alarm(ctx: ApplyContext, cmd: SetConsistencyAlarm) -> Handled[ConsistencyAlarmSet]:
    _check_id(cmd.node_id, "node_id")
    key = CONSISTENCY_ALARM_PREFIX + cmd.node_id
    if cmd.raised:
        ctx.store.set_meta(key, cmd.index)
    else:
        ctx.store.conn.execute("DELETE FROM meta WHERE key = ?", (key,))
    return Handled(ConsistencyAlarmSet(cmd.node_id, cmd.raised, cmd.index))


def set_cluster_version(ctx: ApplyContext, cmd: SetClusterVersion) -> Handled[ClusterVersionSet]:
    # Never down: a member of the older version may be gone for good by now. (A version
    # above this node's never gets here: the engine stops on it, NeedsUpgrade.)
    current = ctx.store.meta(CLUSTER_VERSION, FIRST_STATE_MACHINE_VERSION)
    if cmd.version <= current:
        return Handled(ClusterVersionSet(current), noop=True)
    ctx.store.set_meta(CLUSTER_VERSION, cmd.version)
    return Handled(ClusterVersionSet(cmd.version))


def _check_id(value: str, field: str) -> None:
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise Rejected("invalid", f"{field} must be 1 to {MAX_ID_LENGTH} printable characters")


# Each handler returns the value its command's Proposal names (test_handlers_return_their_commands_value).
HANDLERS: dict[type, Callable[[ApplyContext, Any], Handled[Any]]] = {
    CreateSession: create_session,
    RegisterAgent: register_agent,
    SendMessage: send_message,
    CancelTurn: cancel_turn,
    DeleteSession: delete_session,
    ExpireSessions: expire_sessions,
    StartAttempts: start_attempts,
    StartQueuedAttempts: start_queued_attempts,
    CompleteAttempt: complete_attempt,
    FailAttempt: fail_attempt,
    ReportResults: report_results,
    HeartbeatLost: heartbeat_lost,
    AttemptTimedOut: attempt_timed_out,
    FailHeldAttempts: fail_held_attempts,
    FireTimer: fire_timer,
    DecideApproval: decide_approval,
    AnswerQuestion: answer_question,
    ReconcileToolCall: reconcile_tool_call,
    CheckStateHash: check_state_hash,
    SetConsistencyAlarm: set_consistency_alarm,
    SetClusterVersion: set_cluster_version,
}
