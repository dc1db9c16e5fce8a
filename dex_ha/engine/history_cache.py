"""What a task is built from, kept in memory where the engine applies: each recent
session's visible history (the items after its summary) and summary, and the agents'
parsed definitions.

A hand-out builds its Worker's task inside the apply that starts the attempt (see
`tasks.task_input`), so the leader answers the Worker without reading the database, and
the apply reads this instead of the history table.

The cache is local to one node and never replicated: it only saves reads, and a task built
from it equals the task built from the database (tests/engine/test_history_cache.py checks
that over random command sequences). It is kept correct by the writes themselves: the
store tells it of every new session, history item and summary; a session it does not hold
is read from the database once and kept from then on. Whatever a transaction touched is
dropped when it rolls back (`rolled_back`), everything when a snapshot replaces the state
(`clear`). Its size is bounded: past `budget_chars` characters of history (as JSON text),
the sessions used least recently are dropped.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# 1 M characters of history text, held parsed: about 8 MB of Python objects (7 bytes per
# character, measured; docs/performance.md, Memory). At a few hundred characters per item,
# the recent turns of a few hundred sessions. A session too large for it, or dropped from
# it, is simply read from the database. (16 M cost 120 MB on every node, standbys too, and
# bought no steps/s over 1 M in the side-by-side bench.)
DEFAULT_BUDGET_CHARS = 1 << 20
# What an entry costs beyond its items (so that empty sessions count too).
ENTRY_OVERHEAD_CHARS = 200


@dataclass(slots=True)
class SessionHistory:
    """A session's summary and the history items after it, as a task shows them.

    `items` are shared with every task built from them: nobody may change them."""

    summary: str | None
    summary_upto_seq: int
    last_seq: int  # the seq of the latest item (the session's history_count)
    items: list[dict[str, Any]] = field(default_factory=list)  # seq summary_upto_seq + 1 .. last_seq
    # Characters of the items' JSON text, plus the overhead: for the budget, not compared.
    size: int = field(default=ENTRY_OVERHEAD_CHARS, compare=False)


class HistoryCache:
    """Session histories (least recently used first) and agent definitions; see the module."""

    def __init__(self, budget_chars: int = DEFAULT_BUDGET_CHARS) -> None:
        self.budget_chars = budget_chars
        self._sessions: OrderedDict[str, SessionHistory] = OrderedDict()
        self._size = 0
        self._definitions: dict[str, dict[str, Any] | None] = {}  # agent name -> parsed definition
        self._touched: set[str] = set()  # sessions changed by the open transaction

    def __len__(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------- sessions

    def session(self, session_id: str) -> SessionHistory | None:
        found = self._sessions.get(session_id)
        if found is not None:
            self._sessions.move_to_end(session_id)
        return found

    def put(self, session_id: str, history: SessionHistory) -> None:
        """Keep `history`, read from the state as it is now (a new session, or one read once)."""
        self._drop(session_id)
        self._touched.add(session_id)
        self._sessions[session_id] = history
        self._size += history.size
        self._shrink()

    def appended(self, session_id: str, first_seq: int, texts: list[str]) -> None:
        """Items `texts` (JSON) were written at seq `first_seq` onwards."""
        history = self._sessions.get(session_id)
        if history is None:
            return
        self._touched.add(session_id)
        if history.last_seq != first_seq - 1:  # not the items it holds: never guess
            self._drop(session_id)
            return
        history.items.extend(json.loads("[" + ",".join(texts) + "]"))
        history.last_seq += len(texts)
        grown = sum(map(len, texts))
        history.size += grown
        self._size += grown
        self._shrink()

    def summarised(self, session_id: str, summary: str, upto_seq: int) -> None:
        """The session's summary now covers its items up to `upto_seq`."""
        history = self._sessions.get(session_id)
        if history is None:
            return
        self._touched.add(session_id)
        if not history.summary_upto_seq <= upto_seq <= history.last_seq:
            self._drop(session_id)
            return
        history.items = history.items[upto_seq - history.summary_upto_seq :]
        history.summary, history.summary_upto_seq = summary, upto_seq
        # The size is not recounted: it only overstates, until the session is dropped.

    def deleted(self, session_id: str) -> None:
        """The session was deleted (dropping it is right whether or not that commits)."""
        self._drop(session_id)

    def _drop(self, session_id: str) -> None:
        history = self._sessions.pop(session_id, None)
        if history is not None:
            self._size -= history.size

    def _shrink(self) -> None:
        while self._size > self.budget_chars and self._sessions:
            _, history = self._sessions.popitem(last=False)
            self._size -= history.size

    # ------------------------------------------------------------- agents

    def definition(self, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(known, the agent's parsed definition); known is False when it was never read."""
        if name in self._definitions:
            return True, self._definitions[name]
        return False, None

    def put_definition(self, name: str, definition: dict[str, Any] | None) -> None:
        if len(self._definitions) >= 1024:  # agents are few; a bound all the same
            self._definitions.clear()
        self._definitions[name] = definition

    def agent_changed(self, name: str) -> None:
        self._definitions.pop(name, None)

    # ------------------------------------------------------------- transactions

    def committed(self) -> None:
        self._touched.clear()

    def rolled_back(self) -> None:
        """The open transaction (or a savepoint in it) was undone: forget what it may have
        changed. Definitions read inside it may be its own uncommitted ones: forget all."""
        for session_id in self._touched:
            self._drop(session_id)
        self._touched.clear()
        self._definitions.clear()

    def clear(self) -> None:
        """The whole state was replaced (a snapshot installed, a backup restored)."""
        self._sessions.clear()
        self._size = 0
        self._definitions.clear()
        self._touched.clear()
