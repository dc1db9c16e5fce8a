"""Background asyncio tasks of a node: one way to stop one, and one timer loop for the
services that act only on the active node (consistency checks, retention, the cluster
version). Standard library only, below every layer: Raft uses it too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (None: there is none) and return once it has ended; its
    CancelledError stays here. An error it ended with earlier is raised."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


class ActiveNodeTimer:
    """Calls `tick` every `interval_s` seconds, from `start` until `stop`, whenever the node
    serves (`is_serving()`: the active node). A timer, not a schedule: the next interval
    starts when a tick ends. `tick` handles its own errors; one it lets out ends the loop."""

    def __init__(self, name: str, interval_s: float, tick: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self, is_serving: Callable[[], bool]) -> None:
        self._task = asyncio.create_task(self._run(is_serving), name=self.name)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self, is_serving: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if is_serving():
                await self._tick()
