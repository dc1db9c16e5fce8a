"""The pure Raft consensus core: no I/O, no clock, no global state (the etcd-raft design).

The node loop drives a `RaftCore`:

* `tick(now_ms)` is the only way time enters; `step(msg)` feeds a message from a peer;
  `propose`, `propose_conf_change` and `transfer_leadership` are the local requests.
* `has_ready()` / `ready()` hand out what to persist, send and apply (see `Ready` in
  types.py for the order the caller follows); `advance(rd)` says it was done. At most
  one Ready is outstanding: `has_ready()` is False until the previous one is advanced.
  Messages produced by `step()` between `ready()` and `advance()` wait for the next
  Ready, so a message never depends on state that has not been persisted before it
  is sent.

Same configuration, same `rng` seed and same inputs give the same outputs.

The core's parts that need no Raft roles or messages live beside it, pure like it: the
in-memory log (raft_log.py), what a membership change does to a configuration
(confchange.py), the lease arithmetic and its rule (lease.py), the errors it raises
(errors.py) and what it reports (status.py). This module keeps the state machine: roles,
elections, replication, and the Ready cycle.

Conventions worth knowing:

* The first leader of a brand-new cluster (empty log, no snapshot) writes the bootstrap
  configuration into the log as CONF_CHANGE entries (ADD_LEARNER + PROMOTE per voter)
  before its no-op. They are no-ops for the initial members; a node added later starts
  with an empty configuration and rebuilds it from the log (or from a snapshot).
* A learner never campaigns, and candidates only count votes from voters of their own
  configuration. A learner does answer a vote request (like etcd): the candidate may
  already know that the learner was promoted, and refusing could block elections.
* `compact(index, meta)` wants `meta` as made by `snapshot_meta(index)`; for SNAP
  messages the node loop fills `data` and must call `report_snapshot(to, ok)` once the
  transfer ended, or the leader keeps waiting for that follower.
* Without `check_quorum` there is no recent-leader vote refusal, so `lease_valid()` is
  always False.
* A follower's answers carry its applied index (`Message.applied`), which the leader's
  status shows. A follower whose answers show it lacks entries it acknowledged (its
  storage lost them) is reset to what it provably holds and replicated to again; the
  leader hands each such event out once through `take_lost_entries()`, for the node loop
  to log and count.

Configuration changes take effect when their entry is APPENDED to a log (the Raft
dissertation §4.1 rule, single-server changes), not when committed. Why: with
commit-time activation, nodes switch at different moments (when each learns of the
commit) and a node that has not learned it yet can still run an election under a
configuration two changes old. With append-time activation a node always uses the
newest configuration in its own log, and a truncated configuration entry is undone
(we re-derive the configuration from the snapshot's config plus the log's
CONF_CHANGE entries). See "Safety: membership changes" below.

Safety: membership changes
--------------------------
Two configurations that differ by one server have intersecting majorities. We allow
one change at a time: the leader refuses a new change until (a) it has committed an
entry of its own term (its no-op; this is Ongaro's fix for single-server changes: an
uncommitted configuration left by an older term can then no longer win an election)
and (b) the previous change is committed. A node whose log lacks a committed
configuration entry cannot collect votes from the quorum that stores that entry (its
log is not up to date), so any node that can still be elected uses either the newest
committed configuration or the one uncommitted change after it: its quorums intersect
the leader's, and election safety and leader completeness hold as in plain Raft. A
leader that removes itself stops counting itself from the moment it appends the change
and steps down once the change is committed.

Safety: the leader lease
------------------------
Every heartbeat round is numbered (`Message.context`) and echoed in HEARTBEAT_RESP.
The leader records the time (its clock, at the tick that started the round, which is
no later than the real send) of each round. A voter that acknowledged round r received
it after it was sent. The lease lasts until

    (send time of the newest round acknowledged by a quorum of the current voters,
     the leader counting itself) + W_L - lease_drift_margin,

where W_L is the leader's election_timeout_min, which every heartbeat carries
(`Message.lease_window_ms`). Only heartbeat acknowledgements extend the lease.

A voter refuses (pre)votes for a term above its own until W after it last heard from a
leader, by its own clock, where W = max(its own election_timeout_min, the window the
leader's heartbeat carried): a follower with a shorter timeout than the leader's still
waits the leader's lease out (timeouts differ during a rolling change of the setting).
The moment is taken at the first tick after the message, so it is never earlier than
the real receipt. A leader counts as hearing from itself until it steps down.

A restarted node forgot whom it heard from: it refuses votes from its start for
max(own election_timeout_min, HardState.vote_refusal_ms), the window it last promised a
leader. That window is in the hard state of the Ready that carries the acknowledgement,
and is synced before the acknowledgement is sent, so a crash cannot erase a promise a
leader counts on (see `_promise` for when it may shrink).

Any quorum that elects a new leader intersects the quorum that acknowledged round r, so
the new leader is elected no earlier than (receipt of r) + W_L of a voter's clock. With
clock rates within 1±rho, the old lease is over before that when
(W_L - margin) / (1 - rho) <= W_L / (1 + rho), i.e. rho <= margin / (2 W_L - margin):
5.26 % for the defaults (1000 ms, 100 ms), 11 % for 500 ms and 100 ms. Votes granted
before acknowledging r cannot help a rival: such a voter is already in a higher term
and does not acknowledge r. The intersection also holds across membership changes:
the lease is evaluated with the configuration current at evaluation time, and any
node that can still be elected uses that configuration or one a single change away
(previous section). tests/raft/sim.py checks the invariant itself at every event: while
a lease is valid, a quorum of the leader's voters will refuse votes until it ends; one
family of seeds gives the nodes different timeouts and changes them by rolling restarts.

Two exceptions, both made safe by the leader giving its lease up first:
* leadership transfer: the leader gives its lease up for the rest of its term before it
  emits TIMEOUT_NOW, because the target's VOTE (context=1) bypasses the recent-leader
  check. A transfer that does not finish within an election timeout is aborted and the
  leader steps down: it cannot hold a lease again in this term (a delayed TIMEOUT_NOW
  may still arrive), so a new election is the only way back to an active node;
* the lease also requires that the leader committed and applied an entry of its own
  term, so an active node has applied every entry committed before it was elected.
"""

from __future__ import annotations

import enum
import itertools
import random
from dataclasses import dataclass
from types import MappingProxyType

from . import lease
from .confchange import bootstrap_changes, canonical_conf, check_fits, conf_after
from .errors import ConfChangeRefused, EntryTooLarge, NotLeader, ProposalDropped
from .lease import HeartbeatRounds
from .progress import Inflights, Progress, ProgressState
from .raft_log import RaftLog
from .status import LostEntries, MemberStatus, Status
from .types import (
    NO_NODE,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Ready,
    Role,
    SnapshotMeta,
    encode_conf_change,
)

__all__ = [
    "MAX_LEASE_WINDOW_MS",
    "RaftConfig",
    "RaftCore",
    "check_timing",
    "TRANSFER_CONTEXT",
]

# Message.context on VOTE that marks a leadership-transfer campaign.
TRANSFER_CONTEXT = 1

_MT = MessageType
# Messages only a leader of the message's term sends.
_FROM_LEADER = (_MT.APP, _MT.HEARTBEAT, _MT.SNAP)
_MESSAGE_TYPES = frozenset(int(t) for t in MessageType if t != MessageType.NOTE)  # notes are the node's
_ENTRY_TYPES = frozenset(int(t) for t in EntryType)


# The longest vote-refusal window a heartbeat may ask for. A peer asking for more is
# broken: obeying it would block elections for that long.
MAX_LEASE_WINDOW_MS = 60_000


# The product's Raft timing, the one source of every default (RaftConfig, NodeConfig and
# the server's ServerConfig read these). Failover takes about election_timeout_min plus a
# random part of the range: the lease forbids a faster election. A 500 ms minimum leaves 10
# heartbeats of slack before a busy leader looks dead. The range only has to keep two
# candidates apart (a vote round takes a few ms): with 250 ms of it, the earlier of two
# followers times out 583 ms after the last heartbeat on average (667 ms with 500-1000).
# The drift margin lets clocks run 5.3 % apart (margin / (2 * election_timeout_min - margin))
# without two leases overlapping.
DEFAULT_ELECTION_TIMEOUT_MIN_MS = 500
DEFAULT_ELECTION_TIMEOUT_MAX_MS = 750
DEFAULT_HEARTBEAT_INTERVAL_MS = 50
DEFAULT_LEASE_DRIFT_MARGIN_MS = 50


def check_timing(
    election_timeout_min_ms: int, election_timeout_max_ms: int, heartbeat_interval_ms: int, lease_drift_margin_ms: int
) -> None:
    """Raise ValueError (naming the setting) unless the timing can hold a lease.

    The lease lasts election_timeout_min - lease_drift_margin after a heartbeat round a
    quorum acknowledged; the next round must go out before it ends, or the lease lapses
    between rounds and the node is not active while it leads.
    """
    if not 0 < election_timeout_min_ms <= MAX_LEASE_WINDOW_MS:
        raise ValueError(f"election_timeout_min_ms must be in 1..{MAX_LEASE_WINDOW_MS}, not {election_timeout_min_ms}")
    if election_timeout_max_ms < election_timeout_min_ms:
        raise ValueError(
            f"election_timeout_max_ms ({election_timeout_max_ms}) must not be below "
            f"election_timeout_min_ms ({election_timeout_min_ms})"
        )
    if not 0 <= lease_drift_margin_ms < election_timeout_min_ms:
        raise ValueError(
            f"lease_drift_margin_ms ({lease_drift_margin_ms}) must be in "
            f"0..election_timeout_min_ms ({election_timeout_min_ms}) - 1"
        )
    lease_ms = election_timeout_min_ms - lease_drift_margin_ms
    if not 0 < heartbeat_interval_ms < lease_ms:
        raise ValueError(
            f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be positive and below "
            f"election_timeout_min_ms - lease_drift_margin_ms ({lease_ms})"
        )


@dataclass
class RaftConfig:
    id: str
    election_timeout_min_ms: int = DEFAULT_ELECTION_TIMEOUT_MIN_MS  # randomized in [min, max)
    election_timeout_max_ms: int = DEFAULT_ELECTION_TIMEOUT_MAX_MS
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS
    lease_drift_margin_ms: int = DEFAULT_LEASE_DRIFT_MARGIN_MS  # clock-drift margin subtracted from the lease
    max_entry_bytes: int = 8 << 20  # propose() refuses bigger data (EntryTooLarge)
    max_msg_bytes: int = 1 << 20  # max entry bytes per APP message (batching)
    max_inflight_msgs: int = 256  # pipelining: APP messages in flight per follower
    max_inflight_bytes: int = 32 << 20  # flow control by bytes in flight
    pre_vote: bool = True
    check_quorum: bool = True
    # Cap on the bytes of committed entries handed out in one Ready (it bounds apply
    # batches; `ready()` takes a cap on their number).
    max_committed_bytes_per_ready: int = 8 << 20

    def __post_init__(self) -> None:
        check_timing(
            self.election_timeout_min_ms,
            self.election_timeout_max_ms,
            self.heartbeat_interval_ms,
            self.lease_drift_margin_ms,
        )
        if self.max_entry_bytes < 1:
            raise ValueError(f"max_entry_bytes must be positive, not {self.max_entry_bytes}")


# ---------------------------------------------------------------------------------
# The core


class _Campaign(enum.Enum):
    PRE_VOTE = "pre_vote"
    ELECTION = "election"
    TRANSFER = "transfer"  # after TIMEOUT_NOW: no pre-vote, context=1


class _Poll(enum.Enum):
    WON = "won"
    LOST = "lost"
    PENDING = "pending"


@dataclass
class _Transfer:
    target: str
    deadline_ms: int


class RaftCore:
    """One Raft node's consensus state machine. See the module docstring."""

    # Leader state set by _reset_leader_state; declared here because _tick_leader, which
    # mypy reads first, uses it.
    _next_heartbeat_ms: int

    def __init__(
        self,
        config: RaftConfig,
        *,
        hard_state: HardState,
        conf_state: ConfState,
        snapshot: SnapshotMeta | None,
        entries: list[Entry],
        applied: int,
        now_ms: int,
        rng: random.Random,
    ) -> None:
        self._cfg = config
        self.id = config.id
        self._rng = rng
        snap_index = snapshot.index if snapshot is not None else 0
        snap_term = snapshot.term if snapshot is not None else 0
        self._log = RaftLog(snap_index, snap_term, entries)
        self._snapshot = snapshot
        # Configuration: the base as of the snapshot, plus CONF_CHANGE entries in the log.
        self._base_conf = canonical_conf(conf_state)
        self._conf_entries = [e.index for e in entries if e.type == EntryType.CONF_CHANGE]
        self._conf = self._conf_at(self._log.last_index)

        self._term = hard_state.term
        self._vote = hard_state.vote
        commit = max(hard_state.commit, applied, snap_index)
        self._log.commit = min(commit, self._log.last_index)
        self._applied = max(min(applied, self._log.commit), snap_index)
        self._applying = self._applied  # committed entries handed out up to here
        self._prev_hs = hard_state  # the hard state the caller has (was handed)

        self._now = now_ms
        # Vote refusal (lease safety): we refuse (pre)votes until `_refuse_until_ms`, and
        # for `_heard_window_ms` after the next tick when a leader's message came in since
        # the last tick (0: none). A restarted node forgot whom it heard from: it refuses
        # for the longest window it may have promised before the crash (persisted in the
        # hard state), and at least its own election_timeout_min.
        self._refusal_ms = hard_state.vote_refusal_ms  # goes into the hard state
        # The term of the leader that _refusal_ms was promised to, or after a restart an
        # upper bound of it (the promise was made in our term or an earlier one).
        self._refusal_term = hard_state.term
        self._refuse_until_ms = now_ms + max(config.election_timeout_min_ms, self._refusal_ms)
        self._heard_window_ms = 0

        self._role = Role.FOLLOWER
        self._leader = NO_NODE
        self._election_deadline = 0
        self._votes: dict[str, bool] = {}
        self._msgs: list[Message] = []
        self._pending_snapshot: tuple[SnapshotMeta, bytes] | None = None
        self._outstanding: Ready | None = None
        self._barred: frozenset[str] = frozenset()  # members that must not lead: set_barred
        # Followers seen losing acknowledged entries, for the node loop to log and count
        # (take_lost_entries): the core does no I/O of its own.
        self._lost_entries: list[LostEntries] = []
        self._reset_leader_state()
        self._reset_election_timer()

    # -- public properties ---------------------------------------------------------------

    @property
    def role(self) -> Role:
        if self._role == Role.FOLLOWER and self.id not in self._conf.voters:
            return Role.LEARNER
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def vote(self) -> str:
        return self._vote

    @property
    def leader_id(self) -> str:
        return self._leader

    @property
    def commit_index(self) -> int:
        return self._log.commit

    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def conf_state(self) -> ConfState:
        """The current configuration (the newest one in the log)."""
        return self._conf

    @property
    def last_index(self) -> int:
        return self._log.last_index

    @property
    def first_index(self) -> int:
        return self._log.first_index

    @property
    def snapshot(self) -> SnapshotMeta | None:
        """The latest snapshot the log was compacted to or restored from."""
        return self._snapshot

    @property
    def transferring_to(self) -> str:
        """Target of an ongoing leadership transfer ("" if none)."""
        return self._transfer.target if self._transfer is not None else NO_NODE

    @property
    def refuses_votes(self) -> bool:
        """True while this node ignores (pre)votes that are not a transfer campaign,
        because it is a leader or heard from one within the refusal window (or restarted
        less than that ago). A leader's lease rests on a quorum of these."""
        return self._cfg.check_quorum and self._in_lease()

    @property
    def refuses_votes_until_ms(self) -> float:
        """Local time at which `refuses_votes` ends if nothing else happens: +inf while
        leader or before the tick that timestamps a leader's message, -inf without
        check_quorum. For checkers that look at the real clock between ticks."""
        if not self._cfg.check_quorum:
            return float("-inf")
        if self._role == Role.LEADER or self._heard_window_ms:
            return float("inf")
        return self._refuse_until_ms

    def term_at(self, index: int) -> int | None:
        return self._log.term(index)

    def entry(self, index: int) -> Entry | None:
        """The entry at `index` if it is in the in-memory log (not compacted)."""
        return self._log.entry(index)

    # -- time ----------------------------------------------------------------------------

    def set_time(self, now_ms: int) -> None:
        """Advance the clock without firing timers. Time never goes backwards here.

        A node loop calls this before it steps the messages that arrived while it could not
        run, then `tick()`: their contact is stamped with a time no earlier than their
        arrival, so a leader whose own thread stalled does not count the acks that came
        meanwhile as old and step down by check-quorum."""
        if now_ms > self._now:
            self._now = now_ms

    def tick(self, now_ms: int) -> None:
        """Advance the clock and fire what is due (elections, heartbeats, check-quorum)."""
        self.set_time(now_ms)
        if self._heard_window_ms:
            # Take "heard from a leader" at a tick after the message arrived: never
            # earlier than the real receipt, which the lease argument needs.
            self._refuse_until_ms = max(self._refuse_until_ms, self._now + self._heard_window_ms)
            self._heard_window_ms = 0
        if self._role == Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def _tick_election(self) -> None:
        if self._now < self._election_deadline:
            return
        if not self._promotable():
            self._reset_election_timer()
            return
        if self._cfg.check_quorum and self._in_lease():
            return  # our own vote is a vote too: wait until the refusal window ends
        self._campaign(_Campaign.PRE_VOTE if self._cfg.pre_vote else _Campaign.ELECTION)

    def _tick_leader(self) -> None:
        if self._now >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = self._now + self._cfg.heartbeat_interval_ms
            self._bcast_heartbeat()
        if self._cfg.check_quorum and not self._quorum_recently_active():
            self._become_follower(self._term, NO_NODE)  # CheckQuorum: step down
            return
        if self._transfer is not None and self._now >= self._transfer.deadline_ms:
            self._abort_transfer()

    def _reset_election_timer(self) -> None:
        lo = self._cfg.election_timeout_min_ms
        spread = max(1, self._cfg.election_timeout_max_ms - lo)
        self._election_deadline = self._now + lo + self._rng.randrange(spread)

    def _in_lease(self) -> bool:
        """Are we a leader, or within the window we promised a leader to refuse votes?"""
        return self._role == Role.LEADER or bool(self._heard_window_ms) or self._now < self._refuse_until_ms

    def _heard_from_leader(self, m: Message) -> None:
        """`m` came from the leader of our term: refuse votes for the longer of our own
        election_timeout_min and the window its heartbeat asks for (its own timeout,
        which its lease counts on), from the next tick on."""
        window = max(self._cfg.election_timeout_min_ms, m.lease_window_ms)
        self._promise(window)
        self._heard_window_ms = max(self._heard_window_ms, window)
        self._reset_election_timer()

    def _promise(self, window: int) -> None:
        """Keep `window` in the hard state, so a restart refuses votes as long.

        The hard state goes to disk before our answer to the leader's message is sent
        (Ready order), so a leader never counts an acknowledgement whose promise a crash
        could erase. Within one term we keep the largest window (appends carry none, and
        must not shrink what a heartbeat of the same leader asked for). A leader of a
        newer term than the kept promise proves every lease of older terms is over (its
        voters waited them out), so its window replaces the kept one: after a rolling
        change to shorter timeouts, restarts get shorter too.
        """
        if self._term > self._refusal_term:
            self._refusal_ms, self._refusal_term = window, self._term
        else:
            self._refusal_ms = max(self._refusal_ms, window)

    # -- role changes --------------------------------------------------------------------

    def _promotable(self) -> bool:
        return self.id in self._conf.voters and self.id not in self._barred

    def set_barred(self, members: frozenset[str]) -> None:
        """Members that must not become leader (the application found their state divergent
        from the majority's). A barred node never campaigns, not even on TIMEOUT_NOW, and
        a leader transfers to no barred member; a barred leader hands its leadership to the
        most caught-up voter that is not barred, if there is one. It still votes and
        replicates: its log is as good as anyone's, only its applied state is suspect."""
        self._barred = frozenset(members)
        if self._role == Role.LEADER and self.id in self._barred and self._transfer is None:
            others = [
                (pr.match, member)
                for member, pr in self._prs.items()
                if member in self._conf.voters and member not in self._barred
            ]
            if others:
                self._start_transfer(max(others)[1], strict=False)

    def _reset_leader_state(self) -> None:
        self._prs: dict[str, Progress] = {}
        self._transfer: _Transfer | None = None
        self._lease_given_up = False
        self._rounds = HeartbeatRounds()
        self._term_start_index = 0
        self._pending_conf_index = 0
        self._next_heartbeat_ms = 0
        self._append_pending = False
        # A commit advance the followers have not been told of yet: announced at the next
        # has_ready()/ready() with whatever entries go out then (see _flush_appends).
        self._commit_pending = False

    def _become_follower(self, term: int, leader: str) -> None:
        if term > self._term:
            self._term = term
            self._vote = NO_NODE
        if self._role == Role.LEADER:
            # Until now we were "hearing from a leader" (ourselves): keep refusing votes
            # for an election timeout, like any follower of ours would.
            self._heard_window_ms = max(self._heard_window_ms, self._cfg.election_timeout_min_ms)
        self._role = Role.FOLLOWER
        self._leader = leader
        self._votes = {}
        self._reset_leader_state()
        self._reset_election_timer()

    def _campaign(self, kind: _Campaign) -> None:
        if kind is _Campaign.PRE_VOTE:
            self._role = Role.PRE_CANDIDATE
            vote_term, msg_type = self._term + 1, _MT.PRE_VOTE
        else:
            self._term += 1
            self._vote = self.id
            self._role = Role.CANDIDATE
            vote_term, msg_type = self._term, _MT.VOTE
        self._leader = NO_NODE
        self._votes = {self.id: True}
        self._reset_election_timer()
        if self._poll() is _Poll.WON:  # a single-voter cluster
            self._on_campaign_won()
            return
        context = TRANSFER_CONTEXT if kind is _Campaign.TRANSFER else 0
        for voter in self._conf.voters:
            if voter != self.id:
                self._send(
                    msg_type,
                    voter,
                    term=vote_term,
                    index=self._log.last_index,
                    log_term=self._log.last_term,
                    context=context,
                )

    def _poll(self) -> _Poll:
        voters = self._conf.voters
        quorum = len(voters) // 2 + 1
        granted = sum(1 for v in voters if self._votes.get(v) is True)
        rejected = sum(1 for v in voters if self._votes.get(v) is False)
        if granted >= quorum:
            return _Poll.WON
        if rejected > len(voters) - quorum:
            return _Poll.LOST
        return _Poll.PENDING

    def _on_campaign_won(self) -> None:
        if self._role == Role.PRE_CANDIDATE:
            if self._cfg.check_quorum and self._in_lease():
                self._become_follower(self._term, NO_NODE)  # defensive: see _tick_election
                return
            self._campaign(_Campaign.ELECTION)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        self._role = Role.LEADER
        self._leader = self.id
        self._votes = {}
        self._reset_leader_state()
        for member in self._conf.members():
            if member != self.id:
                self._prs[member] = self._new_progress(self._log.last_index + 1)
        if self._log.last_index == 0:
            self._append_bootstrap_conf()
        # Raft §5.4.2 + §8: commit an entry of our own term before anything else counts;
        # the lease and configuration changes both wait for it.
        noop = Entry(self._term, self._log.last_index + 1, EntryType.NORMAL, b"")
        self._log.append([noop])
        self._term_start_index = noop.index
        self._pending_conf_index = noop.index
        self._next_heartbeat_ms = self._now + self._cfg.heartbeat_interval_ms
        self._bcast_append()
        self._bcast_heartbeat()  # start the lease as early as possible

    def _append_bootstrap_conf(self) -> None:
        """Write the bootstrap configuration into a brand-new cluster's log.

        The initial members know it from their configuration, but a node added later
        starts with an empty configuration and, if it receives the log from index 1
        (no snapshot yet), must be able to rebuild it from the log alone. For the
        initial members these entries are no-ops (the members already exist).
        """
        changes = bootstrap_changes(self._base_conf)
        entries = [
            Entry(self._term, i + 1, EntryType.CONF_CHANGE, encode_conf_change(cc)) for i, cc in enumerate(changes)
        ]
        if entries:
            self._log.append(entries)
            self._log_changed(1, entries)

    def _new_progress(self, next_index: int) -> Progress:
        return Progress(
            next=max(1, next_index),
            inflights=Inflights(self._cfg.max_inflight_msgs, self._cfg.max_inflight_bytes),
            last_contact_ms=self._now,
        )

    # -- messages in -------------------------------------------------------------------

    def step(self, msg: Message) -> None:
        """Process a message from a peer. Malformed, stale or hostile input is ignored."""
        if not self._well_formed(msg):
            return
        m = msg
        if m.term > self._term:
            if m.type in (_MT.PRE_VOTE, _MT.VOTE) and self._refuses_vote(m):
                return  # do not even adopt the term: that is what keeps leaders stable
            if m.type == _MT.PRE_VOTE or (m.type == _MT.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes run one term ahead and never change ours
            else:
                self._become_follower(m.term, m.frm if m.type in _FROM_LEADER else NO_NODE)
        elif m.term < self._term:
            self._answer_stale(m)
            return
        if m.type in (_MT.PRE_VOTE, _MT.VOTE):
            self._handle_vote_request(m)
        elif self._role == Role.LEADER:
            self._step_leader(m)
        elif self._role in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def _refuses_vote(self, m: Message) -> bool:
        """Recent-leader check: ignore a (pre)vote while a leader may hold a lease."""
        if m.type == _MT.VOTE and m.context == TRANSFER_CONTEXT:
            return False  # the old leader gave its lease up before sending TIMEOUT_NOW
        return self._cfg.check_quorum and self._in_lease()

    def _yields_to_rival(self, m: Message) -> bool:
        """Two pre-candidates with equal logs: only the lower id gets the other's pre-vote.

        Nodes whose election timers fire within one tick of each other would otherwise
        grant each other's pre-votes, both campaign in the same term, split the vote and
        lose a whole election timeout (seen as ~2 s failovers). Refusing a pre-vote never
        affects safety, and the rival with the better log (or the lower id) still wins.
        """
        return (
            self._role == Role.PRE_CANDIDATE
            and m.frm > self.id
            and (m.log_term, m.index) == (self._log.last_term, self._log.last_index)
        )

    def _answer_stale(self, m: Message) -> None:
        if m.type in (_MT.APP, _MT.HEARTBEAT):
            # A leader from an older term: our answer carries our term so it steps down
            # (otherwise a node whose term ran ahead could be cut off for good).
            self._send(_MT.APP_RESP, m.frm)
        elif m.type == _MT.PRE_VOTE:
            self._send(_MT.PRE_VOTE_RESP, m.frm, reject=True)

    def _handle_vote_request(self, m: Message) -> None:
        pre = m.type == _MT.PRE_VOTE
        resp_type = _MT.PRE_VOTE_RESP if pre else _MT.VOTE_RESP
        can_vote = (
            self._vote == m.frm or (self._vote == NO_NODE and self._leader == NO_NODE) or (pre and m.term > self._term)
        )
        # The recent-leader check again, for a vote in a term we adopted from some other
        # message (e.g. a delayed rejection carrying a higher term): the leader we heard
        # from may still hold a lease that counts on us.
        if can_vote and self._vote != m.frm and self._refuses_vote(m):
            can_vote = False
        if can_vote and pre and self._yields_to_rival(m):
            can_vote = False
        if can_vote and self._log.is_up_to_date(m.index, m.log_term):
            self._send(resp_type, m.frm, term=m.term)
            if not pre:
                self._vote = m.frm
                self._reset_election_timer()
        else:
            self._send(resp_type, m.frm, reject=True)
            if pre and can_vote:
                self._campaign_for_a_stale_rival()

    def _campaign_for_a_stale_rival(self) -> None:
        """A pre-vote we refused only because the rival's log is behind ours: the rival
        cannot win, and it asked because the leader went silent, which we see too (we
        are past our own refusal window, or can_vote would be false). Campaign now
        instead of waiting out the rest of our timer: failover no longer costs up to two
        election timeouts when the stale node's timer fires first. Liveness only: a
        pre-vote decides nothing."""
        if self._role == Role.FOLLOWER and self._promotable():
            self._campaign(_Campaign.PRE_VOTE if self._cfg.pre_vote else _Campaign.ELECTION)

    def _step_candidate(self, m: Message) -> None:
        if m.type in _FROM_LEADER:
            self._become_follower(self._term, m.frm)
            self._step_follower(m)
            return
        if m.type == _MT.PRE_VOTE_RESP and self._role == Role.PRE_CANDIDATE:
            # A grant carries the term we asked for; a rejection the voter's (= ours).
            expected = self._term if m.reject else self._term + 1
            if m.term == expected:
                self._record_vote(m.frm, not m.reject)
        elif m.type == _MT.VOTE_RESP and self._role == Role.CANDIDATE:
            self._record_vote(m.frm, not m.reject)

    def _record_vote(self, voter: str, granted: bool) -> None:
        if voter not in self._conf.voters:
            return  # learners and strangers do not count
        self._votes.setdefault(voter, granted)
        result = self._poll()
        if result is _Poll.WON:
            self._on_campaign_won()
        elif result is _Poll.LOST:
            self._become_follower(self._term, NO_NODE)

    def _step_follower(self, m: Message) -> None:
        if m.type == _MT.APP:
            self._handle_append(m)
        elif m.type == _MT.HEARTBEAT:
            self._handle_heartbeat(m)
        elif m.type == _MT.SNAP:
            self._handle_snapshot(m)
        elif m.type == _MT.TIMEOUT_NOW:
            if self._promotable() and self._leader in (NO_NODE, m.frm):
                self._campaign(_Campaign.TRANSFER)
        elif m.type == _MT.TRANSFER_LEADER and self._leader not in (NO_NODE, m.frm):
            self._send(_MT.TRANSFER_LEADER, self._leader, frm=m.frm)

    # -- follower ------------------------------------------------------------------------

    def _handle_append(self, m: Message) -> None:
        self._leader = m.frm
        self._heard_from_leader(m)
        log = self._log
        if m.index < log.commit:
            self._send(_MT.APP_RESP, m.frm, index=log.commit)
            return
        if log.term(m.index) != m.log_term:
            hint = log.find_conflict_by_term(min(m.index, log.last_index), m.log_term)
            self._send(
                _MT.APP_RESP,
                m.frm,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=log.term(hint) or 0,
            )
            return
        if not self._append_from_leader(m.entries):
            return
        last_new = m.index + len(m.entries)
        log.commit_to(min(m.commit, last_new))
        self._send(_MT.APP_RESP, m.frm, index=last_new)

    def _append_from_leader(self, entries: list[Entry]) -> bool:
        """Append what we do not have yet; truncate a conflicting suffix first.

        Returns False (and changes nothing) if that would overwrite a committed entry,
        which only a buggy or hostile leader asks for.
        """
        conflict = next((e.index for e in entries if self._log.term(e.index) != e.term), 0)
        if conflict == 0:
            return True
        if conflict <= self._log.commit:
            return False
        new = entries[conflict - entries[0].index :]
        self._log.append(new)
        self._log_changed(conflict, new)
        return True

    def _handle_heartbeat(self, m: Message) -> None:
        self._leader = m.frm
        self._heard_from_leader(m)
        # The leader sends min(our match, its commit): our log matches it up to there.
        log = self._log
        log.commit_to(min(m.commit, log.last_index))
        if m.commit > log.last_index:
            # We acknowledged entries up to there and no longer have them (our storage lost
            # them): say so, with our last entry, or the leader never sends them again. The
            # answer still acknowledges the round (we do refuse votes now: the lease holds).
            last = log.last_index
            self._send(
                _MT.HEARTBEAT_RESP, m.frm, context=m.context, reject=True, reject_hint=last, log_term=log.last_term
            )
            return
        self._send(_MT.HEARTBEAT_RESP, m.frm, context=m.context)

    def _handle_snapshot(self, m: Message) -> None:
        self._leader = m.frm
        self._heard_from_leader(m)
        snap = m.snapshot
        assert snap is not None  # checked by _well_formed
        log = self._log
        if snap.index <= log.commit:
            self._send(_MT.APP_RESP, m.frm, index=log.commit)
            return
        if log.term(snap.index) == snap.term:
            # We already have the snapshot's last entry: just fast-forward the commit.
            log.commit_to(snap.index)
            self._send(_MT.APP_RESP, m.frm, index=log.commit)
            return
        self._restore(snap, m.data)
        self._send(_MT.APP_RESP, m.frm, index=log.last_index)

    def _restore(self, snap: SnapshotMeta, data: bytes) -> None:
        self._log.restore(snap.index, snap.term)
        self._snapshot = snap
        self._base_conf = canonical_conf(snap.conf_state)
        self._conf_entries = []
        self._conf = self._base_conf
        self._pending_snapshot = (snap, data)
        self._applying = max(self._applying, snap.index)  # the snapshot covers these

    # -- leader: replication -------------------------------------------------------------

    def _step_leader(self, m: Message) -> None:
        pr = self._prs.get(m.frm)
        if m.type == _MT.TRANSFER_LEADER:
            self._start_transfer(m.frm, strict=False)
            return
        if pr is None:
            return
        pr.last_contact_ms = self._now
        pr.heard_from = True
        if m.type == _MT.APP_RESP:
            pr.applied = m.applied
            self._handle_append_response(m, pr)
        elif m.type == _MT.HEARTBEAT_RESP:
            pr.applied = m.applied
            self._handle_heartbeat_response(m, pr)

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        if m.reject:
            hint = m.reject_hint
            if m.log_term > 0:
                hint = self._log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.lost_entries_at(m.index):
                self._follower_lost_entries(m, pr, min(m.index, hint + 1))
                self._replicate_to(m.frm)
            elif pr.maybe_decr_to(m.index, hint + 1):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._replicate_to(m.frm)
            return
        was_paused = pr.is_paused()
        if m.index > self._log.last_index or not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= self._log.first_index:
            pr.become_replicate()
        else:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            if self._role != Role.LEADER:
                return  # we committed our own removal and stepped down
            self._commit_pending = True
        else:
            # A peer we had paused may lack the latest commit index: tell it, even with
            # no entries. Otherwise only send entries (no empty APP per ack).
            self._replicate_to(m.frm, announce_commit=was_paused)
        self._maybe_send_timeout_now(m.frm)

    def _follower_lost_entries(self, m: Message, pr: Progress, hint_next: int) -> None:
        """`m` rejects our probe at or below the follower's match index, or our heartbeat's
        commit index: it lost entries it had acknowledged. What it still provably holds:
        its answer names its entry at `reject_hint` with term `log_term`; if ours there has
        the same term, the logs match up to it (Log Matching). Reset its progress to that,
        so that it catches up and its old match no longer counts for commit, and report it."""
        has = m.reject_hint if 0 < m.reject_hint < pr.match and self._log.term(m.reject_hint) == m.log_term else 0
        self._lost_entries.append(LostEntries(m.frm, self._term, pr.match, has))
        pr.lose_entries(has, hint_next)

    def take_lost_entries(self) -> list[LostEntries]:
        """The followers seen losing acknowledged entries since the last call (to log)."""
        reports, self._lost_entries = self._lost_entries, []
        return reports

    def _handle_heartbeat_response(self, m: Message, pr: Progress) -> None:
        if m.reject and m.reject_hint < pr.match:
            # It lacks entries our heartbeat's commit index (at most its match) counted as
            # stored there: the way an idle leader, which sends no probe, finds it out.
            hint = self._log.find_conflict_by_term(m.reject_hint, m.log_term) if m.log_term > 0 else m.reject_hint
            self._follower_lost_entries(m, pr, hint + 1)
        sent = self._rounds.sent_ms(m.context)
        if sent is not None and (pr.lease_ack_ms is None or sent > pr.lease_ack_ms):
            pr.lease_ack_ms = sent
        pr.probe_sent = False  # the peer is alive: allow the next probe
        if pr.state is ProgressState.REPLICATE and pr.inflights.full():
            pr.inflights.free_first()  # recover a window clogged by lost messages
        if pr.match < self._log.last_index:
            self._send_append(m.frm)
        self._maybe_send_timeout_now(m.frm)

    def _replicate_to(self, peer: str, announce_commit: bool = True) -> None:
        """Send what the peer's progress allows: one message, more when pipelining."""
        sent = self._send_append(peer, send_if_empty=announce_commit)
        while sent and self._send_append(peer, send_if_empty=False):
            pass

    def _bcast_append(self) -> None:
        for peer in self._prs:
            self._replicate_to(peer)

    def _flush_appends(self) -> None:
        """Send the entries proposed since the last Ready, and the commit index if it
        moved, batched per peer: one APP per peer carries both.

        Under load many acks (each may move the commit index) and many proposals arrive
        between two Readies; telling each follower the new commit with the next entries,
        rather than with an empty APP per commit advance, saves a message (and its
        answer) per advance and per follower. A peer with no entries to receive still
        gets an empty APP with the commit index, in the same Ready as before."""
        if (self._append_pending or self._commit_pending) and self._role == Role.LEADER:
            for peer in self._prs:
                self._replicate_to(peer, announce_commit=self._commit_pending)
        self._append_pending = False
        self._commit_pending = False

    def _send_append(self, peer: str, send_if_empty: bool = True) -> bool:
        pr = self._prs[peer]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        prev_term = self._log.term(prev)
        if prev_term is None:
            if prev < self._log.snap_index:
                return self._send_snapshot(peer, pr)
            return False
        ents = self._log.slice(pr.next, self._log.last_index + 1, self._cfg.max_msg_bytes)
        if not ents and not send_if_empty:
            return False
        self._send(_MT.APP, peer, index=prev, log_term=prev_term, entries=ents, commit=self._log.commit)
        last = ents[-1].index if ents else prev
        pr.sent_entries(last, sum(e.size() for e in ents), len(ents))
        return True

    def _send_snapshot(self, peer: str, pr: Progress) -> bool:
        snap = self._snapshot
        if snap is None:
            return False
        # `data` is left empty: the node loop fills it from the snapshot on disk.
        self._send(_MT.SNAP, peer, snapshot=snap)
        pr.become_snapshot(snap.index)
        return True

    def _bcast_heartbeat(self) -> None:
        round_number = self._rounds.start(self._now, keep_ms=self._cfg.election_timeout_min_ms)
        for peer, pr in self._prs.items():
            commit = min(pr.match, self._log.commit)
            self._send(
                _MT.HEARTBEAT,
                peer,
                commit=commit,
                context=round_number,
                lease_window_ms=self._cfg.election_timeout_min_ms,
            )

    def _match_of(self, node: str) -> int:
        if node == self.id:
            return self._log.persisted  # our own entries count only once durable
        pr = self._prs.get(node)
        return pr.match if pr is not None else 0

    def _maybe_commit(self) -> bool:
        """Advance commit to what a quorum stores, for entries of our term only (§5.4.2)."""
        voters = self._conf.voters
        if not voters:
            return False
        matches = sorted((self._match_of(v) for v in voters), reverse=True)
        n = matches[len(voters) // 2]
        if n <= self._log.commit or self._log.term(n) != self._term:
            return False
        self._log.commit_to(n)
        conf_index = self._conf_entries[-1] if self._conf_entries else self._log.snap_index
        if self.id not in voters and self._log.commit >= conf_index:
            self._become_follower(self._term, NO_NODE)  # our removal is committed
        return True

    def _quorum_recently_active(self) -> bool:
        voters = self._conf.voters
        horizon = self._now - self._cfg.election_timeout_min_ms
        active = 0
        for v in voters:
            pr = self._prs.get(v)
            if v == self.id or (pr is not None and pr.last_contact_ms > horizon):
                active += 1
        return active >= len(voters) // 2 + 1

    # -- proposals -----------------------------------------------------------------------

    def propose(self, data: bytes) -> int:
        """Append `data` as a new entry; returns its index. Raises EntryTooLarge above
        max_entry_bytes (checked first: the answer does not depend on leadership)."""
        if len(data) > self._cfg.max_entry_bytes:
            raise EntryTooLarge(len(data), self._cfg.max_entry_bytes)
        self._check_can_propose()
        return self._append_as_leader(EntryType.NORMAL, bytes(data))

    def propose_conf_change(self, cc: ConfChange) -> int:
        """Append a configuration change; one at a time. Returns its index."""
        self._check_can_propose()
        self.check_conf_change(cc)
        index = self._append_as_leader(EntryType.CONF_CHANGE, encode_conf_change(cc))
        self._pending_conf_index = index
        return index

    def check_conf_change(self, cc: ConfChange) -> None:
        """Raise ConfChangeRefused unless `cc` could be proposed now."""
        if self._log.commit < self._pending_conf_index:
            raise ConfChangeRefused("a configuration change (or the leader's no-op) is pending")
        check_fits(self._conf, cc)

    def _check_can_propose(self) -> None:
        if self._role != Role.LEADER:
            raise NotLeader(self._leader)
        if self._transfer is not None:
            raise ProposalDropped("leadership transfer in progress")
        if self.id not in self._conf.voters:
            raise ProposalDropped("this leader is being removed from the cluster")

    def _append_as_leader(self, etype: EntryType, data: bytes) -> int:
        entry = Entry(self._term, self._log.last_index + 1, etype, data)
        self._log.append([entry])
        self._log_changed(entry.index, [entry])
        self._append_pending = True  # sent, batched, at the next has_ready()/ready()
        return entry.index

    # -- configuration tracking --------------------------------------------------------

    def _log_changed(self, first_changed: int, new_entries: list[Entry]) -> None:
        """Entries from `first_changed` on were replaced by `new_entries`."""
        before = len(self._conf_entries)
        self._conf_entries = [i for i in self._conf_entries if i < first_changed]
        changed = len(self._conf_entries) != before
        for e in new_entries:
            if e.type == EntryType.CONF_CHANGE:
                self._conf_entries.append(e.index)
                changed = True
        if changed:
            self._conf = self._conf_at(self._log.last_index)
            if self._role == Role.LEADER:
                self._sync_progress()

    def _conf_at(self, index: int) -> ConfState:
        """The configuration as of `index`: the snapshot's plus the log's changes up to it."""
        upto = itertools.takewhile(lambda i: i <= index, self._conf_entries)
        return conf_after(self._base_conf, (self._log.entry(i) for i in upto))

    def _sync_progress(self) -> None:
        members = self._conf.members()
        for member in members:  # sorted: message order must not depend on set order
            if member != self.id and member not in self._prs:
                self._prs[member] = self._new_progress(self._log.last_index)
        for gone in [p for p in self._prs if p not in members]:
            del self._prs[gone]
        if self._transfer is not None and self._transfer.target not in self._prs:
            self._abort_transfer()

    # -- leadership transfer -------------------------------------------------------------

    def transfer_leadership(self, to: str) -> None:
        """Hand leadership to voter `to`. A follower forwards the request to the leader.

        Raises NotLeader("") on a non-leader that knows no leader, ProposalDropped on a
        leader if `to` is not a voter.
        """
        if self._role != Role.LEADER:
            if self._leader == NO_NODE:
                raise NotLeader(NO_NODE)
            if to != self._leader:
                # TRANSFER_LEADER carries the target in `frm` (types.py).
                self._send(_MT.TRANSFER_LEADER, self._leader, frm=to)
            return
        self._start_transfer(to, strict=True)

    def _start_transfer(self, to: str, *, strict: bool) -> None:
        if to == self.id or (self._transfer is not None and self._transfer.target == to):
            return
        if to not in self._conf.voters or to not in self._prs:
            if strict:
                raise ProposalDropped(f"cannot transfer leadership to {to!r}: not a voter")
            return
        if to in self._barred:
            if strict:
                raise ProposalDropped(f"cannot transfer leadership to {to!r}: it is barred from leading")
            return
        # Give the lease up FIRST: the target's VOTE will bypass the recent-leader check.
        self._lease_given_up = True
        self._transfer = _Transfer(to, self._now + self._cfg.election_timeout_min_ms)
        if not self._maybe_send_timeout_now(to):
            self._replicate_to(to)  # bring the target up to date first

    def _maybe_send_timeout_now(self, peer: str) -> bool:
        t = self._transfer
        pr = self._prs.get(peer)
        if t is None or t.target != peer or pr is None or pr.match != self._log.last_index:
            return False
        assert self._lease_given_up
        self._send(_MT.TIMEOUT_NOW, peer)
        return True

    def _abort_transfer(self) -> None:
        # The lease is gone for this term (a delayed TIMEOUT_NOW may still make the
        # target campaign), so staying leader would leave the cluster without an active
        # node. Step down; the next election restores one.
        self._become_follower(self._term, NO_NODE)

    # -- lease ---------------------------------------------------------------------------

    def _lease_acks(self) -> dict[str, int]:
        """Voter -> send time of the newest heartbeat round it acknowledged in this term
        (ourselves: the latest round). Empty while we may not hold a lease."""
        if self._role != Role.LEADER or self._lease_given_up or not self._cfg.check_quorum:
            return {}
        if self._applied < self._term_start_index or self._rounds.latest == 0:
            return {}  # not active before our own-term entry is committed and applied
        return lease.voter_acks(self._conf.voters, self.id, self._rounds.latest_sent_ms, self._prs)

    def _lease_end_ms(self) -> int | None:
        start = lease.start_ms(self._lease_acks(), self._conf.voters)
        return lease.end_ms(start, self._cfg.election_timeout_min_ms, self._cfg.lease_drift_margin_ms)

    def lease_end_ms(self) -> int | None:
        """When this leader's lease ends (its own clock), or None when it holds none: not
        the leader, not yet active in its term, lease given up, or no quorum of acks."""
        return self._lease_end_ms()

    def lease_supporters(self) -> tuple[str, ...]:
        """The voters whose acknowledgements the current lease counts (this leader
        included): each promised to refuse votes until after the lease ends. Empty
        without a lease. For checkers."""
        acks = self._lease_acks()
        return lease.supporters(acks, lease.start_ms(acks, self._conf.voters))

    def lease_valid(self, now_ms: int) -> bool:
        """May this node act as the active node at `now_ms` (its own clock)? The rule of
        lease.py, which the node's published view applies too."""
        return lease.lease_holds(self._lease_end_ms(), self.sole_voter(), now_ms)

    def sole_voter(self) -> bool:
        """This node is the only voter (`dex-ha dev`)."""
        return tuple(self.conf_state.voters) == (self.id,)

    def lease_remaining_ms(self, now_ms: int) -> int:
        end = self._lease_end_ms()
        return max(0, end - now_ms) if end is not None else 0

    # -- snapshots -----------------------------------------------------------------------

    def snapshot_meta(self, index: int) -> SnapshotMeta:
        """The SnapshotMeta for a snapshot of the state machine at `index`."""
        term = self._log.term(index)
        if term is None:
            raise ValueError(f"index {index} is not in the log")
        return SnapshotMeta(index, term, self._conf_at(index))

    def compact(self, index: int, meta: SnapshotMeta) -> None:
        """The app has a durable snapshot at `index`: drop the log up to it."""
        if index <= self._log.snap_index:
            return
        if index > self._applied or index > self._log.persisted:
            raise ValueError(f"cannot compact to {index}: not applied/persisted yet")
        expected = self.snapshot_meta(index)
        if meta.index != index or meta.term != expected.term or canonical_conf(meta.conf_state) != expected.conf_state:
            raise ValueError(f"snapshot meta {meta} does not match the log ({expected})")
        self._base_conf = expected.conf_state
        self._conf_entries = [i for i in self._conf_entries if i > index]
        self._log.compact(index, expected.term)
        self._snapshot = meta

    def report_snapshot(self, to: str, ok: bool) -> None:
        """The node loop finished (ok) or failed sending a snapshot to `to`.

        Required after every SNAP message: until then the leader sends `to` nothing
        but heartbeats. Either way the leader then probes `to` again.
        """
        pr = self._prs.get(to) if self._role == Role.LEADER else None
        if pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        pr.probe_sent = True  # probe again after the next heartbeat response

    def report_unreachable(self, to: str) -> None:
        pr = self._prs.get(to) if self._role == Role.LEADER else None
        if pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()

    # -- Ready / advance -----------------------------------------------------------------

    def _hard_state(self) -> HardState:
        return HardState(self._term, self._vote, self._log.commit, self._refusal_ms)

    def _committed_hi(self) -> int:
        # Only entries we persisted ourselves may be applied.
        return min(self._log.commit, self._log.persisted)

    def has_ready(self) -> bool:
        if self._outstanding is not None:
            return False
        self._flush_appends()
        return bool(
            self._msgs
            or self._pending_snapshot is not None
            or self._log.handed < self._log.last_index
            or self._hard_state() != self._prev_hs
            or self._committed_hi() > self._applying
        )

    def ready(self, max_committed_entries: int = 0) -> Ready:
        """What to persist, send and apply now. `max_committed_entries` (0: no cap) bounds
        the committed entries in it, and so how long the node applies before it ticks again."""
        if self._outstanding is not None:
            raise RuntimeError("advance() the previous Ready before asking for another")
        self._flush_appends()
        hs = self._hard_state()
        rd = Ready()
        if hs != self._prev_hs:
            rd.hard_state = hs
        rd.entries = self._log.unhanded()
        self._log.handed = self._log.last_index
        if self._pending_snapshot is not None:
            rd.snapshot, rd.snapshot_data = self._pending_snapshot
            self._pending_snapshot = None
        hi = self._committed_hi()
        if hi > self._applying:
            if max_committed_entries:
                hi = min(hi, self._applying + max_committed_entries)
            rd.committed_entries = self._log.slice(self._applying + 1, hi + 1, self._cfg.max_committed_bytes_per_ready)
            self._applying = rd.committed_entries[-1].index
        rd.messages, self._msgs = self._msgs, []
        prev = self._prev_hs
        rd.must_sync = (
            bool(rd.entries)
            or rd.snapshot is not None
            or (hs.term, hs.vote, hs.vote_refusal_ms) != (prev.term, prev.vote, prev.vote_refusal_ms)
        )
        self._prev_hs = hs
        self._outstanding = rd
        return rd

    def advance(self, rd: Ready) -> None:
        if rd is not self._outstanding:
            raise RuntimeError("advance() must get the Ready returned by the last ready()")
        self._outstanding = None
        if rd.entries:
            self._log.stable_to(rd.entries[-1].index, rd.entries[-1].term)
        if rd.committed_entries:
            self._applied = max(self._applied, rd.committed_entries[-1].index)
        if rd.snapshot is not None:
            self._applied = max(self._applied, rd.snapshot.index)
        if self._role == Role.LEADER and self._maybe_commit() and self._role == Role.LEADER:
            self._commit_pending = True

    # -- status --------------------------------------------------------------------------

    def peer_progress(self) -> list[tuple[str, bool, int, int]]:
        """(id, voter, match index, last contact ms on the tick clock) of each other member
        the leader tracks; empty on a follower. Cheaper than status(): built every turn."""
        if self._role != Role.LEADER:
            return []
        voters = self._conf.voters
        return [(m, m in voters, pr.match, pr.last_contact_ms) for m, pr in sorted(self._prs.items()) if m != self.id]

    def status(self) -> Status:
        """The node's Raft state now, with each member's progress as far as this node knows it."""
        return Status(
            id=self.id,
            role=self.role.name.lower(),
            term=self._term,
            vote=self._vote,
            leader=self._leader,
            commit=self._log.commit,
            applied=self._applied,
            first_index=self._log.first_index,
            last_index=self._log.last_index,
            lease_remaining_ms=self.lease_remaining_ms(self._now),
            transferring_to=self.transferring_to,
            members=MappingProxyType({m: self._member_status(m) for m in self._conf.members()}),
        )

    def _member_status(self, member_id: str) -> MemberStatus:
        voter = member_id in self._conf.voters
        if member_id == self.id:
            return MemberStatus(
                voter,
                match=self._log.persisted,
                next=self._log.last_index + 1,
                state="self",
                last_contact_ms_ago=0,
                contacted=True,
                applied=self._applied,
                lost_entries=0,
            )
        pr = self._prs.get(member_id)
        if pr is None:  # not the leader: this node knows nothing of the member's progress
            return MemberStatus(voter)
        # contacted=False (and no last contact): this leader never heard from the peer
        # (not yet started, unreachable).
        return MemberStatus(
            voter,
            match=pr.match,
            next=pr.next,
            state=pr.state.value,
            contacted=pr.heard_from,
            last_contact_ms_ago=self._now - pr.last_contact_ms if pr.heard_from else None,
            applied=pr.applied,
            lost_entries=pr.lost_entries,
            lost_acknowledged=pr.lost_acknowledged or None,
        )

    # -- helpers -------------------------------------------------------------------------

    def _send(
        self, mtype: MessageType, to: str, *, term: int | None = None, frm: str | None = None, **fields: object
    ) -> None:
        if mtype in (_MT.APP_RESP, _MT.HEARTBEAT_RESP):
            fields["applied"] = self._applied  # the leader shows it as this node's progress
        self._msgs.append(
            Message(
                type=mtype,
                to=to,
                frm=self.id if frm is None else frm,
                term=self._term if term is None else term,
                **fields,  # type: ignore[arg-type]
            )
        )

    def _well_formed(self, m: object) -> bool:
        """Shape checks so that no peer input can make step() raise or corrupt state."""
        if not isinstance(m, Message) or m.to != self.id:
            return False
        if not isinstance(m.frm, str) or not m.frm or m.frm == self.id:
            return False
        if not isinstance(m.type, int) or m.type not in _MESSAGE_TYPES:
            return False
        for v in (m.term, m.log_term, m.index, m.commit, m.reject_hint, m.context, m.lease_window_ms, m.applied):
            if not isinstance(v, int) or v < 0:
                return False
        if m.lease_window_ms > MAX_LEASE_WINDOW_MS:
            return False
        if m.term == 0 or not isinstance(m.data, bytes) or not isinstance(m.entries, list):
            return False
        if m.entries and (m.type != _MT.APP or not self._entries_ok(m)):
            return False
        if m.type == _MT.SNAP:
            return self._snapshot_ok(m.snapshot)
        return True

    @staticmethod
    def _entries_ok(m: Message) -> bool:
        prev_term = m.log_term
        for i, e in enumerate(m.entries):
            if not isinstance(e, Entry) or e.index != m.index + 1 + i:
                return False
            if not isinstance(e.term, int) or not prev_term <= e.term <= m.term:
                return False
            if not isinstance(e.data, bytes) or not isinstance(e.type, int):
                return False
            if e.type not in _ENTRY_TYPES:
                return False
            prev_term = e.term
        return True

    @staticmethod
    def _snapshot_ok(s: object) -> bool:
        if not isinstance(s, SnapshotMeta) or not isinstance(s.conf_state, ConfState):
            return False
        if not isinstance(s.index, int) or not isinstance(s.term, int):
            return False
        if s.index < 1 or s.term < 1:
            return False
        cs = s.conf_state
        if not isinstance(cs.voters, tuple) or not isinstance(cs.learners, tuple):
            return False
        return all(isinstance(n, str) for n in (*cs.voters, *cs.learners))
