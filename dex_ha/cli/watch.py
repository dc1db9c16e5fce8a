"""`dex-ha sessions watch SESSION_ID`: a session's events as they happen, one line each.

    2026-12-05 17:02:03Z  turn_started          turn 1 t-0001
    2026-12-05 17:02:03Z  attempt_started       RunModel step st-1 attempt 1 worker w-1
    2026-12-05 17:02:04Z  delta                 step st-1 attempt 1 "Hello, how can I…" (12 deltas)
    2026-12-05 17:02:04Z  tool_call_finished    refund call c-1 succeeded output "refunded A17"

It follows GET /v1/sessions/{id}/events through the Client SDK, which resumes after the last
event it saw when the active node changes, so a failover shows as a short pause. Live model
output comes as many small `delta` events: the consecutive deltas of one attempt are printed
as one line (at the next other event, or every DELTA_LINE_EVERY_S while the model streams).
`--json` prints each event as it came, one JSON object a line. `--until-idle` stops once the
session is idle: the event that ended its last turn was printed and no message waits.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dex_ha.cli.common import short, when
from dex_ha.client import DexClient, SessionEvent

# While a model streams, its condensed text line is printed at least this often.
DELTA_LINE_EVERY_S = 1.0
# How much of a value (a message, an output) one line shows.
VALUE_CHARS = 60
# The events that end a turn: turn_completed, turn_failed, turn_cancelled.
TURN_END_EVENTS = frozenset({"turn_completed", "turn_failed", "turn_cancelled"})
TYPE_WIDTH = len("tool_call_reconciled")

# What one line shows of each event's data: (label, key) pairs; an empty label shows the
# value alone. Missing or null values are left out. Other types show their data as JSON.
_STEP = (("", "kind"), ("step", "step_id"), ("call", "call_id"))
ESSENTIALS: dict[str, tuple[tuple[str, str], ...]] = {
    "session_created": (("agent", "agent"),),
    "message_received": (("", "mode"), ("message", "message_id"), ("text", "text")),
    "message_delivered": (("", "mode"), ("message", "message_id"), ("turn", "turn_id")),
    "turn_started": (("turn", "number"), ("", "turn_id")),
    "step_queued": _STEP,
    "step_waiting": _STEP,
    "attempt_started": (*_STEP, ("attempt", "attempt"), ("worker", "worker_id")),
    "attempt_failed": (*_STEP, ("attempt", "attempt"), ("error", "error")),
    "assistant_message": (("step", "step_id"), ("text", "content"), ("tool calls", "tool_names")),
    "approval_requested": (("", "name"), ("call", "call_id"), ("arguments", "arguments")),
    "approval_decided": (("", "decision"), ("call", "call_id"), ("reason", "reason")),
    "question_asked": (("question", "question_id"), ("call", "call_id"), ("", "question")),
    "question_answered": (("question", "question_id"), ("call", "call_id"), ("answer", "answer")),
    "tool_task_started": (("call", "call_id"), ("handle", "handle")),
    "tool_call_finished": (("", "name"), ("call", "call_id"), ("", "status"), ("output", "output"), ("error", "error")),
    "tool_call_reconciled": (("call", "call_id"), ("", "outcome"), ("result", "result"), ("error", "error")),
    "timer_set": (("", "purpose"), ("step", "step_id"), ("due", "due")),
    "timer_fired": (("", "purpose"), ("step", "step_id")),
    "summary_updated": (("turn", "turn_id"), ("up to message", "upto_seq")),
    "turn_completed": (("turn", "turn_id"),),
    "turn_failed": (("turn", "turn_id"), ("error", "error")),
    "turn_cancelled": (("turn", "turn_id"), ("reason", "error")),
    "session_deleted": (("session", "session_id"),),
}


def add_arguments(watch: argparse.ArgumentParser) -> None:
    watch.add_argument("session_id", metavar="SESSION_ID")
    watch.add_argument(
        "--until-idle",
        action="store_true",
        help="exit 0 once the session is idle (its last turn ended, no message waits) instead of at Ctrl-C",
    )


async def watch_session(args: argparse.Namespace, client: DexClient, write: Callable[[str], None]) -> None:
    """Write the session's events (every one since it was created, then live ones) until
    Ctrl-C, the session's deletion, or with --until-idle the end of its last turn.
    An unknown session raises the server's 404 before anything is written."""
    sid = args.session_id
    snapshot = await client.get_session(sid)
    if args.until_idle and snapshot.is_idle and not snapshot.turns:
        return  # it never ran a turn and nothing waits: it is idle already
    lines = EventLines(write, as_json=args.json)
    events = client.events(sid)
    try:
        async for event in events:
            lines.feed(event)
            if args.until_idle and event.type in TURN_END_EVENTS and await _idle_after(client, sid, event):
                return
    finally:
        lines.flush()
        await events.aclose()


async def _idle_after(client: DexClient, sid: str, ended: SessionEvent) -> bool:
    """Whether the turn that `ended` is the session's last and nothing waits to start another
    (a replayed end of an earlier turn is not the end)."""
    snapshot = await client.get_session(sid)
    return snapshot.is_idle and bool(snapshot.turns) and snapshot.turns[-1].turn_id == ended.data.get("turn_id")


@dataclass
class _Deltas:
    """Consecutive deltas of one attempt, not printed yet."""

    step_id: str | None
    attempt: int | None
    first_at_ms: int
    first_seen_s: float
    count: int = 0
    text: list[str] = field(default_factory=list)


class EventLines:
    """Turns events into lines for `write`, condensing each attempt's deltas (see the module doc)."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        as_json: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._write = write
        self._as_json = as_json
        self._clock = clock
        self._wall_ms = wall_ms  # a delta carries no time: it is shown with the time it came
        self._deltas: _Deltas | None = None

    def feed(self, event: SessionEvent) -> None:
        if self._as_json:
            self._write(json.dumps(raw_event(event), sort_keys=True))
        elif event.type == "delta":
            self._delta(event)
        else:
            self.flush()
            self._write(event_line(event))

    def flush(self) -> None:
        """Write the deltas not printed yet, as one line."""
        deltas, self._deltas = self._deltas, None
        if deltas is not None:
            self._write(_deltas_line(deltas))

    def _delta(self, event: SessionEvent) -> None:
        group = self._deltas
        if group is not None and (
            (group.step_id, group.attempt) != (event.step_id, event.attempt)
            or self._clock() - group.first_seen_s >= DELTA_LINE_EVERY_S
        ):
            self.flush()
            group = None
        if group is None:
            group = self._deltas = _Deltas(event.step_id, event.attempt, self._wall_ms(), self._clock())
        group.count += 1
        text = event.data.get("text")
        if isinstance(text, str):
            group.text.append(text)


def raw_event(event: SessionEvent) -> dict[str, Any]:
    """The event as the stream sent it: id (null for a delta), type, at, data, and for the
    events of one attempt its step_id and attempt."""
    raw: dict[str, Any] = {"id": event.id, "type": event.type, "at": event.at, "data": event.data}
    if event.step_id is not None:
        raw.update(step_id=event.step_id, attempt=event.attempt)
    return raw


def event_line(event: SessionEvent) -> str:
    """One line: UTC time, type, then the essentials of the event's data."""
    essentials = ESSENTIALS.get(event.type)
    if essentials is None:
        details = short(event.data, VALUE_CHARS * 2)
    else:
        data = _derived(event.type, event.data)
        details = " ".join(_field(label, data[key]) for label, key in essentials if data.get(key) is not None)
    return f"{when(event.at)}  {event.type.ljust(TYPE_WIDTH)}  {details}".rstrip()


def _derived(type_: str, data: dict[str, Any]) -> dict[str, Any]:
    """The data with the values a line shows that the event holds in another shape."""
    if type_ == "approval_decided":
        return {**data, "decision": "approved" if data.get("approved") else "denied"}
    if type_ == "assistant_message":
        names = [call.get("name") for call in data.get("tool_calls") or [] if isinstance(call, dict)]
        return {**data, "tool_names": ", ".join(str(n) for n in names) or None, "content": data.get("content") or None}
    if type_ == "timer_set":
        return {**data, "due": when(data.get("due_at"))}
    return data


def _field(label: str, value: Any) -> str:
    text = short(value, VALUE_CHARS)
    if isinstance(value, str) and (" " in text or not text):
        text = json.dumps(text, ensure_ascii=False)  # quoted, so that it reads as one value
    return f"{label} {text}" if label else text


def _deltas_line(deltas: _Deltas) -> str:
    text = "".join(deltas.text)
    said = json.dumps(short(text, VALUE_CHARS), ensure_ascii=False) if text else "(no text)"
    count = f"({deltas.count} delta{'s' if deltas.count != 1 else ''})"
    return f"{when(deltas.first_at_ms)}  {'delta'.ljust(TYPE_WIDTH)}  step {deltas.step_id} attempt {deltas.attempt} {said} {count}"
