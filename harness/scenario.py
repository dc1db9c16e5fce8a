"""What the HA scenarios share: a writer whose acknowledged writes are checked on every
node afterwards, and reading a node's replicated state from its SQLite file (evidence from
outside the server: no node has to be active to be read)."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from dex_ha.client import DexClient, DexError
from dex_ha.server.node import STATE_DB
from harness.cluster_process import LocalCluster, cluster_view
from harness.waiting import eventually

WRITE_TIMEOUT_S = 2.0  # one try; a try that times out is retried with the same id


class AckedWriter:
    """Creates sessions `prefix-0`, `prefix-1`, … one after the other through the SDK
    (the URLs given), each until it is acknowledged; `acked` holds the acknowledged ids.
    Run it with tests.e2e.conftest.running."""

    def __init__(self, urls: list[str], token: str, agent: str = "ha-writes", prefix: str = "w") -> None:
        self.urls = urls
        self.token = token
        self.agent = agent
        self.prefix = prefix
        self.acked: list[str] = []

    async def run(self) -> None:
        async with DexClient(
            self.urls, token=self.token, request_timeout_s=WRITE_TIMEOUT_S, give_up_after_s=WRITE_TIMEOUT_S
        ) as client:
            while True:
                session_id = f"{self.prefix}-{len(self.acked)}"
                try:
                    await client.create_session(self.agent, session_id=session_id)
                except (TimeoutError, DexError):
                    continue  # not acknowledged: the same id again (creating it twice is a no-op)
                self.acked.append(session_id)

    async def stop(self) -> None:
        """Nothing to drain: `running` cancels run(), which closes the client."""

    async def acked_after(self, count: int, deadline_s: float = 30.0) -> None:
        """Wait until `count` more writes are acknowledged (the cluster makes progress)."""
        target = len(self.acked) + count
        await eventually(lambda: len(self.acked) >= target, f"{count} more acknowledged writes", deadline_s)


def query_state(data_dir: Path, sql: str) -> list[tuple]:
    """Rows of a query on a node's state database (read-only, while the node runs)."""
    conn = sqlite3.connect(f"file:{data_dir / STATE_DB}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def sessions_on_disk(data_dir: Path) -> set[str]:
    """The session ids in a node's state database."""
    return {row[0] for row in query_state(data_dir, "SELECT session_id FROM sessions")}


async def all_caught_up(cluster: LocalCluster, node_ids: list[str], deadline_s: float = 30.0) -> int:
    """Wait until every node has applied the active node's commit index; that index."""
    admin = cluster.tokens["admin"]
    active = await cluster.active_node(deadline_s)
    target = (await eventually(lambda: cluster_view(cluster.urls[active], admin), "the active node's view"))[
        "commit_index"
    ]

    async def caught_up() -> bool:
        views = await asyncio.gather(*(cluster_view(cluster.urls[n], admin) for n in node_ids))
        return all(v is not None and v["applied_index"] >= target for v in views)

    await eventually(caught_up, f"every node to apply index {target}", deadline_s)
    return target


@dataclass(frozen=True)
class AttemptRow:
    session_id: str
    kind: str
    call_id: str | None
    number: int
    term: int
    status: str  # running | completed | failed
    progress: str | None  # NOT_STARTED | NOT_COMPLETED when it failed


def attempts_on_disk(data_dir: Path) -> list[AttemptRow]:
    """Every attempt of every step (RunModel included) in a node's state database."""
    rows = query_state(
        data_dir,
        "SELECT s.session_id, s.kind, s.call_id, a.number, a.term, a.status, "
        "a.attempt_progress FROM attempts a JOIN steps s ON s.step_id = a.step_id "
        "ORDER BY s.session_id, s.created_at, a.number",
    )
    return [AttemptRow(*row) for row in rows]


def failed_attempts(data_dir: Path) -> int:
    """How many attempts failed so far, in a node's state database."""
    return query_state(data_dir, "SELECT count(*) FROM attempts WHERE status = 'failed'")[0][0]


async def rejoined(cluster: LocalCluster, node_id: str, leader: str) -> None:
    """Wait until `node_id` follows `leader` again (a voter the next failover can count on)."""

    async def following() -> bool:
        view = await cluster_view(cluster.urls[node_id], cluster.tokens["admin"])
        return view is not None and view["role"] == "standby" and view["leader_id"] == leader

    await eventually(following, f"{node_id} to follow {leader} again")
