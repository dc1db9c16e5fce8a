"""Streams: live, non-durable model output relayed from Worker heartbeats to SSE clients.

A delta is never stored: a subscriber that connects later, or to another node after a
failover, does not see it. Each delta carries the step id and attempt, so a client can drop
the deltas of an attempt that failed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("dex_ha.server.streams")

# A subscriber that cannot keep up loses deltas rather than growing memory without bound.
SUBSCRIBER_QUEUE_LIMIT = 1_000


class DeltaRelay:
    """Per-session fan-out of deltas to the SSE subscribers of that session."""

    def __init__(self) -> None:
        self._subscribers: dict[str, dict[asyncio.Queue[dict[str, Any]], asyncio.Event]] = {}

    def subscribe(self, session_id: str, wake: asyncio.Event) -> asyncio.Queue[dict[str, Any]]:
        """A queue of the session's deltas; `wake` is set whenever one arrives."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(SUBSCRIBER_QUEUE_LIMIT)
        self._subscribers.setdefault(session_id, {})[queue] = wake
        return queue

    def unsubscribe(self, session_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        queues = self._subscribers.get(session_id)
        if queues is not None:
            queues.pop(queue, None)
            if not queues:
                del self._subscribers[session_id]

    def publish(self, session_id: str, step_id: str, attempt: int, deltas: list[dict[str, Any]]) -> None:
        for queue, wake in self._subscribers.get(session_id, {}).items():
            wake.set()
            for data in deltas:
                event = {
                    "type": "delta",
                    "session_id": session_id,
                    "step_id": step_id,
                    "attempt": attempt,
                    "data": data,
                }
                try:
                    queue.put_nowait(event)
                except asyncio.QueueFull:  # a slow reader misses live output, never committed events
                    pass
