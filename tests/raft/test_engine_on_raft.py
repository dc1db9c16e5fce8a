"""The engine is the Raft state machine: three nodes in one process, each applying the
same committed commands to its own SQLite store; a learner that joins after compaction
gets the engine's snapshot and ends with the same logical state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dex_ha.engine import CreateSession, Engine, SendMessage, encode_command
from dex_ha.raft.errors import NotLeader
from dex_ha.raft.node import Member, NodeConfig, RaftNode, member_context
from dex_ha.raft.types import ConfChange, ConfChangeType
from harness.ports import free_ports

SECRET = b"engine-on-raft-secret-0123456789"


async def _until(pred: Callable[[], bool], deadline_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < deadline_s, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _node(
    nid: str,
    root: Path,
    members: dict[str, Member],
    engine: Engine,
    listen: tuple[str, int] | None = None,
    join: bool = False,
) -> RaftNode:
    cfg = NodeConfig(
        id=nid,
        data_dir=root / nid,
        raft_listen=listen or members[nid].raft_addr,
        members=members,
        join=join,
        durability="relaxed",
        election_timeout_min_ms=300,
        election_timeout_max_ms=600,
        heartbeat_interval_ms=50,
        lease_drift_margin_ms=30,
        snapshot_every_entries=40,
        secret=SECRET,
    )
    return RaftNode(cfg, engine)


async def _propose(nodes: dict[str, RaftNode], data: bytes):
    t0 = time.monotonic()
    while True:
        leader = next((n for n in nodes.values() if n.is_leader and n.lease_valid()), None)
        if leader is not None:
            try:
                return await asyncio.wait_for(leader.propose(data), timeout=5)
            except NotLeader:
                pass
        assert time.monotonic() - t0 < 10, "no leader accepted the command"
        await asyncio.sleep(0.02)


@pytest.mark.timeout(120)
async def test_engines_on_raft_reach_identical_state_including_a_snapshot_joiner(tmp_path: Path) -> None:
    ports = free_ports(4)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}
    engines = {nid: Engine(str(tmp_path / f"{nid}.db")) for nid in ["n1", "n2", "n3", "n4"]}
    nodes = {nid: _node(nid, tmp_path, members, engines[nid]) for nid in members}
    for n in nodes.values():
        await n.start()
    try:
        at = 1_700_000_000_000
        for i in range(130):  # snapshots every 40 entries; the log is compacted behind them
            res = await _propose(nodes, encode_command(CreateSession(at=at + i, agent="a", session_id=f"s{i}")))
            assert res.ok, res
        res = await _propose(nodes, encode_command(SendMessage(at=at + 99, session_id="nope", text="hi")))
        assert not res.ok and res.http_status == 404  # a rejected command still commits, changes nothing

        joiner = _node("n4", tmp_path, dict(members), engines["n4"], listen=("127.0.0.1", ports[3]), join=True)
        await joiner.start()
        nodes["n4"] = joiner
        leader = next(n for n in nodes.values() if n.is_leader)
        await leader.change_membership(
            ConfChange(ConfChangeType.ADD_LEARNER, "n4", member_context("127.0.0.1", ports[3]))
        )
        await _propose(nodes, encode_command(CreateSession(at=at + 100, agent="a", session_id="last")))
        target = leader.sm.applied_index()
        await _until(lambda: all(e.applied_index() >= target for e in engines.values()), 10, "all engines")
        assert joiner.metrics.snapshots_installed >= 1
        dumps = {nid: e.logical_dump() for nid, e in engines.items()}
        assert all(d == dumps["n1"] for d in dumps.values())
        assert engines["n4"].get_agent_snapshot("s59") is not None
    finally:
        for n in nodes.values():
            await n.stop()
        for e in engines.values():
            e.close()
