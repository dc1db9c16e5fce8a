"""Where the Raft loop's time goes, for a warning an operator can act on.

A leader that does not send heartbeats for an election timeout loses its term, and a
leader that does not hear acks for as long loses its lease (its `/readyz` turns 503). Both
happen when the loop's thread is kept from running: a long fsync, a long apply, or a
thread that waited for the CPU or the interpreter. `TurnWatch` times each turn of the
loop by part, and the gap between two turns, and logs a warning naming the part when
either comes close to the election timeout, at most once per `LOG_EVERY_S` (with a count
of what it did not log). It measures only (with perf_counter, like the fsync timing):
nothing the loop decides depends on it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

LOG_EVERY_S = 5.0


@dataclass
class TurnCost:
    """One turn of the loop: its parts in seconds, and how much it did."""

    sync_s: float = 0.0
    apply_s: float = 0.0
    applied: int = 0
    stepped: int = 0


@dataclass
class TurnWatch:
    node_id: str
    # A turn or a gap between turns longer than this is slow (the node uses a quarter of
    # the election timeout: two such in a row and a busy leader is close to losing its lease).
    slow_ms: float
    slow_turns: int = 0
    late_turns: int = 0
    _turn_started: float = 0.0
    _last_turn_ended: float | None = None
    _cost: TurnCost = field(default_factory=TurnCost)
    _last_log: float = float("-inf")
    _unlogged: int = 0

    @property
    def cost(self) -> TurnCost:
        """The turn under way; the loop adds its parts to it."""
        return self._cost

    def turn_starts(self) -> None:
        now = time.perf_counter()
        self._turn_started = now
        self._cost = TurnCost()
        if self._last_turn_ended is None:
            return
        gap_ms = (now - self._last_turn_ended) * 1000
        if gap_ms > self.slow_ms:
            self.late_turns += 1
            self._warn(
                "node %s: the Raft loop did not run for %.0f ms (it wakes at least every tick): "
                "its thread waited for the CPU or the interpreter, or the event loop was busy",
                self.node_id,
                gap_ms,
            )

    def turn_ends(self) -> None:
        now = time.perf_counter()
        self._last_turn_ended = now
        took_ms = (now - self._turn_started) * 1000
        if took_ms <= self.slow_ms:
            return
        self.slow_turns += 1
        c = self._cost
        self._warn(
            "node %s: a Raft loop turn took %.0f ms (fsync %.0f ms; apply %.0f ms for %d entries; "
            "%d messages stepped): no heartbeat or ack left meanwhile",
            self.node_id,
            took_ms,
            c.sync_s * 1000,
            c.apply_s * 1000,
            c.applied,
            c.stepped,
        )

    def _warn(self, message: str, *args: object) -> None:
        now = time.perf_counter()
        if now - self._last_log < LOG_EVERY_S:
            self._unlogged += 1
            return
        if self._unlogged:
            log.warning("node %s: %d more slow turns were not logged", self.node_id, self._unlogged)
            self._unlogged = 0
        self._last_log = now
        log.warning(message, *args)
