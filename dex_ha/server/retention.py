"""Retention: the active node deletes ended sessions that have been idle too long.

Every `retention_check_interval_ms`, while this node is the active node and
`retention_days` is above 0, it reads which idle sessions were last active before the cutoff
(now minus retention_days, from the node's clock) and proposes `ExpireSessions` entries of
at most MAX_EXPIRED_PER_ENTRY of them each, the oldest first, until none is left. The
engine deletes each named session that is still idle and still older than the cutoff the
entry carries, so a session that became active after the read stays, and every node
deletes the same ones. The engine then gives the freed pages back to the file system.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dex_ha.background import ActiveNodeTimer
from dex_ha.engine import MAX_EXPIRED_PER_ENTRY, EngineReader, ExpireSessions, Propose

log = logging.getLogger("dex_ha.server")

DAY_MS = 86_400_000


def cutoff_at(now_ms: int, retention_days: float) -> int:
    """Sessions last active before this are past retention."""
    return now_ms - int(retention_days * DAY_MS)


class Retention:
    """The retention loop of one node (it acts only while the node is the active node)."""

    def __init__(
        self,
        reads: EngineReader,
        propose: Propose,
        now_ms: Callable[[], int],
        retention_days: float,
        interval_ms: int,
    ) -> None:
        self._reads = reads
        self._propose = propose
        self._now_ms = now_ms
        self.retention_days = retention_days
        self._timer = ActiveNodeTimer("retention", interval_ms / 1000, self._expire_round)

    def start(self, is_serving: Callable[[], bool]) -> None:
        if self.retention_days > 0:
            self._timer.start(is_serving)

    async def stop(self) -> None:
        await self._timer.stop()

    async def _expire_round(self) -> None:
        try:
            await self.expire_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not the active node any more, a write that timed out...
            log.info("retention: stopped this round (%s); the next round goes on", exc)

    async def expire_once(self) -> int:
        """Delete every session past retention now, in entries of a bounded size; how many."""
        now = self._now_ms()
        cutoff = cutoff_at(now, self.retention_days)
        total = 0
        while True:
            session_ids = self._reads.expired_sessions(cutoff, MAX_EXPIRED_PER_ENTRY)
            if not session_ids:
                break
            result = await self._propose(ExpireSessions(at=now, cutoff_at=cutoff, session_ids=session_ids))
            deleted = len(result.value.deleted) if result.value is not None else 0  # None: refused
            total += deleted
            if deleted == 0:  # each one became active since the read: the next round looks again
                break
        if total:
            log.info(
                "retention: deleted %d ended sessions idle for more than %g days (last active before %d ms)",
                total,
                self.retention_days,
                cutoff,
            )
        return total
