"""dex_ha.engine — the deterministic session state machine.

Public API (what a server and the Raft node call):

- ``Engine(path, durable=True)`` — open or create the SQLite state at `path`.
  - ``apply(index, data) -> ApplyResult`` and ``apply_batch([(index, data), ...])``:
    apply committed log entries; never raise on a bad command (``ok=False`` with
    ``code``, ``reason``, ``http_status``); idempotent by index.
  - ``applied_index()``, ``snapshot() -> bytes``, ``restore(data, index)``, ``close()``.
  - ``reader() -> EngineReader``: the queries below through a connection of their own, for
    a thread other than the one that applies (the node's HTTP side).
  - Leader queries: ``count_queued(agent, limit)``, ``running_attempts(term_lt=None)``,
    ``attempt_state(step_id, attempt, term, token_secret)`` (a Worker's report: whose
    attempt, current? cancel? None unless the token's secret matches),
    ``next_timer()``, ``due_timers(now_ms, limit)``, ``task_for(step_id)``.
  - API queries: ``get_agent_snapshot(session_id)``, ``sessions_page(agent, status, limit,
    after, max_bytes=None) -> Page``, ``events(session_id, after, limit)`` (and
    ``events_page``: the same with a byte budget, as a ``Page``), ``stats()``; ``expired_sessions(cutoff_at, limit)`` (retention: idle sessions
    last active before the cutoff, oldest first); ``logical_dump()`` and
    ``queued_steps(agent, limit)`` (the queue in order) for tests and benches;
  ``agent_namespace(name)`` (the namespace an agent name belongs to).
- Commands (dataclasses, each with ``at`` in leader wall-clock ms) and their wire format:
  ``encode_command(cmd) -> bytes``, ``decode_command(data) -> Command``. Each command is a
  ``Proposal[V]``: ``V`` is the dataclass of its result's ``value`` (``results.py``), and
  ``Propose`` types a proposer that returns ``ApplyResult[V]`` for it.
- ``MAX_EXPIRED_PER_ENTRY``: the most sessions one ExpireSessions may name.
- ``STEP_KINDS``: the step-kind table (kind → StepKindSpec); kind name constants.
- ``ApplyResult`` (generic over its value), ``StartedAttempt`` (a hand-out, as the leader
  reads it) and the results the server looks for; ``TOOL_CALL_NOT_RUN_ERROR_PREFIX`` lives
  in ``dex_ha``.

The engine never imports ``dex_ha.server`` or ``dex_ha.raft``.
"""

from dex_ha.engine.commands import (
    DEFAULT_NAMESPACE,
    FIRST_STATE_MACHINE_VERSION,
    STATE_MACHINE_VERSION,
    AnswerQuestion,
    AttemptTimedOut,
    CancelTurn,
    CheckStateHash,
    Command,
    CommandDecodeError,
    CompleteAttempt,
    CreateSession,
    DecideApproval,
    DeleteSession,
    ExpireSessions,
    FailAttempt,
    FailHeldAttempts,
    FireTimer,
    Handout,
    HeartbeatLost,
    NeedsUpgrade,
    ReconcileToolCall,
    RegisterAgent,
    ReportItem,
    ReportResults,
    SendMessage,
    SetClusterVersion,
    SetConsistencyAlarm,
    StartAttempts,
    StartQueuedAttempts,
    as_command,
    command_since,
    decode_command,
    encode_command,
)
from dex_ha.engine.engine import Engine, EngineReader, copy_to_bytes
from dex_ha.engine.handlers import MAX_EXPIRED_PER_ENTRY
from dex_ha.engine.kinds import STEP_KINDS, StepKind, StepKindSpec, idempotency_key
from dex_ha.engine.queries import (
    AttemptState,
    Page,
    QueuedStep,
    RunningAttempt,
    Timer,
    same_token_secret,
)
from dex_ha.engine.results import (
    ApplyResult,
    ClusterVersionSet,
    ConsistencyAlarmSet,
    Proposal,
    Propose,
    StartedAttempt,
    TimerFired,
)
from dex_ha.session_protocol import SessionEvent
from dex_ha.worker_protocol import Task

__all__ = [
    "DEFAULT_NAMESPACE",
    "MAX_EXPIRED_PER_ENTRY",
    "FIRST_STATE_MACHINE_VERSION",
    "STATE_MACHINE_VERSION",
    "STEP_KINDS",
    "StepKind",
    "AnswerQuestion",
    "ApplyResult",
    "ClusterVersionSet",
    "ConsistencyAlarmSet",
    "Proposal",
    "Propose",
    "StartedAttempt",
    "TimerFired",
    "as_command",
    "AttemptState",
    "AttemptTimedOut",
    "CancelTurn",
    "CheckStateHash",
    "Command",
    "CommandDecodeError",
    "CompleteAttempt",
    "ReportItem",
    "ReportResults",
    "CreateSession",
    "DecideApproval",
    "DeleteSession",
    "Engine",
    "EngineReader",
    "ExpireSessions",
    "FailAttempt",
    "FailHeldAttempts",
    "FireTimer",
    "Handout",
    "HeartbeatLost",
    "NeedsUpgrade",
    "Page",
    "QueuedStep",
    "ReconcileToolCall",
    "RegisterAgent",
    "RunningAttempt",
    "SendMessage",
    "SessionEvent",
    "SetClusterVersion",
    "SetConsistencyAlarm",
    "StartAttempts",
    "StartQueuedAttempts",
    "StepKindSpec",
    "Task",
    "Timer",
    "command_since",
    "copy_to_bytes",
    "decode_command",
    "encode_command",
    "idempotency_key",
    "same_token_secret",
]
