"""Snapshots carry a checksum (raft/snapshot_file.py), and the Raft log a CRC per record.

The repro: bytes changed in the leader's snapshot file used to be installed by a lagging
follower without a word (its state read `account-9999` while the others read
`account-1111`). Now the leader finds the damage before sending, never sends it, takes a
new snapshot, and the follower ends with the right state. A damaged snapshot that arrives
is not installed, and a node whose snapshot or log is damaged refuses to start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from dex_ha.engine import ApplyResult, CreateSession, Engine, encode_command
from dex_ha.raft.errors import NotLeader
from dex_ha.raft.node import Member, NodeConfig, RaftNode
from dex_ha.raft.snapshot_file import SnapshotCorruptionError, seal_bytes, seal_file, verify, verify_file
from dex_ha.raft.storage import LogCorruptionError
from dex_ha.raft.types import ConfState, Message, MessageType, SnapshotMeta
from harness.kv_node import KVStateMachine
from harness.ports import free_ports
from tests.raft.node_config import node_config

SECRET = b"snapshot-integrity-secret-012345"
AT = 1_700_000_000_000


def _config(nid: str, root: Path, members: dict[str, Member], every: int, join: bool = False) -> NodeConfig:
    listen = members[nid].raft_addr if len(members) > 1 else None
    return node_config(nid, root, members, raft_listen=listen, secret=SECRET, snapshot_every_entries=every, join=join)


async def _until(pred: Callable[[], bool], deadline_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < deadline_s, f"timed out after {deadline_s} s waiting for {what}"
        await asyncio.sleep(0.01)


async def _propose(nodes: dict[str, RaftNode], data: bytes) -> ApplyResult:
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


def _replace_in_file(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data, f"{old!r} is not in {path}"
    path.write_bytes(data.replace(old, new))


# ---------------------------------------------------------------- the repro


def _compacted_to_the_older_of_two(node: RaftNode, snap_dir: Path) -> bool:
    """No snapshot being taken, and the log compacted to the older of the two files kept:
    the file at the snapshot index is the one a lagging follower will be sent."""
    indexes = sorted(int(p.stem.split("-")[1]) for p in snap_dir.glob("snapshot-*.bin"))
    return node._snapshot_task is None and len(indexes) == 2 and node.status().snapshot_index == indexes[0]


@pytest.mark.timeout(120)
async def test_a_lagging_follower_never_installs_a_damaged_snapshot_and_ends_with_the_right_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ports = free_ports(3)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}
    engines = {nid: Engine(str(tmp_path / f"{nid}.db")) for nid in members}
    nodes = {nid: RaftNode(_config(nid, tmp_path, members, every=40), engines[nid]) for nid in members}
    for n in nodes.values():
        await n.start()
    try:
        create = CreateSession(at=AT, agent="a", session_id="acct", metadata={"account": "account-1111"})
        assert (await _propose(nodes, encode_command(create))).ok
        leader = next(n for n in nodes.values() if n.is_leader)
        lagging = next(nid for nid in members if nid != leader.id)
        await nodes[lagging].stop()  # it misses what follows, and the log is compacted past it
        behind = engines[lagging].applied_index()
        for i in range(130):
            assert (await _propose(nodes, encode_command(CreateSession(at=AT + i, agent="a", session_id=f"s{i}")))).ok
        snap_dir = tmp_path / leader.id / "snapshots"
        await _until(lambda: _compacted_to_the_older_of_two(leader, snap_dir), 10, "snapshots to settle")
        snap_index = leader.status().snapshot_index
        assert snap_index is not None and snap_index > behind + 1
        snap_file = snap_dir / f"snapshot-{snap_index:020d}.bin"
        _replace_in_file(snap_file, b"account-1111", b"account-9999")  # SQLite has no checksum of its own

        caplog.set_level(logging.ERROR, logger="dex_ha.raft.node")
        nodes[lagging] = RaftNode(_config(lagging, tmp_path, members, every=40), engines[lagging])
        await nodes[lagging].start()
        target = leader.sm.applied_index()
        await _until(lambda: engines[lagging].applied_index() >= target, 20, "the lagging follower to catch up")

        dumps = {nid: e.logical_dump(include_applied_index=False) for nid, e in engines.items()}
        assert "account-1111" in repr(dumps[lagging]["sessions"])
        assert "account-9999" not in repr(dumps[lagging]), "the damaged snapshot was installed"
        assert dumps[lagging] == dumps[leader.id]
        assert leader.metrics.snapshots_refused == 1
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any(f"snapshot file at index {snap_index} is damaged, NOT sent to {lagging}" in e for e in errors), (
            errors
        )
        assert (snap_file.parent / (snap_file.name + ".damaged")).exists()  # kept for inspection
    finally:
        for n in nodes.values():
            await n.stop()
        for e in engines.values():
            e.close()


# ---------------------------------------------------------------- a node's own files at start


async def _single_node_with_snapshot(root: Path) -> tuple[dict[str, Member], Path]:
    """A lone voter (in-memory state machine) with a snapshot file; stopped. (members, snapshot file)."""
    members = {"n1": Member(("127.0.0.1", 1))}
    node = RaftNode(_config("n1", root, members, every=5), KVStateMachine())
    await node.start()
    try:
        await _until(lambda: node.is_leader, 10, "the lone node to lead")
        for i in range(500):  # a snapshot is started by a write after the previous one ended
            await node.propose(msgpack.packb([f"k{i}", "account-1111"]))
            if node.status().snapshot_index:
                break
        index = node.status().snapshot_index
        assert index, "the log was never compacted to a snapshot"
    finally:
        await node.stop()
    return members, root / "n1" / "snapshots" / f"snapshot-{index:020d}.bin"


async def test_a_node_whose_snapshot_is_damaged_refuses_to_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    members, snap_file = await _single_node_with_snapshot(tmp_path)
    sm = KVStateMachine()
    RaftNode(_config("n1", tmp_path, members, every=5), sm).storage.close()  # a good file starts
    assert sm.kv["k0"] == "account-1111"
    _replace_in_file(snap_file, b"account-1111", b"account-9999")
    with pytest.raises(SnapshotCorruptionError, match="checksum mismatch"):
        RaftNode(_config("n1", tmp_path, members, every=5), KVStateMachine())
    assert any("cannot start" in r.getMessage() and str(snap_file) in r.getMessage() for r in caplog.records)


async def test_a_node_whose_log_is_damaged_in_the_middle_refuses_to_start(tmp_path: Path) -> None:
    """Every record of the log (entries, hard state, snapshot marks) has a CRC checked on
    read (tests/raft/test_storage.py covers each kind); here the whole node stops."""
    members = {"n1": Member(("127.0.0.1", 1))}
    node = RaftNode(_config("n1", tmp_path, members, every=10_000), KVStateMachine())
    await node.start()
    try:
        await _until(lambda: node.is_leader, 10, "the lone node to lead")
        for i in range(30):
            await node.propose(msgpack.packb([f"k{i}", f"value-{i:04d}"]))
    finally:
        await node.stop()
    (segment,) = (tmp_path / "n1" / "raft").glob("*.wal")
    data = bytearray(segment.read_bytes())
    at = data.index(b"value-0015")
    data[at] ^= 0x40
    segment.write_bytes(bytes(data))
    with pytest.raises(LogCorruptionError, match=r"checksum mismatch.*entry index \d+.*valid records follow") as err:
        RaftNode(_config("n1", tmp_path, members, every=10_000), KVStateMachine())
    assert str(segment) in str(err.value)


# ---------------------------------------------------------------- a snapshot that arrives damaged


async def test_a_received_snapshot_that_fails_its_checksum_is_not_installed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    members = {"n1": Member(("127.0.0.1", 1)), "n2": Member(("127.0.0.1", 2))}
    sm = KVStateMachine()
    # A joining node takes what a leader sends at once (a fresh voter would wait for its peers).
    node = RaftNode(_config("n2", tmp_path, members, every=10_000, join=True), sm)
    good = seal_bytes(msgpack.packb([7, {"k": "account-1111"}]), 7)
    meta = SnapshotMeta(7, 1, ConfState(voters=("n1", "n2")))
    damaged = good.replace(b"account-1111", b"account-9999")
    try:
        node._on_message(Message(MessageType.SNAP, to="n2", frm="n1", term=1, snapshot=meta, data=damaged))
        await _until(lambda: node.metrics.snapshots_refused == 1, 5, "the check")
        node._turn()
        assert sm.applied_index() == 0 and "k" not in sm.kv
        assert any("refused the snapshot at index 7 from n1, NOT installed" in r.getMessage() for r in caplog.records)
        node._on_message(Message(MessageType.SNAP, to="n2", frm="n1", term=1, snapshot=meta, data=good))
        await _until(lambda: bool(node._inbox), 5, "the good snapshot to pass its check")
        node._turn()
        assert sm.kv == {"k": "account-1111"} and node.metrics.snapshots_installed == 1
        assert node.metrics.snapshots_refused == 1
    finally:
        node.storage.close()


# ---------------------------------------------------------------- the file format


def test_a_sealed_file_verifies_and_any_change_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    payload = bytes(range(256)) * 5000
    path.write_bytes(payload)
    trailer = seal_file(path, 42)
    assert trailer.index == 42 and trailer.payload_bytes == len(payload)
    assert path.read_bytes() == seal_bytes(payload, 42)
    assert verify_file(path, 42) == trailer
    assert bytes(verify(path.read_bytes(), 42, "here")) == payload

    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[len(payload) // 2] ^= 1
    damaged = {
        "a flipped byte": (bytes(flipped), "checksum mismatch at index 42"),
        "cut short": (data[: len(payload) // 2] + data[len(payload) :], "the state has"),
        "no trailer": (payload, "no snapshot trailer"),
        "empty": (b"", "too short"),
    }
    for bad, message in damaged.values():
        with pytest.raises(SnapshotCorruptionError, match=message):
            verify(bad, 42, "here")
        path.write_bytes(bad)
        with pytest.raises(SnapshotCorruptionError, match=message):
            verify_file(path, 42)
    with pytest.raises(SnapshotCorruptionError, match="at index 42, not 43"):
        verify(data, 43, "here")
