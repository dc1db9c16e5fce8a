"""Focused unit tests of the pure Raft core, driven in lockstep (no randomness in the
network: messages are delivered in order unless a test drops or holds them)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import pytest

from dex_ha.raft.core import MAX_LEASE_WINDOW_MS, RaftConfig, RaftCore
from dex_ha.raft.errors import ConfChangeRefused, EntryTooLarge, NotLeader, ProposalDropped
from dex_ha.raft.types import (
    NO_NODE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Ready,
    Role,
    SnapshotMeta,
    decode_message,
    encode_message,
)

MT = MessageType
ETMIN = 1000
MARGIN = 100


class Timing(TypedDict):
    """RaftConfig's timing fields, as keyword arguments for it."""

    election_timeout_min_ms: int
    election_timeout_max_ms: int
    heartbeat_interval_ms: int
    lease_drift_margin_ms: int


# The timing these tests are written for (slower than the product's default, so that
# ten heartbeats fit in the lease): every RaftConfig here is made with it.
TIMING = Timing(
    election_timeout_min_ms=ETMIN,
    election_timeout_max_ms=2 * ETMIN,
    heartbeat_interval_ms=100,
    lease_drift_margin_ms=MARGIN,
)


# ---------------------------------------------------------------------------------
# Harness


@dataclass
class Store:
    """What a node persisted, and what it applied."""

    hs: HardState = field(default_factory=HardState)
    snap: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)
    applied: list[Entry] = field(default_factory=list)
    applied_index: int = 0

    def write(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.snap, self.entries = rd.snapshot, []
            self.applied_index = rd.snapshot.index
        if rd.entries:
            offset = (self.snap.index if self.snap else 0) + 1
            del self.entries[rd.entries[0].index - offset :]
            self.entries.extend(rd.entries)
        if rd.hard_state is not None:
            self.hs = rd.hard_state

    def apply(self, rd: Ready) -> None:
        for e in rd.committed_entries:
            assert e.index == self.applied_index + 1
            self.applied.append(e)
            self.applied_index = e.index


class Cluster:
    """Cores plus a perfect network that tests can cut, hold, or watch."""

    def __init__(
        self,
        voters: list[str],
        learners: Sequence[str] = (),
        seed: int = 0,
        node_cfg: dict[str, Timing] | None = None,
        **cfg: object,
    ) -> None:
        self.conf = ConfState(tuple(voters), tuple(learners))
        self.cfg = cfg
        self.node_cfg = node_cfg or {}  # per-node RaftConfig overrides
        self.seed = seed
        self.now = 0
        self.stores: dict[str, Store] = {}
        self.cores: dict[str, RaftCore] = {}
        self.cut: set[tuple[str, str]] = set()
        self.drop: Callable[[Message], bool] = lambda m: False
        self.sent: list[Message] = []
        for nid in [*voters, *learners]:
            self.stores[nid] = Store()
            self.start(nid)

    def start(self, nid: str, conf: ConfState | None = None) -> RaftCore:
        st = self.stores.setdefault(nid, Store())
        self.cores[nid] = RaftCore(
            RaftConfig(id=nid, **{**TIMING, **self.cfg, **self.node_cfg.get(nid, {})}),  # type: ignore[arg-type]
            hard_state=st.hs,
            conf_state=st.snap.conf_state if st.snap else (conf or self.conf),
            snapshot=st.snap,
            entries=list(st.entries),
            applied=st.applied_index,
            now_ms=self.now,
            rng=random.Random(f"{self.seed}/{nid}/{self.now}"),
        )
        return self.cores[nid]

    def crash(self, nid: str) -> None:
        del self.cores[nid]

    def isolate(self, nid: str) -> None:
        for other in self.stores:
            self.cut |= {(nid, other), (other, nid)}

    def heal(self) -> None:
        self.cut = set()

    # -- running -----------------------------------------------------------------------

    def process(self, nid: str) -> list[Message]:
        """Run one node's Ready cycle; returns the messages it sends."""
        core = self.cores[nid]
        if not core.has_ready():
            return []
        rd = core.ready()
        st = self.stores[nid]
        st.write(rd)
        st.apply(rd)
        core.advance(rd)
        return rd.messages

    def flush(self, limit: int = 10_000) -> None:
        """Deliver everything until the cluster is quiet."""
        for _ in range(limit):
            msgs = [m for nid in sorted(self.cores) for m in self.process(nid)]
            if not msgs:
                return
            for m in msgs:
                self.deliver(m)
        raise AssertionError("cluster did not go quiet")

    def deliver(self, m: Message) -> None:
        self.sent.append(m)
        if (m.frm, m.to) in self.cut or m.to not in self.cores or self.drop(m):
            return
        self.cores[m.to].step(decode_message(encode_message(m)))

    def tick(self, ms: int = 10, only: list[str] | None = None) -> None:
        self.now += ms
        for nid in sorted(only or self.cores):
            self.cores[nid].tick(self.now)
        self.flush()

    def run(self, ms: int, step: int = 10) -> None:
        for _ in range(ms // step):
            self.tick(step)

    def elect(self, nid: str) -> RaftCore:
        """Make `nid` win an election: only its clock runs until it campaigns."""
        if self.now < ETMIN:
            self.tick(ETMIN - self.now)  # the restart guard: nobody votes before this
        core = self.cores[nid]
        t = self.now
        while core.role != Role.LEADER:
            t += 10
            core.tick(t)
            self.flush()
            assert t < self.now + 5 * ETMIN, "no election"
        self.now = t
        self.tick(0)
        return core

    def leader(self) -> RaftCore:
        leaders = [c for c in self.cores.values() if c.role == Role.LEADER]
        assert len(leaders) == 1, [c.id for c in leaders]
        return leaders[0]


def lone_core(
    config: RaftConfig,
    hard_state: HardState,
    conf_state: ConfState,
    entries: Sequence[Entry] = (),
    applied: int = 0,
    seed: int = 1,
) -> RaftCore:
    """A core outside any Cluster, started at 0 ms with no snapshot: its test steps it by hand."""
    return RaftCore(
        config,
        hard_state=hard_state,
        conf_state=conf_state,
        snapshot=None,
        entries=list(entries),
        applied=applied,
        now_ms=0,
        rng=random.Random(seed),
    )


def campaign_alone(core: RaftCore, now: int = ETMIN) -> None:
    """Tick `core` alone in 10 ms steps from `now` until it campaigns."""
    while core.role != Role.CANDIDATE:
        now += 10
        core.tick(now)


def data_of(st: Store) -> list[bytes]:
    return [e.data for e in st.applied if e.type == EntryType.NORMAL and e.data]


# ---------------------------------------------------------------------------------
# Elections


def test_election_and_first_entries() -> None:
    c = Cluster(["n1", "n2", "n3"])
    leader = c.elect("n1")
    assert leader.term == 1 and leader.leader_id == "n1"
    for nid in ("n2", "n3"):
        assert c.cores[nid].role == Role.FOLLOWER and c.cores[nid].leader_id == "n1"
    # The log starts with the bootstrap configuration, then the leader's no-op.
    types = [e.type for e in c.stores["n2"].entries]
    assert types[:-1] == [EntryType.CONF_CHANGE] * 6 and types[-1] == EntryType.NORMAL
    assert all(core.commit_index == 7 for core in c.cores.values())


def test_no_vote_during_restart_guard_then_election_happens() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.tick(ETMIN - 10)
    assert all(core.role == Role.FOLLOWER and core.term == 0 for core in c.cores.values())
    c.run(3000)
    assert c.leader().term >= 1


def test_randomized_timeouts_are_deterministic_per_seed() -> None:
    def first_campaign(seed: int) -> tuple[int, str]:
        c = Cluster(["n1", "n2", "n3"], seed=seed)
        while not any(m.type == MT.PRE_VOTE for m in c.sent):
            c.tick(1)
        return c.now, next(m.frm for m in c.sent if m.type == MT.PRE_VOTE)

    assert first_campaign(1) == first_campaign(1)  # same seed, same run
    runs = [first_campaign(seed) for seed in range(20)]
    assert all(ETMIN <= t < 2000 for t, _ in runs)
    assert len({t for t, _ in runs}) > 10 and len({who for _, who in runs}) == 3


def test_prevote_refused_while_leader_heard_recently() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    n2 = c.cores["n2"]
    term = n2.term
    pre = Message(MT.PRE_VOTE, to="n2", frm="n3", term=term + 1, index=100, log_term=term)
    n2.step(pre)
    assert not c.process("n2") and n2.term == term  # ignored: no answer, no term change
    vote = Message(MT.VOTE, to="n2", frm="n3", term=term + 1, index=100, log_term=term)
    n2.step(vote)
    assert n2.term == term and n2.vote != "n3"
    # The leader itself ignores them too.
    c.cores["n1"].step(Message(MT.PRE_VOTE, to="n1", frm="n3", term=term + 1, index=100, log_term=term))
    assert c.cores["n1"].role == Role.LEADER


def test_prevote_granted_after_leader_silent_and_term_unchanged() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.crash("n1")
    c.tick(ETMIN)  # n2 and n3 have not heard from a leader for election_timeout_min
    n2 = c.cores["n2"]
    term = n2.term
    n2.step(Message(MT.PRE_VOTE, to="n2", frm="n3", term=term + 1, index=100, log_term=term))
    (resp,) = c.process("n2")
    assert resp.type == MT.PRE_VOTE_RESP and not resp.reject and resp.term == term + 1
    assert n2.term == term  # a pre-vote never changes the voter's term


def test_vote_refused_in_a_term_adopted_from_another_message() -> None:
    """A delayed answer can carry a higher term without being a vote request; the
    recent-leader check must still hold for the vote that follows in that term."""
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    n2 = c.cores["n2"]
    term = n2.term
    n2.step(Message(MT.PRE_VOTE_RESP, to="n2", frm="n3", term=term + 1, reject=True))
    assert n2.term == term + 1 and n2.vote == NO_NODE and n2.leader_id == NO_NODE
    n2.step(Message(MT.VOTE, to="n2", frm="n3", term=term + 1, index=100, log_term=term))
    (resp,) = c.process("n2")
    assert resp.type == MT.VOTE_RESP and resp.reject and n2.vote == NO_NODE


def test_partitioned_node_does_not_inflate_its_term() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.isolate("n3")
    c.run(10_000)
    assert c.cores["n3"].term == c.cores["n1"].term  # pre-votes failed, term unchanged
    c.heal()
    c.run(500)
    assert c.leader().id == "n1"


def test_check_quorum_leader_steps_down() -> None:
    c = Cluster(["n1", "n2", "n3"])
    leader = c.elect("n1")
    c.isolate("n1")
    c.run(ETMIN - 100)
    assert leader.role == Role.LEADER
    c.run(200)
    assert leader.role == Role.FOLLOWER and leader.leader_id == NO_NODE


@pytest.mark.parametrize("acks_first", [True, False])
def test_acks_that_came_while_the_leader_stalled_count_when_stepped_after_set_time(acks_first: bool) -> None:
    """A leader's thread stalls longer than the election timeout while its followers' acks
    wait in its inbox. Stepped after set_time() and before tick() (the node loop's order),
    they count as recent contact and the leader stays; ticked first, check-quorum sees only
    contact from before the stall and the leader steps down."""
    c = Cluster(["n1", "n2", "n3"])
    leader = c.elect("n1")
    leader.tick(c.now + 100)  # a heartbeat round
    for m in c.process("n1"):
        c.deliver(m)
    acks = [m for nid in ("n2", "n3") for m in c.process(nid)]
    assert {m.type for m in acks} == {MT.HEARTBEAT_RESP}
    after_stall = c.now + ETMIN + 300
    if acks_first:
        leader.set_time(after_stall)
        for m in acks:
            leader.step(m)
        leader.tick(after_stall)
        assert leader.role == Role.LEADER
    else:
        leader.tick(after_stall)
        assert leader.role == Role.FOLLOWER


def test_restarted_node_grants_no_vote_for_election_timeout_min() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.crash("n1")
    c.run(ETMIN)
    c.crash("n2")
    n2 = c.start("n2")
    term = n2.term
    vote = Message(MT.VOTE, to="n2", frm="n3", term=term + 1, index=100, log_term=term)
    n2.step(vote)
    assert n2.term == term and not c.process("n2")
    c.tick(ETMIN, only=["n2"])
    n2.step(vote)
    (resp,) = c.process("n2")
    assert resp.type == MT.VOTE_RESP and not resp.reject and n2.vote == "n3"


def test_heard_from_leader_is_timestamped_at_the_next_tick() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    n2 = c.cores["n2"]
    c.cores["n1"].tick(c.now + 100)  # a heartbeat round, delivered before n2's next tick
    c.flush()
    assert n2.refuses_votes_until_ms == float("inf")  # heard, not yet timestamped
    n2.tick(c.now + 37)
    assert n2.refuses_votes_until_ms == c.now + 37 + ETMIN


def test_learner_never_campaigns_and_its_vote_does_not_count() -> None:
    c = Cluster(["n1", "n2"], learners=["n3"])
    c.elect("n1")
    assert c.cores["n3"].role == Role.LEARNER
    c.crash("n1")
    c.crash("n2")
    c.run(10 * ETMIN)
    assert c.cores["n3"].role == Role.LEARNER
    assert not any(m.frm == "n3" and m.type in (MT.PRE_VOTE, MT.VOTE) for m in c.sent)
    assert not any(m.to == "n3" and m.type in (MT.PRE_VOTE, MT.VOTE) for m in c.sent)
    # A candidate among voters {n1, n2} does not count a grant from the learner.
    cand = lone_core(RaftConfig(id="n1", pre_vote=False, **TIMING), HardState(term=1), c.conf, seed=3)
    campaign_alone(cand)
    cand.step(Message(MT.VOTE_RESP, to="n1", frm="n3", term=cand.term))
    assert cand.role == Role.CANDIDATE
    cand.step(Message(MT.VOTE_RESP, to="n1", frm="n2", term=cand.term))
    assert cand.role == Role.LEADER


# ---------------------------------------------------------------------------------
# Lease


def test_lease_starts_after_quorum_acked_round_and_own_entry_applied() -> None:
    c = Cluster(["n1", "n2", "n3"])
    acks = (MT.APP_RESP, MT.HEARTBEAT_RESP)
    c.drop = lambda m: m.to == "n1" and m.type in acks
    n1 = c.elect("n1")
    assert n1.role == Role.LEADER and not n1.lease_valid(c.now)  # nothing acknowledged
    c.drop = lambda m: m.to == "n1" and m.type == MT.APP_RESP
    c.tick(100)  # a heartbeat round that a quorum acknowledges...
    assert n1.commit_index < n1.last_index
    assert not n1.lease_valid(c.now)  # ...but the own-term no-op is not committed
    c.cut = {("n1", "n2"), ("n1", "n3")}
    n1.step(Message(MT.APP_RESP, to="n1", frm="n2", term=n1.term, index=n1.last_index))
    assert n1.commit_index == n1.last_index
    assert not n1.lease_valid(c.now)  # committed, not applied yet
    c.process("n1")
    assert n1.lease_valid(c.now)
    assert 0 < n1.lease_remaining_ms(c.now) <= ETMIN - MARGIN


def run_to_heartbeat_round(c: Cluster, leader: str) -> int:
    """Tick until `leader` sends a heartbeat round; returns the round's send time."""
    while True:
        mark = len(c.sent)
        c.tick(10)
        if any(m.type == MT.HEARTBEAT and m.frm == leader for m in c.sent[mark:]):
            return c.now


def test_lease_expires_at_round_send_plus_timeout_minus_margin() -> None:
    c = Cluster(["n1", "n2", "n3"])
    leader = c.elect("n1")
    c.run(300)
    sent_at = run_to_heartbeat_round(c, "n1")  # acknowledged by everyone in flush()
    c.isolate("n1")
    end = sent_at + ETMIN - MARGIN
    assert leader.lease_remaining_ms(sent_at) == ETMIN - MARGIN
    c.run(end - 10 - c.now)
    assert leader.lease_valid(end - 1) and not leader.lease_valid(end)
    assert leader.lease_remaining_ms(end - 1) == 1 and leader.lease_remaining_ms(end) == 0
    assert leader.role == Role.LEADER  # CheckQuorum steps down a bit later
    c.run(200)
    assert leader.role == Role.FOLLOWER


def test_lease_needs_a_quorum_of_acks() -> None:
    c = Cluster(["n1", "n2", "n3", "n4", "n5"])
    leader = c.elect("n1")
    c.cut = {("n2", "n1"), ("n3", "n1")}  # n4 and n5 answer: 3 of 5 with the leader
    for _ in range(200):
        c.tick(10)
        assert leader.lease_valid(c.now)
    sent_at = run_to_heartbeat_round(c, "n1")
    c.cut.add(("n4", "n1"))  # now only n5 answers: 2 of 5
    c.run(sent_at + ETMIN - MARGIN - 10 - c.now)
    assert leader.lease_valid(c.now)
    c.tick(10)
    assert not leader.lease_valid(c.now) and leader.role == Role.LEADER


def test_lease_counts_from_round_send_not_ack_arrival() -> None:
    c = Cluster(["n1", "n2", "n3"])
    leader = c.elect("n1")
    c.run(300)
    held: list[Message] = []

    def hold_acks(m: Message) -> bool:
        if m.type != MT.HEARTBEAT_RESP:
            return False
        held.append(m)
        return True

    c.drop = hold_acks
    sent_at = run_to_heartbeat_round(c, "n1")
    late_acks = list(held)
    c.run(300)  # later rounds go unanswered too
    before = leader.lease_remaining_ms(c.now)
    for m in late_acks:
        leader.step(decode_message(encode_message(m)))
    assert leader.lease_remaining_ms(c.now) == sent_at + ETMIN - MARGIN - c.now
    assert leader.lease_remaining_ms(c.now) == before + 100  # one round later than before


def test_no_lease_without_check_quorum() -> None:
    c = Cluster(["n1"], check_quorum=False)
    leader = c.elect("n1")
    assert leader.role == Role.LEADER and not leader.lease_valid(c.now)


def test_single_node_lease() -> None:
    c = Cluster(["n1"])
    leader = c.elect("n1")
    c.run(100)
    assert leader.lease_valid(c.now)
    assert leader.propose(b"x") == leader.last_index


# Timeouts that differ between nodes (as during a rolling change of the setting).
SLOW = Timing(
    election_timeout_min_ms=1000, election_timeout_max_ms=2000, heartbeat_interval_ms=100, lease_drift_margin_ms=100
)
FAST = Timing(
    election_timeout_min_ms=500, election_timeout_max_ms=1000, heartbeat_interval_ms=50, lease_drift_margin_ms=50
)
SLOW_LEADER = {"n1": SLOW, "n2": FAST, "n3": FAST}


def elect_slow_leader(c: Cluster) -> RaftCore:
    """Elect n1 (SLOW) although n2 and n3 (FAST) would campaign first: their clocks
    stop just past their restart guard, before their election timers fire."""
    guard = FAST["election_timeout_min_ms"]
    for nid in ("n2", "n3"):
        c.cores[nid].tick(guard)
    n1, t = c.cores["n1"], guard
    while n1.role != Role.LEADER:
        t += 10
        n1.tick(t)
        c.flush()
        assert t < 5 * ETMIN, "no election"
    c.now = t
    c.tick(0)
    return n1


def test_followers_with_a_shorter_timeout_wait_out_the_leaders_lease() -> None:
    """A leader with 1000 ms, followers with 500 ms, the leader isolated: the followers
    used to vote after their own 500 ms while the leader's lease (900 ms) still ran."""
    c = Cluster(["n1", "n2", "n3"], node_cfg=SLOW_LEADER)
    n1 = elect_slow_leader(c)
    c.run(300)
    sent_at = run_to_heartbeat_round(c, "n1")
    c.isolate("n1")
    lease_end = sent_at + 1000 - 100
    assert n1.lease_valid(lease_end - 1)
    c.tick(10)  # the followers timestamp the round
    for nid in ("n2", "n3"):
        assert c.cores[nid].refuses_votes_until_ms >= lease_end, nid
    while not any(c.cores[nid].role == Role.LEADER for nid in ("n2", "n3")):
        c.tick(10)
        assert c.now < sent_at + 5000, "the others never elected a leader"
    assert c.now >= lease_end and not n1.lease_valid(c.now)


def test_restarted_follower_refuses_votes_for_the_window_it_promised() -> None:
    c = Cluster(["n1", "n2", "n3"], node_cfg=SLOW_LEADER)
    elect_slow_leader(c)
    c.run(300)
    assert c.stores["n2"].hs.vote_refusal_ms == 1000  # n1's window, above n2's own 500
    c.crash("n1")
    c.crash("n2")
    n2 = c.start("n2")
    term = n2.term
    vote = Message(MT.VOTE, to="n2", frm="n3", term=term + 1, index=100, log_term=term)
    c.tick(600, only=["n2"])  # past n2's own timeout, not past the promise
    n2.step(vote)
    assert n2.term == term and not c.process("n2")
    c.tick(400, only=["n2"])
    n2.step(vote)
    (resp,) = c.process("n2")
    assert resp.type == MT.VOTE_RESP and not resp.reject


def test_after_a_restart_the_same_leaders_appends_do_not_shrink_the_promise() -> None:
    """A second crash soon after the first must still honour the promise made before
    the first: appends carry no window, so they must not lower the kept one."""
    c = Cluster(["n1", "n2", "n3"], node_cfg=SLOW_LEADER)
    n1 = elect_slow_leader(c)
    c.run(300)
    c.crash("n2")
    c.start("n2")
    c.drop = lambda m: m.type == MT.HEARTBEAT  # only appends reach n2 for now
    n1.propose(b"x")
    c.flush()
    assert c.stores["n2"].applied[-1].data == b"x"
    assert c.stores["n2"].hs.vote_refusal_ms == 1000


def _follower(nid: str = "n2", term: int = 2) -> RaftCore:
    return lone_core(RaftConfig(id=nid, **FAST), HardState(term=term), ConfState(("n1", "n2", "n3")))


def _heartbeat(frm: str, term: int, window: int) -> Message:
    return Message(MT.HEARTBEAT, to="n2", frm=frm, term=term, lease_window_ms=window)


def test_a_longer_window_is_synced_before_the_acknowledgement_goes_out() -> None:
    n2 = _follower()
    n2.step(_heartbeat("n1", 2, 1000))
    rd = n2.ready()
    assert rd.hard_state is not None and rd.hard_state.vote_refusal_ms == 1000 and rd.must_sync
    assert [m.type for m in rd.messages] == [MT.HEARTBEAT_RESP]  # sent after the sync
    n2.advance(rd)
    n2.step(_heartbeat("n1", 2, 1000))
    rd = n2.ready()
    assert rd.hard_state is None and not rd.must_sync  # the same promise: no fsync


def test_a_newer_leaders_window_replaces_an_older_one() -> None:
    """Within a term the largest window is kept; a leader of a newer term proves the
    older leases are over, so its window (at least our own timeout) replaces them."""
    n2 = _follower()
    hs = HardState(term=2)  # what the node persisted
    for frm, term, window, kept in [("n1", 2, 1000, 1000), ("n1", 2, 300, 1000), ("n3", 3, 300, 500)]:
        n2.step(_heartbeat(frm, term, window))
        rd = n2.ready()
        n2.advance(rd)
        hs = rd.hard_state or hs
        assert (hs.term, hs.vote_refusal_ms) == (term, kept), (frm, term, window)


def test_a_heartbeat_asking_for_an_absurd_window_is_ignored() -> None:
    n2 = _follower()
    n2.step(_heartbeat("n1", 2, MAX_LEASE_WINDOW_MS + 1))
    assert not n2.has_ready() and n2.leader_id == NO_NODE


@pytest.mark.parametrize(
    "settings,named",
    [
        ({"election_timeout_min_ms": 100, "lease_drift_margin_ms": 100}, "lease_drift_margin_ms"),
        ({"lease_drift_margin_ms": -1}, "lease_drift_margin_ms"),
        ({"heartbeat_interval_ms": 900}, "heartbeat_interval_ms"),  # = 1000 - 100: the lease lapses
        ({"heartbeat_interval_ms": 0}, "heartbeat_interval_ms"),
        ({"election_timeout_max_ms": 900}, "election_timeout_max_ms"),
        (
            {"election_timeout_min_ms": MAX_LEASE_WINDOW_MS + 1, "election_timeout_max_ms": 2 * MAX_LEASE_WINDOW_MS},
            "election_timeout_min_ms",
        ),
        ({"max_entry_bytes": 0}, "max_entry_bytes"),
    ],
)
def test_config_refuses_settings_that_cannot_hold_a_lease(settings: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        RaftConfig(id="n1", **{**TIMING, **settings})


def test_a_proposal_above_max_entry_bytes_is_refused_and_nothing_appended() -> None:
    c = Cluster(["n1", "n2", "n3"], max_entry_bytes=1000)
    leader = c.elect("n1")
    last = leader.last_index
    with pytest.raises(EntryTooLarge) as info:
        leader.propose(b"x" * 1001)
    assert (info.value.size, info.value.limit) == (1001, 1000)
    assert leader.last_index == last
    with pytest.raises(EntryTooLarge):  # the answer does not depend on leadership
        c.cores["n2"].propose(b"x" * 1001)
    index = leader.propose(b"x" * 1000)
    c.flush()
    assert all(st.applied[-1].index == index and st.applied[-1].data == b"x" * 1000 for st in c.stores.values())


# ---------------------------------------------------------------------------------
# Leadership transfer


def test_transfer_gives_up_lease_before_timeout_now() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.run(200)
    assert n1.lease_valid(c.now)
    n1.transfer_leadership("n2")
    assert not n1.lease_valid(c.now)  # before any message went out
    with pytest.raises(ProposalDropped):
        n1.propose(b"x")
    rd = n1.ready()
    assert [m.type for m in rd.messages] == [MT.TIMEOUT_NOW]
    n1.advance(rd)
    for m in rd.messages:
        c.deliver(m)
    c.flush()
    n2 = c.cores["n2"]
    assert n2.role == Role.LEADER and n2.term == 2
    votes = [m for m in c.sent if m.type == MT.VOTE and m.frm == "n2"]
    assert votes and all(m.context == 1 for m in votes)  # voters skip the lease check
    assert not any(m.type == MT.PRE_VOTE and m.frm == "n2" for m in c.sent)


def test_transfer_waits_for_target_to_catch_up() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.cut = {("n1", "n3")}
    for i in range(5):
        n1.propose(b"p%d" % i)
    c.flush()
    c.sent.clear()
    n1.transfer_leadership("n3")
    c.flush()
    assert not any(m.type == MT.TIMEOUT_NOW for m in c.sent)  # n3 is behind
    c.heal()
    c.run(200)
    timeout_now = [i for i, m in enumerate(c.sent) if m.type == MT.TIMEOUT_NOW]
    apps = [i for i, m in enumerate(c.sent) if m.type == MT.APP and m.to == "n3" and m.entries]
    assert timeout_now and apps and apps[0] < timeout_now[0]
    assert c.cores["n3"].role == Role.LEADER


def test_transfer_aborts_after_election_timeout_and_leader_steps_down() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.drop = lambda m: m.type == MT.TIMEOUT_NOW
    n1.transfer_leadership("n2")
    c.run(ETMIN - 50)
    assert n1.role == Role.LEADER and n1.transferring_to == "n2"
    c.run(100)
    assert n1.role == Role.FOLLOWER  # no lease is possible again in this term
    c.drop = lambda m: False
    c.run(4 * ETMIN)
    leader = c.leader()
    assert leader.term > 1
    c.run(200)
    assert leader.lease_valid(c.now)


def test_follower_forwards_transfer_request() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.cores["n3"].transfer_leadership("n2")
    c.flush()
    fwd = [m for m in c.sent if m.type == MT.TRANSFER_LEADER]
    assert fwd and fwd[0].to == "n1" and fwd[0].frm == "n2"
    assert c.cores["n2"].role == Role.LEADER


def test_transfer_errors() -> None:
    c = Cluster(["n1", "n2"], learners=["n3"])
    n1 = c.elect("n1")
    with pytest.raises(ProposalDropped):
        n1.transfer_leadership("n3")  # a learner cannot lead
    c2 = Cluster(["n1", "n2"])
    with pytest.raises(NotLeader) as info:
        c2.cores["n1"].transfer_leadership("n2")
    assert info.value.leader_id == NO_NODE


# ---------------------------------------------------------------------------------
# Replication


def test_propose_on_follower_names_the_leader() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    with pytest.raises(NotLeader) as info:
        c.cores["n2"].propose(b"x")
    assert info.value.leader_id == "n1"


def test_replication_is_batched_and_pipelined() -> None:
    c = Cluster(["n1", "n2"], max_msg_bytes=100, max_inflight_msgs=3)
    n1 = c.elect("n1")
    for i in range(40):
        n1.propose(b"%032d" % i)  # 48 bytes each counted: two per message
    rd = n1.ready()
    apps = [m for m in rd.messages if m.type == MT.APP]
    assert len(apps) == 3  # three in flight without waiting for an answer
    assert all(len(m.entries) == 2 for m in apps)
    n1.advance(rd)
    for m in rd.messages:
        c.deliver(m)
    c.flush()
    assert data_of(c.stores["n2"]) == [b"%032d" % i for i in range(40)]


def test_inflight_bytes_limit() -> None:
    c = Cluster(["n1", "n2"], max_msg_bytes=1000, max_inflight_bytes=1500)
    n1 = c.elect("n1")
    for _ in range(10):
        n1.propose(b"x" * 900)
    rd = n1.ready()
    apps = [m for m in rd.messages if m.type == MT.APP]
    assert len(apps) == 2  # 916 + 916 bytes reach the 1500-byte window
    n1.advance(rd)


def test_follower_conflicting_suffix_is_truncated() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.cut = {("n1", "n2"), ("n1", "n3")}
    for i in range(3):
        n1.propose(b"lost%d" % i)  # only n1 has these (term 1, uncommitted)
    c.flush()
    lost_from = n1.commit_index + 1
    c.heal()
    c.isolate("n1")
    c.run(3 * ETMIN)
    n2 = c.leader()
    assert n2.id != "n1"
    n2.propose(b"kept")
    c.flush()
    c.heal()
    c.crash("n1")
    n1 = c.start("n1")
    c.cores["n1"] = n1
    seen: list[Ready] = []
    original = n1.ready

    def spy(max_committed_entries: int = 0) -> Ready:
        rd = original(max_committed_entries)
        seen.append(rd)
        return rd

    n1.ready = spy  # type: ignore[method-assign]
    c.run(500)
    first_overwrite = next(rd for rd in seen if rd.entries)
    assert first_overwrite.entries[0].index == lost_from  # caller overwrites from here
    assert not any(e.data.startswith(b"lost") for e in c.stores["n1"].entries)
    assert data_of(c.stores["n1"]) == [b"kept"]


def test_fast_backtracking_with_reject_hint() -> None:
    common = [Entry(1, i) for i in range(1, 6)]
    leader_log = common + [Entry(2, i, data=b"t2") for i in range(6, 106)]
    stale_log = common + [Entry(1, i, data=b"stale") for i in range(6, 156)]
    c = Cluster(["n1", "n2", "n3"])
    for nid, log in (("n1", leader_log), ("n2", leader_log), ("n3", stale_log)):
        c.stores[nid] = Store(hs=HardState(term=2, commit=5), entries=list(log))
        c.start(nid)
    c.cut = {("n1", "n3"), ("n3", "n1")}
    n1 = c.elect("n1")
    c.heal()
    c.sent.clear()
    c.run(300)
    rejects = [m for m in c.sent if m.type == MT.APP_RESP and m.frm == "n3" and m.reject]
    assert len(rejects) == 1  # one round trip, not one per divergent entry
    assert c.stores["n3"].entries == c.stores["n1"].entries
    assert c.cores["n3"].last_index == n1.last_index == 106


def test_commit_only_by_counting_current_term_entries() -> None:
    """Raft §5.4.2 (Figure 8): an old-term entry on a majority is not committed."""
    conf = ConfState(("n1", "n2", "n3"), ())
    old = [Entry(1, 1), Entry(2, 2, data=b"old")]
    core = lone_core(
        RaftConfig(id="n1", pre_vote=False, **TIMING), HardState(term=2, vote="n1", commit=1), conf, old, 1
    )
    campaign_alone(core)
    core.advance(core.ready())
    core.step(Message(MT.VOTE_RESP, to="n1", frm="n2", term=core.term))
    assert core.role == Role.LEADER and core.term == 3
    core.advance(core.ready())  # the no-op (index 3, term 3) is persisted
    core.step(Message(MT.APP_RESP, to="n1", frm="n2", term=3, index=2))
    assert core.commit_index == 1  # index 2 (term 2) is on n1 and n2, yet not committed
    core.step(Message(MT.APP_RESP, to="n1", frm="n2", term=3, index=3))
    assert core.commit_index == 3  # committing the term-3 entry commits index 2 too


def test_leader_counts_its_own_entries_only_once_persisted() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    idx = n1.propose(b"x")
    rd = n1.ready()  # not advanced: n1 has not persisted idx yet
    for m in rd.messages:
        c.deliver(m)
    for nid in ("n2",):  # a single follower acknowledges
        for m in c.process(nid):
            c.deliver(m)
    assert n1.commit_index < idx  # n2 alone is no quorum without n1's own disk
    n1.advance(rd)
    assert n1.commit_index == idx


def test_heartbeat_commit_is_capped_by_match() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.cut = {("n1", "n3")}
    n1.propose(b"x")
    c.flush()
    c.heal()
    c.drop = lambda m: m.type == MT.APP
    c.sent.clear()
    c.run(150)
    hb = [m for m in c.sent if m.type == MT.HEARTBEAT and m.to == "n3"]
    assert hb and all(m.commit < n1.commit_index for m in hb)


# ---------------------------------------------------------------------------------
# Snapshots


def compact_node(c: Cluster, nid: str) -> int:
    core = c.cores[nid]
    idx = core.applied_index
    meta = core.snapshot_meta(idx)
    st = c.stores[nid]
    st.entries = st.entries[idx - (st.snap.index if st.snap else 0) :]
    st.snap = meta
    core.compact(idx, meta)
    return idx


def test_snapshot_sent_when_follower_lags_behind_compaction() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.crash("n3")
    for i in range(10):
        n1.propose(b"p%d" % i)
    c.flush()
    idx = compact_node(c, "n1")
    assert n1.first_index == idx + 1
    n3 = c.start("n3")
    c.sent.clear()
    installed: list[Ready] = []
    original = n3.ready

    def spy(max_committed_entries: int = 0) -> Ready:
        rd = original(max_committed_entries)
        if rd.snapshot is not None:
            installed.append(rd)
        return rd

    n3.ready = spy  # type: ignore[method-assign]
    c.run(300)
    snaps = [m for m in c.sent if m.type == MT.SNAP]
    assert snaps and snaps[0].to == "n3" and installed
    sent, got = snaps[0].snapshot, installed[0].snapshot
    assert sent is not None and sent.index == idx
    assert got is not None and got.index == idx
    assert n3.conf_state == n1.conf_state
    assert n3.last_index == n1.last_index
    n1.propose(b"after")
    c.run(100)
    assert c.stores["n3"].applied[-1].data == b"after"


def test_compact_rejects_bad_requests() -> None:
    c = Cluster(["n1"])
    n1 = c.elect("n1")
    with pytest.raises(ValueError):
        n1.compact(n1.applied_index + 1, SnapshotMeta(n1.applied_index + 1, 1, c.conf))
    meta = n1.snapshot_meta(n1.applied_index)
    with pytest.raises(ValueError):
        n1.compact(meta.index, SnapshotMeta(meta.index, meta.term + 1, meta.conf_state))
    n1.compact(meta.index, meta)
    n1.compact(meta.index, meta)  # idempotent
    assert n1.snapshot == meta


def test_report_snapshot_failure_retries() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.crash("n3")
    n1.propose(b"x")
    c.flush()
    compact_node(c, "n1")
    c.start("n3")
    c.drop = lambda m: m.type == MT.SNAP
    c.run(100)
    n1.report_snapshot("n3", False)
    c.drop = lambda m: False
    c.run(300)
    assert sum(m.type == MT.SNAP for m in c.sent) >= 2
    assert c.cores["n3"].commit_index == n1.commit_index


# ---------------------------------------------------------------------------------
# Membership


def add_member(c: Cluster, nid: str) -> None:
    leader = c.leader()
    leader.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, nid))
    c.stores[nid] = Store()
    c.start(nid, conf=ConfState())  # a new node knows no configuration
    c.flush()


def test_learner_joins_from_empty_configuration_then_is_promoted() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    n1.propose(b"before")
    c.flush()
    add_member(c, "n4")
    c.run(200)
    n4 = c.cores["n4"]
    assert n4.role == Role.LEARNER and n4.conf_state == n1.conf_state
    assert data_of(c.stores["n4"]) == [b"before"]
    with pytest.raises(ConfChangeRefused):  # the previous change must commit first...
        n1.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n4"))  # ...and be valid
    n1.propose_conf_change(ConfChange(ConfChangeType.PROMOTE, "n4"))
    c.run(100)
    assert n4.role == Role.FOLLOWER and "n4" in n1.conf_state.voters
    n1.transfer_leadership("n4")
    c.run(100)
    assert n4.role == Role.LEADER


def test_conf_change_pending_rules() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.tick(ETMIN)
    n1 = c.cores["n1"]
    t = c.now
    c.drop = lambda m: m.type == MT.APP  # votes pass, replication does not
    while n1.role != Role.LEADER:
        t += 10
        n1.tick(t)
        c.flush()
    c.now = t
    with pytest.raises(ConfChangeRefused):  # the no-op of this term is not committed yet
        n1.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n4"))
    c.drop = lambda m: False
    c.tick(100)
    idx = n1.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n4"))
    c.drop = lambda m: m.type == MT.APP
    with pytest.raises(ConfChangeRefused):  # one change at a time
        n1.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n5"))
    assert n1.commit_index < idx
    with pytest.raises(ConfChangeRefused):
        n1.propose_conf_change(ConfChange(ConfChangeType.REMOVE, "nobody"))


def test_configuration_takes_effect_when_appended_and_reverts_if_truncated() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.drop = lambda m: m.type == MT.APP_RESP  # followers append, n1 never commits
    idx = n1.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "n9"))
    c.flush()
    n2 = c.cores["n2"]
    assert "n9" in n2.conf_state.learners and n2.commit_index < idx  # in effect, uncommitted
    # A leader of a later term overwrites the uncommitted entry: the change is undone.
    n2.step(Message(MT.APP, to="n2", frm="n3", term=5, index=idx - 1, log_term=1, entries=[Entry(5, idx)]))
    assert n2.entry(idx) == Entry(5, idx)
    assert n2.conf_state == c.conf


def test_removed_leader_steps_down_after_commit() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    idx = n1.propose_conf_change(ConfChange(ConfChangeType.REMOVE, "n1"))
    assert "n1" not in n1.conf_state.voters and n1.role == Role.LEADER
    with pytest.raises(ProposalDropped):
        n1.propose(b"x")
    c.flush()
    assert n1.commit_index >= idx and n1.role == Role.LEARNER  # a non-voting follower
    c.run(4 * ETMIN)
    leader = c.leader()
    assert leader.id in ("n2", "n3") and leader.conf_state.voters == ("n2", "n3")
    assert n1.role != Role.LEADER


# ---------------------------------------------------------------------------------
# Ready / advance contract, robustness


def _leader_persisted_an_entry() -> tuple[Cluster, int, Ready]:
    """A three-node cluster whose leader n1 has persisted one new entry: the Ready that
    carried it is advanced, its messages are not sent yet. The entry's index and that Ready."""
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    idx = n1.propose(b"x")
    rd = n1.ready()
    n1.advance(rd)
    return c, idx, rd


def test_ready_contract() -> None:
    c, idx, rd = _leader_persisted_an_entry()
    n1, n2 = c.cores["n1"], c.cores["n2"]
    for m in rd.messages:
        c.deliver(m)
    for m in c.process("n2") + c.process("n3"):
        c.deliver(m)
    assert n1.commit_index == idx and n2.commit_index < idx
    assert not n2.has_ready()
    # A follower's commit-only change: hard state without sync.
    n2.step(Message(MT.HEARTBEAT, to="n2", frm="n1", term=n1.term, commit=idx, context=99))
    rd = n2.ready()
    assert rd.hard_state is not None and not rd.must_sync and not rd.entries
    assert not n2.has_ready()  # one Ready at a time
    with pytest.raises(RuntimeError):
        n2.ready()
    n2.advance(rd)
    # Term/vote changes must be synced.
    n2.step(Message(MT.APP_RESP, to="n2", frm="n3", term=n1.term + 1))
    rd = n2.ready()
    assert rd.hard_state is not None and rd.hard_state.term == n1.term + 1 and rd.must_sync
    n2.advance(rd)
    assert not n2.has_ready()


def test_committed_entries_handed_out_once_and_only_when_persisted() -> None:
    c, idx, rd1 = _leader_persisted_an_entry()
    n2 = c.cores["n2"]
    app = next(m for m in rd1.messages if m.type == MT.APP and m.to == "n2")
    app.commit = idx  # pretend the leader already knows it is committed
    n2.step(app)
    rd = n2.ready()
    assert [e.index for e in rd.entries] == [idx]
    assert all(e.index < idx for e in rd.committed_entries)  # not persisted yet
    n2.advance(rd)
    rd = n2.ready()
    assert [e.index for e in rd.committed_entries] == [idx]
    n2.advance(rd)
    assert not n2.has_ready() and n2.applied_index == idx


def test_stale_messages_are_ignored() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.cores["n1"].transfer_leadership("n2")
    c.flush()
    n2 = c.cores["n2"]
    assert n2.role == Role.LEADER and n2.term == 2
    before = (n2.term, n2.last_index, n2.commit_index)
    # An APP from the old term: answered with our term, log untouched.
    n2.step(
        Message(
            MT.APP,
            to="n2",
            frm="n1",
            term=1,
            index=n2.last_index,
            log_term=1,
            entries=[Entry(1, n2.last_index + 1, data=b"evil")],
        )
    )
    (resp,) = c.process("n2")
    assert resp.type == MT.APP_RESP and resp.term == 2 and resp.to == "n1"
    # Old-term answers and votes change nothing.
    for m in (
        Message(MT.APP_RESP, to="n2", frm="n3", term=1, index=999),
        Message(MT.HEARTBEAT_RESP, to="n2", frm="n3", term=1, context=1),
        Message(MT.VOTE, to="n2", frm="n3", term=1, index=999, log_term=9),
        Message(MT.TIMEOUT_NOW, to="n2", frm="n1", term=1),
    ):
        n2.step(m)
    assert (n2.term, n2.last_index, n2.commit_index) == before and n2.role == Role.LEADER
    # A stale APP_RESP in the current term (rejecting an index we already matched).
    n2.step(Message(MT.APP_RESP, to="n2", frm="n3", term=2, index=1, reject=True, reject_hint=0))
    c.flush()
    assert c.cores["n3"].last_index == n2.last_index


def test_hostile_messages_never_raise() -> None:
    rng = random.Random(42)
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    junk_values: list[object] = [-1, 0, 1, 2, 10**12, "x", None, 3.5, [], b"\x00"]
    for _ in range(3000):
        target = rng.choice(["n1", "n2", "n3"])
        kw: dict[str, object] = {
            "type": rng.choice(list(MessageType) + [99, -1, "APP"]),
            "to": rng.choice([target, target, "zz", ""]),
            "frm": rng.choice(["n1", "n2", "n3", "n9", "", target]),
            "term": rng.choice(junk_values + [1, 2, 3]),
            "log_term": rng.choice(junk_values),
            "index": rng.choice(junk_values + [5, 7, 8]),
            "commit": rng.choice(junk_values + [10**6]),
            "reject": rng.random() < 0.5,
            "reject_hint": rng.choice(junk_values),
            "context": rng.choice(junk_values),
            "data": rng.choice([b"", b"zz", "str"]),
        }
        if rng.random() < 0.3:
            start = rng.choice([0, 5, 7, 100])
            kw["entries"] = [
                Entry(
                    rng.choice([1, 2, 5]),
                    start + 1 + i,
                    rng.choice([0, 1, 7]),  # type: ignore[arg-type]  # junk on purpose: 7 is no EntryType
                    rng.choice([b"", b"\xff\xfe", b"garbage"]),
                )
                for i in range(rng.randint(1, 3))
            ]
        if rng.random() < 0.2:
            kw["snapshot"] = rng.choice(
                [
                    SnapshotMeta(rng.choice([0, 3, 50]), rng.choice([0, 1, 9]), c.conf),
                    SnapshotMeta(5, 1, ConfState(("n1",), ())),
                    "not a snapshot",
                ]
            )
        c.cores[target].step(Message(**kw))  # type: ignore[arg-type]
        c.flush()
        if rng.random() < 0.05:
            c.tick(50)
    c.run(5 * ETMIN)
    c.leader()  # the cluster still works


def test_status_shape() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.run(200)
    st = n1.status()
    assert st.id == "n1" and st.role == "leader" and st.leader == "n1"
    assert st.commit == n1.commit_index and st.applied == n1.applied_index
    assert 0 < st.lease_remaining_ms <= ETMIN - MARGIN
    assert set(st.members) == {"n1", "n2", "n3"}
    n2 = st.members["n2"]
    assert n2.voter and n2.match == n1.last_index and n2.last_contact_ms_ago is not None and n2.last_contact_ms_ago >= 0
    assert c.cores["n2"].status().role == "follower"
    assert st.to_json()["members"]["n2"]["match"] == n2.match  # the plain form carries the same values


def test_simultaneous_pre_candidates_do_not_split_the_vote() -> None:
    """Both followers time out in the same tick after the leader dies: with equal logs
    exactly one of them (the lower id) gets the other's pre-vote and wins term+1."""
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    term = c.leader().term
    c.crash("n1")
    c.tick(10)  # followers note the leader's last contact at this tick
    c.now += ETMIN * 3  # every follower's timer and refusal window are long past
    for nid in ("n2", "n3"):  # both tick before either's messages are delivered
        c.cores[nid].tick(c.now)
    assert all(c.cores[n].role == Role.PRE_CANDIDATE for n in ("n2", "n3"))
    c.flush()
    assert c.cores["n2"].role == Role.LEADER and c.cores["n2"].term == term + 1
    assert c.cores["n3"].leader_id == "n2" and c.cores["n3"].term == term + 1


def _n1_died_after_an_entry_n2_missed() -> Cluster:
    """n1 led three nodes, appended an entry that reached n3 but not n2 (still cut from n1), and crashed."""
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.cut = {("n1", "n2")}  # n2 misses the last entry
    c.leader().propose(b"only-n1-and-n3")
    c.flush()
    c.crash("n1")
    return c


def test_pre_candidate_with_the_better_log_still_wins_against_a_lower_id() -> None:
    c = _n1_died_after_an_entry_n2_missed()
    c.tick(10)  # followers note the leader's last contact at this tick
    c.heal()
    c.now += ETMIN * 3
    for nid in ("n2", "n3"):
        c.cores[nid].tick(c.now)
    assert all(c.cores[n].role == Role.PRE_CANDIDATE for n in ("n2", "n3"))
    c.flush()
    assert c.cores["n3"].role == Role.LEADER


def test_follower_with_the_better_log_campaigns_when_a_stale_rival_asks() -> None:
    """The stale follower's timer fires first; the up-to-date one refuses its pre-vote and
    wins at once instead of waiting for its own timer."""
    c = _n1_died_after_an_entry_n2_missed()
    c.heal()
    c.tick(10)  # followers note the leader's last contact at this tick
    c.now += ETMIN + 1  # past n3's refusal window, well before its own timer can fire
    # Timers are random; pin them so that n2's fires now and n3's much later.
    c.cores["n2"]._election_deadline = c.now
    c.cores["n3"]._election_deadline = c.now + 10 * ETMIN
    c.cores["n2"].tick(c.now)
    c.cores["n3"].tick(c.now)
    assert c.cores["n2"].role == Role.PRE_CANDIDATE and c.cores["n3"].role == Role.FOLLOWER
    c.flush()
    assert c.cores["n3"].role == Role.LEADER


def _leader_with_an_acked_entry() -> tuple[Cluster, RaftCore, int]:
    """A three-node cluster whose leader n1 has just heard both followers acknowledge one
    new entry (the acks move its commit index); its next Ready is not taken yet."""
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.flush()
    index = n1.propose(b"a")
    for m in c.process("n1"):
        c.deliver(m)
    acks = [m for nid in ("n2", "n3") for m in c.process(nid) if m.type == MT.APP_RESP]
    assert len(acks) == 2 and n1.commit_index < index
    for ack in acks:
        n1.step(ack)
    return c, n1, index


def test_one_append_per_follower_carries_the_new_entries_and_the_commit() -> None:
    """Acks that move the commit index and proposals that arrive before the next Ready
    go to each follower as one APP (no empty APP per commit advance)."""
    _, n1, index = _leader_with_an_acked_entry()
    n1.propose(b"b")
    rd = n1.ready()
    apps = sorted((m for m in rd.messages if m.type == MT.APP), key=lambda m: m.to)
    assert [m.to for m in apps] == ["n2", "n3"]
    assert all([e.data for e in m.entries] == [b"b"] and m.commit == index for m in apps)
    n1.advance(rd)


def test_a_commit_advance_with_nothing_to_send_still_reaches_the_followers() -> None:
    _, n1, index = _leader_with_an_acked_entry()
    rd = n1.ready()
    apps = sorted((m for m in rd.messages if m.type == MT.APP), key=lambda m: m.to)
    assert [(m.to, m.entries, m.commit) for m in apps] == [("n2", [], index), ("n3", [], index)]
    n1.advance(rd)


def test_proposals_made_together_reach_storage_in_one_ready_split_per_message_size() -> None:
    """N proposals before one Ready: one write (and one fsync) of all N; each follower
    gets them in messages no bigger than max_msg_bytes."""
    c = Cluster(["n1", "n2", "n3"], max_msg_bytes=100)
    n1 = c.elect("n1")
    c.flush()
    first = n1.propose(b"%032d" % 0)
    for i in range(1, 10):
        n1.propose(b"%032d" % i)  # 48 bytes each counted: two per message
    rd = n1.ready()
    assert [e.index for e in rd.entries] == list(range(first, first + 10)) and rd.must_sync
    for peer in ("n2", "n3"):
        apps = [m for m in rd.messages if m.type == MT.APP and m.to == peer]
        assert [len(m.entries) for m in apps] == [2] * 5
    n1.advance(rd)
    assert not n1.has_ready() or not n1.ready().entries


# -- members barred from leading (the consistency alarm) ---------------------------------


def test_a_barred_member_never_campaigns_and_the_others_elect_a_leader() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    for core in c.cores.values():
        core.set_barred(frozenset({"n2"}))
    c.crash("n1")
    c.run(6 * ETMIN)
    assert c.leader().id == "n3"
    assert not any(m.frm == "n2" and m.type in (MT.PRE_VOTE, MT.VOTE) for m in c.sent)
    assert n1.role == Role.LEADER  # the crashed one still thinks so; it is not part of the rest


def test_no_leadership_is_transferred_to_a_barred_member_and_a_barred_leader_hands_over() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    for core in c.cores.values():
        core.set_barred(frozenset({"n2"}))
    with pytest.raises(ProposalDropped, match="barred"):
        n1.transfer_leadership("n2")
    for core in c.cores.values():
        core.set_barred(frozenset({"n1"}))
    c.run(200)
    assert c.leader().id != "n1" and c.leader().id in ("n2", "n3")
    assert n1.role == Role.FOLLOWER


def test_a_barred_member_ignores_timeout_now() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    n1.transfer_leadership("n2")  # n2 is not barred yet on the leader...
    c.cores["n2"].set_barred(frozenset({"n2"}))  # ...but it knows it is
    c.run(ETMIN + 200)
    assert all(m.frm != "n2" or m.type not in (MT.PRE_VOTE, MT.VOTE) for m in c.sent)
    assert c.cores["n2"].role != Role.LEADER


# ---------------------------------------------------------------------------------
# A follower that lost entries it had acknowledged (its data directory wiped)


def _wipe_and_restart(c: Cluster, nid: str) -> RaftCore:
    """`nid` comes back with nothing: no log, no hard state, nothing applied."""
    c.crash(nid)
    c.stores[nid] = Store()
    return c.start(nid)


def _leader_with_a_wiped_follower() -> tuple[Cluster, RaftCore, int]:
    """n1 leads; n3 acknowledged every entry, then lost them all; n2 is down, so n3 is
    needed for every commit. Returns the cluster, the leader and n3's old match index."""
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    for i in range(5):
        n1.propose(b"p%d" % i)
    c.flush()
    acknowledged = n1.status().members["n3"].match
    assert acknowledged == n1.last_index and n1.commit_index == n1.last_index
    c.crash("n2")
    _wipe_and_restart(c, "n3")
    return c, n1, acknowledged


def test_a_follower_that_lost_acknowledged_entries_is_reported_and_catches_up() -> None:
    c, n1, acknowledged = _leader_with_a_wiped_follower()
    commit = n1.commit_index
    # Hold n3 back (no probe below its old match gets through) to look at the leader meanwhile.
    c.drop = lambda m: m.to == "n3" and m.type == MT.APP and m.index < acknowledged
    n1.propose(b"after the wipe")
    c.run(300)
    reports = n1.take_lost_entries()
    assert [(r.member, r.term, r.acknowledged, r.has) for r in reports][:1] == [("n3", n1.term, acknowledged, 0)]
    assert n1.take_lost_entries() == []  # handed out once
    n3 = n1.status().members["n3"]
    # Its old match no longer counts: the new entry is not committed on the strength of it,
    # and the commit index never moves back.
    assert n3.match == 0 and n3.lost_acknowledged == acknowledged
    assert n3.lost_entries is not None and n3.lost_entries >= 1
    assert n1.commit_index == commit
    c.drop = lambda m: False
    c.run(300)
    assert c.stores["n3"].applied_index == n1.commit_index == n1.last_index  # caught up: applied, not only stored
    assert data_of(c.stores["n3"])[-1] == b"after the wipe"
    n3 = n1.status().members["n3"]
    assert n3.match == n1.last_index and n3.applied == n1.commit_index
    assert (
        n3.lost_acknowledged is None and n3.lost_entries is not None and n3.lost_entries >= 1
    )  # recovered; the count stays for this term


def test_a_follower_that_lost_only_its_tail_is_probed_from_what_it_still_has() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    for i in range(3):
        n1.propose(b"a%d" % i)
    c.flush()
    kept = n1.last_index
    for i in range(3):
        n1.propose(b"b%d" % i)
    c.flush()
    acknowledged = n1.last_index
    c.crash("n3")
    st = c.stores["n3"]
    st.entries = st.entries[:kept]  # the tail it acknowledged never reached its disk
    st.applied = st.applied[: len([e for e in st.applied if e.index <= kept])]
    st.applied_index = kept
    st.hs = HardState(st.hs.term, st.hs.vote, kept)
    c.start("n3")
    c.sent.clear()
    n1.propose(b"after")
    c.run(300)
    reports = n1.take_lost_entries()
    assert reports and (reports[0].member, reports[0].acknowledged, reports[0].has) == ("n3", acknowledged, kept)
    assert c.stores["n3"].applied_index == n1.commit_index == n1.last_index
    # Only what it lacked was sent again: no entry at or below what it kept.
    resent = [e.index for m in c.sent if m.to == "n3" and m.type == MT.APP for e in m.entries]
    assert resent and min(resent) == kept + 1


def test_a_rejection_below_the_match_in_replicate_is_stale_not_a_loss() -> None:
    """In REPLICATE an answer may be overtaken by a later ack (etcd's rule): a rejection at
    or below the match index is old news there, neither a loss nor a reason to back off."""
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    for i in range(5):
        n1.propose(b"p%d" % i)
    c.flush()
    before = n1.status().members["n2"]
    assert before.state == "replicate" and before.match is not None
    n1.step(Message(MT.APP_RESP, "n1", "n2", term=n1.term, index=before.match - 1, reject=True, reject_hint=1))
    after = n1.status().members["n2"]
    assert n1.take_lost_entries() == []
    assert (after.match, after.state, after.lost_entries) == (before.match, "replicate", 0)


def test_followers_report_their_applied_index_to_the_leader() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.flush()
    applied_before = c.cores["n2"].applied_index
    n1.propose(b"x")
    # One round: n2 stores the entry and acks it, but learns of its commit only later.
    for m in c.process("n1"):
        c.deliver(m)
    for m in c.process("n2"):
        c.deliver(m)
    n2 = n1.status().members["n2"]
    assert n2.match == n1.last_index and n2.applied == applied_before < n2.match
    c.run(200)  # the commit reaches n2, which applies it and says so in its next answer
    n2 = n1.status().members["n2"]
    assert n2.applied == c.cores["n2"].applied_index == n1.commit_index
    assert n1.status().members["n1"].applied == n1.applied_index  # the leader's own


def test_an_idle_leader_finds_a_wiped_follower_by_its_heartbeats() -> None:
    """No write comes, so the leader sends no probe: the wiped follower's answer to a
    heartbeat whose commit index it cannot reach is what tells the leader."""
    c, n1, acknowledged = _leader_with_a_wiped_follower()
    c.run(300)  # heartbeats only
    reports = n1.take_lost_entries()
    assert reports and (reports[0].member, reports[0].acknowledged) == ("n3", acknowledged)
    assert c.stores["n3"].applied_index == n1.commit_index == acknowledged
    assert n1.status().members["n3"].applied == acknowledged
    assert n1.lease_valid(c.now)  # its heartbeat acks still count for the lease


def test_a_follower_that_only_lags_never_rejects_a_heartbeat() -> None:
    c = Cluster(["n1", "n2", "n3"])
    n1 = c.elect("n1")
    c.drop = lambda m: m.to == "n3" and m.type == MT.APP  # n3 falls behind, losing nothing
    for i in range(5):
        n1.propose(b"p%d" % i)
    c.run(300)
    assert c.cores["n3"].last_index < n1.last_index
    assert not [m for m in c.sent if m.type == MT.HEARTBEAT_RESP and m.reject]
    assert n1.take_lost_entries() == []


def test_the_core_and_its_published_view_judge_the_lease_alike_on_one_node_and_on_three() -> None:
    """One lease rule (raft/lease.py): the core's own check and the view the HTTP side reads
    agree, for a lone voter (whose established lease does not run out with time: a starved
    thread must not make `dex-ha dev` inactive) and for a leader of three (whose does)."""
    from dex_ha.raft.status import view_of

    for voters, holds_later in ((["n1"], True), (["n1", "n2", "n3"], False)):
        c = Cluster(voters)
        n1 = c.elect("n1")
        c.tick(100)  # a round acknowledged and the own-term entry committed: the lease holds
        assert n1.lease_valid(c.now) and view_of(n1).lease_valid(at_ms=c.now), voters
        much_later = c.now + 10 * n1._cfg.election_timeout_max_ms  # no tick meanwhile: a starved loop
        assert n1.lease_valid(much_later) is holds_later, voters
        assert view_of(n1).lease_valid(at_ms=much_later) is holds_later, voters
