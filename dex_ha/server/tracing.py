"""OpenTelemetry traces of turns, with the optional extra `otel` (`pip install -e '.[otel]'`).

Each turn is a trace: a `turn` span, one span per step under it, and one span per attempt
under its step (node, term, Worker, outcome, attempt_progress). Failover, takeover and
reconcile are span events. The spans are built on the active node from the session events
that its applies add (the engine knows nothing of tracing), and exported when they end, with
the times the events carry (the active node's clock, replicated): a turn that spans a
failover is ended by the new active node. Trace and span ids are derived from the session,
turn, step and attempt ids, so every node gives a span the same ids, and the Worker SDK
continues the attempt's span from the `traceparent` of its task.

Nothing here runs unless the OpenTelemetry SDK and OTLP exporter are installed (imported
once, below) and an endpoint is set by the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT
or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true turns it off). Otherwise
`span_sink_from_environment` returns None, and the node's only cost is a None check per
hand-out.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dex_ha.engine import EngineReader, SessionEvent, StartedAttempt
from dex_ha.engine.statuses import AttemptStatus, CallStatus, TurnStatus
from dex_ha.engine.store import EVENT_ID_SHIFT

try:  # the optional extra, imported once
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    OTLPSpanExporter = None  # type: ignore[misc,assignment]

log = logging.getLogger("dex_ha.server.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SAMPLED = 0x01
NS_PER_MS = 1_000_000


# ---------------------------------------------------------------- ids (no OpenTelemetry needed)


def _hashed_id(n_bytes: int, *parts: object) -> int:
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=n_bytes).digest()
    return int.from_bytes(digest, "big") or 1  # an all-zero id is invalid


def trace_id(session_id: str, turn_id: str) -> int:
    """A turn's trace id (128 bits), the same on every node."""
    return _hashed_id(16, "trace", session_id, turn_id)


def turn_span_id(session_id: str, turn_id: str) -> int:
    return _hashed_id(8, "turn", session_id, turn_id)


def step_span_id(session_id: str, step_id: str) -> int:
    return _hashed_id(8, "step", session_id, step_id)


def attempt_span_id(session_id: str, step_id: str, attempt: int) -> int:
    return _hashed_id(8, "attempt", session_id, step_id, attempt)


# The fields of a log line about an attempt (`extra=`): `--log-json` writes them out, so an
# operator can find a session's lines, and go from a line to its trace.
LOG_FIELDS = ("session_id", "turn_id", "step_id", "attempt", "trace_id")


def attempt_log_fields(session_id: str, turn_id: str, step_id: str, attempt: int) -> dict[str, Any]:
    """The `extra=` of a log line about an attempt (the trace id is derived, so it is there
    whether or not traces are exported)."""
    return {
        "session_id": session_id,
        "turn_id": turn_id,
        "step_id": step_id,
        "attempt": attempt,
        "trace_id": f"{trace_id(session_id, turn_id):032x}",
    }


def traceparent(started: StartedAttempt) -> str:
    """The W3C traceparent of a hand-out (an element of an apply's `started`): the attempt's
    span, which the Worker SDK makes the parent of the tool's or model's own spans."""
    sid = started.session_id
    return (
        f"00-{trace_id(sid, started.turn_id):032x}-"
        f"{attempt_span_id(sid, started.step_id, started.attempt):016x}-{SAMPLED:02x}"
    )


# ---------------------------------------------------------------- export


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """An OTLP endpoint is set and the SDK is not disabled (the standard variables)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


class SpanSink:
    """Where finished spans go: a batch processor in front of the OTLP/HTTP exporter (which
    reads its endpoint, headers and timeout from the OTEL_EXPORTER_OTLP_* variables)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.resource = Resource.create({"service.instance.id": node_id}).merge(
            Resource({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "dex-ha"})
        )
        self.scope = InstrumentationScope("dex_ha.server")
        self._processor: SpanProcessor = BatchSpanProcessor(OTLPSpanExporter())

    def export(self, span: ReadableSpan) -> None:
        self._processor.on_end(span)

    def close(self) -> None:
        self._processor.shutdown()  # sends what is queued


def span_sink_from_environment(node_id: str, environ: Mapping[str, str] = os.environ) -> SpanSink | None:
    """A SpanSink when tracing is wanted and the extra is installed; None otherwise (a line
    in the log says why when an endpoint is set but the extra is missing)."""
    if not tracing_wanted(environ):
        return None
    if OTLPSpanExporter is None:
        log.warning(
            "an OTLP endpoint is set but the OpenTelemetry packages are not installed: "
            "no traces (install them from the dex-ha clone: pip install -e '.[otel]')"
        )
        return None
    log.info("node %s exports traces over OTLP/HTTP", node_id)
    return SpanSink(node_id)


# ---------------------------------------------------------------- spans from session events


@dataclass
class _Attempt:
    number: int
    term: int
    worker_id: str
    start_at: int
    events: list[Any] = field(default_factory=list)


@dataclass
class _Step:
    step_id: str
    turn_id: str
    kind: str
    call_id: str | None
    start_at: int
    attempts: dict[int, _Attempt] = field(default_factory=dict)


@dataclass
class _Turn:
    turn_id: str
    start_at: int
    opened_before_term: bool
    events: list[Any] = field(default_factory=list)


@dataclass
class _SessionSpans:
    """The open spans of one session, rebuilt from its events."""

    cursor: int = 0  # the id of the last event read
    turn: _Turn | None = None
    steps: dict[str, _Step] = field(default_factory=dict)
    step_of_call: dict[str, str] = field(default_factory=dict)
    # call_id -> turn_id of the calls that ended outcome_unknown: an operator may reconcile
    # one after its turn ended, and the reconcile shows in that turn's trace.
    unknown_calls: dict[str, str] = field(default_factory=dict)


class TurnTracer:
    """The spans of one leader term. `sessions_changed(ids)` reads the sessions' new events
    (a session first seen this term is read from its first event, to rebuild what is open)
    and exports every span that ends in an entry of this term; spans that ended before were
    the previous active node's to export."""

    def __init__(self, sink: SpanSink, reads: EngineReader, term: int, first_index: int) -> None:
        self.sink = sink
        self.reads = reads
        self.term = term
        # `first_index`: the entry of this term's takeover; it and every later entry are ours.
        self.first_event_id = first_index << EVENT_ID_SHIFT
        self._sessions: dict[str, _SessionSpans] = {}

    def sessions_changed(self, session_ids: Iterable[str]) -> None:
        for session_id in session_ids:
            try:
                self._read(session_id)
            except Exception:  # tracing must never break the node
                log.exception(
                    "tracing: could not read the events of session %s", session_id, extra={"session_id": session_id}
                )

    def known(self) -> list[str]:
        """The sessions read so far (to read again when which ones changed is not known)."""
        return list(self._sessions)

    def _read(self, session_id: str) -> None:
        state = self._sessions.setdefault(session_id, _SessionSpans())
        while True:
            page = self.reads.events_page(session_id, after=state.cursor, limit=1000)
            for event in page.items:
                state.cursor = event.event_id
                self._on_event(session_id, state, event)
            if not page.more or not page.items:
                return

    def _ours(self, event: SessionEvent) -> bool:
        return event.event_id >= self.first_event_id

    def _on_event(self, sid: str, state: _SessionSpans, ev: SessionEvent) -> None:
        d = ev.data
        turn = state.turn
        if turn is not None and turn.opened_before_term and self._ours(ev):
            turn.opened_before_term = False  # this node carries the turn on from here
            turn.events.append(
                Event(
                    "failover",
                    {"dex.node": self.sink.node_id, "dex.term": self.term},
                    ev.committed_at * NS_PER_MS,
                )
            )
        handler = _HANDLERS.get(ev.type)
        if handler is None and ev.type.startswith("turn_") and ev.type != "turn_started":
            handler = TurnTracer._turn_ended
        if handler is not None:
            handler(self, sid, state, ev, d)

    # -- event handlers

    def _turn_started(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        state.turn = _Turn(d["turn_id"], ev.committed_at, opened_before_term=not self._ours(ev))
        state.steps.clear()
        state.step_of_call.clear()

    def _step_queued(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        if d["step_id"] not in state.steps:  # queued again after a backoff: the same step
            state.steps[d["step_id"]] = _Step(d["step_id"], d["turn_id"], d["kind"], d.get("call_id"), ev.committed_at)
        call_id = d.get("call_id")
        if call_id:
            # A call's wait step (an approval, a question) ends when its tool step is queued.
            waited = state.step_of_call.get(call_id)
            if waited is not None and waited != d["step_id"] and waited in state.steps:
                self._end_step(sid, state.steps.pop(waited), ev, AttemptStatus.COMPLETED, None)
            state.step_of_call[call_id] = d["step_id"]

    def _attempt_started(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        step = state.steps.get(d["step_id"])
        if step is not None:
            step.attempts[d["attempt"]] = _Attempt(d["attempt"], d["term"], d.get("worker_id") or "", ev.committed_at)

    def _attempt_failed(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        step = state.steps.get(d["step_id"])
        attempt = step.attempts.pop(d["attempt"], None) if step is not None else None
        if step is None or attempt is None:
            return
        if self._ours(ev) and attempt.term < self.term:  # only the takeover fails attempts of earlier terms
            attempt.events.append(
                Event("takeover", {"dex.node": self.sink.node_id, "dex.term": self.term}, ev.committed_at * NS_PER_MS)
            )
        self._end_attempt(sid, step, attempt, ev, AttemptStatus.FAILED, d.get("attempt_progress"), d.get("error"))

    def _assistant_message(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        step = state.steps.pop(d.get("step_id") or "", None)
        if step is not None:
            self._end_step(sid, step, ev, AttemptStatus.COMPLETED, None)

    def _tool_call_finished(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        step = state.steps.pop(state.step_of_call.pop(d["call_id"], ""), None)
        if d.get("status") == CallStatus.OUTCOME_UNKNOWN and step is not None:
            state.unknown_calls[d["call_id"]] = step.turn_id
        if step is not None:
            self._end_step(sid, step, ev, d.get("status") or "finished", d.get("attempt_progress"))

    def _tool_call_reconciled(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        turn_id = state.unknown_calls.pop(d["call_id"], None)
        attributes = {"dex.call_id": d["call_id"], "dex.outcome": d.get("outcome") or ""}
        event = Event("reconcile", attributes, ev.committed_at * NS_PER_MS)
        if state.turn is not None and turn_id in (None, state.turn.turn_id):
            state.turn.events.append(event)
        elif turn_id is not None and self._ours(ev):  # its turn ended: a span of its own in that trace
            span_attributes = {"dex.session_id": sid, "dex.turn_id": turn_id, **attributes}
            parent = turn_span_id(sid, turn_id)
            span = _hashed_id(8, "reconcile", sid, d["call_id"])
            self._export(
                "reconcile",
                sid,
                turn_id,
                span,
                parent,
                ev.committed_at,
                ev.committed_at,
                span_attributes,
                [event],
                ok=True,
            )

    def _turn_ended(self, sid: str, state: _SessionSpans, ev: SessionEvent, d: dict[str, Any]) -> None:
        status = ev.type.removeprefix("turn_")
        for step in list(state.steps.values()):  # steps whose own end no event tells
            self._end_step(sid, step, ev, f"turn_{status}", None)
        state.steps.clear()
        state.step_of_call.clear()
        turn, state.turn = state.turn, None
        if turn is None or turn.turn_id != d["turn_id"] or not self._ours(ev):
            return
        self._export(
            "turn",
            sid,
            turn.turn_id,
            turn_span_id(sid, turn.turn_id),
            None,
            turn.start_at,
            ev.committed_at,
            {"dex.session_id": sid, "dex.turn_id": turn.turn_id, "dex.status": status},
            turn.events,
            ok=status == TurnStatus.COMPLETED,
            error=d.get("error"),
        )

    # -- ending spans

    def _end_step(self, sid: str, step: _Step, ev: SessionEvent, outcome: str, progress: str | None) -> None:
        for attempt in step.attempts.values():  # the running attempt ended with its step
            self._end_attempt(
                sid,
                step,
                attempt,
                ev,
                AttemptStatus.COMPLETED if _succeeded(outcome) else outcome,
                progress,
                None,
            )
        step.attempts.clear()
        if not self._ours(ev):
            return
        attributes = {
            "dex.session_id": sid,
            "dex.turn_id": step.turn_id,
            "dex.step_id": step.step_id,
            "dex.kind": step.kind,
            "dex.outcome": outcome,
        }
        if step.call_id:
            attributes["dex.call_id"] = step.call_id
        self._export(
            step.kind,
            sid,
            step.turn_id,
            step_span_id(sid, step.step_id),
            turn_span_id(sid, step.turn_id),
            step.start_at,
            ev.committed_at,
            attributes,
            [],
            ok=_succeeded(outcome),
        )

    def _end_attempt(
        self,
        sid: str,
        step: _Step,
        attempt: _Attempt,
        ev: SessionEvent,
        outcome: str,
        progress: str | None,
        error: str | None,
    ) -> None:
        if not self._ours(ev):
            return
        attributes: dict[str, Any] = {
            "dex.session_id": sid,
            "dex.turn_id": step.turn_id,
            "dex.step_id": step.step_id,
            "dex.kind": step.kind,
            "dex.attempt": attempt.number,
            "dex.node": self.sink.node_id,  # the active node that recorded its end
            "dex.term": attempt.term,  # the term of the leader that handed it out
            "dex.worker_id": attempt.worker_id,
            "dex.outcome": outcome,
        }
        if progress:
            attributes["dex.attempt_progress"] = progress
        self._export(
            f"{step.kind} attempt {attempt.number}",
            sid,
            step.turn_id,
            attempt_span_id(sid, step.step_id, attempt.number),
            step_span_id(sid, step.step_id),
            attempt.start_at,
            ev.committed_at,
            attributes,
            attempt.events,
            ok=_succeeded(outcome),
            error=error,
        )

    def _export(
        self,
        name: str,
        sid: str,
        turn_id: str,
        span_id: int,
        parent_id: int | None,
        start_ms: int,
        end_ms: int,
        attributes: dict[str, Any],
        events: list[Any],
        *,
        ok: bool | None,
        error: str | None = None,
    ) -> None:
        """`ok` None: the span's outcome is not known (a step ended by its turn's end)."""
        trace = trace_id(sid, turn_id)
        flags = TraceFlags(SAMPLED)
        if ok is None:
            status = Status(StatusCode.UNSET)
        elif ok:
            status = Status(StatusCode.OK)
        else:
            status = Status(StatusCode.ERROR, error or attributes.get("dex.outcome"))
        self.sink.export(
            ReadableSpan(
                name,
                context=SpanContext(trace, span_id, is_remote=False, trace_flags=flags),
                parent=None if parent_id is None else SpanContext(trace, parent_id, is_remote=False, trace_flags=flags),
                resource=self.sink.resource,
                attributes=attributes,
                events=events,
                status=status,
                start_time=start_ms * NS_PER_MS,
                end_time=max(end_ms, start_ms) * NS_PER_MS,
                instrumentation_scope=self.sink.scope,
            )
        )


def _succeeded(outcome: str) -> bool | None:
    """A step's or attempt's outcome as a span status: True, False, or None (not known)."""
    if outcome in (AttemptStatus.COMPLETED, CallStatus.SUCCEEDED):
        return True
    if outcome.startswith("turn_"):
        return None
    return False


_HANDLERS = {
    "turn_started": TurnTracer._turn_started,
    "step_queued": TurnTracer._step_queued,
    "step_waiting": TurnTracer._step_queued,
    "attempt_started": TurnTracer._attempt_started,
    "attempt_failed": TurnTracer._attempt_failed,
    "assistant_message": TurnTracer._assistant_message,
    "tool_call_finished": TurnTracer._tool_call_finished,
    "tool_call_reconciled": TurnTracer._tool_call_reconciled,
}
