"""Small stand-ins that model and adapter tests share."""

from __future__ import annotations

from typing import Any

# The built-in tool the server adds to an agent's tools, as a ModelRequest carries it.
ASK_USER_BUILTIN: dict[str, Any] = {
    "name": "ask_user",
    "builtin": True,
    "description": "Ask the user.",
    "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
}


class TextSink:
    """A DeltaSink that keeps the text streamed to it. Any other delta fails the test,
    unless `other_deltas="ignore"` (a model that also streams progress, say)."""

    def __init__(self, other_deltas: str = "fail") -> None:
        if other_deltas not in ("fail", "ignore"):
            raise ValueError(f"other_deltas must be 'fail' or 'ignore', not {other_deltas!r}")
        self.texts: list[str] = []
        self.other_deltas = other_deltas

    def send_text(self, text: str) -> None:
        self.texts.append(text)

    def send(self, delta: dict[str, Any]) -> None:
        if self.other_deltas == "fail":
            raise AssertionError(f"only text is streamed, got {delta}")
