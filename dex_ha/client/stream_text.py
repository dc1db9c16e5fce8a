"""StreamText: the live text of each model step, without the text of failed attempts.

A RunModel step that fails mid-stream (its Worker died, the model API broke) runs again as
a new attempt, and the server relays the deltas of both: attempt 1's partial text, then
attempt 2's from the start. A UI that appends every delta shows the text twice. Each delta
names its step and attempt, and the committed ``attempt_failed`` event names the attempt
that failed, so the text of a failed attempt can be dropped::

    stream = StreamText()
    async for event in client.events(session_id):
        stream.feed(event)
        if event.type == "delta":
            render(event.step_id, stream.text(event.step_id))

Rules, per step: a delta of a newer attempt starts the text afresh; ``attempt_failed``
drops the failed attempt's text; a delta of an attempt that failed or was overtaken
(a late one, relayed after the failure was committed) is ignored. Deltas without
``text`` (a tool's progress) are not text and are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dex_ha.session_protocol import SessionEvent


@dataclass
class _StepText:
    attempt: int = 0  # the attempt whose text `pieces` holds (0: none yet)
    failed_upto: int = 0  # attempts up to this one failed: their deltas are dropped
    pieces: list[str] = field(default_factory=list)


class StreamText:
    """Text so far per step, for the step's current attempt (see the module doc)."""

    def __init__(self) -> None:
        self._steps: dict[str, _StepText] = {}

    def feed(self, event: SessionEvent) -> None:
        """Take one event of ``DexClient.events()``; events of other types are ignored."""
        if event.step_id is None or event.attempt is None:
            return
        if event.type == "delta":
            self._delta(event.step_id, event.attempt, event.data.get("text"))
        elif event.type == "attempt_failed":
            self._failed(event.step_id, event.attempt)

    def text(self, step_id: str) -> str:
        """The text the step's current attempt has streamed so far ("" when none)."""
        step = self._steps.get(step_id)
        return "".join(step.pieces) if step is not None else ""

    def attempt(self, step_id: str) -> int | None:
        """The attempt whose text ``text(step_id)`` is, or None before any text."""
        step = self._steps.get(step_id)
        return step.attempt if step is not None and step.attempt else None

    def _delta(self, step_id: str, attempt: int, text: object) -> None:
        if not isinstance(text, str):
            return
        step = self._steps.setdefault(step_id, _StepText())
        if attempt <= step.failed_upto or attempt < step.attempt:
            return  # a late delta of an attempt that failed or was overtaken
        if attempt > step.attempt:
            step.attempt, step.pieces = attempt, []
        step.pieces.append(text)

    def _failed(self, step_id: str, attempt: int) -> None:
        step = self._steps.setdefault(step_id, _StepText())
        step.failed_upto = max(step.failed_upto, attempt)
        if step.attempt <= attempt:
            step.attempt, step.pieces = 0, []
