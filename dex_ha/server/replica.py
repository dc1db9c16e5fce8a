"""The engine as this node's Raft state machine, plus a signal that wakes whoever waits
for the state to change (long polls, SSE streams, the timer and drain loops).

Everything here runs on the node's event loop: the Raft loop applies committed entries
through `apply_batch`, and then `changed` wakes the waiters, who re-read the engine.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from dex_ha.engine import ApplyResult, Engine


class ChangeSignal:
    """A broadcast 'something changed': every waiter wakes on the next `notify()`.

    A waiter reads `version` before it reads the state, then waits for a version above it,
    so a change between its read and its wait is never missed.
    """

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on every change (for loops that also wake on other things)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def notify(self) -> None:
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()
        for listener in self._listeners:
            listener()

    async def wait_past(self, version: int, timeout_s: float | None) -> bool:
        """Wait until the version is above `version`; False when `timeout_s` passed first."""
        if self.version > version:
            return True
        event = self._event
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: see dex_ha.server.leader
                await event.wait()
            return True
        except TimeoutError:
            return self.version > version


class Replica:
    """The Raft StateMachine protocol over an Engine, with a change signal."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.changed = ChangeSignal()

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[ApplyResult]:
        results = self.engine.apply_batch(entries)
        self.changed.notify()
        return results

    def applied_index(self) -> int:
        return self.engine.applied_index()

    def snapshot_copier(self) -> Callable[[], tuple[int, bytes]]:
        return self.engine.snapshot_copier()

    def restore(self, data: bytes, index: int) -> None:
        self.engine.restore(data, index)
        self.changed.notify()

    def close(self) -> None:
        self.engine.close()
