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

    def __post_init__(self) -> None:
        self.ids = IdGen(self.index)

    def emit(self, session_id: str, type_: str, **data: Any) -> None:
        """Store a session event (streamed over SSE with its increasing id)."""
        self.store.add_event(session_id, type_, data, self.at, self.index)
