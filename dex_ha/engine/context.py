"""What a handler works with while one log entry is applied."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dex_ha.engine.store import Store


@dataclass
class IdGen:
    """Ids derived from the log index, so every node derives the same ones.

    The n-th id made while applying entry 1234 is ``<prefix>1234`` for n = 0 and
    ``<prefix>1234.<n>`` after that; `queue_position` gives integers that sort in log order.
    """

    index: int
    _count: int = 0

    def new(self, prefix: str) -> str:
        n = self._count
        self._count += 1
        return f"{prefix}{self.index}" if n == 0 else f"{prefix}{self.index}.{n}"

    def queue_position(self) -> int:
        n = self._count
        self._count += 1
        return (self.index << 20) + n


@dataclass
class ApplyContext:
    store: Store
    index: int  # the log index being applied
    at: int  # the command's leader wall-clock ms: the only "now" the engine knows
    ids: IdGen = field(init=False)
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ids = IdGen(self.index)

    def emit(self, session_id: str, type_: str, **data: Any) -> None:
        """A session event (streamed over SSE with its increasing id); stored by `flush_events`."""
        self.events.append((session_id, type_, data))

    def flush_events(self) -> None:
        """Store the entry's events in one statement, in the order they were emitted."""
        if self.events:
            self.store.add_events(self.events, self.at, self.index)
            self.events.clear()
