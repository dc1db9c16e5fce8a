"""Several RaftNodes in one process (no global state), over real loopback TCP.

Covers what ties core, storage and transport together: proposals return the state
machine's result, a leadership transfer moves the lease, a learner joins through a
snapshot after the log was compacted, is promoted and removed, and a restart resumes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict, Unpack

import msgpack
import pytest

from dex_ha.raft.errors import EntryTooLarge, NotLeader
from dex_ha.raft.node import MAX_ENTRY_BYTES_LIMIT, ApplyPace, Member, NodeConfig, RaftNode, member_context
from dex_ha.raft.storage import RaftStorage
from dex_ha.raft.threaded import RaftThread
from dex_ha.raft.transport import DEFAULT_MAX_FRAME_BYTES, KIND_MESSAGE, pack_frame
from dex_ha.raft.types import (
    ConfChange,
    ConfChangeType,
    Entry,
    HardState,
    Message,
    MessageType,
    Role,
    encode_message,
)
from harness.kv_node import KVStateMachine
from harness.ports import free_ports
from tests.raft.node_config import node_config

SECRET = b"test-cluster-secret-0123456789"


def _config(
    nid: str, root: Path, members: dict[str, Member], listen: tuple[str, int] | None = None, **kw
) -> NodeConfig:
    return node_config(nid, root, members, raft_listen=listen or members[nid].raft_addr, secret=SECRET, **kw)


async def _until(pred: Callable[[], bool], deadline_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > deadline_s:
            raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
        await asyncio.sleep(0.01)


def _leased_leaders(nodes: dict[str, RaftNode]) -> list[RaftNode]:
    return [n for n in nodes.values() if n.is_leader and n.lease_valid()]


async def _put(nodes: dict[str, RaftNode], key: str, value: str) -> int:
    """Propose through whichever node is leader, retrying through elections."""
    data = msgpack.packb([key, value], use_bin_type=True)
    t0 = time.monotonic()
    while True:
        leaders = _leased_leaders(nodes)
        if leaders:
            try:
                return await asyncio.wait_for(leaders[0].propose(data), timeout=5)
            except NotLeader:
                pass
        assert time.monotonic() - t0 < 10, "no leader accepted the proposal"
        await asyncio.sleep(0.02)


@pytest.fixture
async def cluster(tmp_path: Path):
    ports = free_ports(3)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}
    sms = {nid: KVStateMachine() for nid in members}
    nodes = {nid: RaftNode(_config(nid, tmp_path, members, snapshot_every_entries=50), sms[nid]) for nid in members}
    for n in nodes.values():
        await n.start()
    yield nodes, sms, members, tmp_path
    for n in nodes.values():
        await n.stop()


@pytest.mark.parametrize(
    "settings,named",
    [
        ({"election_timeout_min_ms": 300, "lease_drift_margin_ms": 300}, "lease_drift_margin_ms"),
        ({"heartbeat_interval_ms": 270}, "heartbeat_interval_ms"),  # = 300 - 30: the lease lapses
    ],
)
def test_node_config_refuses_timing_that_cannot_hold_a_lease(tmp_path: Path, settings: dict, named: str) -> None:
    members = {"n1": Member(("127.0.0.1", 1))}
    with pytest.raises(ValueError, match=named):
        _config("n1", tmp_path, members, **settings)


def test_a_node_starts_on_a_log_with_a_zero_filled_tail(tmp_path: Path) -> None:
    """Zeroes in the unsynced tail, then a later write's records: the node starts with
    the entries before the zeroes (it used to refuse the log as corrupt)."""
    members = {"n1": Member(("127.0.0.1", 1))}
    st = RaftStorage.open(tmp_path / "n1" / "raft", durability="relaxed")
    st.save(HardState(1, "n1", 3), [Entry(1, i, data=msgpack.packb([f"k{i}", "v"])) for i in (1, 2, 3)])
    synced = st._seg_size
    for i in range(4, 12):
        st.save(None, [Entry(1, i, data=msgpack.packb([f"k{i}", "v" * 200]))])
    zero_to = st._seg_size - 300  # the last records of the later write stay well-formed
    path = st._segments[-1].path
    st.close()
    buf = bytearray(path.read_bytes())
    buf[synced:zero_to] = bytes(zero_to - synced)
    path.write_bytes(bytes(buf))
    node = RaftNode(_config("n1", tmp_path, members), KVStateMachine())
    try:
        assert node.core.last_index == 3 and node.core.commit_index == 3
    finally:
        node.storage.close()


async def test_proposal_commits_on_every_node(cluster) -> None:
    nodes, sms, _, _ = cluster
    await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader with a lease")
    index = await _put(nodes, "a", "1")
    assert index > 0
    await _until(lambda: all(sm.kv.get("a") == "1" for sm in sms.values()), 5, "replication")
    assert sum(n.is_leader for n in nodes.values()) == 1


def _kv_entry(key: str, size: int) -> bytes:
    """A KV command of exactly `size` bytes."""
    value = "x" * size
    data = msgpack.packb([key, value], use_bin_type=True)
    return msgpack.packb([key, value[: size - (len(data) - size)]], use_bin_type=True)


async def test_a_too_large_entry_is_refused_and_the_largest_allowed_one_replicates(cluster) -> None:
    """Unrefused, an entry above the transport's frame limit was appended, its
    AppendEntries dropped by the transport on every send, and replication stalled."""
    nodes, sms, _, _ = cluster
    await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader with a lease")
    leader = _leased_leaders(nodes)[0]
    limit = leader.config.max_entry_bytes
    too_big = _kv_entry("big", DEFAULT_MAX_FRAME_BYTES + 1)
    with pytest.raises(EntryTooLarge) as info:
        await asyncio.wait_for(leader.propose(too_big), timeout=5)
    assert (info.value.size, info.value.limit) == (len(too_big), limit)
    largest = _kv_entry("big", limit)
    assert len(largest) == limit
    await asyncio.wait_for(leader.propose(largest), timeout=10)
    await _until(
        lambda: all(len(sm.kv.get("big", "")) > limit - 16 for sm in sms.values()),
        10,
        "the largest entry on every node",
    )
    await _put(nodes, "after", "1")
    await _until(lambda: all(sm.kv.get("after") == "1" for sm in sms.values()), 5, "replication after it")


def test_an_append_with_the_largest_entry_fits_in_one_frame() -> None:
    longest_id = "n" * 255  # the transport's MAX_NODE_ID_CHARS
    big = 2**63 - 1
    msg = Message(
        MessageType.APP,
        to=longest_id,
        frm=longest_id,
        term=big,
        log_term=big,
        index=big,
        entries=[Entry(big, big, data=b"x" * MAX_ENTRY_BYTES_LIMIT)],
        commit=big,
    )
    assert len(pack_frame(KIND_MESSAGE, encode_message(msg))) - 4 <= DEFAULT_MAX_FRAME_BYTES
    with pytest.raises(ValueError, match="max_entry_bytes"):
        _config("n1", Path("/nonexistent"), {"n1": Member(("127.0.0.1", 1))}, max_entry_bytes=MAX_ENTRY_BYTES_LIMIT + 1)


async def test_transfer_moves_leadership_and_lease(cluster) -> None:
    nodes, sms, _, _ = cluster
    await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader with a lease")
    old = _leased_leaders(nodes)[0]
    await _put(nodes, "before", "x")
    target = next(nid for nid in nodes if nid != old.id)
    old.transfer_leadership(target)
    assert not old.lease_valid(), "the old leader must give up its lease before TimeoutNow"
    await _until(lambda: nodes[target].is_leader and nodes[target].lease_valid(), 5, "target leads")
    assert not old.is_leader
    await _put(nodes, "after", "y")
    await _until(lambda: all(sm.kv.get("after") == "y" for sm in sms.values()), 5, "replication")


async def test_learner_joins_from_snapshot_then_promoted_and_removed(cluster) -> None:
    nodes, sms, members, root = cluster
    await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader with a lease")
    for i in range(200):  # several snapshots; the log before them is compacted away
        await _put(nodes, f"k{i}", str(i))
    leader = _leased_leaders(nodes)[0]
    snapshot_index = leader.status().snapshot_index
    assert snapshot_index is not None and snapshot_index > 0

    (port,) = free_ports(1)
    joiner_sm = KVStateMachine()
    joiner = RaftNode(_config("n4", root, dict(members), listen=("127.0.0.1", port), join=True), joiner_sm)
    await joiner.start()
    nodes["n4"] = joiner  # the fixture stops it
    await leader.change_membership(ConfChange(ConfChangeType.ADD_LEARNER, "n4", member_context("127.0.0.1", port)))
    await _until(lambda: joiner_sm.kv.get("k199") == "199", 10, "the learner to catch up")
    assert joiner.metrics.snapshots_installed >= 1, "the learner should have needed a snapshot"
    assert joiner.core.role == Role.LEARNER
    assert "n4" in leader.core.conf_state.learners

    await leader.change_membership(ConfChange(ConfChangeType.PROMOTE, "n4"))
    await _until(lambda: "n4" in leader.core.conf_state.voters, 5, "promotion")
    await _put(nodes, "post-promote", "1")
    await _until(lambda: joiner_sm.kv.get("post-promote") == "1", 5, "replication to n4")

    leader = _leased_leaders(nodes)[0]
    victim = next(nid for nid in ("n1", "n2", "n3") if nid != leader.id)
    await leader.change_membership(ConfChange(ConfChangeType.REMOVE, victim))
    await _until(lambda: victim not in leader.core.conf_state.members(), 5, "removal")
    await nodes.pop(victim).stop()
    await _put(nodes, "after-remove", "1")
    await _until(lambda: joiner_sm.kv.get("after-remove") == "1", 5, "replication after removal")


async def test_restart_resumes_from_disk(tmp_path: Path) -> None:
    ports = free_ports(3)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}

    async def boot() -> tuple[dict[str, RaftNode], dict[str, KVStateMachine]]:
        sms = {nid: KVStateMachine() for nid in members}
        nodes = {nid: RaftNode(_config(nid, tmp_path, members, snapshot_every_entries=30), sms[nid]) for nid in members}
        for n in nodes.values():
            await n.start()
        return nodes, sms

    nodes, sms = await boot()
    await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader")
    for i in range(100):
        await _put(nodes, f"k{i}", str(i))
    for n in nodes.values():
        await n.stop()
    nodes, sms = await boot()
    try:
        await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader after restart")
        await _put(nodes, "after", "restart")
        await _until(lambda: all(len(sm.kv) == 101 for sm in sms.values()), 5, "every node to replay")
        assert all(sm.kv["k99"] == "99" for sm in sms.values())
    finally:
        for n in nodes.values():
            await n.stop()


class SlowCopyKV(KVStateMachine):
    """A state machine whose snapshot copy takes far longer than an election timeout."""

    COPY_SECONDS = 1.5

    def __init__(self) -> None:
        super().__init__()
        self.copies_started = 0

    def snapshot_copier(self):
        inner = super().snapshot_copier()
        self.copies_started += 1

        def copy(path):
            time.sleep(self.COPY_SECONDS)  # blocks its thread, never the event loop
            return inner(path)

        return copy


async def test_a_slow_snapshot_copy_does_not_cost_leadership(tmp_path: Path) -> None:
    ports = free_ports(3)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}
    sms = {nid: SlowCopyKV() for nid in members}
    nodes = {nid: RaftNode(_config(nid, tmp_path, members, snapshot_every_entries=20), sms[nid]) for nid in members}
    for n in nodes.values():
        await n.start()
    try:
        await _until(lambda: len(_leased_leaders(nodes)) == 1, 10, "a leader with a lease")
        leader = _leased_leaders(nodes)[0]
        term = leader.core.term
        for i in range(25):  # crosses the snapshot threshold on every node
            await _put(nodes, f"k{i}", str(i))
        await _until(lambda: all(sm.copies_started for sm in sms.values()), 5, "copies to start")
        t0 = time.monotonic()
        while time.monotonic() - t0 < SlowCopyKV.COPY_SECONDS:  # while every copy runs
            await _put(nodes, f"during{time.monotonic()}", "x")
            assert leader.is_leader and leader.lease_valid() and leader.core.term == term
        await _until(lambda: all(n.metrics.snapshots_taken >= 1 for n in nodes.values()), 5, "snapshots")
    finally:
        for n in nodes.values():
            await n.stop()


class SlowKVStateMachine(KVStateMachine):
    """Takes `per_entry_s` of wall time per entry, as a busy engine does."""

    def __init__(self, per_entry_s: float) -> None:
        super().__init__()
        self.per_entry_s = per_entry_s

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[object]:
        time.sleep(self.per_entry_s * len(entries))  # releases the GIL: the other nodes go on
        return super().apply_batch(entries)


class Timing(TypedDict):
    """The election timeouts a test sets (keyword arguments of NodeConfig)."""

    election_timeout_min_ms: int
    election_timeout_max_ms: int


class BurstConfig(TypedDict, total=False):
    """NodeConfig settings a burst test changes."""

    max_apply_entries_per_ready: int
    apply_budget_ms: int


async def _burst_of_400(tmp_path: Path, leader_s: float, follower_s: float, **config: Unpack[BurstConfig]) -> None:
    """Three RaftThreads (each node on its own thread, as in the server); once a leader is
    up, its state machine takes `leader_s` an entry and the others `follower_s`; 400
    proposals at once. Fails unless every node applied them all under the first leader."""
    ports = free_ports(3)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}
    timing = Timing(election_timeout_min_ms=800, election_timeout_max_ms=1200)
    sms = {nid: SlowKVStateMachine(per_entry_s=0.0) for nid in members}
    nodes = {nid: RaftThread(_config(nid, tmp_path, members, **timing, **config), sms[nid]) for nid in members}
    for n in nodes.values():
        await n.start()
    try:
        await _until(lambda: [n.view.is_leader for n in nodes.values()].count(True) == 1, 10, "a leader")
        [leader] = [n for n in nodes.values() if n.view.is_leader]
        term = leader.view.term
        for nid, sm in sms.items():
            sm.per_entry_s = leader_s if nid == leader.id else follower_s
        burst = [leader.propose(msgpack.packb([f"k{i}", "v"], use_bin_type=True)) for i in range(400)]
        await asyncio.wait_for(asyncio.gather(*burst), timeout=30)
        await _until(lambda: all(len(sm.kv) == 400 for sm in sms.values()), 30, "every node to apply the burst")
        assert [(n.view.term, n.view.leader_id) for n in nodes.values()] == [(term, leader.id)] * 3
    finally:
        for n in nodes.values():
            await n.stop()


async def test_a_burst_of_slow_applies_does_not_cost_the_leader_its_term(tmp_path: Path) -> None:
    """On the leader (the busy node: it also serves the HTTP side) the 400 entries take
    5 ms each, 2 s in all, longer than the election timeout; the followers apply at once.
    All in one Ready, the leader's loop sent no heartbeat meanwhile, the followers elected
    another leader, and a busy cluster failed over. The count cap is set above the burst
    here: the apply budget (20 ms, a few entries at this cost) is what keeps each Ready
    short, with ticks and the network in between. (With `apply_budget_ms=10_000` it fails.)"""
    await _burst_of_400(tmp_path, leader_s=0.005, follower_s=0.0, max_apply_entries_per_ready=400)


async def test_messages_that_came_during_a_stall_count_as_contact(tmp_path: Path) -> None:
    """Every node applies the 400 entries at 5 ms each in one Ready (pacing off): each loop
    stalls 2 s, longer than the election timeout. The heartbeats and acks that arrived
    meanwhile are stepped before the timers fire (`RaftCore.set_time`), so no follower
    campaigns and the leader does not step down when its loop runs again. (Ticked before
    the inbox, as the loop once did, a follower lost its leader.)"""
    await _burst_of_400(
        tmp_path, leader_s=0.005, follower_s=0.005, max_apply_entries_per_ready=400, apply_budget_ms=10_000
    )


async def test_a_follower_acks_heartbeats_while_its_disk_is_slow(tmp_path: Path) -> None:
    """Both followers take 1 s to write each batch of entries; the leader proposes without
    pause for 4 s. A heartbeat that arrives during a write is acked at the start of the
    next turn, before that turn's own write (the ack needs nothing new on disk), so an ack
    comes at most one write and one heartbeat interval (1.05 s) after its round, and the
    leader's lease (1.5 s past each acked round) never runs out. Sent after the write, as
    an append ack must be, the ack waited for two writes (2 s) and the lease lapsed about
    half of the time. The 450 ms between 1.05 s and 1.5 s leave room for the stalls of a
    busy machine (with 500 ms writes and a 770 ms lease, 220 ms did not always)."""
    ports = free_ports(3)
    members = {f"n{i + 1}": Member(("127.0.0.1", ports[i])) for i in range(3)}
    timing = Timing(election_timeout_min_ms=1530, election_timeout_max_ms=2000)  # lease 1500 ms (drift 30)
    nodes = {nid: RaftThread(_config(nid, tmp_path, members, **timing), KVStateMachine()) for nid in members}
    for n in nodes.values():
        await n.start()
    try:
        await _until(lambda: [n.view.is_leader for n in nodes.values()].count(True) == 1, 10, "a leader")
        [leader] = [n for n in nodes.values() if n.view.is_leader]
        await _until(lambda: leader.view.lease_valid(), 5, "the leader's lease")
        for follower in (n for n in nodes.values() if n is not leader):
            storage = follower.node.storage
            append = storage.append

            def slow_append(hard_state: object, entries: list[Entry], append: Callable = append) -> None:
                if entries:
                    time.sleep(1.0)  # a slow disk; releases the GIL like a real write
                append(hard_state, entries)

            storage.append = slow_append  # type: ignore[method-assign]
        lapses = 0
        t0 = time.monotonic()
        proposals = []
        while time.monotonic() - t0 < 4:
            proposals.append(asyncio.ensure_future(leader.propose(msgpack.packb(["k", "v"], use_bin_type=True))))
            lapses += not leader.view.lease_valid()
            await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*proposals), timeout=30)
        assert lapses == 0, f"the leader's lease lapsed in {lapses} of the samples"
        assert all(n.view.term == leader.view.term for n in nodes.values())
    finally:
        for n in nodes.values():
            await n.stop()


def test_the_apply_pace_fits_the_entries_of_a_ready_in_the_budget_at_the_recent_cost() -> None:
    pace = ApplyPace(budget_s=0.020, max_entries=64)
    assert pace.limit() == 20  # before any apply is timed: 1 ms an entry
    for _ in range(30):
        pace.record(entries=10, seconds=0.001)  # 0.1 ms an entry: the count cap holds
    assert pace.limit() == 64
    for _ in range(30):
        pace.record(entries=5, seconds=0.025)  # 5 ms an entry
    assert pace.limit() == 4
    pace.record(entries=1, seconds=0.5)  # one entry slower than the budget: still one
    assert pace.limit() == 1
    for _ in range(30):
        pace.record(entries=1, seconds=0.0)  # a clock that read 0: finite, the count cap
    assert pace.limit() == 64


async def test_a_slow_turn_is_logged_with_the_part_that_took_the_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One entry that takes 200 ms to apply makes one turn longer than a quarter of the
    election timeout (75 ms here): the warning names the apply and its length."""
    members = {"n1": Member(("127.0.0.1", free_ports(1)[0]))}
    sm = SlowKVStateMachine(per_entry_s=0.0)
    node = RaftNode(_config("n1", tmp_path, members), sm)
    await node.start()
    try:
        await _until(lambda: node.is_leader, 5, "the lone node to lead")
        await node.propose(msgpack.packb(["fast", "v"], use_bin_type=True))
        assert node.turn_watch.slow_turns == 0
        sm.per_entry_s = 0.2
        with caplog.at_level(logging.WARNING, logger="dex_ha.raft.turn_watch"):
            await node.propose(msgpack.packb(["slow", "v"], use_bin_type=True))
            await _until(lambda: node.turn_watch.slow_turns == 1, 5, "the slow turn to end")
        [warning] = [r.getMessage() for r in caplog.records if "Raft loop turn took" in r.getMessage()]
        took_ms, apply_ms = (int(x) for x in re.findall(r"took (\d+) ms.*apply (\d+) ms", warning)[0])
        assert 200 <= apply_ms <= took_ms, warning
        assert "for 1 entries" in warning
    finally:
        await node.stop()
