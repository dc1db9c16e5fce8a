"""A fake leader for engine tests: proposes commands at increasing log indexes, with a
clock it moves by hand, and keeps the log so tests can replay it into another engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from dex_ha.engine import (
    AnswerQuestion,
    ApplyResult,
    AttemptTimedOut,
    CancelTurn,
    CompleteAttempt,
    CreateSession,
    DecideApproval,
    Engine,
    FailAttempt,
    FailHeldAttempts,
    FireTimer,
    Handout,
    HeartbeatLost,
    Proposal,
    ReconcileToolCall,
    RegisterAgent,
    SendMessage,
    StartAttempts,
    Task,
    Timer,
    as_command,
    encode_command,
)
from dex_ha.session_protocol import SessionSnapshot, ToolCallView

V = TypeVar("V")

AGENT = "helper"

# SQL that takes a schema-4 database back to schema 3 (no namespaces), for migration tests;
# a test going back further runs it first.
UNDO_SCHEMA_4 = (
    "DROP INDEX sessions_by_namespace; ALTER TABLE sessions DROP COLUMN namespace; "
    "ALTER TABLE agents DROP COLUMN namespace; PRAGMA user_version=3;"
)

DEFAULT_TOOLS: list[dict[str, Any]] = [
    {"name": "lookup", "effect": "read"},
    {"name": "put_item", "effect": "idempotent_write"},
    {"name": "send_email", "effect": "write"},
    {"name": "wire_money", "effect": "write", "approval": True},
    {"name": "search_inline", "effect": "read", "inline": True},
    {"name": "build", "effect": "idempotent_write"},
]


class Driver:
    def __init__(self, path: str, *, term: int = 1, at: int = 1_700_000_000_000) -> None:
        self.path = path
        self.engine = Engine(path, durable=False)
        self.index = self.engine.applied_index()
        self.term = term
        self.at = at
        self.log: list[tuple[int, bytes]] = []
        self.secrets: dict[str, str] = {}  # step id -> the token secret of its latest hand-out

    # ------------------------------------------------------------- log

    def apply(self, cmd: Proposal[V]) -> ApplyResult[V]:
        return self.apply_raw(encode_command(as_command(cmd)))

    def apply_raw(self, data: bytes) -> ApplyResult[Any]:
        self.index += 1
        self.log.append((self.index, data))
        return self.engine.apply(self.index, data)

    def ok(self, cmd: Proposal[V]) -> ApplyResult[V]:
        result = self.apply(cmd)
        assert result.ok, result
        return result

    def tick(self, ms: int) -> None:
        self.at += ms

    # ------------------------------------------------------------- failures

    def takeover(self) -> ApplyResult:
        """A new leader (new term) fails every attempt held by the old one."""
        self.term += 1
        return self.ok(FailHeldAttempts(at=self.at, term=self.term))

    def restart(self) -> ApplyResult:
        """The single node restarts on its data dir: reopen the store, new term, takeover."""
        self.engine.close()
        self.engine = Engine(self.path, durable=False)
        assert self.engine.applied_index() == self.index
        return self.takeover()

    def worker_kill(self, step_id: str) -> ApplyResult:
        attempt = self.running(step_id)
        return self.ok(HeartbeatLost(at=self.at, step_id=step_id, attempt=attempt.attempt, term=attempt.term))

    def fail_by(self, failure: str, step_id: str) -> None:
        """Fail the running attempt of `step_id` the way `failure` would."""
        if failure == "worker_kill":
            self.worker_kill(step_id)
        elif failure == "server_restart":
            self.restart()
        elif failure == "takeover":
            self.takeover()
        else:
            raise ValueError(failure)

    # ------------------------------------------------------------- setup

    def register(self, tools: list[dict[str, Any]] | None = None, name: str = AGENT, **more: Any) -> None:
        self.ok(RegisterAgent(at=self.at, name=name, definition={"tools": tools or DEFAULT_TOOLS, **more}))

    def create(self, session_id: str = "s1", agent: str = AGENT) -> None:
        self.ok(CreateSession(at=self.at, session_id=session_id, agent=agent))

    def send(self, text: str = "hello", session_id: str = "s1", **kw: Any) -> ApplyResult:
        return self.ok(SendMessage(at=self.at, session_id=session_id, text=text, **kw))

    # ------------------------------------------------------------- leader services

    def queued(self, agent: str = AGENT) -> list[Any]:
        return self.engine.queued_steps(agent, 1000)

    def queued_kinds(self, agent: str = AGENT) -> list[str]:
        return [s.kind for s in self.queued(agent)]

    def next_step(self, kind: str | None = None, call_id: str | None = None) -> str:
        for s in self.queued():
            if (kind is None or s.kind == kind) and (call_id is None or s.call_id == call_id):
                return s.step_id
        raise AssertionError(f"no queued step of kind {kind} / call {call_id}: {self.queued()}")

    def hand_out(self, kind: str | None = None, call_id: str | None = None, worker: str = "w1") -> str:
        step_id = self.next_step(kind, call_id)
        secret = self.secrets[step_id] = f"secret-{self.index + 1}"  # the leader's random draw, made up
        self.ok(
            StartAttempts(
                at=self.at, handouts=[Handout(step_id=step_id, worker_id=worker, term=self.term, token_secret=secret)]
            )
        )
        return step_id

    def running(self, step_id: str) -> Any:
        found = [a for a in self.engine.running_attempts() if a.step_id == step_id]
        assert len(found) == 1, found
        return found[0]

    def complete(self, step_id: str, result: dict[str, Any], **eager: Any) -> ApplyResult:
        """Complete the running attempt of `step_id`; `eager`: CompleteAttempt's next_* fields."""
        return self.apply(self.complete_command(step_id, result, **eager))

    def complete_command(self, step_id: str, result: dict[str, Any], **eager: Any) -> CompleteAttempt:
        """The CompleteAttempt of the running attempt of `step_id`, not applied."""
        a = self.running(step_id)
        return CompleteAttempt(at=self.at, step_id=step_id, attempt=a.attempt, term=a.term, result=result, **eager)

    def refused(self, cmd: Any) -> ApplyResult:
        """Apply `cmd`, which the engine must refuse without changing anything but the
        applied index; the refusal."""
        before = self.engine.logical_dump(include_applied_index=False)
        result = self.apply(cmd)
        assert not result.ok, result
        assert self.engine.logical_dump(include_applied_index=False) == before
        return result

    def fail(self, step_id: str, error: str = "boom", retryable: bool = True) -> ApplyResult:
        a = self.running(step_id)
        return self.ok(
            FailAttempt(at=self.at, step_id=step_id, attempt=a.attempt, term=a.term, error=error, retryable=retryable)
        )

    def time_out(self, step_id: str) -> ApplyResult:
        a = self.running(step_id)
        return self.ok(AttemptTimedOut(at=self.at, step_id=step_id, attempt=a.attempt, term=a.term))

    def fire_due(self) -> int:
        fired = 0
        for t in self.engine.due_timers(self.at, 1000):
            self.ok(FireTimer(at=self.at, timer_id=t.timer_id))
            fired += 1
        return fired

    def model(
        self, step_id: str, content: str = "", calls: list[tuple[str, str, dict]] | None = None, **extra: Any
    ) -> ApplyResult:
        tool_calls = [{"id": cid, "name": name, "arguments": args} for cid, name, args in (calls or [])]
        result = self.complete(step_id, {"content": content, "tool_calls": tool_calls, **extra})
        assert result.ok, result
        return result

    def run_model(self, content: str = "", calls: list[tuple[str, str, dict]] | None = None) -> str:
        step_id = self.hand_out("RunModel")
        self.model(step_id, content, calls)
        return step_id

    def approve(
        self, call_id: str, approved: bool = True, reason: str | None = None, session_id: str = "s1"
    ) -> ApplyResult:
        return self.apply(
            DecideApproval(at=self.at, session_id=session_id, call_id=call_id, approved=approved, reason=reason)
        )

    def answer(self, question_id: str, answer: Any, session_id: str = "s1") -> ApplyResult:
        return self.apply(AnswerQuestion(at=self.at, session_id=session_id, question_id=question_id, answer=answer))

    def cancel(self, session_id: str = "s1") -> ApplyResult:
        return self.ok(CancelTurn(at=self.at, session_id=session_id))

    def reconcile(
        self, call_id: str, outcome: Literal["succeeded", "failed"], session_id: str = "s1", **kw: Any
    ) -> ApplyResult:
        return self.apply(ReconcileToolCall(at=self.at, session_id=session_id, call_id=call_id, outcome=outcome, **kw))

    # ------------------------------------------------------------- reads

    def snap(self, session_id: str = "s1") -> SessionSnapshot:
        snapshot = self.engine.get_agent_snapshot(session_id)
        assert snapshot is not None, f"no session {session_id}"
        return snapshot

    def task(self, step_id: str) -> Task:
        """The task a worker is given for the step, which must be queued or running."""
        task = self.engine.task_for(step_id)
        assert task is not None, f"no task for step {step_id}"
        return task

    def next_timer(self) -> Timer:
        """The timer due first; there must be one."""
        timer = self.engine.next_timer()
        assert timer is not None, "no timer is set"
        return timer

    def call(self, call_id: str, session_id: str = "s1") -> ToolCallView:
        return next(c for c in self.snap(session_id)["tool_calls"] if c["call_id"] == call_id)

    def turn_status(self, session_id: str = "s1") -> str:
        return self.snap(session_id)["turns"][-1]["status"]


def running_model_step(path: Path, worker: str = "w1") -> tuple[Driver, str]:
    """A session whose first RunModel step is handed out to `worker`; (driver, that step's id)."""
    d = Driver(str(path))
    d.register()
    d.create()
    d.send()
    return d, d.hand_out("RunModel", worker=worker)
