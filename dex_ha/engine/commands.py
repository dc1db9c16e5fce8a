"""Commands: the entries of the Raft log that the engine applies.

Every command is a frozen dataclass that carries `at`, the leader's wall-clock time in
milliseconds when it proposed the command; the engine never reads a clock of its own.
Each is a `Proposal[V]` (results.py): `V` is the value its handler returns.

Wire format (versioned msgpack): ``[COMMAND_FORMAT_VERSION, "<ClassName>", {field: value}]``.
Decoding checks the version, the command name and the type of every field, so a malformed
entry becomes an `invalid` rejection instead of an exception deep inside a handler.
Unknown fields are ignored, so a newer leader may add optional fields.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import msgpack  # type: ignore[import-untyped, unused-ignore]  # msgpack ships no type hints

from dex_ha.engine.results import (
    AgentRegistered,
    ApprovalDecided,
    AttemptCompleted,
    AttemptFailed,
    AttemptsStarted,
    ClusterVersionSet,
    ConsistencyAlarmSet,
    HeldAttemptsFailed,
    MessageSent,
    Proposal,
    QuestionAnswered,
    ResultsReported,
    SessionCreated,
    SessionDeleted,
    SessionsExpired,
    TimerFired,
    ToolCallReconciled,
    TurnCancelled,
)

COMMAND_FORMAT_VERSION = 1

# The state machine's version: what the commands mean. Bump it (docs/architecture.md,
# "The state-machine version") whenever a command type is added, or a command's meaning
# changes, so that a node of an older version never applies it differently. 1 is 0.1.0's.
STATE_MACHINE_VERSION = 2
FIRST_STATE_MACHINE_VERSION = 1  # 0.1.0's, and a cluster's until it moves on

# The namespace of a command that names none: entries written before namespaces existed
# decode with it, and every row they made was migrated to it (schema 4).
DEFAULT_NAMESPACE = "default"


class CommandDecodeError(ValueError):
    """The bytes are not a command this engine understands."""


class UnknownCommand(CommandDecodeError):
    """A command type this code does not have: a newer state machine wrote it (its
    `since`, when the entry says; 0 when it does not)."""

    def __init__(self, name: str, since: int) -> None:
        super().__init__(f"unknown command {name!r}")
        self.name = name
        self.since = since


class NeedsUpgrade(Exception):
    """An entry this node must not apply: its command needs a newer state machine than
    the one this node runs. The node stops (the entry stays unapplied) until it is
    upgraded; applying it as invalid would part its state from the others'."""

    def __init__(self, index: int, command: str, needs: int, runs: int) -> None:
        needs_text = f"state machine v{needs}" if needs else "a newer state machine"
        super().__init__(f"upgrade this node: entry {index} carries {command} of {needs_text}; this node runs v{runs}")
        self.index = index


# ---------------------------------------------------------------- sessions and agents


@dataclass(frozen=True, kw_only=True, slots=True)
class CreateSession(Proposal[SessionCreated]):
    """Create a session; `session_id` None lets the engine derive one from the log index."""

    at: int
    agent: str
    session_id: str | None = None
    metadata: dict[str, Any] | None = None
    namespace: str = DEFAULT_NAMESPACE


@dataclass(frozen=True, kw_only=True, slots=True)
class RegisterAgent(Proposal[AgentRegistered]):
    """Register or change an agent definition (`PUT /v1/agents/{name}`) in `namespace`.

    `may_lower_approval` False (a Worker's token): a tool that needed approval must keep
    needing it; only an admin may lower that. Entries written before the rule decode with
    True, so they apply as they did.
    """

    at: int
    name: str
    definition: dict[str, Any]
    namespace: str = DEFAULT_NAMESPACE
    may_lower_approval: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class SendMessage(Proposal[MessageSent]):
    """A user message. `mode="steer"` delivers it at the next model call of a running turn."""

    at: int
    session_id: str
    text: str
    message_id: str | None = None
    mode: Literal["queue", "steer"] = "queue"
    namespace: str = DEFAULT_NAMESPACE  # the caller's: a session of another is not found


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelTurn(Proposal[TurnCancelled]):
    """Cancel the session's running turn."""

    at: int
    session_id: str
    reason: str | None = None
    namespace: str = DEFAULT_NAMESPACE  # the caller's: a session of another is not found


@dataclass(frozen=True, kw_only=True, slots=True)
class DeleteSession(Proposal[SessionDeleted]):
    """Delete an ended session and every row of it (`DELETE /v1/sessions/{id}`). A session
    with a running turn is refused (conflict): cancel the turn first."""

    at: int
    session_id: str
    namespace: str = DEFAULT_NAMESPACE  # the caller's: a session of another is not found


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpireSessions(Proposal[SessionsExpired]):
    """Retention: delete each of `session_ids` that is still idle and whose last activity
    (its updated_at) is before `cutoff_at`; the others stay. The active node picks the ids
    (queries.expired_sessions) and sets the cutoff from its clock: the engine reads none."""

    at: int
    cutoff_at: int
    session_ids: list[str]


# ---------------------------------------------------------------- attempts


@dataclass(frozen=True, kw_only=True, slots=True)
class Handout:
    """One queued step handed to one Worker by the leader of `term`.

    `token_secret` is the random part of the task token (see dex_ha.server.task_tokens):
    the leader draws it, because the engine may not, and the engine stores it with the
    attempt. None only in entries written before schema 2; no token matches such an attempt.
    """

    step_id: str
    worker_id: str
    term: int
    token_secret: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class StartAttempts(Proposal[AttemptsStarted]):
    """Hand-outs of named steps, many in one entry. The leader answered Worker polls with
    these until it proposed `StartQueuedAttempts` instead; the engine still applies them,
    as a log or snapshot may hold them."""

    at: int
    handouts: list[Handout] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class StartQueuedAttempts(Proposal[AttemptsStarted]):
    """A Worker poll answered: up to `len(token_secrets)` steps from the heads of the
    `agents`' queues (agent by agent, each in queue order, whichever session) go to
    `worker_id` in `term`, the n-th with `token_secrets[n]`.

    Which steps is decided when the entry applies, as for eager dispatch (CompleteAttempt).
    A hand-out that named its steps when proposed could lose every one of them to the
    results applied before it, which take the head of the same queue: under a backlog that
    kept polls waiting while steps queued.
    """

    at: int
    worker_id: str
    term: int
    agents: list[str]
    token_secrets: list[str]
    namespace: str = DEFAULT_NAMESPACE  # the Worker's: agents of another namespace are skipped


@dataclass(frozen=True, kw_only=True, slots=True)
class CompleteAttempt(Proposal[AttemptCompleted]):
    """A Worker's result for attempt (`step_id`, `attempt`, `term`).

    Eager dispatch: with `next_max` > 0 the same entry also hands out to `next_worker_id`
    (in this term) up to `next_max` steps from the head of the agent's queue, in queue
    order, of whichever session (no queued step is overtaken). It saves the Worker a poll
    and the log an entry for each step, also while a backlog waits. The n-th of those
    hand-outs gets `next_token_secrets[n]` (the leader draws `next_max` of them; the list
    is empty only in entries written before schema 2).
    """

    at: int
    step_id: str
    attempt: int
    term: int
    result: dict[str, Any]
    next_worker_id: str | None = None
    next_max: int = 0
    next_token_secrets: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class FailAttempt(Proposal[AttemptFailed]):
    """A Worker's failure report; `retryable=False` uses up every attempt left.

    `not_started=True`: the Worker never called the tool function for this attempt (unknown
    tool, arguments refused). The attempt records NOT_STARTED; the call counts as not run
    only while no attempt of any of its steps may have run (see steps.fail_attempt).
    Entries written before the field existed decode with False.
    """

    at: int
    step_id: str
    attempt: int
    term: int
    error: str
    retryable: bool = True
    not_started: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportItem:
    """One report of a `ReportResults`: a result (`outcome="complete"`) or a failure
    (`outcome="fail"`) for attempt (`step_id`, `attempt`, `term`), as CompleteAttempt and
    FailAttempt carry them."""

    step_id: str
    attempt: int
    term: int
    outcome: Literal["complete", "fail"]
    result: dict[str, Any] | None = None
    error: str = ""
    retryable: bool = True
    not_started: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportResults(Proposal[ResultsReported]):
    """The reports of one Worker channel frame, applied in order in one entry, each on its
    own: each is fenced as its CompleteAttempt or FailAttempt would be, and a refused one
    changes nothing and leaves the others be (its refusal is in the entry's value).

    Then, with `next_token_secrets`, the same entry hands `next_worker_id` up to that many
    steps from the heads of the `next_agents`' queues, as a StartQueuedAttempts would: the
    channel's credit, spent without a poll and without a second entry.
    """

    at: int
    reports: list[ReportItem]
    next_worker_id: str | None = None
    next_term: int = 0
    next_agents: list[str] = field(default_factory=list)
    next_token_secrets: list[str] = field(default_factory=list)
    namespace: str = DEFAULT_NAMESPACE


@dataclass(frozen=True, kw_only=True, slots=True)
class HeartbeatLost(Proposal[AttemptFailed]):
    """The leader stopped hearing from the Worker: the attempt fails NOT_COMPLETED.

    `silent_ms`: how long before `at` the Worker was last heard from (its last heartbeat, or
    its channel's close). A retry's backoff counts from then, so that much of it has passed
    already: a Worker found dead after the channel's 1 s grace retries at once, not 1 s later.
    0 in entries written before the field existed (the whole backoff, as then)."""

    at: int
    step_id: str
    attempt: int
    term: int
    silent_ms: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptTimedOut(Proposal[AttemptFailed]):
    """The attempt ran past its start_to_close timeout: it fails NOT_COMPLETED."""

    at: int
    step_id: str
    attempt: int
    term: int


@dataclass(frozen=True, kw_only=True, slots=True)
class FailHeldAttempts(Proposal[HeldAttemptsFailed]):
    """Takeover: every attempt handed out in a term before `term` fails NOT_COMPLETED."""

    at: int
    term: int


# ---------------------------------------------------------------- waits


@dataclass(frozen=True, kw_only=True, slots=True)
class FireTimer(Proposal[TimerFired]):
    at: int
    timer_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class DecideApproval(Proposal[ApprovalDecided]):
    """Approve or deny a tool call that waits in AwaitToolApproval."""

    at: int
    session_id: str
    call_id: str
    approved: bool
    reason: str | None = None
    namespace: str = DEFAULT_NAMESPACE  # the caller's: a session of another is not found


@dataclass(frozen=True, kw_only=True, slots=True)
class AnswerQuestion(Proposal[QuestionAnswered]):
    at: int
    session_id: str
    question_id: str
    answer: Any
    namespace: str = DEFAULT_NAMESPACE  # the caller's: a session of another is not found


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconcileToolCall(Proposal[ToolCallReconciled]):
    """An operator settles an `outcome_unknown` call as succeeded or failed."""

    at: int
    session_id: str
    call_id: str
    outcome: Literal["succeeded", "failed"]
    result: Any = None
    error: str | None = None
    namespace: str = DEFAULT_NAMESPACE  # the caller's: a session of another is not found


# ---------------------------------------------------------------- replica checks


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckStateHash(Proposal[None]):
    """Every node hashes its state as of this entry's index (the consistency check): the
    engine ends its transaction right after this entry, so that a reader can see exactly
    that state (Engine.on_state_check). It changes nothing."""

    at: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SetConsistencyAlarm(Proposal[ConsistencyAlarmSet]):
    """Raise (or clear) the consistency alarm of a member whose state hash at `index`
    differed from the majority's: replicated, so every node knows it, and a member under
    the alarm never becomes the leader."""

    at: int
    node_id: str
    index: int
    raised: bool
    found: str = ""  # the member's hash
    expected: str = ""  # the majority's


# ---------------------------------------------------------------- the cluster


@dataclass(frozen=True, kw_only=True, slots=True)
class SetClusterVersion(Proposal[ClusterVersionSet]):
    """Every member runs state machine `version` or newer: from this entry on, the leader
    may propose the commands of that version (COMMAND_SINCE). The leader proposes it once
    the last member is upgraded; it only ever goes up."""

    at: int
    version: int


Command = (
    CreateSession
    | RegisterAgent
    | SendMessage
    | CancelTurn
    | DeleteSession
    | ExpireSessions
    | StartAttempts
    | StartQueuedAttempts
    | CompleteAttempt
    | FailAttempt
    | ReportResults
    | HeartbeatLost
    | AttemptTimedOut
    | FailHeldAttempts
    | FireTimer
    | DecideApproval
    | AnswerQuestion
    | ReconcileToolCall
    | CheckStateHash
    | SetConsistencyAlarm
    | SetClusterVersion
)

COMMAND_TYPES: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(Command)}

# The state-machine version that added each command type; those not named here are of
# version 1 (0.1.0). The leader proposes none newer than the cluster's version, and the
# entry of one names it (SINCE_FIELD), so that a node without the type can say which
# version it needs.
COMMAND_SINCE: dict[type, int] = {ReportResults: 2, SetClusterVersion: 2, DeleteSession: 2, ExpireSessions: 2}
SINCE_FIELD = "_sm"  # in a command's fields; short: ReportResults is on the hot path


def as_command(proposal: Proposal[object]) -> Command:
    """`proposal` as a member of the `Command` union, which every Proposal subclass is
    (only commands are Proposals); TypeError for anything else."""
    if COMMAND_TYPES.get(type(proposal).__name__) is not type(proposal):
        raise TypeError(f"not a command: {proposal!r}")
    return typing.cast(Command, proposal)  # the union names every Proposal subclass


def command_since(cls: type) -> int:
    """The state-machine version that added command type `cls`."""
    return COMMAND_SINCE.get(cls, FIRST_STATE_MACHINE_VERSION)


Validator = Callable[[Any, str], Any]  # (value, where) -> the value to use; raises on misfit

# ---------------------------------------------------------------- encoding


def encode_command(cmd: Command) -> bytes:
    """The log entry for `cmd`."""
    name = type(cmd).__name__
    if name not in COMMAND_TYPES:
        raise TypeError(f"not a command: {cmd!r}")
    fields = _to_plain(cmd)
    since = COMMAND_SINCE.get(type(cmd))
    if since is not None:
        fields[SINCE_FIELD] = since
    data: bytes = msgpack.packb([COMMAND_FORMAT_VERSION, name, fields], use_bin_type=True)
    return data


def decode_command(data: bytes) -> Command:
    """The command in a log entry; raises CommandDecodeError for anything malformed."""
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CommandDecodeError(f"not msgpack: {exc}") from None
    if not (isinstance(envelope, list) and len(envelope) == 3):
        raise CommandDecodeError("a command is [version, name, fields]")
    version, name, fields = envelope
    if isinstance(version, int) and version > COMMAND_FORMAT_VERSION:  # a newer writer's format
        raise UnknownCommand(f"{str(name)[:100]} (command format {version})", 0)
    if version != COMMAND_FORMAT_VERSION:
        raise CommandDecodeError(f"unsupported command format version {version!r}")
    cls = COMMAND_TYPES.get(name) if isinstance(name, str) else None
    if cls is None and isinstance(name, str):
        since = fields.get(SINCE_FIELD) if isinstance(fields, dict) else None
        raise UnknownCommand(name[:100], since if isinstance(since, int) else 0)
    if cls is None:
        raise CommandDecodeError(f"unknown command {name!r}")
    command: Command = _build(cls, fields, name)
    return command


def _to_plain(obj: Any) -> Any:
    # Only commands and Handout are dataclasses here; everything else is plain JSON-like
    # data (results, answers) that msgpack takes as it is. A type lookup is much cheaper
    # than dataclasses.is_dataclass()/fields() on every value of a hot-path command.
    names = _FIELD_NAMES.get(type(obj))
    if names is not None:
        return {name: _to_plain(getattr(obj, name)) for name in names}
    if type(obj) is list:
        return [_to_plain(x) for x in obj]
    return obj


def _build(cls: type, fields: Any, where: str) -> Any:
    if not isinstance(fields, dict):
        raise CommandDecodeError(f"{where}: fields must be a map")
    kwargs = {}
    for name, required, validate, field_where in _FIELD_VALIDATORS[cls]:
        if name in fields:
            kwargs[name] = validate(fields[name], field_where)
        elif required:
            raise CommandDecodeError(f"{where}: missing field {name!r}")
    return cls(**kwargs)


def _validator(hint: Any) -> Validator:
    """A function that checks a decoded value against the type hint `hint`.

    Built once per field at import, so decoding does no typing introspection.
    """
    origin = typing.get_origin(hint)
    if hint is Any:
        return _check_json
    if origin in (Union, types.UnionType):
        options = [_validator(option) for option in typing.get_args(hint)]
        return lambda value, where: _first_fit(options, value, where, hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        return lambda value, where: value if value in allowed else _fail(where, f"must be one of {allowed}")
    if origin is list:
        item = _validator(typing.get_args(hint)[0])
        return lambda value, where: (
            [item(v, f"{where}[]") for v in value] if isinstance(value, list) else _fail(where, "must be a list")
        )
    if origin is dict:
        return lambda value, where: (
            _check_json(value, where) if isinstance(value, dict) else _fail(where, "must be a map")
        )
    if hint is type(None):
        return lambda value, where: None if value is None else _fail(where, "must be null")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda value, where: _build(hint, value, where)
    if hint is int:
        # type(...) is int: a bool is not an int here
        return lambda value, where: value if type(value) is int else _fail(where, "must be int")
    return lambda value, where: value if isinstance(value, hint) else _fail(where, f"must be {hint.__name__}")


def _first_fit(options: list[Validator], value: Any, where: str, hint: Any) -> Any:
    for validate in options:
        try:
            return validate(value, where)
        except CommandDecodeError:
            continue
    raise CommandDecodeError(f"{where}: {value!r} does not fit {hint}")


def _fail(where: str, why: str) -> Any:
    raise CommandDecodeError(f"{where}: {why}")


def _check_json(value: Any, where: str) -> Any:
    """Free-form values (results, answers, metadata) are stored as JSON: they must fit it."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return value
    if kind is list:
        for v in value:
            _check_json(v, where)
        return value
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise CommandDecodeError(f"{where}: map keys must be strings")
            _check_json(v, where)
        return value
    raise CommandDecodeError(f"{where}: {kind.__name__} is not JSON")


def _field_validators(cls: type) -> list[tuple[str, bool, Validator, str]]:
    hints = typing.get_type_hints(cls)
    return [
        (
            f.name,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            _validator(hints[f.name]),
            f"{cls.__name__}.{f.name}",
        )
        for f in dataclasses.fields(cls)
    ]


# Per class: (field, required, validator, where); computed once at import, never mutated.
_FIELD_VALIDATORS: dict[type, list[tuple[str, bool, Validator, str]]] = {
    cls: _field_validators(cls) for cls in [*COMMAND_TYPES.values(), Handout, ReportItem]
}

# Field names per dataclass, for encoding; computed once at import, never mutated.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in [*COMMAND_TYPES.values(), Handout, ReportItem]
}
