"""What a handler works with while one log entry is applied."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dex_ha.engine.store import Store
from dex_ha.session_protocol import Event


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
    counts: dict[str, int] = field(default_factory=dict)  # counter name -> increment
    # True while the engine applies with a savepoint around each entry (after an entry wrote
    # and then refused): a command of several parts on their own (ReportResults) then puts a
    # savepoint around each part too; on the fast path it asks for that replay instead.
    careful: bool = False

    def __post_init__(self) -> None:
        self.ids = IdGen(self.index)

    def emit(self, session_id: str, event: Event) -> None:
        """A session event (streamed over SSE with its increasing id); stored by `hand_over_writes`.
        Its type and data come from its class (dex_ha.session_protocol), so an unknown type
        or a misspelt field does not type-check."""
        self.events.append((session_id, event.type.value, event.as_json()))

    def bump(self, counter: str, by: int = 1) -> None:
        """Add `by` to a counter of the `counters` table (written by `hand_over_writes`)."""
        self.counts[counter] = self.counts.get(counter, 0) + by

    def hand_over_writes(self) -> None:
        """The entry applied: hand its events (in the order they were emitted) and counter
        increments to the store, which writes them at the end of the transaction."""
        if self.events or self.counts:
            self.store.buffer_entry_writes(self.events, self.counts, self.at, self.index)
        self.events, self.counts = [], {}


class NeedsSavepoints(Exception):
    """Raised on the fast path by a part of an entry that wrote and then refused: the engine
    applies the batch again with savepoints (see Engine._apply_entry), where the part's
    changes can be undone on their own."""
