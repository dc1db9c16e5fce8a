"""The Worker protocol's types, shared by the server and the Worker SDK.

One `Task` (what a Worker is handed, on HTTP and on the channel alike) and one `Report`
(what a Worker says about an attempt: its result or its failure), plus the frames of the
Worker channel (`GET /v1/worker/channel`, a WebSocket) and their encoding. The contract in
plain words is docs/worker-protocol.md; this module is its code. It imports nothing of
dex_ha at run time, so the engine, the server and the SDKs can all use it (it names the
engine's `StartedAttempt` for the type checker only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped, unused-ignore]  # msgpack ships no type hints

if TYPE_CHECKING:  # not an import at run time (the SDKs use this module without the engine)
    from dex_ha.engine.results import StartedAttempt

CHANNEL_PATH = "/v1/worker/channel"
PROTOCOL_VERSION = 1
ENCODINGS = ("msgpack", "json")  # msgpack frames are binary, JSON frames are text

# Frame types. Server -> Worker:
WELCOME = "welcome"  # the first frame: the channel is open
TASKS = "tasks"  # attempts handed to this Worker (committed before they are sent)
ACKS = "acks"  # one ack per report of a `results` frame, once its entry applied
CANCEL = "cancel"  # stop working on an attempt
# Worker -> server:
RESULTS = "results"  # reports, stream deltas, credit, the last `tasks` seq received
CREDIT = "credit"  # how many more tasks the Worker will take

# Why the server asks a Worker to stop an attempt (the `reason` of a `cancel` frame).
CANCEL_REQUESTED = "cancel_requested"  # the turn was cancelled: report a failure, then stop
NOT_CURRENT = "not_current"  # the attempt failed or moved on: send nothing more for it

# WebSocket close codes (besides 1000 normal closure and 1001 going away).
CLOSE_NOT_ACTIVE = 4000  # this node is no longer the active node: reconnect (to the active one)
CLOSE_INVALID_FRAME = 4400  # a frame that does not decode or does not fit the contract
CLOSE_POLICY = 4403  # the Worker may not do what the frame asks (reserved)

# The most reports (and deltas) in one `results` frame, and tasks in one `tasks` frame.
MAX_BATCH = 256


class ProtocolError(ValueError):
    """A frame that does not fit the contract; the message names the field."""


@dataclass(frozen=True, slots=True)
class Task:
    """One attempt handed to a Worker: what it runs, with the token it reports with."""

    session_id: str
    turn_id: str
    step_id: str
    kind: str
    attempt: int
    idempotency_key: str | None  # contract: "{session_id}:{call_id}" for tool steps
    input: dict[str, Any]
    heartbeat_timeout_ms: int
    deadline_ms: int | None  # absolute leader wall-clock ms: hand-out + start_to_close
    agent: str | None
    task_token: str = ""  # set by the server at hand-out; names the attempt in every report
    # The W3C trace context of the attempt's span, when the server exports traces: the
    # Worker SDK runs the tool or model call in a context continued from it.
    traceparent: str | None = None

    def as_json(self) -> dict[str, Any]:
        # Shallow on purpose: asdict() deep-copies the whole history of a RunModel task.
        body = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if body["traceparent"] is None:  # only sent when traces are exported
            del body["traceparent"]
        return body

    @classmethod
    def from_handout(cls, started: StartedAttempt, heartbeat_timeout_ms: int) -> Task:
        """The task of a hand-out as the apply that started it reports it (an element of
        `started` in a StartAttempts, StartQueuedAttempts, CompleteAttempt or ReportResults
        result): its input was built there, where the state is warm, so nothing is read.
        The server sets `task_token` afterwards."""
        return cls(
            session_id=started.session_id,
            turn_id=started.turn_id,
            step_id=started.step_id,
            kind=started.kind,
            attempt=started.attempt,
            idempotency_key=started.idempotency_key,
            input=started.input,
            heartbeat_timeout_ms=heartbeat_timeout_ms,
            deadline_ms=started.deadline_at,
            agent=started.agent,
        )

    @classmethod
    def from_json(cls, raw: Any) -> Task:
        """Parse one task of a poll answer or a `tasks` frame; ValueError naming the bad field."""
        if not isinstance(raw, dict):
            raise ValueError(f"a task must be an object, got {type(raw).__name__}")
        for name in ("task_token", "session_id", "turn_id", "step_id", "kind"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise ValueError(f"task.{name} must be a non-empty string")
        if not isinstance(raw.get("input"), dict):
            raise ValueError("task.input must be an object")
        traceparent = raw.get("traceparent")
        if traceparent is not None and not isinstance(traceparent, str):
            raise ValueError("task.traceparent must be a string when present")
        return cls(
            task_token=raw["task_token"],
            session_id=raw["session_id"],
            turn_id=raw["turn_id"],
            step_id=raw["step_id"],
            kind=raw["kind"],
            attempt=int(raw.get("attempt") or 1),
            input=raw["input"],
            heartbeat_timeout_ms=int(raw.get("heartbeat_timeout_ms") or 30_000),
            agent=raw.get("agent"),
            idempotency_key=raw.get("idempotency_key"),
            deadline_ms=raw.get("deadline_ms"),
            traceparent=traceparent,
        )

    def __str__(self) -> str:
        return f"{self.kind} step {self.step_id} attempt {self.attempt}"


@dataclass(frozen=True, slots=True)
class Report:
    """What a Worker says about one attempt: `complete` with `result`, or `fail` with
    `error` (`retryable`, `not_started` as on `POST .../fail`)."""

    task_token: str
    outcome: str  # "complete" | "fail"
    result: Any = None
    error: str = ""
    retryable: bool = True
    not_started: bool = False

    def as_json(self) -> dict[str, Any]:
        if self.outcome == "complete":
            return {"task_token": self.task_token, "outcome": "complete", "result": self.result}
        body: dict[str, Any] = {
            "task_token": self.task_token,
            "outcome": "fail",
            "error": self.error,
            "retryable": self.retryable,
        }
        if self.not_started:
            body["not_started"] = True
        return body

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Report:
        if not isinstance(raw, dict):
            raise ProtocolError(f"{where} must be a map")
        token = raw.get("task_token")
        if not isinstance(token, str) or not token:
            raise ProtocolError(f"{where}.task_token must be a non-empty string")
        outcome = raw.get("outcome")
        if outcome == "complete":
            if not isinstance(raw.get("result"), dict):
                raise ProtocolError(f"{where}.result must be a map")
            return cls(token, "complete", result=raw["result"])
        if outcome == "fail":
            error, retryable, not_started = raw.get("error"), raw.get("retryable", True), raw.get("not_started", False)
            if not isinstance(error, str):
                raise ProtocolError(f"{where}.error must be a string")
            if not isinstance(retryable, bool) or not isinstance(not_started, bool):
                raise ProtocolError(f"{where}.retryable and .not_started must be booleans")
            return cls(token, "fail", error=error, retryable=retryable, not_started=not_started)
        raise ProtocolError(f"{where}.outcome must be 'complete' or 'fail'")


@dataclass(frozen=True, slots=True)
class Deltas:
    """Live stream deltas (and progress) of one running attempt."""

    task_token: str
    deltas: list[dict[str, Any]]

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Deltas:
        if not isinstance(raw, dict) or not isinstance(raw.get("task_token"), str):
            raise ProtocolError(f"{where} must be a map with a task_token")
        deltas = raw.get("deltas")
        if not isinstance(deltas, list) or not all(isinstance(d, dict) for d in deltas):
            raise ProtocolError(f"{where}.deltas must be a list of maps")
        return cls(raw["task_token"], deltas)


@dataclass(frozen=True, slots=True)
class WorkerFrame:
    """A decoded Worker -> server frame (`results` or `credit`; both may carry every field)."""

    reports: list[Report]
    deltas: list[Deltas]
    credit: int  # more tasks the Worker will take, on top of what it said before
    ack: int | None  # the highest `tasks` seq the Worker has received


def parse_worker_frame(frame: dict[str, Any]) -> WorkerFrame:
    """Check a Worker's frame against the contract; ProtocolError naming the field."""
    kind = frame.get("type")
    if kind not in (RESULTS, CREDIT):
        raise ProtocolError(f"type must be {RESULTS!r} or {CREDIT!r}, got {kind!r}")
    reports, deltas = frame.get("results", []), frame.get("deltas", [])
    if not isinstance(reports, list) or not isinstance(deltas, list):
        raise ProtocolError("results and deltas must be lists")
    if len(reports) > MAX_BATCH or len(deltas) > MAX_BATCH:
        raise ProtocolError(f"a frame holds at most {MAX_BATCH} results and {MAX_BATCH} deltas")
    credit, ack = frame.get("credit", 0), frame.get("ack")
    if type(credit) is not int or not 0 <= credit <= 10_000:
        raise ProtocolError("credit must be an integer from 0 to 10000")
    if ack is not None and type(ack) is not int:
        raise ProtocolError("ack must be an integer")
    return WorkerFrame(
        [Report.from_json(r, f"results[{i}]") for i, r in enumerate(reports)],
        [Deltas.from_json(d, f"deltas[{i}]") for i, d in enumerate(deltas)],
        credit,
        ack,
    )


def encode_frame(frame: dict[str, Any], encoding: str) -> bytes | str:
    """A frame as msgpack bytes (a binary WebSocket message) or JSON text (a text one)."""
    if encoding == "json":
        return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
    data: bytes = msgpack.packb(frame, use_bin_type=True)
    return data


def decode_frame(data: bytes | str, encoding: str) -> dict[str, Any]:
    """A received frame as a map with a `type`; ProtocolError for anything else."""
    try:
        if encoding == "json":
            if not isinstance(data, str):
                raise ProtocolError("this channel speaks JSON: frames must be text messages")
            frame = json.loads(data)
        else:
            if not isinstance(data, bytes):
                raise ProtocolError("this channel speaks msgpack: frames must be binary messages")
            frame = msgpack.unpackb(data, raw=False)
    except ProtocolError:
        raise
    except Exception as exc:  # json and msgpack raise several unrelated types
        raise ProtocolError(f"the frame does not decode as {encoding}: {exc}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ProtocolError("a frame must be a map with a string `type`")
    return frame
