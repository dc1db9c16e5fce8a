"""Typed answers of the Client SDK: what DexClient returns instead of bare JSON dicts.

Each result is a frozen dataclass with the fields clients read, and ``raw``: the JSON
object as the server sent it. Nothing the server sends is lost, and a field a newer
server adds is readable in ``raw`` before the SDK names it.

Parsing is lenient where leniency is safe and strict where a field is the point:

- an unknown field is kept in ``raw`` and otherwise ignored;
- a missing optional field (or null) is None, a missing list is empty;
- a required field that is missing, or any field of the wrong type, raises
  :class:`MalformedAnswer` (a :class:`~dex_ha.client.DexError`) naming the field by its
  path in the answer (``turns[0].steps[1].status``).

Which calls get a typed result, and why:

- ``create_session``, ``get_session``, ``wait_until_idle`` -> :class:`Session`: the agent
  snapshot is the richest answer and the one every client reads (status, turns, tool
  calls, pending approvals and questions).
- ``list_sessions`` -> :class:`SessionPage` of :class:`SessionSummary`; ``iter_sessions``
  yields SessionSummary: the cursor and the counts an operator filters on.
- ``send_message`` -> :class:`MessageAccepted`: the message id that the server recorded
  (the one to look for in events) and whether it was a repeat.
- ``cluster`` -> :class:`ClusterView` with :class:`Member` rows.
- ``approve``, ``deny``, ``answer``, ``cancel``, ``reconcile`` keep returning the JSON dict:
  they are acknowledgements (a call id, ``noop``) that callers check for success only; what
  they changed is read from the session (``get_session``) or its events, which are typed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dex_ha.client.connection import DexError
from dex_ha.client.env import DEFAULT_NAMESPACE

T = TypeVar("T")


class MalformedAnswer(DexError):
    """A success answer whose body does not have the documented shape.

    ``field`` is the path of the first field at fault (``turns[0].status``); ``body`` is
    the whole answer. ``status`` is 0: the HTTP exchange itself succeeded.
    """

    def __init__(self, field_path: str, problem: str, body: Any) -> None:
        super().__init__(0, "malformed_answer", f"{field_path}: {problem}", body)
        self.field = field_path


class _Fields:
    """Typed reads of one JSON object of an answer, each naming the field's path on failure."""

    def __init__(self, value: Any, path: str, body: Any) -> None:
        self.path = path
        self.body = body
        if not isinstance(value, dict):
            self._fail(path or "answer", "expected a JSON object", value)
        self.raw: dict[str, Any] = value

    def _fail(self, path: str, problem: str, value: Any) -> None:
        raise MalformedAnswer(path, f"{problem}, got {type(value).__name__}", self.body)

    def _where(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _typed(self, name: str, kinds: type | tuple[type, ...], what: str, *, required: bool) -> Any:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise MalformedAnswer(self._where(name), "required, missing", self.body)
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
            self._fail(self._where(name), f"expected {what}", value)
        return value

    def req_str(self, name: str) -> str:
        value: str = self._typed(name, str, "a string", required=True)
        return value

    def opt_str(self, name: str) -> str | None:
        value: str | None = self._typed(name, str, "a string", required=False)
        return value

    def opt_int(self, name: str) -> int | None:
        value: int | None = self._typed(name, int, "an integer", required=False)
        return value

    def int_or(self, name: str, default: int) -> int:
        value = self.opt_int(name)
        return default if value is None else value

    def req_int(self, name: str) -> int:
        value: int = self._typed(name, int, "an integer", required=True)
        return value

    def opt_bool(self, name: str) -> bool | None:
        value: bool | None = self._typed(name, bool, "a boolean", required=False)
        return value

    def opt_dict(self, name: str) -> dict[str, Any] | None:
        value: dict[str, Any] | None = self._typed(name, dict, "a JSON object", required=False)
        return value

    def value(self, name: str) -> Any:
        return self.raw.get(name)

    def dicts(self, name: str) -> tuple[dict[str, Any], ...]:
        """A list of JSON objects kept as they are (items whose shape is free-form)."""
        return self.items(name, lambda f: f.raw)

    def items(self, name: str, parse: Callable[[_Fields], T]) -> tuple[T, ...]:
        """A list of JSON objects, each parsed by ``parse``; missing or null is empty."""
        values = self._typed(name, list, "a list", required=False) or []
        where = self._where(name)
        return tuple(parse(_Fields(item, f"{where}[{i}]", self.body)) for i, item in enumerate(values))

    def item(self, name: str, parse: Callable[[_Fields], T]) -> T | None:
        value = self.raw.get(name)
        return None if value is None else parse(_Fields(value, self._where(name), self.body))


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _parse(answer: Any, parse: Callable[[_Fields], T]) -> T:
    return parse(_Fields(answer, "", answer))


def acknowledgement(answer: Any) -> dict[str, Any]:
    """The JSON object of an acknowledgement (approve, answer, cancel, delete, reconcile), as
    sent; :class:`MalformedAnswer` when the answer is not an object."""
    return _parse(answer, lambda f: f.raw)


# ---------------------------------------------------------------- sessions


@dataclass(frozen=True)
class Attempt:
    """One attempt of a step: which Worker ran it, in which term, with which idempotency key."""

    number: int
    status: str
    worker_id: str | None
    term: int | None
    idempotency_key: str | None
    started_at: int | None
    ended_at: int | None
    error: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> Attempt:
        return cls(
            number=f.req_int("number"),
            status=f.req_str("status"),
            worker_id=f.opt_str("worker_id"),
            term=f.opt_int("term"),
            idempotency_key=f.opt_str("idempotency_key"),
            started_at=f.opt_int("started_at"),
            ended_at=f.opt_int("ended_at"),
            error=f.opt_str("error"),
            raw=f.raw,
        )


@dataclass(frozen=True)
class Step:
    """One step of a turn (a model call, a tool call, a compaction) and its attempts."""

    step_id: str
    kind: str
    status: str
    call_id: str | None
    attempts_used: int
    max_attempts: int | None
    error: str | None
    attempts: tuple[Attempt, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> Step:
        return cls(
            step_id=f.req_str("step_id"),
            kind=f.req_str("kind"),
            status=f.req_str("status"),
            call_id=f.opt_str("call_id"),
            attempts_used=f.int_or("attempts_used", 0),
            max_attempts=f.opt_int("max_attempts"),
            error=f.opt_str("error"),
            attempts=f.items("attempts", Attempt.parse),
            raw=f.raw,
        )


@dataclass(frozen=True)
class Turn:
    """One turn: the work a user message started, with its steps."""

    turn_id: str
    number: int | None
    status: str
    message_id: str | None
    started_at: int | None
    ended_at: int | None
    error: str | None
    steps: tuple[Step, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> Turn:
        return cls(
            turn_id=f.req_str("turn_id"),
            number=f.opt_int("number"),
            status=f.req_str("status"),
            message_id=f.opt_str("message_id"),
            started_at=f.opt_int("started_at"),
            ended_at=f.opt_int("ended_at"),
            error=f.opt_str("error"),
            steps=f.items("steps", Step.parse),
            raw=f.raw,
        )


@dataclass(frozen=True)
class ToolCallRecord:
    """A tool call of the session: what the model asked, its effect, status and outcome."""

    call_id: str
    turn_id: str | None
    name: str
    arguments: Any
    effect: str | None
    policy: dict[str, Any] | None
    status: str
    output: Any
    error: str | None
    attempt_progress: str | None
    idempotency_key: str | None
    steps: tuple[Step, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> ToolCallRecord:
        return cls(
            call_id=f.req_str("call_id"),
            turn_id=f.opt_str("turn_id"),
            name=f.req_str("name"),
            arguments=f.value("arguments"),
            effect=f.opt_str("effect"),
            policy=f.opt_dict("policy"),
            status=f.req_str("status"),
            output=f.value("output"),
            error=f.opt_str("error"),
            attempt_progress=f.opt_str("attempt_progress"),
            idempotency_key=f.opt_str("idempotency_key"),
            steps=f.items("steps", Step.parse),
            raw=f.raw,
        )


@dataclass(frozen=True)
class PendingApproval:
    """A tool call that waits for ``approve`` or ``deny``."""

    call_id: str
    name: str | None
    arguments: Any
    requested_at: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> PendingApproval:
        return cls(
            call_id=f.req_str("call_id"),
            name=f.opt_str("name"),
            arguments=f.value("arguments"),
            requested_at=f.opt_int("requested_at"),
            raw=f.raw,
        )


@dataclass(frozen=True)
class PendingQuestion:
    """A question (asked by the model or a tool) that waits for ``answer``."""

    question_id: str
    call_id: str | None
    source: str | None
    question: Any
    asked_at: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> PendingQuestion:
        return cls(
            question_id=f.req_str("question_id"),
            call_id=f.opt_str("call_id"),
            source=f.opt_str("source"),
            question=f.value("question"),
            asked_at=f.opt_int("asked_at"),
            raw=f.raw,
        )


@dataclass(frozen=True)
class Session:
    """The agent snapshot of a session (``GET /v1/sessions/{id}``).

    ``history`` items, ``summary``, ``pending_timers`` and ``waiting_messages`` stay JSON
    objects: their shape is the model's conversation, not the SDK's.
    """

    session_id: str
    namespace: str  # "default" from a server older than namespaces
    agent: str
    status: str
    metadata: dict[str, Any] | None
    created_at: int | None
    updated_at: int | None
    waiting_for: str | None
    current_turn: Turn | None
    turns: tuple[Turn, ...]
    history: tuple[dict[str, Any], ...]
    summary: dict[str, Any] | None
    tool_calls: tuple[ToolCallRecord, ...]
    pending_approvals: tuple[PendingApproval, ...]
    pending_questions: tuple[PendingQuestion, ...]
    pending_timers: tuple[dict[str, Any], ...]
    waiting_messages: tuple[dict[str, Any], ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def is_idle(self) -> bool:
        """Idle with no message waiting: nothing more happens until the next message."""
        return self.status == "idle" and not self.waiting_messages

    def tool_call(self, call_id: str) -> ToolCallRecord:
        """The tool call with this id (KeyError when the session has none)."""
        for call in self.tool_calls:
            if call.call_id == call_id:
                return call
        raise KeyError(call_id)

    @classmethod
    def from_answer(cls, answer: Any) -> Session:
        return _parse(answer, cls._parse)

    @classmethod
    def _parse(cls, f: _Fields) -> Session:
        return cls(
            session_id=f.req_str("session_id"),
            namespace=f.opt_str("namespace") or DEFAULT_NAMESPACE,
            agent=f.req_str("agent"),
            status=f.req_str("status"),
            metadata=f.opt_dict("metadata"),
            created_at=f.opt_int("created_at"),
            updated_at=f.opt_int("updated_at"),
            waiting_for=f.opt_str("waiting_for"),
            current_turn=f.item("current_turn", Turn.parse),
            turns=f.items("turns", Turn.parse),
            history=f.dicts("history"),
            summary=f.opt_dict("summary"),
            tool_calls=f.items("tool_calls", ToolCallRecord.parse),
            pending_approvals=f.items("pending_approvals", PendingApproval.parse),
            pending_questions=f.items("pending_questions", PendingQuestion.parse),
            pending_timers=f.dicts("pending_timers"),
            waiting_messages=f.dicts("waiting_messages"),
            raw=f.raw,
        )


@dataclass(frozen=True)
class SessionSummary:
    """One row of ``list_sessions``: a session and the counts an operator acts on."""

    session_id: str
    namespace: str  # "default" from a server older than namespaces
    agent: str
    status: str
    current_turn_id: str | None
    turn_count: int | None
    created_at: int | None
    updated_at: int | None
    metadata: dict[str, Any] | None
    pending_approvals: int
    outcome_unknown_calls: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> SessionSummary:
        return cls(
            session_id=f.req_str("session_id"),
            namespace=f.opt_str("namespace") or DEFAULT_NAMESPACE,
            agent=f.req_str("agent"),
            status=f.req_str("status"),
            current_turn_id=f.opt_str("current_turn_id"),
            turn_count=f.opt_int("turn_count"),
            created_at=f.opt_int("created_at"),
            updated_at=f.opt_int("updated_at"),
            metadata=f.opt_dict("metadata"),
            pending_approvals=f.int_or("pending_approvals", 0),
            outcome_unknown_calls=f.int_or("outcome_unknown_calls", 0),
            raw=f.raw,
        )


@dataclass(frozen=True)
class SessionPage:
    """One page of ``list_sessions``. Pass ``next_after`` as ``after`` for the next page; None: the last."""

    sessions: tuple[SessionSummary, ...]
    next_after: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_answer(cls, answer: Any) -> SessionPage:
        return _parse(
            answer,
            lambda f: cls(
                sessions=f.items("sessions", SessionSummary.parse), next_after=f.opt_str("next_after"), raw=f.raw
            ),
        )


@dataclass(frozen=True)
class MessageAccepted:
    """``send_message``'s 202: the id the message was recorded under; ``duplicate`` for a repeat."""

    session_id: str
    message_id: str
    duplicate: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_answer(cls, answer: Any) -> MessageAccepted:
        return _parse(
            answer,
            lambda f: cls(
                session_id=f.req_str("session_id"),
                message_id=f.req_str("message_id"),
                duplicate=bool(f.opt_bool("duplicate")),
                raw=f.raw,
            ),
        )


# ---------------------------------------------------------------- cluster


@dataclass(frozen=True)
class Member:
    """A cluster member as the answering node sees it (contact and progress are the leader's knowledge)."""

    id: str
    voter: bool
    url: str | None
    match_index: int | None
    last_contact_ms_ago: int | None
    contacted: bool | None
    replication: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, f: _Fields) -> Member:
        return cls(
            id=f.req_str("id"),
            voter=bool(f.opt_bool("voter")),
            url=f.opt_str("url"),
            match_index=f.opt_int("match_index"),
            last_contact_ms_ago=f.opt_int("last_contact_ms_ago"),
            contacted=f.opt_bool("contacted"),
            replication=f.opt_str("replication"),
            raw=f.raw,
        )


@dataclass(frozen=True)
class ClusterView:
    """``GET /v1/cluster``: one node's view of the cluster (every node answers with its own)."""

    node_id: str
    role: str
    term: int | None
    leader_id: str | None
    leader_url: str | None
    commit_index: int | None
    applied_index: int | None
    lease_remaining_ms: int | None
    members: tuple[Member, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_answer(cls, answer: Any) -> ClusterView:
        return _parse(
            answer,
            lambda f: cls(
                node_id=f.req_str("node_id"),
                role=f.req_str("role"),
                term=f.opt_int("term"),
                leader_id=f.opt_str("leader_id"),
                leader_url=f.opt_str("leader_url"),
                commit_index=f.opt_int("commit_index"),
                applied_index=f.opt_int("applied_index"),
                lease_remaining_ms=f.opt_int("lease_remaining_ms"),
                members=f.items("members", Member.parse),
                raw=f.raw,
            ),
        )


__all__ = [
    "Attempt",
    "ClusterView",
    "MalformedAnswer",
    "Member",
    "MessageAccepted",
    "PendingApproval",
    "PendingQuestion",
    "Session",
    "SessionPage",
    "SessionSummary",
    "Step",
    "ToolCallRecord",
    "Turn",
]
