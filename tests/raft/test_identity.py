"""Cluster and member identity (dex_ha/raft/identity.py): the fresh voter's decision, and
RaftNodes in one process over loopback TCP founding a cluster, refusing a member that lost
its data, refusing a node of another cluster, and giving a data dir from before ids one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgpack
import pytest

from dex_ha.raft.identity import (
    IDENTITY_FILE,
    Found,
    FreshVoter,
    Identity,
    IdentityRefused,
    LostData,
    Wait,
    founders_cluster_id,
)
from dex_ha.raft.node import Member, RaftNode
from dex_ha.raft.snapshot_file import seal_bytes
from dex_ha.raft.types import ConfState, Message, MessageType, SnapshotMeta, decode_message, encode_message
from harness.kv_node import KVStateMachine
from harness.ports import free_ports
from harness.waiting import eventually
from tests.raft.test_node import _config, _leased_leaders, _put

VOTERS = ("n1", "n2", "n3")


def fresh(incarnation: str) -> Identity:
    return Identity(incarnation)


# ---------------------------------------------------------------- the decision, pure


def test_a_fresh_voter_waits_until_every_configured_voter_answered() -> None:
    voter = FreshVoter("n1", fresh("a"), VOTERS)
    assert voter.decide() == Wait(("n2", "n3"))
    assert voter.heard("n2", fresh("b")) == Wait(("n3",))
    assert voter.heard("n9", fresh("z")) == Wait(("n3",))  # not a configured voter: not counted


def test_fresh_voters_that_all_answer_fresh_found_the_same_cluster() -> None:
    ids = {"n1": "a", "n2": "b", "n3": "c"}
    decisions = []
    for me in VOTERS:
        voter = FreshVoter(me, fresh(ids[me]), VOTERS)
        for peer in VOTERS:
            if peer != me:
                decision = voter.heard(peer, fresh(ids[peer]))
        decisions.append(decision)
    assert decisions[0] == decisions[1] == decisions[2] == Found(founders_cluster_id(("a", "b", "c")), ("a", "b", "c"))
    assert founders_cluster_id(("a", "b", "c")) != founders_cluster_id(("a", "b", "d"))  # another cluster


def test_a_peer_with_data_that_this_incarnation_did_not_found_means_lost_data() -> None:
    voter = FreshVoter("n1", fresh("new"), VOTERS)
    with_data = Identity("b", cluster_id="X", founders=("old", "b", "c"), has_log=True)
    assert voter.heard("n2", with_data) == LostData("n2", "X")
    from_before_ids = Identity("c", has_log=True)  # a log, no id yet: still a cluster with data
    assert FreshVoter("n1", fresh("new"), VOTERS).heard("n3", from_before_ids) == LostData("n3", "")


def test_a_slow_founder_adopts_the_cluster_its_peers_founded_with_it() -> None:
    voter = FreshVoter("n1", fresh("a"), VOTERS)
    founded = Identity("b", cluster_id="X", founders=("a", "b", "c"), has_log=True)
    assert voter.heard("n2", founded) == Found("X", ("a", "b", "c"), adopted_from="n2")


def test_identity_travels_and_refuses_garbage() -> None:
    who = Identity("a", "X", ("a", "b"), True)
    assert Identity.from_wire(who.to_wire()) == who
    for bad in (None, ["a"], [1, "X", True, [], True], ["a", "X", True, [1], True]):
        with pytest.raises(ValueError):
            Identity.from_wire(bad)


# ---------------------------------------------------------------- nodes


def _members(n: int = 3) -> dict[str, Member]:
    ports = free_ports(n)
    return {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(n)}


async def _start(root: Path, members: dict[str, Member], only: tuple[str, ...] | None = None, **kw) -> dict:
    nodes = {nid: RaftNode(_config(nid, root, members, **kw), KVStateMachine()) for nid in only or tuple(members)}
    for node in nodes.values():
        await node.start()
    return nodes


async def _stop(nodes: dict) -> None:
    for node in nodes.values():
        await node.stop()


async def test_fresh_nodes_found_one_cluster_and_two_clusters_get_different_ids(tmp_path: Path) -> None:
    ids = [await _found_cluster(tmp_path / name) for name in ("x", "y")]
    assert ids[0] != ids[1]


async def _found_cluster(root: Path) -> str:
    """Start three fresh nodes; the id they all wrote to their data dirs."""
    nodes = await _start(root, _members())
    try:
        await eventually(lambda: len(_leased_leaders(nodes)) == 1, "a leader", 15)
        on_disk = {json.loads((n.config.data_dir / IDENTITY_FILE).read_text())["cluster_id"] for n in nodes.values()}
        assert len(on_disk) == 1 and "" not in on_disk
        return on_disk.pop()
    finally:
        await _stop(nodes)


async def test_a_voter_that_lost_its_data_never_votes_and_stops(tmp_path: Path) -> None:
    members = _members()
    nodes = await _start(tmp_path, members)
    try:
        await eventually(lambda: len(_leased_leaders(nodes)) == 1, "a leader", 15)
        await _put(nodes, "acknowledged", "1")
        wiped = next(nid for nid, n in nodes.items() if not n.is_leader)
        await nodes.pop(wiped).stop()
        shutil.rmtree(tmp_path / wiped)
        refused: list[BaseException] = []
        again = RaftNode(_config(wiped, tmp_path, members), KVStateMachine(), on_fatal=refused.append)
        nodes[wiped] = again
        await again.start()
        await eventually(lambda: bool(refused), "the wiped node refusing to run", 10)
        assert isinstance(refused[0], IdentityRefused)
        assert "dex-ha members replace" in str(refused[0]) and wiped in str(refused[0])
        assert again.core.term == 0 and again.core.vote == ""  # it never voted, never campaigned
    finally:
        await _stop(nodes)


async def test_a_node_of_another_cluster_is_refused_by_both_sides(tmp_path: Path, caplog) -> None:
    members = _members()
    nodes = await _start(tmp_path / "y", members)
    try:
        await eventually(lambda: len(_leased_leaders(nodes)) == 1, "a leader", 15)
        await _put(nodes, "y", "1")
        await nodes.pop("n2").stop()
        # n2's data dir is replaced by one of another cluster (founded alone), then n2 starts again.
        alone = await _start(tmp_path / "x", {"n2": members["n2"]})
        try:
            await eventually(lambda: len(_leased_leaders(alone)) == 1, "the lone leader", 15)
            await _put(alone, "x", "1")
        finally:
            await _stop(alone)
        shutil.rmtree(tmp_path / "y" / "n2")
        shutil.copytree(tmp_path / "x" / "n2", tmp_path / "y" / "n2")
        refused: list[BaseException] = []
        nodes["n2"] = RaftNode(_config("n2", tmp_path / "y", members), KVStateMachine(), on_fatal=refused.append)
        await nodes["n2"].start()
        await eventually(lambda: bool(refused), "n2 refusing to run beside another cluster", 15)
        assert len(refused) == 1 and isinstance(refused[0], IdentityRefused)
        assert "belong to another cluster" in str(refused[0])
        theirs, ours = nodes["n2"].cluster_id, nodes["n1"].cluster_id
        assert theirs and ours and theirs != ours
        refusals = [
            r.getMessage() for r in caplog.records if r.levelname == "ERROR" and "refuses peer" in r.getMessage()
        ]
        assert any(m.startswith("node n1") and theirs in m and ours in m for m in refusals), refusals
        await _put({k: v for k, v in nodes.items() if k != "n2"}, "still", "y")  # n1 and n3 go on
    finally:
        await _stop(nodes)


async def test_a_data_dir_from_before_ids_gets_one_from_its_leader(tmp_path: Path) -> None:
    members = _members()
    nodes = await _start(tmp_path, members)
    try:
        await eventually(lambda: len(_leased_leaders(nodes)) == 1, "a leader", 15)
        await _put(nodes, "k", "v")
    finally:
        await _stop(nodes)
    for nid in members:
        (tmp_path / nid / IDENTITY_FILE).unlink()  # as written by a version without ids
    nodes = await _start(tmp_path, members)
    try:
        await eventually(lambda: len(_leased_leaders(nodes)) == 1, "a leader", 15)
        await _put(nodes, "k2", "v")
        await eventually(lambda: len({n.cluster_id for n in nodes.values()} - {""}) == 1, "one id everywhere", 10)
        assert all(n.cluster_id for n in nodes.values())
    finally:
        await _stop(nodes)


def test_a_snapshot_message_carries_the_cluster_id() -> None:
    snap = Message(MessageType.SNAP, "n2", "n1", term=3, snapshot=SnapshotMeta(9, 3, ConfState(("n1",))), data=b"s")
    assert decode_message(encode_message(snap)).cluster_id == ""  # as from a node of the release before
    snap.cluster_id = "X"
    assert decode_message(encode_message(snap)).cluster_id == "X"


async def test_a_snapshot_of_another_cluster_is_dropped_and_one_of_this_cluster_teaches_the_id(
    tmp_path: Path, caplog
) -> None:
    members = _members(2)
    joiner = RaftNode(_config("n2", tmp_path, members, join=True), KVStateMachine())
    try:
        data = seal_bytes(msgpack.packb([9, {}]), 9)
        snap = Message(MessageType.SNAP, "n2", "n1", term=3, snapshot=SnapshotMeta(9, 3, ConfState(("n1",))), data=data)
        snap.cluster_id = "X"
        joiner._on_message(snap)
        assert joiner.cluster_id == "X"  # a joining node learns it
        await eventually(lambda: len(joiner._inbox) == 1, "the snapshot to pass its checksum", 5)
        snap.cluster_id = "Y"
        checks = len(joiner._background)
        joiner._on_message(snap)
        # Another cluster's: dropped, loudly (not even checked, let alone stepped).
        assert len(joiner._background) == checks and len(joiner._inbox) == 1
        assert any(r.levelname == "ERROR" and "of cluster Y from n1" in r.getMessage() for r in caplog.records)
    finally:
        joiner.storage.close()


def test_a_damaged_identity_file_stops_the_node_with_one_line(tmp_path: Path) -> None:
    members = _members(1)
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(IdentityRefused, match="identity.json is damaged .* Replace the node"):
        RaftNode(_config("n1", tmp_path, members), KVStateMachine())
