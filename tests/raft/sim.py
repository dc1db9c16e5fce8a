"""Deterministic simulation of a Raft cluster built from pure `RaftCore`s.

One seeded `random.Random` drives everything: a priority queue of events in simulated
milliseconds, per-node clocks that drift, a network that loses, duplicates, delays
(hence reorders) and partitions (symmetric and one-way) messages, disks that lose
what was not synced when a node crashes, leadership transfers, membership changes
(add learner, promote, remove), snapshots with log compaction, and snapshot installs.
Each node applies committed entries to a tiny state machine (a hash chain over the
applied entries) that it snapshots.

Where the node loop (dex_ha.raft.node) has a rule, the simulation calls it rather than a
copy: which messages leave before the fsync (`split_early_messages`, for every role),
the view the HTTP side reads (`view_of`) and the cap on committed entries per Ready
(`ApplyPace`). Nodes crash between an early send and its fsync, and a node's loop stalls
for up to twice its election timeout (no ticks, messages queue, the Ready in flight
finishes when it resumes).

After EVERY event `Checker` verifies the safety properties; after the chaos phase the
faults heal and the run checks liveness. A failure raises `SimFailure` whose message
holds the command that replays the seed and the tail of the event trace.

Same seed, same run: nothing here iterates over a set of strings or reads a clock.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import msgpack

from dex_ha.raft import node as raft_node
from dex_ha.raft.core import TRANSFER_CONTEXT, RaftConfig, RaftCore
from dex_ha.raft.errors import ConfChangeRefused, NotLeader, ProposalDropped
from dex_ha.raft.node import NodeConfig
from dex_ha.raft.status import RaftView, view_of
from dex_ha.raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    HardState,
    Message,
    MessageType,
    Ready,
    Role,
    SnapshotMeta,
    decode_message,
    encode_message,
)

REPLAY = "DEX_HA_SIM_SEED={seed} python -m pytest tests/raft/test_sim.py -k replay"


class SimFailure(AssertionError):
    pass


# ---------------------------------------------------------------------------------
# Scenario: everything a seed decides up front


@dataclass
class Scenario:
    seed: int
    voters: int = 3
    membership: bool = False  # add learners, promote them, remove voters
    chaos_ms: int = 15_000
    drift: float = 0.045  # clock rates in [1-drift, 1+drift]; margin 100/1000 covers 5.26 %
    tick_ms: tuple[float, float] = (10.0, 25.0)
    fsync_ms: tuple[float, float] = (0.5, 4.0)
    # The node loop's early sends (dex_ha.raft.node.split_early_messages): a leader's
    # appends and heartbeats, a follower's heartbeat acks, before the Ready's fsync.
    sends_early: bool = True
    # Chance that a node which sent early crashes before the fsync of that Ready, and
    # restarts at once; higher when the Ready carries a new term, vote or vote-refusal
    # window (the promises a crash must not erase once a message relied on them).
    crash_after_early_prob: float = 0.01
    crash_after_early_promise_prob: float = 0.3
    # "Quiet" runs: mostly idle clients (cut-off followers stay up to date and can win
    # elections) and partitions that cut the leader from one follower: lease races.
    client_idle_prob: float = 0.5
    partition_kinds: tuple[str, ...] = ("split", "isolate_leader", "cut_leader", "one_way", "random_edges")
    # Liveness bounds, measured from the heal.
    lease_bound_ms: int = 15_000
    commit_bound_ms: int = 3_000
    catchup_bound_ms: int = 8_000
    liveness_proposals: int = 5
    raft: dict[str, Any] = field(default_factory=dict)  # RaftConfig overrides
    # Per-node election timeouts: each node's election_timeout_min is one of these (see
    # timing_for), and a rolling restart during the chaos moves every node to another.
    # Empty: every node uses `raft`.
    election_timeouts: tuple[int, ...] = ()

    @classmethod
    def from_seed(cls, seed: int) -> Scenario:
        """The seed's low bits pick the family; any 128 consecutive seeds cover all:

        seed % 4  3 or 5 voters, without or with membership changes
        bit 2     slow disks: crashes in the middle of a write are likelier
        bit 3     quiet clients and leader-cutting partitions: lease races
        bit 4     coarse ticks: "heard from a leader" must not be timestamped early
        bit 5     strict ordering: no node sends anything before its own fsync
        bit 6     the node loop's settings: 500-1000 ms elections, 50 ms heartbeats
        bit 7     timeouts differ between nodes, and a rolling restart changes them: the
                  lease must not rest on the followers having the leader's timeout
        """
        kind = seed % 4
        sc = cls(seed=seed, voters=3 if kind in (0, 2) else 5, membership=kind >= 2)
        if seed & 4:
            sc.fsync_ms = (2.0, 40.0)
        if seed & 8:
            sc.client_idle_prob = 0.85
            sc.partition_kinds = ("cut_leader", "cut_leader", "one_way", "split", "isolate_leader")
        if seed & 16:
            sc.tick_ms = (20.0, 60.0)
        if seed & 32:
            sc.sends_early = False
        if seed & 64:
            sc.raft = {"election_timeout_min_ms": 500, "election_timeout_max_ms": 1000, "heartbeat_interval_ms": 50}
        if seed & 128:
            sc.election_timeouts = (300, 500, 1000)
        return sc


# The timing every node runs with unless its scenario says otherwise. Slower than the
# product's default; the seeds' recorded runs are made with it.
BASE_TIMING = {
    "election_timeout_min_ms": 1000,
    "election_timeout_max_ms": 2000,
    "heartbeat_interval_ms": 100,
    "lease_drift_margin_ms": 100,
}


def timing_for(election_timeout_min_ms: int) -> dict[str, int]:
    """RaftConfig timing for one node of the mixed-timeout family. Margin and heartbeat
    scale with the timeout, so every node's lease covers the same clock drift (5.26 %)."""
    t = election_timeout_min_ms
    return {
        "election_timeout_min_ms": t,
        "election_timeout_max_ms": 2 * t,
        "heartbeat_interval_ms": t // 10,
        "lease_drift_margin_ms": t // 10,
    }


# ---------------------------------------------------------------------------------
# Node-local pieces: clock, disk, state machine


@dataclass
class Clock:
    offset: float
    rate: float

    def local(self, t: float) -> int:
        return int(self.offset + self.rate * t)


class Disk:
    """Durable log/hard state/snapshot, plus what was written but not yet synced."""

    def __init__(self) -> None:
        self.hs = HardState()
        self.unsynced_hs: HardState | None = None
        self.snap: SnapshotMeta | None = None
        self.snap_data = b""
        self.entries: list[Entry] = []

    @property
    def snap_index(self) -> int:
        return self.snap.index if self.snap is not None else 0

    def write(self, rd: Ready) -> None:
        if rd.entries and not rd.must_sync:
            raise SimFailure("a Ready with entries must be synced")
        if rd.snapshot is not None:
            self.snap, self.snap_data = rd.snapshot, rd.snapshot_data
            self.entries = []
        if rd.entries:
            keep = rd.entries[0].index - self.snap_index - 1
            if not 0 <= keep <= len(self.entries):
                raise SimFailure(f"Ready entries start at {rd.entries[0].index}: not contiguous")
            self.entries = self.entries[:keep] + rd.entries
        if rd.hard_state is not None:
            self.unsynced_hs = rd.hard_state
        if rd.must_sync and self.unsynced_hs is not None:
            self.hs, self.unsynced_hs = self.unsynced_hs, None  # fsync flushes everything

    def crash(self) -> None:
        self.unsynced_hs = None

    def has(self, index: int, term: int) -> bool:
        if index <= self.snap_index:
            return True  # covered by the snapshot (only committed entries are compacted)
        i = index - self.snap_index - 1
        return i < len(self.entries) and self.entries[i].term == term

    def save_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        drop = meta.index - self.snap_index
        self.entries = self.entries[drop:]
        self.snap, self.snap_data = meta, data


def _chain(digest: bytes, e: Entry) -> bytes:
    h = hashlib.blake2b(digest, digest_size=8)
    h.update(b"%d:%d:%d:" % (e.index, e.term, int(e.type)))
    h.update(e.data)
    return h.digest()


# ---------------------------------------------------------------------------------
# A simulated node


class SimNode:
    def __init__(self, node_id: str, clock: Clock, bootstrap: ConfState, compact_every: int, raft: dict[str, Any]):
        self.id = node_id
        self.clock = clock
        self.raft = raft  # RaftConfig overrides; a rolling restart changes them
        self.bootstrap = bootstrap
        self.compact_every = compact_every
        self.disk = Disk()
        self.core: RaftCore | None = None
        self.incarnation = 0
        self.outstanding: Ready | None = None
        self.late_messages: list[Message] = []  # the outstanding Ready's, sent after the write
        # State machine: index of the last applied entry and the hash chain up to it.
        self.sm_index = 0
        self.sm_digest = b""
        self.max_sent_term = 0
        self.completeness_checked_term = -1
        self.checked_commit = 0  # commit scanned by the checker (this incarnation)
        self.seen_commit = 0
        # What the node loop publishes for the HTTP side (dex_ha.raft.status.view_of): the
        # server answers as the active node while this view's lease is valid.
        self.view: RaftView | None = None
        # The committed entries per Ready, paced as the node loop paces them.
        self.apply_pace = raft_node.ApplyPace(NodeConfig.apply_budget_ms / 1000, NodeConfig.max_apply_entries_per_ready)
        self.apply_cost_s = 0.0002  # per entry; changes with the simulated load
        # A stalled loop (see Simulation._chaos_stall): until `stalled_until` the node
        # neither ticks nor steps messages nor handles Readies; what comes waits here.
        self.stalled_until: float | None = None
        self.stall_lease_end = float("-inf")  # real time its lease ended when the stall began
        self.stalled_inbox: list[Message] = []
        self.stalled_reports: list[tuple[str, bool]] = []
        self.stalled_io = False  # an fsync that finished while stalled: handled on resume

    @property
    def up(self) -> bool:
        return self.core is not None

    def start(self, now: float, seed: int) -> None:
        disk = self.disk
        snap = disk.snap
        self.sm_index, self.sm_digest = 0, b""
        if snap is not None:
            self.sm_index, self.sm_digest = msgpack.unpackb(disk.snap_data)
        self.core = RaftCore(
            RaftConfig(id=self.id, **self.raft),
            hard_state=disk.hs,
            conf_state=snap.conf_state if snap is not None else self.bootstrap,
            snapshot=snap,
            entries=list(disk.entries),
            applied=self.sm_index,
            now_ms=self.clock.local(now),
            rng=random.Random(seed),
        )
        self.incarnation += 1
        self.outstanding = None
        self.checked_commit = 0
        self.seen_commit = 0
        self.view = view_of(self.core)

    @property
    def stalled(self) -> bool:
        return self.stalled_until is not None

    def end_stall(self) -> None:
        self.stalled_until = None
        self.stalled_inbox, self.stalled_reports, self.stalled_io = [], [], False

    def crash(self) -> None:
        self.core = None
        self.view = None
        self.outstanding = None  # the in-flight write never completed
        self.end_stall()
        self.disk.crash()
        self.incarnation += 1


# ---------------------------------------------------------------------------------
# Safety checker


class Checker:
    """Global records of what the cluster has promised, checked after every event."""

    def __init__(self, nodes: dict[str, SimNode], fail: Callable[[str], None]) -> None:
        self.nodes = nodes
        self.fail = fail
        self.leaders: dict[int, str] = {}
        self.committed: dict[int, tuple[int, int, bytes]] = {}  # index -> (term, type, data)
        self.max_committed = 0
        # The term in which each entry was committed (the term of the node that first
        # showed it committed: the leader that committed it), and per such term the
        # highest index committed in it. Leader completeness is about these terms.
        self.commit_term: dict[int, int] = {}
        self.max_index_by_commit_term: dict[int, int] = {}
        self.max_index_by_term: dict[int, int] = {}
        self.by_index_term: dict[tuple[int, int], tuple[int, bytes, int | None]] = {}
        self.digests: dict[int, bytes] = {}
        self.votes: dict[tuple[str, int], str] = {}  # (voter, term) -> candidate

    def on_persist(self, node: SimNode, rd: Ready, prev_term: int | None) -> None:
        """Log matching: (index, term) fixes the entry and the term before it."""
        for e in rd.entries:
            key = (e.index, e.term)
            val = (int(e.type), e.data, prev_term)
            old = self.by_index_term.setdefault(key, val)
            if old != val:
                self.fail(f"log matching: {node.id} has {e} after term {prev_term}, seen {old}")
            prev_term = e.term

    def on_sent(self, node: SimNode, m: Message) -> None:
        """Durability: what a node told others survives its crashes."""
        pre = m.type in (MessageType.PRE_VOTE, MessageType.PRE_VOTE_RESP)
        if m.term > node.max_sent_term and not pre:  # pre-votes run a term ahead
            node.max_sent_term = m.term
        if m.type == MessageType.VOTE_RESP and not m.reject:
            self.on_vote_sent(m)

    def on_restart(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        if core.term < node.max_sent_term:
            self.fail(f"{node.id} restarted in term {core.term} after sending in {node.max_sent_term}")
        voted = self.votes.get((node.id, core.term))
        if voted is not None and core.vote != voted:
            self.fail(f"{node.id} restarted with vote {core.vote!r}, but voted {voted} in {core.term}")

    def check_commit_durable(self, leader: SimNode, index: int, term: int) -> None:
        """A leader may only count entries that are durable (etcd ordering)."""
        voters = leader.core.conf_state.voters  # type: ignore[union-attr]
        durable = [v for v in voters if v in self.nodes and self.nodes[v].disk.has(index, term)]
        if len(durable) < len(voters) // 2 + 1:
            self.fail(f"{leader.id} committed {index} but it is durable only on {durable}")

    def on_vote_sent(self, m: Message) -> None:
        """A voter grants at most one candidate per term, across crashes."""
        key = (m.frm, m.term)
        old = self.votes.setdefault(key, m.to)
        if old != m.to:
            self.fail(f"{m.frm} voted for {old} and {m.to} in term {m.term}")

    def record_committed(self, who: str, e: Entry, term: int) -> None:
        """`who`, now in `term`, shows `e` committed."""
        val = (e.term, int(e.type), e.data)
        old = self.committed.setdefault(e.index, val)
        if old != val:
            self.fail(f"committed entry {e.index} changed on {who}: {old} -> {val}")
        self.max_committed = max(self.max_committed, e.index)
        commit_term = self.commit_term.setdefault(e.index, term)
        if e.index > self.max_index_by_commit_term.get(commit_term, 0):
            self.max_index_by_commit_term[commit_term] = e.index
        if e.index > self.max_index_by_term.get(e.term, 0):
            self.max_index_by_term[e.term] = e.index

    def on_apply(self, node: SimNode, e: Entry) -> None:
        if e.index != node.sm_index + 1:
            self.fail(f"{node.id} applied {e.index} after {node.sm_index}")
        self.record_committed(node.id, e, node.core.term)  # type: ignore[union-attr]
        node.sm_index, node.sm_digest = e.index, _chain(node.sm_digest, e)
        self.check_digest(node)

    def check_digest(self, node: SimNode) -> None:
        old = self.digests.setdefault(node.sm_index, node.sm_digest)
        if old != node.sm_digest:
            self.fail(f"{node.id}'s applied sequence up to {node.sm_index} diverges")

    def check_leased_read(self, node: SimNode) -> None:
        """An active node serves reads from its state machine: it must already have
        applied every entry committed in an earlier term."""
        term = node.core.term  # type: ignore[union-attr]
        need = max((i for t, i in self.max_index_by_term.items() if t < term), default=0)
        if node.sm_index < need:
            self.fail(
                f"{node.id} holds a lease in term {term} but applied only {node.sm_index} < {need} committed before"
            )

    def check_node(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        if core.commit_index < node.seen_commit:
            self.fail(f"{node.id} commit went back {node.seen_commit} -> {core.commit_index}")
        node.seen_commit = core.commit_index
        if core.role == Role.LEADER:
            self._check_leader(node)
        lo = max(node.checked_commit + 1, core.first_index)
        for i in range(lo, core.commit_index + 1):
            e = core.entry(i)
            if e is not None:
                if i > self.max_committed and core.role == Role.LEADER:
                    self.check_commit_durable(node, i, e.term)
                self.record_committed(node.id, e, core.term)
        node.checked_commit = max(node.checked_commit, core.commit_index)

    def _check_leader(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        holder = self.leaders.setdefault(core.term, node.id)
        if holder != node.id:
            self.fail(f"two leaders in term {core.term}: {holder} and {node.id}")
        if node.completeness_checked_term == core.term:
            return
        node.completeness_checked_term = core.term
        # Leader completeness: every entry committed in an earlier term is in the new
        # leader's log. (Not those committed in later terms: a leader elected late, by
        # votes that were delayed, may lack them; it can then neither commit nor hold a
        # lease, as its followers have moved on.)
        need = max((i for t, i in self.max_index_by_commit_term.items() if t < core.term), default=0)
        if need > core.last_index:
            self.fail(f"leader {node.id} (term {core.term}) lacks {need}, committed before its term")
        for i in range(core.first_index, need + 1):
            want = self.committed.get(i)
            if want is None or self.commit_term[i] >= core.term:
                continue
            e = core.entry(i)
            if e is None or (e.term, int(e.type), e.data) != want:
                self.fail(f"leader {node.id} (term {core.term}) has {e} at {i}, committed {want}")


# ---------------------------------------------------------------------------------
# The simulation


class Simulation:
    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.rng = random.Random(scenario.seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, str, tuple]] = []
        self._seq = 0
        self.trace: deque[tuple] = deque(maxlen=400)
        self.nodes: dict[str, SimNode] = {}
        self.check = Checker(self.nodes, self._fail)
        # Small batches and windows so that batching and flow control really happen.
        self.raft = {**BASE_TIMING, "max_msg_bytes": 400, "max_inflight_msgs": 8, **scenario.raft}
        self.events = 0
        self.stats: Counter[str] = Counter()  # what the run exercised (see test_sim)
        # Network
        self.blocked: set[tuple[str, str]] = set()
        self.partition_gen = 0
        self.loss = 0.0
        self.dup = 0.02
        self.slow = 0.03
        self.client_idle = False  # idle periods let cut-off followers stay up to date
        # Phases
        self.healed = False
        self.proposals = 0
        self.live_leader: str | None = None
        self.live_pending: list[tuple[int, int, bytes, float]] = []
        self.live_done = False
        self.next_node_no = scenario.voters + 1
        # Mixed-timeout family: half the runs start uniform (the rolling restart makes the
        # mix), half with a timeout per node.
        self.start_timeout = 0
        if scenario.election_timeouts and self.rng.random() < 0.5:
            self.start_timeout = self.rng.choice(scenario.election_timeouts)
        ids = [f"n{i}" for i in range(1, scenario.voters + 1)]
        bootstrap = ConfState(tuple(ids), ())
        for nid in ids:
            self._add_node(nid, bootstrap)

    # -- setup ----------------------------------------------------------------------------

    def _add_node(self, nid: str, bootstrap: ConfState) -> SimNode:
        d = self.sc.drift
        rate = 1 + self.rng.choice([-d, d, self.rng.uniform(-d, d)])
        clock = Clock(self.rng.uniform(0, 1e6), rate)
        raft = self.raft
        if self.sc.election_timeouts:
            t = self.start_timeout or self.rng.choice(self.sc.election_timeouts)
            raft = {**self.raft, **timing_for(t)}
        node = SimNode(nid, clock, bootstrap, compact_every=self.rng.randint(10, 60), raft=raft)
        self.nodes[nid] = node
        self._start(node)
        return node

    def _start(self, node: SimNode) -> None:
        node.start(self.now, self.rng.getrandbits(32))
        self.check.on_restart(node)
        self.trace.append((self.now, "start", node.id, node.incarnation))
        self._schedule(self.rng.uniform(*self.sc.tick_ms), "tick", node.id, node.incarnation)

    # -- event loop -----------------------------------------------------------------------

    def _schedule(self, delay: float, kind: str, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay, self._seq, kind, args))

    def run(self) -> None:
        self._schedule(0, "chaos")
        self._schedule(0, "client")
        self._schedule(self.sc.chaos_ms, "heal")
        if self.sc.election_timeouts:
            self._schedule(self.rng.uniform(1000, self.sc.chaos_ms / 2), "rolling_change")
        handlers: dict[str, Callable[..., None]] = {
            "tick": self._on_tick,
            "deliver": self._on_deliver,
            "io_done": self._on_io_done,
            "chaos": self._on_chaos,
            "client": self._on_client,
            "heal": self._on_heal,
            "restart": self._on_restart,
            "unpartition": self._on_unpartition,
            "deadline": self._on_deadline,
            "rolling_change": self._on_rolling_change,
            "roll": self._on_roll,
            "crash_before_sync": self._on_crash_before_sync,
            "unstall": self._on_unstall,
        }
        while self._queue and not self.live_done:
            self.now, _, kind, args = heapq.heappop(self._queue)
            self.events += 1
            handlers[kind](*args)
            self._check_all()
        if not self.live_done:
            self._fail("event queue ran dry before the liveness checks finished")

    def _node_up(self, nid: str, incarnation: int | None = None) -> SimNode | None:
        node = self.nodes.get(nid)
        if node is None or node.core is None:
            return None
        if incarnation is not None and node.incarnation != incarnation:
            return None
        return node

    def _on_tick(self, nid: str, incarnation: int) -> None:
        node = self._node_up(nid, incarnation)
        if node is None:
            return
        if not node.stalled:
            node.core.tick(node.clock.local(self.now))  # type: ignore[union-attr]
            self._pump(node)
        self._schedule(self.rng.uniform(*self.sc.tick_ms), "tick", nid, incarnation)

    def _pump(self, node: SimNode) -> None:
        """Publish the node's view, and start writing the next Ready if the node is not
        busy writing one. A stalled node does neither."""
        core = node.core
        if core is None or node.stalled:
            return
        node.view = view_of(core)  # before any message of a new Ready leaves
        if node.outstanding is not None or not core.has_ready():
            return
        rd = core.ready(max_committed_entries=node.apply_pace.limit())
        if rd.entries:
            self.check.on_persist(node, rd, core.term_at(rd.entries[0].index - 1))
        node.outstanding = rd
        early: list[Message]
        early, node.late_messages = [], rd.messages
        if self.sc.sends_early:
            # The node loop's own rule: what may leave before this Ready is on disk.
            early, node.late_messages = raft_node.split_early_messages(rd, core.role, node.disk.hs)
        for m in early:
            self._send(node, m)
        latency = self.rng.uniform(*self.sc.fsync_ms) if rd.must_sync else self.rng.uniform(0, 0.5)
        self._schedule(latency, "io_done", node.id, node.incarnation)
        if early and rd.must_sync and not self.healed and self.rng.random() < self._crash_after_early_prob(node, rd):
            # A crash after the early sends and before the fsync: the disk loses the Ready.
            self._schedule(self.rng.uniform(0, latency), "crash_before_sync", node.id, node.incarnation)

    def _crash_after_early_prob(self, node: SimNode, rd: Ready) -> float:
        # Compared here field by field, not with the node's own promise check: a mutation
        # of that check must not also change where the simulation crashes nodes.
        hs, durable = rd.hard_state, node.disk.hs
        if hs is not None and (hs.term, hs.vote, hs.vote_refusal_ms) != (
            durable.term,
            durable.vote,
            durable.vote_refusal_ms,
        ):
            return self.sc.crash_after_early_promise_prob
        return self.sc.crash_after_early_prob

    def _on_crash_before_sync(self, nid: str, incarnation: int) -> None:
        node = self._node_up(nid, incarnation)
        if node is not None and node.outstanding is not None and not self.healed:  # no faults after the heal
            self.stats["crash_before_sync"] += 1
            self._crash(node, fast=True)

    def _on_io_done(self, nid: str, incarnation: int) -> None:
        node = self._node_up(nid, incarnation)
        if node is None or node.outstanding is None:
            return
        if node.stalled:
            node.stalled_io = True  # the loop handles the rest of the Ready when it resumes
            return
        rd, core = node.outstanding, node.core
        assert core is not None
        node.disk.write(rd)  # 1. persist
        failed_snaps = [m.to for m in node.late_messages if not self._send(node, m)]  # 2. send
        if rd.snapshot is not None:  # 3. apply
            self._install(node, rd)
        for e in rd.committed_entries:
            self.check.on_apply(node, e)
        if rd.committed_entries:
            node.apply_pace.record(len(rd.committed_entries), len(rd.committed_entries) * node.apply_cost_s)
        node.outstanding = None
        core.advance(rd)  # 4. advance
        for to in failed_snaps:
            core.report_snapshot(to, False)
        self._maybe_compact(node, force=False)
        self._pump(node)

    def _install(self, node: SimNode, rd: Ready) -> None:
        snap = rd.snapshot
        assert snap is not None
        index, digest = msgpack.unpackb(rd.snapshot_data)
        if index != snap.index:
            self._fail(f"{node.id} got snapshot data for {index} with meta {snap}")
        node.sm_index, node.sm_digest = index, digest
        self.check.check_digest(node)
        self.trace.append((self.now, "install", node.id, index))
        self.stats["snapshot_install"] += 1

    def _maybe_compact(self, node: SimNode, force: bool) -> None:
        core = node.core
        if core is None:
            return
        idx = min(node.sm_index, core.applied_index)
        behind = idx - node.disk.snap_index
        if behind <= 0 or (not force and behind < node.compact_every):
            return
        if core.term_at(idx) is None:
            return  # a newer snapshot from the leader is being installed right now
        meta = core.snapshot_meta(idx)
        node.disk.save_snapshot(meta, msgpack.packb([idx, node.sm_digest]))
        core.compact(idx, meta)
        self.trace.append((self.now, "compact", node.id, idx))
        self.stats["compact"] += 1

    # -- network --------------------------------------------------------------------------

    def _send(self, node: SimNode, m: Message) -> bool:
        """Put `m` on the wire. Returns False for a snapshot that is lost (to report it)."""
        if m.type == MessageType.SNAP:
            # Like a node loop: ship the snapshot on disk (it may be newer than `m`'s).
            m.snapshot, m.data = node.disk.snap, node.disk.snap_data
        if m.frm != node.id and m.type != MessageType.TRANSFER_LEADER:
            self._fail(f"{node.id} sent a message from {m.frm}")
        self.check.on_sent(node, m)
        wire = encode_message(m)
        lost = (node.id, m.to) in self.blocked or self.rng.random() < self.loss
        self.stats[m.type.name] += 1
        self.trace.append(
            (
                self.now,
                "send",
                m.type.name,
                node.id,
                m.to,
                m.term,
                m.index,
                len(m.entries),
                m.commit,
                m.reject,
                m.context,
                "LOST" if lost else "",
            )
        )
        if lost:
            return m.type != MessageType.SNAP
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            if self.rng.random() < self.slow:
                delay = self.rng.uniform(50, 1500)
            else:
                delay = self.rng.uniform(0.5, 15)
            self._schedule(delay, "deliver", wire, node.id, node.incarnation)
        return True

    def _on_deliver(self, wire: bytes, frm: str, frm_incarnation: int) -> None:
        m = decode_message(wire)
        node = self._node_up(m.to)
        delivered = node is not None and (frm, m.to) not in self.blocked
        if m.type == MessageType.SNAP:
            # The sender's transport learns whether the snapshot stream went through.
            sender = self._node_up(frm, frm_incarnation)
            if sender is not None and sender.stalled:
                sender.stalled_reports.append((m.to, delivered))
            elif sender is not None:
                sender.core.report_snapshot(m.to, delivered)  # type: ignore[union-attr]
                self._pump(sender)
        if not delivered:
            return
        assert node is not None
        if node.stalled:
            node.stalled_inbox.append(m)  # the transport queues it for the loop
            return
        self.trace.append(
            (self.now, "recv", m.type.name, frm, m.to, m.term, m.index, len(m.entries), m.commit, m.reject, m.context)
        )
        self._step(node, m)
        self._pump(node)

    def _step(self, node: SimNode, m: Message) -> None:
        """Step `m`; a (pre)vote request is granted only outside the refusal window."""
        core = node.core
        assert core is not None
        if m.type not in (MessageType.VOTE, MessageType.PRE_VOTE):
            core.step(m)
            return
        # The core refuses while its clock (its last tick, no later than ours) is in the
        # window; a transfer's vote and a repeat of this term's own vote are exempt.
        local = node.clock.local(self.now)
        exempt = (m.type == MessageType.VOTE and m.context == TRANSFER_CONTEXT) or (
            m.term == core.term and core.vote == m.frm
        )
        must_refuse = not exempt and local < core.refuses_votes_until_ms
        queued = len(core._msgs)
        core.step(m)
        answers = (MessageType.VOTE_RESP, MessageType.PRE_VOTE_RESP)
        granted = [r for r in core._msgs[queued:] if r.type in answers and r.to == m.frm and not r.reject]
        if must_refuse and granted:
            self._fail(
                f"{node.id} granted a {m.type.name} to {m.frm} for term {m.term} while it promised to "
                f"refuse votes until {core.refuses_votes_until_ms} (its clock reads {local})"
            )

    # -- chaos ----------------------------------------------------------------------------

    def _leader(self) -> SimNode | None:
        """The up node that believes it leads in the highest term."""
        best = None
        for nid in sorted(self.nodes):
            node = self.nodes[nid]
            if node.core is not None and node.core.role == Role.LEADER:
                if best is None or node.core.term > best.core.term:  # type: ignore[union-attr]
                    best = node
        return best

    def _on_chaos(self) -> None:
        if self.healed:
            return
        actions: list[tuple[int, Callable[[], None]]] = [
            (3, self._chaos_crash),
            (3, self._chaos_partition),
            (2, self._chaos_transfer),
            (2, self._chaos_loss),
            (1, self._chaos_compact),
            (2, self._chaos_client_mode),
            (2, self._chaos_stall),
            (1, self._chaos_load),
        ]
        if self.sc.membership:
            actions.append((3, self._chaos_membership))
        total = sum(w for w, _ in actions)
        pick = self.rng.uniform(0, total)
        for w, action in actions:
            pick -= w
            if pick <= 0:
                action()
                break
        self._schedule(self.rng.uniform(200, 2000), "chaos")

    def _up_ids(self) -> list[str]:
        return [nid for nid in sorted(self.nodes) if self.nodes[nid].core is not None]

    def _chaos_crash(self) -> None:
        up = self._up_ids()
        if not up:
            return
        writing = [nid for nid in up if self.nodes[nid].outstanding is not None]
        if writing and self.rng.random() < 0.5:
            up = writing  # crash in the middle of a write: its data is lost
        self._crash(self.nodes[self.rng.choice(up)], fast=self.rng.random() < 0.3)

    def _crash(self, node: SimNode, fast: bool) -> None:
        """Crash `node` and restart it after a while (5-150 ms when `fast`)."""
        node.crash()
        self.trace.append((self.now, "crash", node.id))
        self.stats["crash"] += 1
        self._schedule(self.rng.uniform(5, 150) if fast else self.rng.uniform(150, 2500), "restart", node.id)

    def _chaos_stall(self) -> None:
        """The node loop stops (a long GC pause, a starved thread, a blocking call) for up
        to twice its election timeout: no ticks, no messages stepped, no Ready handled."""
        leader = self._leader()
        up = [nid for nid in self._up_ids() if not self.nodes[nid].stalled]
        if not up:
            return
        nid = leader.id if leader is not None and leader.id in up and self.rng.random() < 0.5 else self.rng.choice(up)
        node = self.nodes[nid]
        core = node.core
        assert core is not None
        end = core.lease_end_ms()
        node.stall_lease_end = float("-inf") if end is None else self._real(node, end)
        duration = self.rng.uniform(0, 2 * node.raft["election_timeout_min_ms"])
        node.stalled_until = self.now + duration
        self.trace.append((self.now, "stall", nid, round(duration, 1)))
        self.stats["stall"] += 1
        self.stats["stall_leader" if core.role == Role.LEADER else "stall_follower"] += 1
        self._schedule(duration, "unstall", nid, node.incarnation)

    def _on_unstall(self, nid: str, incarnation: int) -> None:
        """The loop resumes as the node loop's turn does: it finishes the Ready it was
        writing, then steps what arrived meanwhile (the clock set first), then ticks."""
        node = self._node_up(nid, incarnation)
        if node is None or not node.stalled:
            return
        core = node.core
        assert core is not None
        inbox, reports, io = node.stalled_inbox, node.stalled_reports, node.stalled_io
        node.end_stall()
        self.trace.append((self.now, "unstall", nid, len(inbox)))
        if io:
            self._on_io_done(nid, incarnation)
        now = node.clock.local(self.now)
        core.set_time(now)
        for to, ok in reports:
            core.report_snapshot(to, ok)
        for m in inbox:
            self._step(node, m)
        core.tick(now)
        self._pump(node)

    def _chaos_load(self) -> None:
        """A node's apply cost per entry changes (0.2 ms idle to 20 ms on a starved
        machine): its ApplyPace caps the committed entries of its next Readies."""
        up = self._up_ids()
        if up:
            node = self.nodes[self.rng.choice(up)]
            node.apply_cost_s = self.rng.choice([0.0002, 0.001, 0.006, 0.02])
            self.trace.append((self.now, "load", node.id, node.apply_cost_s))

    def _on_restart(self, nid: str) -> None:
        node = self.nodes[nid]
        if node.core is None:
            self._start(node)

    def _on_rolling_change(self) -> None:
        """An operator changes election_timeout_min everywhere, restarting one node at a
        time: for a while the old and the new setting run side by side."""
        choices = self.sc.election_timeouts
        # From a uniform setting to another one; from a mix, each node to a new value.
        target = self.rng.choice([t for t in choices if t != self.start_timeout])
        delay = 0.0
        for nid in sorted(self.nodes):
            delay += self.rng.uniform(300, 3000)
            current = self.nodes[nid].raft["election_timeout_min_ms"]
            new = target if self.start_timeout else self.rng.choice([t for t in choices if t != current])
            self._schedule(delay, "roll", nid, new)

    def _on_roll(self, nid: str, timeout: int) -> None:
        if self.healed:
            # The liveness phase allows no faults: a restart of the leader it proposed
            # to loses the proposals (seed 679). The remaining nodes keep their setting.
            self.trace.append((self.now, "roll_skipped_after_heal", nid))
            return
        node = self.nodes[nid]
        node.raft = {**self.raft, **timing_for(timeout)}
        self.trace.append((self.now, "roll", nid, timeout))
        self.stats["rolling_restart"] += 1
        if node.core is not None:  # a node that is down picks the setting up when it starts
            node.crash()
            self._schedule(self.rng.uniform(5, 500), "restart", nid)

    def _chaos_partition(self) -> None:
        ids = sorted(self.nodes)
        kind = self.rng.choice(self.sc.partition_kinds)
        blocked: set[tuple[str, str]] = set()
        if kind == "split":
            group = self.rng.sample(ids, self.rng.randint(1, len(ids) // 2))
            rest = [n for n in ids if n not in group]
            blocked = {(a, b) for a in group for b in rest} | {(b, a) for a in group for b in rest}
        elif kind == "isolate_leader":
            leader = self._leader()
            if leader is not None:
                others = [n for n in ids if n != leader.id]
                way = self.rng.choice(["in", "out", "both"])
                if way in ("out", "both"):
                    blocked |= {(leader.id, o) for o in others}
                if way in ("in", "both"):
                    blocked |= {(o, leader.id) for o in others}
        elif kind == "cut_leader":
            # The leader keeps its lease through the others while one follower stops
            # hearing from it: that follower's election races the lease.
            leader = self._leader()
            if leader is not None:
                victim = self.rng.choice([n for n in ids if n != leader.id])
                blocked = {(leader.id, victim)}
                if self.rng.random() < 0.5:
                    blocked.add((victim, leader.id))
        elif kind == "one_way":
            a, b = self.rng.sample(ids, 2)
            blocked = {(a, b)}
        else:
            blocked = {(a, b) for a in ids for b in ids if a != b and self.rng.random() < 0.3}
        self.blocked = blocked
        self.partition_gen += 1
        self.trace.append((self.now, "partition", kind, sorted(blocked)))
        self.stats["partition_" + kind] += 1
        self._schedule(self.rng.uniform(300, 3500), "unpartition", self.partition_gen)

    def _on_unpartition(self, gen: int) -> None:
        if gen == self.partition_gen:
            self.blocked = set()
            self.trace.append((self.now, "unpartition"))

    def _chaos_transfer(self) -> None:
        leader = self._leader()
        if leader is None:
            return
        core = leader.core
        assert core is not None
        targets = [v for v in core.conf_state.voters if v != leader.id]
        if not targets:
            return
        target = self.rng.choice(targets)
        via = leader
        if self.rng.random() < 0.3:
            followers = [n for n in self._up_ids() if n != leader.id]
            if followers:
                via = self.nodes[self.rng.choice(followers)]
        if via.stalled:
            return  # its loop would take the request only when it resumes
        self.trace.append((self.now, "transfer", via.id, target))
        try:
            via.core.transfer_leadership(target)  # type: ignore[union-attr]
        except (NotLeader, ProposalDropped):
            pass
        self._pump(via)

    def _chaos_loss(self) -> None:
        self.loss = self.rng.choice([0.0, 0.0, 0.01, 0.05, 0.2])
        self.slow = self.rng.choice([0.0, 0.03, 0.03, 0.2])
        self.trace.append((self.now, "loss", self.loss, "slow", self.slow))

    def _chaos_client_mode(self) -> None:
        self.client_idle = self.rng.random() < self.sc.client_idle_prob
        self.trace.append((self.now, "client_idle", self.client_idle))

    def _chaos_compact(self) -> None:
        up = [nid for nid in self._up_ids() if not self.nodes[nid].stalled]
        if up:
            self._maybe_compact(self.nodes[self.rng.choice(up)], force=True)

    def _chaos_membership(self) -> None:
        leader = self._leader()
        if leader is None or leader.stalled:
            return
        core = leader.core
        assert core is not None
        conf = core.conf_state
        choice = self.rng.random()
        if conf.learners and choice < 0.5:
            cc = ConfChange(ConfChangeType.PROMOTE, self.rng.choice(conf.learners))
        elif len(conf.voters) > self.sc.voters and choice < 0.8:
            cc = ConfChange(ConfChangeType.REMOVE, self.rng.choice(conf.voters))
        elif len(self.nodes) < self.sc.voters + 3:
            cc = ConfChange(ConfChangeType.ADD_LEARNER, f"n{self.next_node_no}")
        else:
            return
        try:
            index = core.propose_conf_change(cc)
        except (NotLeader, ProposalDropped, ConfChangeRefused):
            return
        self.trace.append((self.now, "conf_change", leader.id, cc.type.name, cc.node_id, index))
        self.stats["conf_" + cc.type.name] += 1
        if cc.type == ConfChangeType.ADD_LEARNER:
            self.next_node_no += 1
            # A fresh node knows no configuration; it learns it from the leader.
            self._add_node(cc.node_id, ConfState())
        self._pump(leader)

    # -- clients --------------------------------------------------------------------------

    def _propose(self, node: SimNode) -> tuple[int, bytes] | None:
        self.proposals += 1
        data = b"s%d-p%d" % (self.sc.seed, self.proposals)
        try:
            index = node.core.propose(data)  # type: ignore[union-attr]
        except (NotLeader, ProposalDropped):
            return None
        self._pump(node)
        return index, data

    def _on_client(self) -> None:
        if self.healed:
            return
        for nid in [] if self.client_idle else self._up_ids():
            node = self.nodes[nid]
            if node.core.role == Role.LEADER and not node.stalled:  # type: ignore[union-attr]
                for _ in range(self.rng.randint(1, 3)):
                    self._propose(node)
        self._schedule(self.rng.uniform(20, 200), "client")

    # -- heal and liveness ----------------------------------------------------------------

    def _on_heal(self) -> None:
        self.healed = True
        self.blocked = set()
        self.loss = self.dup = self.slow = 0.0
        self.trace.append((self.now, "heal"))
        for nid in sorted(self.nodes):
            if self.nodes[nid].core is None:
                self._start(self.nodes[nid])
        self.heal_time = self.now
        self._schedule(self.sc.lease_bound_ms, "deadline", "lease")

    def _on_deadline(self, what: str) -> None:
        if what == "lease" and self.live_leader is None:
            self._fail(f"no leader with a valid lease {self.sc.lease_bound_ms} ms after heal")
        if what == "commit" and self.live_pending:
            self._fail(f"proposals {[p[0] for p in self.live_pending]} did not commit in time")
        if what == "catchup" and not self.live_done:
            self._fail(f"members did not catch up: {self._catchup_state()}")

    def _liveness_step(self) -> None:
        if self.live_leader is None:
            # A leased leader that is removing itself refuses proposals by design: wait
            # for the leader the cluster settles on.
            holders = [
                h
                for h in self._lease_holders()
                if h in self.nodes[h].core.conf_state.voters and not self.nodes[h].stalled  # type: ignore[union-attr]
            ]
            if not holders:
                return
            leader = self.nodes[holders[0]]
            self.live_leader = leader.id
            self.trace.append((self.now, "live_leader", leader.id))
            for _ in range(self.sc.liveness_proposals):
                got = self._propose(leader)
                if got is None:
                    self._fail(f"leased leader {leader.id} refused a proposal")
                index, data = got
                term = leader.core.term  # type: ignore[union-attr]
                self.live_pending.append((index, term, data, self.now))
            self.live_target = max(p[0] for p in self.live_pending)
            self._schedule(self.sc.commit_bound_ms, "deadline", "commit")
            return
        if self.live_pending:
            committed = self.check.committed
            self.live_pending = [p for p in self.live_pending if committed.get(p[0]) != (p[1], 0, p[2])]
            if not self.live_pending:
                self._schedule(self.sc.catchup_bound_ms, "deadline", "catchup")
            return
        if self._caught_up():
            self.live_done = True

    def _members_now(self) -> list[str]:
        leader = self._leader()
        if leader is None or leader.core is None:
            return []
        conf = leader.core.conf_state
        return sorted(conf.members())

    def _caught_up(self) -> bool:
        for nid in self._members_now():
            node = self.nodes.get(nid)
            if node is None or node.core is None or node.sm_index < self.live_target:
                return False
        return bool(self._members_now())

    def _catchup_state(self) -> dict[str, Any]:
        return {nid: (self.nodes[nid].sm_index if nid in self.nodes else None) for nid in self._members_now()} | {
            "target": self.live_target
        }

    # -- checks ---------------------------------------------------------------------------

    def _lease_holders(self) -> list[str]:
        holders = []
        for nid in self._up_ids():
            node = self.nodes[nid]
            if node.core is not None and node.core.lease_valid(node.clock.local(self.now)):
                holders.append(nid)
        return holders

    def _ready_nodes(self) -> list[str]:
        """The nodes whose published view says they are the active node now: what the
        HTTP side acts on (RaftView.lease_valid at the node's own clock)."""
        return [
            nid
            for nid in self._up_ids()
            if (view := self.nodes[nid].view) is not None and view.lease_valid(self.nodes[nid].clock.local(self.now))
        ]

    def _check_stalls(self) -> None:
        """A stalled leader gets no acks and moves no clock of its own: its lease, as the
        core and as its published view tell it, ends when it ended before the stall."""
        for nid in self._up_ids():
            node = self.nodes[nid]
            if not node.stalled or self.now < node.stall_lease_end:
                continue
            local = node.clock.local(self.now)
            if node.core.lease_valid(local) or (node.view is not None and node.view.lease_valid(local)):  # type: ignore[union-attr]
                self._fail(f"{nid} is stalled and its lease ended at {node.stall_lease_end:.1f}, yet it is valid")

    def _check_all(self) -> None:
        for nid in self._up_ids():
            self.check.check_node(self.nodes[nid])
        self._check_stalls()
        holders = self._lease_holders()
        if len(holders) > 1:
            self._fail(f"two valid leases at once: {holders}")
        ready = self._ready_nodes()
        if len(set(ready) | set(holders)) > 1:
            self._fail(f"two nodes ready (leader with a valid lease) at once: {ready}, by their cores {holders}")
        for nid in sorted(set(holders) | set(ready)):
            self.check.check_leased_read(self.nodes[nid])
            self._check_lease_quorum(self.nodes[nid])
            if self._a_voter_has_a_shorter_timeout(self.nodes[nid]):
                self.stats["events_with_lease_over_a_shorter_timeout"] += 1
        self.stats["events_with_lease"] += len(holders)
        if self.healed:
            self._liveness_step()

    def _check_lease_quorum(self, leader: SimNode) -> None:
        """The lease argument's invariant, checked directly and ahead of time: a quorum
        of the leader's voters will refuse votes (by their own clocks) until the lease
        has ended (by the leader's clock), comparing in simulated real time. A down
        node cannot vote, and after it restarts refuses for the window it promised."""
        core = leader.core
        assert core is not None
        local = leader.clock.local(self.now)
        lease_end = self._real(leader, local + core.lease_remaining_ms(local))
        voters = core.conf_state.voters
        refusing = []
        for v in voters:
            node = self.nodes.get(v)
            if node is None:
                continue
            if node.core is None or self._real(node, node.core.refuses_votes_until_ms) >= lease_end:
                refusing.append(v)
        if len(refusing) < len(voters) // 2 + 1:
            self._fail(
                f"{leader.id}'s lease (ends {lease_end:.1f}) outlives the vote refusal "
                f"of all but {refusing} of {voters}"
            )
        # Stronger, and what an acknowledgement means: each voter the lease counts keeps
        # its promise, even when others happen to refuse in its place (this is what
        # notices a restart that forgets a promise).
        broken = [v for v in core.lease_supporters() if v not in refusing and v in self.nodes]
        if broken:
            self._fail(
                f"{leader.id}'s lease (ends {lease_end:.1f}) outlives the vote refusal "
                f"of {broken}, whose acknowledgements it counts"
            )

    def _a_voter_has_a_shorter_timeout(self, leader: SimNode) -> bool:
        own = leader.raft.get("election_timeout_min_ms", 0)
        voters = leader.core.conf_state.voters  # type: ignore[union-attr]
        return any(v in self.nodes and self.nodes[v].raft.get("election_timeout_min_ms", 0) < own for v in voters)

    @staticmethod
    def _real(node: SimNode, local_ms: float) -> float:
        """Simulated real time at which `node`'s clock reads `local_ms`."""
        return (local_ms - node.clock.offset) / node.clock.rate

    def _fail(self, what: str) -> NoReturn:
        lines = [f"seed {self.sc.seed} at t={self.now:.1f} ms (event {self.events}): {what}"]
        lines.append(f"replay: {REPLAY.format(seed=self.sc.seed)}")
        lines.append(f"scenario: {self.sc}")
        for nid in sorted(self.nodes):
            node = self.nodes[nid]
            st = node.core.status().to_json() if node.core is not None else "down"
            lines.append(f"  {nid} clock={node.clock} sm={node.sm_index}: {st}")
        lines.append("trace (oldest first):")
        lines.extend(f"  {t:10.1f} {' '.join(map(str, rest))}" for t, *rest in self.trace)
        raise SimFailure("\n".join(lines))


def run_seed(seed: int, **overrides: Any) -> Simulation:
    """Run one seeded simulation; raises SimFailure (with the replay command) on failure."""
    sc = Scenario.from_seed(seed)
    for k, v in overrides.items():
        setattr(sc, k, v)
    sim = Simulation(sc)
    sim.run()
    return sim
