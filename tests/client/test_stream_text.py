"""StreamText: the live text of each step, the text of failed attempts dropped; and the
committed attempt events name their step and attempt, so it can tell them apart."""

from __future__ import annotations

import json

from dex_ha.client import SessionEvent, StreamText
from dex_ha.client.client import _decode_event
from dex_ha.client.sse import RawEvent


def delta(step_id: str, attempt: int, text: str) -> SessionEvent:
    return SessionEvent(id=None, type="delta", data={"text": text}, at=None, step_id=step_id, attempt=attempt)


def committed(type_: str, **data: object) -> SessionEvent:
    """A committed event as the client decodes it from the wire."""
    body = {"id": "42", "type": type_, "at": 1, "data": data}
    event = _decode_event(RawEvent(id="42", event=type_, data=json.dumps(body)))
    assert event is not None
    return event


def test_committed_attempt_events_name_their_step_and_attempt() -> None:
    failed = committed(
        "attempt_failed",
        step_id="st7",
        kind="RunModel",
        attempt=1,
        error="lost",
        attempt_progress="NOT_COMPLETED",
        call_id=None,
    )
    assert (failed.step_id, failed.attempt) == ("st7", 1)
    started = committed("attempt_started", step_id="st7", kind="RunModel", attempt=2, term=1, worker_id="w")
    assert (started.step_id, started.attempt) == ("st7", 2)
    other = committed("turn_started", turn_id="tu1", number=1, message_id="m1")
    assert (other.step_id, other.attempt) == (None, None)


def test_a_failed_attempts_text_is_dropped() -> None:
    stream = StreamText()
    for event in [
        delta("st7", 1, "Hello "),
        delta("st7", 1, "wor"),
        committed("attempt_failed", step_id="st7", attempt=1, error="lost"),
        delta("st7", 1, "ld"),  # relayed late, after the failure was committed
        delta("st7", 2, "Hi "),
        delta("st7", 2, "there"),
    ]:
        stream.feed(event)
    assert stream.text("st7") == "Hi there" and stream.attempt("st7") == 2


def test_text_so_far_is_empty_right_after_a_failure() -> None:
    stream = StreamText()
    stream.feed(delta("st7", 1, "partial"))
    assert stream.text("st7") == "partial"
    stream.feed(committed("attempt_failed", step_id="st7", attempt=1, error="lost"))
    assert stream.text("st7") == "" and stream.attempt("st7") is None


def test_a_newer_attempt_starts_afresh_even_before_the_failure_event() -> None:
    """Deltas and committed events travel separately: attempt 2 may stream first."""
    stream = StreamText()
    for event in [
        delta("st7", 1, "old"),
        delta("st7", 2, "new"),
        delta("st7", 1, "late old"),
        committed("attempt_failed", step_id="st7", attempt=1, error="lost"),
    ]:
        stream.feed(event)
    assert stream.text("st7") == "new"


def test_steps_are_kept_apart_and_non_text_deltas_ignored() -> None:
    stream = StreamText()
    stream.feed(delta("a", 1, "model a"))
    stream.feed(delta("b", 1, "model b"))
    stream.feed(SessionEvent(id=None, type="delta", data={"progress": {"stage": 1}}, at=None, step_id="a", attempt=1))
    stream.feed(committed("attempt_failed", step_id="b", attempt=1, error="lost"))
    assert (stream.text("a"), stream.text("b"), stream.text("unknown")) == ("model a", "", "")
