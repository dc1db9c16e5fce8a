"""The engine is the Raft state machine: three nodes in one process, each applying the
same committed commands to its own SQLite store; a learner that joins after compaction
gets the engine's snapshot and ends with the same logical state."""

from __future__ import annotations

from pathlib import Path

import pytest

from dex_ha.engine import CreateSession, Engine, SendMessage, encode_command
from dex_ha.raft.node import Member, RaftNode, member_context
from dex_ha.raft.types import ConfChange, ConfChangeType
from harness.ports import free_ports
from harness.waiting import eventually
from tests.raft.node_helpers import propose_to_leader, relaxed_config

SECRET = b"engine-on-raft-secret-0123456789"


def _node(
    nid: str,
    root: Path,
    members: dict[str, Member],
    engine: Engine,
    listen: tuple[str, int] | None = None,
    join: bool = False,
) -> RaftNode:
    where = {"raft_listen": listen} if listen else {}
    cfg = relaxed_config(nid, root, members, SECRET, join=join, snapshot_every_entries=40, **where)
    return RaftNode(cfg, engine)


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
            res = await propose_to_leader(
                nodes, encode_command(CreateSession(at=at + i, agent="a", session_id=f"s{i}"))
            )
            assert res.ok, res
        res = await propose_to_leader(nodes, encode_command(SendMessage(at=at + 99, session_id="nope", text="hi")))
        assert not res.ok and res.http_status == 404  # a rejected command still commits, changes nothing

        joiner = _node("n4", tmp_path, dict(members), engines["n4"], listen=("127.0.0.1", ports[3]), join=True)
        await joiner.start()
        nodes["n4"] = joiner
        leader = next(n for n in nodes.values() if n.is_leader)
        await leader.change_membership(
            ConfChange(ConfChangeType.ADD_LEARNER, "n4", member_context("127.0.0.1", ports[3]))
        )
        await propose_to_leader(nodes, encode_command(CreateSession(at=at + 100, agent="a", session_id="last")))
        target = leader.sm.applied_index()
        await eventually(lambda: all(e.applied_index() >= target for e in engines.values()), "all engines", 10)
        assert joiner.metrics.snapshots_installed >= 1
        dumps = {nid: e.logical_dump() for nid, e in engines.items()}
        assert all(d == dumps["n1"] for d in dumps.values())
        assert engines["n4"].get_agent_snapshot("s59") is not None
    finally:
        for n in nodes.values():
            await n.stop()
        for e in engines.values():
            e.close()
