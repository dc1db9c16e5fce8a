"""In-process Raft nodes for tests: a relaxed NodeConfig with fast test timings, and a
proposal that goes to whichever node leads with a valid lease."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from dex_ha.raft.errors import NotLeader
from dex_ha.raft.node import Member, NodeConfig, RaftNode

# Elections in well under a second, so tests that wait for a leader are short.
TEST_TIMINGS = {
    "election_timeout_min_ms": 300,
    "election_timeout_max_ms": 600,
    "heartbeat_interval_ms": 50,
    "lease_drift_margin_ms": 30,
}
PROPOSE_DEADLINE_S = 10.0


def relaxed_config(nid: str, root: Path, members: dict[str, Member], secret: bytes, **overrides: Any) -> NodeConfig:
    """Node `nid` of `members`, its data under `root/nid`, relaxed durability, the test
    timings; `overrides` set any other NodeConfig field (raft_listen defaults to the
    member's address)."""
    fields: dict[str, Any] = {**TEST_TIMINGS, **overrides}
    if "raft_listen" not in fields:
        fields["raft_listen"] = members[nid].raft_addr
    return NodeConfig(id=nid, data_dir=root / nid, members=members, durability="relaxed", secret=secret, **fields)


async def propose_to_leader(nodes: dict[str, RaftNode], data: bytes) -> Any:
    """Propose `data` through the node that leads with a valid lease (retried while there
    is none, or it just lost the lead); its apply result."""
    t0 = time.monotonic()
    while True:
        leader = next((n for n in nodes.values() if n.is_leader and n.lease_valid()), None)
        if leader is not None:
            try:
                return await asyncio.wait_for(leader.propose(data), timeout=5)
            except NotLeader:
                pass
        assert time.monotonic() - t0 < PROPOSE_DEADLINE_S, "no leader accepted the command"
        await asyncio.sleep(0.02)
