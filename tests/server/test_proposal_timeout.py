"""A client's write that does not commit within proposal_timeout_ms is answered 503
`unavailable` (with Retry-After) instead of hanging, and the answer never says it failed:
the entry may still commit, and sending the write again with the same ids is safe."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from dex_ha.server.node import NodeServer
from tests.server.conftest import HttpFactory, NodeFactory
from tests.server.node_fixture import expect, single_node_config

TIMEOUT_MS = 300


async def test_a_write_not_applied_in_time_answers_503_unavailable_and_a_retry_with_its_ids_is_safe(
    nodes: NodeFactory, http: HttpFactory, tmp_path: Path
) -> None:
    node: NodeServer = await nodes(single_node_config(tmp_path / "node", proposal_timeout_ms=TIMEOUT_MS))
    api = http(node)
    await api.register_agent("slow", [])
    commit_then_hold = asyncio.Event()
    real_propose = node.raft.propose

    async def commits_but_answers_late(data: bytes) -> Any:
        # The entry commits and applies; only its answer is late, as when a quorum came
        # back just after the timeout: the 503 must not have told the client it failed.
        result = await real_propose(data)
        commit_then_hold.set()
        await asyncio.sleep(60)
        return result

    node.raft.propose = commits_but_answers_late  # type: ignore[method-assign]
    started = time.monotonic()
    reply = await api.post("/v1/sessions", {"agent": "slow", "session_id": "s-late"})
    elapsed = time.monotonic() - started
    assert reply.status == 503 and reply.body["error"] == "unavailable", reply.body
    assert "leader_url" not in reply.body  # this node is the active one: stay on it
    assert reply.headers.get("Retry-After") == "1"
    assert "may still commit" in reply.body["message"] and "same ids" in reply.body["message"]
    assert TIMEOUT_MS / 1000 <= elapsed < TIMEOUT_MS / 1000 + 5
    assert commit_then_hold.is_set()
    metrics = (await api.call("GET", "/metrics", role=None)).body
    assert "dex_raft_proposals_timed_out_total 1.0" in metrics

    node.raft.propose = real_propose  # type: ignore[method-assign]
    again = expect(await api.post("/v1/sessions", {"agent": "slow", "session_id": "s-late"}), 200)
    assert again["session_id"] == "s-late"  # it had committed: the retry is a no-op, not a second session
    listed = expect(await api.get("/v1/sessions?agent=slow"), 200)
    assert [s["session_id"] for s in listed["sessions"]] == ["s-late"]
