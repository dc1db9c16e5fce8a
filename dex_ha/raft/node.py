"""The Raft node loop: ties the pure core, durable storage and the TCP transport together.

One asyncio task owns the core. Everything else (inbound messages, proposals, ticks)
reaches it through queues and a wake-up event, so the core is never touched concurrently.
Each turn of the loop follows the etcd ordering for a `Ready`:

    persist snapshot → persist entries + hard state (one fsync: group commit)
    → send messages → apply snapshot and committed entries → core.advance()

Proposals that arrive while an fsync runs queue up and go into the next Ready together,
which is what batches many entries into one fsync under load. A turn steps the messages
that arrived before it fires timers, and applies committed entries in pieces that fit
`apply_budget_ms`, so the loop's own work does not silence its heartbeats and acks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import msgpack

from .clock import now_ms
from .core import (
    DEFAULT_ELECTION_TIMEOUT_MAX_MS,
    DEFAULT_ELECTION_TIMEOUT_MIN_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_LEASE_DRIFT_MARGIN_MS,
    ConfChangeRefused,
    EntryTooLarge,
    NotLeader,
    ProposalDropped,
    RaftConfig,
    RaftCore,
    check_timing,
)
from .status import Status
from .storage import RaftStorage, fsync_dir
from .transport import DEFAULT_MAX_FRAME_BYTES, RaftTransport
from .turn_watch import TurnWatch
from .types import (
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
    decode_conf_change,
    pack,
)

log = logging.getLogger("dex_ha.raft.node")

Address = tuple[str, int]

# An AppendEntries carrying one entry of max_entry_bytes must fit in one transport frame,
# or the follower never gets it and replication stalls for good. The rest of such a
# message (ids, terms, indexes, msgpack headers) is well under this headroom.
APP_FRAME_HEADROOM = 64 << 10
MAX_ENTRY_BYTES_LIMIT = DEFAULT_MAX_FRAME_BYTES - APP_FRAME_HEADROOM


class StateMachine(Protocol):
    """What the node applies committed entries to (the engine implements this)."""

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[Any]:
        """Apply committed entries (index, data) in order; one result per entry goes
        back to its proposer. A durable machine stores the last index with the changes.

        Empty `data` carries no command (a new leader's no-op entry, or a membership
        change the core handles): the machine only records the index as applied.
        """

    def applied_index(self) -> int:
        """The last index applied (durably, if the machine is durable)."""

    def snapshot_copier(self) -> Callable[[Path], int]:
        """Called on the loop; returns a function that the node runs in a worker thread
        while applies go on. It writes a copy of the state into the file at the path it
        is given (new and empty; the node makes it durable and names it) and returns the
        index the copy is at. A file, not bytes: the state may be far larger than memory
        should hold at once."""

    def restore(self, data: bytes, index: int) -> None:
        """Replace the whole state with a snapshot taken at `index`."""


@dataclass
class Member:
    raft_addr: Address
    url: str = ""


@dataclass
class NodeConfig:
    id: str
    data_dir: Path
    raft_listen: Address | None  # None: no listener (a single voter is never sent to)
    # Every member known at bootstrap, including this node. A brand-new cluster starts
    # with these as voters; a node that joins later starts with `join=True` and learns
    # the configuration from the leader's snapshot.
    members: dict[str, Member]
    join: bool = False
    durability: str = "strict"
    # The product's timing (core.py says why these values).
    election_timeout_min_ms: int = DEFAULT_ELECTION_TIMEOUT_MIN_MS
    election_timeout_max_ms: int = DEFAULT_ELECTION_TIMEOUT_MAX_MS
    heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS
    lease_drift_margin_ms: int = DEFAULT_LEASE_DRIFT_MARGIN_MS
    # propose() refuses bigger data (EntryTooLarge). HTTP bodies go up to 4 MiB, and a
    # command's msgpack can be larger than its JSON (floats).
    max_entry_bytes: int = 8 << 20
    tick_interval_ms: int = 10
    # How much the loop applies in one Ready; it ticks, sends heartbeats and reads the
    # network between two Readies. Applying is the slow part (0.2 ms an entry for the
    # engine on an idle machine, 2–6 ms on three busy nodes sharing two cores): unbounded,
    # a burst of entries kept the loop from sending heartbeats and acks past the election
    # timeout, and a busy cluster failed over. A Ready carries as many entries as fit in
    # `apply_budget_ms` at the recent cost per entry (at least one), and at most
    # `max_apply_entries_per_ready`.
    max_apply_entries_per_ready: int = 64
    apply_budget_ms: float = 20.0
    snapshot_every_entries: int = 20_000
    secret: bytes | None = None
    ssl_server: ssl.SSLContext | None = None
    ssl_client: ssl.SSLContext | None = None
    seed: int | None = None  # election-timeout randomness; None: from os.urandom

    def __post_init__(self) -> None:
        check_timing(
            self.election_timeout_min_ms,
            self.election_timeout_max_ms,
            self.heartbeat_interval_ms,
            self.lease_drift_margin_ms,
        )
        if not 0 < self.max_entry_bytes <= MAX_ENTRY_BYTES_LIMIT:
            raise ValueError(
                f"max_entry_bytes must be in 1..{MAX_ENTRY_BYTES_LIMIT} (one entry must fit "
                f"in one transport frame), not {self.max_entry_bytes}"
            )


# What may leave before its Ready is on disk (see split_early_messages).
_EARLY_FROM_LEADER = (MessageType.APP, MessageType.HEARTBEAT)
_EARLY_FROM_FOLLOWER = (MessageType.HEARTBEAT_RESP,)


def _promises(hs: HardState) -> tuple[int, str, int]:
    """What a hard state promises other nodes: the term, the vote, the vote-refusal window."""
    return hs.term, hs.vote, hs.vote_refusal_ms


def _may_send_early(rd: Ready, durable: HardState) -> bool:
    """Whether any of `rd`'s messages may leave before it is persisted: only when it installs
    no snapshot and changes none of the promises in the durable hard state."""
    hs = rd.hard_state
    return rd.snapshot is None and (hs is None or _promises(hs) == _promises(durable))


def split_early_messages(rd: Ready, role: Role, durable: HardState) -> tuple[list[Message], list[Message]]:
    """The messages of `rd` that may go out before it is persisted, and the rest.

    `role` is the node's role when it took `rd`; `durable` the last hard state it wrote.
    Only when the Ready changes none of the promises in the hard state (term, vote, the
    vote-refusal window), so that these messages depend on nothing not durable yet:
    - a leader's appends and heartbeats (Raft thesis §10.2.1);
    - a follower's heartbeat acks: an ack promises to refuse votes for the window, which
      is already on disk, and vouches for no entry. A slow fsync of entries then does
      not hold up the acks that keep the leader's lease.
    Every other response (votes, append acks: they vouch for entries) waits for the fsync.
    The node loop and the deterministic simulator (tests/raft/sim.py) both use this rule.
    """
    if not _may_send_early(rd, durable):
        return [], rd.messages
    kinds = _EARLY_FROM_LEADER if role == Role.LEADER else _EARLY_FROM_FOLLOWER
    early = [m for m in rd.messages if m.type in kinds]
    if not early:
        return [], rd.messages
    return early, [m for m in rd.messages if m.type not in kinds]


@dataclass
class ApplyPace:
    """How many committed entries the next Ready may carry: as many as fit in `budget_s`
    at the recent cost per entry (a moving average), at least one, at most `max_entries`."""

    budget_s: float
    max_entries: int
    # Until the first apply is timed: the engine's cost on a busy machine, so that a burst
    # committed at once after a start or an election is not applied in one go.
    per_entry_s: float = 0.001

    def limit(self) -> int:
        return max(1, min(self.max_entries, int(self.budget_s / self.per_entry_s)))

    def record(self, entries: int, seconds: float) -> None:
        # Weighted toward the recent: load comes and goes within seconds. (A floor keeps
        # the division in limit() finite when a clock's resolution reads 0.)
        sample = max(seconds / entries, 1e-6)
        self.per_entry_s = 0.7 * self.per_entry_s + 0.3 * sample


@dataclass
class _Pending:
    term: int
    future: Reply


@dataclass
class NodeMetrics:
    """Counters the server layer exports; plain numbers so raft/ imports nothing of ours."""

    leader_changes: int = 0
    fsyncs: int = 0
    proposals: int = 0
    applied_entries: int = 0
    snapshots_taken: int = 0
    snapshots_installed: int = 0
    # The largest gap between two messages from the leader of the current term, measured
    # where they arrive (on a follower): how close load brought the cluster to an election.
    leader_contact_gap_max_ms: int = 0


@dataclass(frozen=True)
class RaftView:
    """What the node's loop publishes of the core after every change that matters, so that
    code on another thread (the HTTP side) reads it without touching the core.

    Published before each Ready is handled (before any message of it leaves) and at the end
    of each turn: a lease given up for a transfer is gone from the view before TimeoutNow is
    sent, so the HTTP side never acts on a lease the core has already given away.
    """

    term: int
    role: Role
    leader_id: str
    lease_end_ms: int | None  # on the `now_ms()` clock; None: no valid lease
    commit: int
    voter: bool  # this node is a voting member
    # The only voter (`dex-ha dev`): no other node can be elected without a membership
    # change that this leader commits itself, so its lease, once established in its term,
    # does not run out with time. (A starved thread must not make a lone node inactive.)
    sole_voter: bool = False

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    def lease_valid(self, at_ms: int | None = None) -> bool:
        if self.lease_end_ms is None or not self.is_leader:
            return False
        return self.sole_voter or (now_ms() if at_ms is None else at_ms) < self.lease_end_ms

    def lease_remaining_ms(self) -> int:
        return 0 if self.lease_end_ms is None else max(0, self.lease_end_ms - now_ms())


def view_of(core: RaftCore) -> RaftView:
    """The view the node loop publishes of `core` (the simulator publishes the same)."""
    voters = core.conf_state.voters
    return RaftView(
        term=core.term,
        role=core.role,
        leader_id=core.leader_id,
        lease_end_ms=core.lease_end_ms(),
        commit=core.commit_index,
        voter=core.id in voters,
        sole_voter=tuple(voters) == (core.id,),
    )


@dataclass(frozen=True)
class PeerProgress:
    """What the leader knows of one other member, published for the HTTP side's metrics
    (like RaftView: read on another thread without touching the core)."""

    id: str
    voter: bool
    match: int  # the highest log index known to be on the peer
    last_contact_ms: int  # on the `now_ms()` clock: when the peer last answered the leader


class Reply(Protocol):
    """Where a proposal's outcome goes: an asyncio.Future of the node's loop, or an object
    that carries it to another thread (see dex_ha.raft.threaded)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exc: BaseException) -> None: ...


class RaftNode:
    """One member of a Raft group, running its loop on the current event loop."""

    def __init__(
        self,
        config: NodeConfig,
        state_machine: StateMachine,
        on_leader_change: Callable[[str], None] | None = None,
        on_fsync: Callable[[float], None] | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        """`on_leader_change(leader_id)` and `on_fsync(seconds)` let the server layer feed
        its metrics (a histogram of fsync time) without raft/ importing anything of ours.
        `on_fatal(exc)` is called when the loop dies of an error it cannot go on from (a
        failed fsync): the node then serves nothing, and a process should exit."""
        self.config = config
        self.sm = state_machine
        self.metrics = NodeMetrics()
        # Slow turns and late turns are logged when they reach a quarter of the election timeout.
        self.turn_watch = TurnWatch(config.id, slow_ms=config.election_timeout_min_ms / 4)
        self.apply_pace = ApplyPace(config.apply_budget_ms / 1000, config.max_apply_entries_per_ready)
        self._on_leader_change = on_leader_change
        self._on_fsync = on_fsync
        self._on_fatal = on_fatal
        self.failure: BaseException | None = None  # why the loop died, if it did
        self._inbox: deque[Message] = deque()
        self._unreachable: set[str] = set()
        # Proposals for the next turn: bytes for a normal entry, a ConfChange for a membership change.
        self._proposals: deque[tuple[bytes | ConfChange, Reply]] = deque()
        self._contact = (0, "", 0)  # (term, leader, arrival ms) of the latest leader message
        self._pending: dict[int, _Pending] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._members: dict[str, Member] = dict(config.members)
        self._last_leader = ""
        self._snapshot_index = 0  # the log (core and storage) starts after this index
        self._taken = SnapshotMeta(0, 0, ConfState())  # the newest snapshot file written
        self._snapshot_task: asyncio.Task[None] | None = None
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        # Changes to the core or the log from outside the loop (snapshot reports, a
        # transfer, compaction) run at once, except while a Ready is being handled
        # (between ready() and advance(), e.g. called back from a send): nothing else may
        # touch them then, so they wait here for the loop's next turn.
        self._in_ready = False
        self._deferred: deque[Callable[[], None]] = deque()
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._snap_dir = config.data_dir / "snapshots"
        self._snap_dir.mkdir(exist_ok=True)
        for leftover in [*self._snap_dir.glob("*.tmp"), *self._snap_dir.glob("*.tmp-*")]:
            leftover.unlink()  # a write cut short by a crash (and files SQLite kept beside it)
        self.storage = RaftStorage.open(
            config.data_dir / "raft", durability=config.durability, on_fsync=self._record_fsync
        )
        self.core = self._build_core()
        self.view = self._current_view()
        self.peer_progress: tuple[PeerProgress, ...] = ()  # only a leader knows it; see _current_peer_progress
        self._durable_hs = self.storage.hard_state  # the last hard state written
        self.transport = RaftTransport(
            config.id,
            config.raft_listen,
            self._peer_addrs(),
            self._on_message,
            secret=config.secret,
            ssl_server=config.ssl_server,
            ssl_client=config.ssl_client,
            on_unreachable=self._on_unreachable,
            on_snapshot_sent=self._on_snapshot_sent,
        )

    # ------------------------------------------------------------------ setup

    def _record_fsync(self, seconds: float) -> None:
        self.metrics.fsyncs += 1
        self.turn_watch.cost.sync_s += seconds
        if self._on_fsync is not None:
            self._on_fsync(seconds)

    def _build_core(self) -> RaftCore:
        hard_state, snap_meta, entries = self.storage.initial_state()
        self._restore_state_machine(snap_meta)
        if snap_meta is not None:
            conf = snap_meta.conf_state
            self._snapshot_index = snap_meta.index
            self._taken = snap_meta
        elif self.config.join:
            conf = ConfState()
        else:
            conf = ConfState(voters=tuple(sorted(self.config.members)))
        self._load_members_file()
        cfg = RaftConfig(
            id=self.config.id,
            election_timeout_min_ms=self.config.election_timeout_min_ms,
            election_timeout_max_ms=self.config.election_timeout_max_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            lease_drift_margin_ms=self.config.lease_drift_margin_ms,
            max_entry_bytes=self.config.max_entry_bytes,
        )
        seed = self.config.seed if self.config.seed is not None else int.from_bytes(os.urandom(8), "big")
        return RaftCore(
            cfg,
            hard_state=hard_state,
            conf_state=conf,
            snapshot=snap_meta,
            entries=entries,
            applied=self.sm.applied_index(),
            now_ms=now_ms(),
            rng=random.Random(seed),
        )

    def _restore_state_machine(self, snap_meta: SnapshotMeta | None) -> None:
        """A state machine behind the durable snapshot (e.g. in-memory) starts from it."""
        if snap_meta is None or self.sm.applied_index() >= snap_meta.index:
            return
        path = self._snapshot_file(snap_meta.index)
        if not path.exists():
            raise RuntimeError(f"snapshot file {path} missing for index {snap_meta.index}")
        self.sm.restore(path.read_bytes(), snap_meta.index)

    def _peer_addrs(self) -> dict[str, Address]:
        return {nid: m.raft_addr for nid, m in self._members.items() if nid != self.config.id}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.config.raft_listen is not None and self.config.secret is None and self.config.ssl_server is None:
            log.warning("raft transport of %s runs WITHOUT peer authentication (insecure)", self.config.id)
        await self.transport.start()
        self._task = asyncio.create_task(self._run(), name=f"raft-{self.config.id}")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # the loop died of it earlier: logged then, and in `failure`
                pass
        await self.transport.stop()
        self._fail_all_pending(ProposalDropped("node stopped"))
        self.storage.close()

    # ------------------------------------------------------------------ public API

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def is_leader(self) -> bool:
        return self.core.role == Role.LEADER

    @property
    def leader_id(self) -> str:
        return self.core.leader_id

    def lease_valid(self) -> bool:
        return self.core.lease_valid(now_ms())

    def lease_remaining_ms(self) -> int:
        return self.core.lease_remaining_ms(now_ms())

    def members(self) -> dict[str, Member]:
        return dict(self._members)

    def status(self) -> Status:
        """The core's status with the node loop's snapshot index and snapshots in flight."""
        return replace(
            self.core.status(),
            snapshot_index=self._snapshot_index,
            snapshots_sending=self.transport.snapshots_in_flight(),
        )

    async def propose(self, data: bytes) -> Any:
        """Replicate `data`, apply it, and return the state machine's result.

        Raises NotLeader when this node is not the leader, ProposalDropped when the
        entry was lost to a leader change (it may or may not commit later: callers make
        commands idempotent), EntryTooLarge above max_entry_bytes (nothing appended).
        """
        return await self._submit(data)

    async def change_membership(self, cc: ConfChange) -> None:
        """Add a learner, promote or remove a member; waits until the change applied.
        Raises ConfChangeRefused (nothing changed) when the change does not fit."""
        if self.core.role != Role.LEADER:
            raise NotLeader(self.core.leader_id)
        self.core.check_conf_change(cc)  # before we learn an address from a refused change
        if cc.type == ConfChangeType.ADD_LEARNER:
            if not cc.context:
                raise ValueError("ADD_LEARNER needs the member's address in context")
            # The core replicates to the learner from the moment it appends the entry;
            # tell the transport where it listens now rather than when the entry commits.
            self._learn_address(cc)
            self.transport.set_peers(self._peer_addrs())
        await self._submit(cc)

    def transfer_leadership(self, to: str) -> None:
        """Planned step down: hand leadership to `to`. Only on the leader: the core's
        forwarded request names the target as sender, which authenticated transports
        rightly refuse, so callers route a step down to the active node instead."""
        if self.core.role != Role.LEADER:
            raise NotLeader(self.core.leader_id)
        self._defer(lambda: self.core.transfer_leadership(to))

    async def wait_applied(self, index: int) -> None:
        """Wait until the state machine applied at least `index` (read-your-writes)."""
        if self.sm.applied_index() >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._apply_waiters.append((index, fut))
        await fut

    # ------------------------------------------------------------------ loop

    async def _submit(self, payload: bytes | ConfChange) -> Any:
        if self.core.role != Role.LEADER:
            raise NotLeader(self.core.leader_id)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.enqueue(payload, fut)
        return await fut

    def enqueue(self, payload: bytes | ConfChange, reply: Reply) -> None:
        """Queue a proposal for the next turn (bytes: a normal entry; a ConfChange: a
        membership change); its outcome goes to `reply`. On the loop only."""
        if self.failure is not None:
            reply.set_exception(ProposalDropped("node failed"))
            return
        self._proposals.append((payload, reply))
        self._wake.set()

    def _on_message(self, msg: Message) -> None:
        self._note_contact(msg)
        self._inbox.append(msg)
        self._wake.set()

    def _note_contact(self, msg: Message) -> None:
        """Track the largest gap between messages of the current leader, as they arrive."""
        view = self.view
        if msg.frm != view.leader_id or msg.term != view.term or view.is_leader:
            return
        now = now_ms()
        term, leader, last = self._contact
        if (term, leader) == (msg.term, msg.frm):
            self.metrics.leader_contact_gap_max_ms = max(self.metrics.leader_contact_gap_max_ms, now - last)
        else:  # a new leader or term: the gap starts again (an election is not load)
            self.metrics.leader_contact_gap_max_ms = 0
        self._contact = (msg.term, msg.frm, now)

    def _on_unreachable(self, peer: str) -> None:
        self._unreachable.add(peer)
        self._wake.set()

    def _on_snapshot_sent(self, peer: str, ok: bool) -> None:
        self._defer(lambda: self.core.report_snapshot(peer, ok))

    def _defer(self, change: Callable[[], None]) -> None:
        """Run `change` now, or at the start of the loop's next turn while a Ready is
        being handled (see `_deferred`)."""
        if self._in_ready:
            self._deferred.append(change)
        else:
            change()
        self._wake.set()

    async def _run(self) -> None:
        tick_s = self.config.tick_interval_ms / 1000
        try:
            while not self._stopping:
                if self._wake.is_set():
                    # More to do at once (e.g. committed entries left by the last turn):
                    # still give the loop one pass, so the transport reads what came.
                    await asyncio.sleep(0)
                else:
                    try:
                        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                        # cancellation that races with the event being set.
                        async with asyncio.timeout(tick_s):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                self._wake.clear()
                self._turn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A storage error (e.g. a failed fsync) leaves durability unknown: stop the
            # node rather than keep answering with state that may not be on disk.
            log.critical("raft node %s stopped by an unexpected error", self.config.id, exc_info=True)
            self.failure = exc
            self.view = replace(self.view, role=Role.FOLLOWER, lease_end_ms=None)
            self._fail_all_pending(ProposalDropped("node failed"))
            if self._on_fatal is not None:
                self._on_fatal(exc)
            raise

    def _turn(self) -> None:
        """One pass: deferred changes, inbound messages, timers, proposals, then every Ready
        up to the first that applied entries (see `apply_budget_ms`); what is
        left waits for the next turn, which comes at once."""
        self.turn_watch.turn_starts()
        while self._deferred:
            try:
                self._deferred.popleft()()
            except Exception as exc:  # e.g. a transfer to a node that left meanwhile
                log.warning("node %s: deferred change failed: %r", self.config.id, exc)
        now = now_ms()
        self.core.set_time(now)  # messages first (see set_time), then the timers
        while self._unreachable:
            self.core.report_unreachable(self._unreachable.pop())
        self.turn_watch.cost.stepped += len(self._inbox)
        while self._inbox:
            self.core.step(self._inbox.popleft())
        self.core.tick(now)
        self._take_proposals()
        while self.core.has_ready():
            self._in_ready = True
            try:
                rd = self.core.ready(max_committed_entries=self.apply_pace.limit())
                self.view = self._current_view()  # before any message of this Ready leaves
                self._handle_ready(rd)
            finally:
                self._in_ready = False
            if rd.committed_entries and self.core.has_ready():
                self._wake.set()
                break
        self.view = self._current_view()
        self.peer_progress = self._current_peer_progress()
        self._note_leader()
        self.turn_watch.turn_ends()

    def _current_view(self) -> RaftView:
        return view_of(self.core)

    def _current_peer_progress(self) -> tuple[PeerProgress, ...]:
        """Each other member's match index and last contact, as the leader tracks them;
        empty on a follower (it tracks no one)."""
        return tuple(
            PeerProgress(id=m, voter=voter, match=match, last_contact_ms=contact)
            for m, voter, match, contact in self.core.peer_progress()
        )

    def _take_proposals(self) -> None:
        while self._proposals:
            payload, fut = self._proposals.popleft()
            if fut.done():
                continue
            try:
                if isinstance(payload, ConfChange):
                    index = self.core.propose_conf_change(payload)
                else:
                    index = self.core.propose(payload)
            except (NotLeader, ProposalDropped, ConfChangeRefused, EntryTooLarge) as exc:
                fut.set_exception(exc)
                continue
            self.metrics.proposals += 1
            self._pending[index] = _Pending(self.core.term, fut)

    def _handle_ready(self, rd: Ready) -> None:
        early, late = split_early_messages(rd, self.core.role, self._durable_hs)
        if early:
            # Raft thesis §10.2.1: a leader may replicate entries while it writes them to
            # its own disk; it counts itself toward commit only after advance(). A
            # follower's heartbeat acks depend on nothing in this Ready (split_early_messages).
            # So these bytes go to the sockets before the fsync.
            for msg in early:
                self._send(msg)
            self.transport.flush()
        if rd.snapshot is not None:
            self._persist_received_snapshot(rd.snapshot, rd.snapshot_data)
        if rd.entries or rd.hard_state is not None:
            self.storage.append(rd.hard_state, rd.entries)
            if rd.must_sync and self.storage.syncs:
                # The fsync runs here, on the Raft thread, as etcd's raft loop does: it
                # releases the GIL, so the HTTP thread runs meanwhile, and it costs one
                # system call where a hop to a worker thread and back costs two thread
                # wake-ups (0.3–0.6 ms on a small VM, more than the fsync itself). The
                # leader's messages of this Ready are already on their way (`early`).
                self.storage.sync()  # timed in _record_fsync
            if rd.hard_state is not None:
                self._durable_hs = rd.hard_state
        for msg in late:
            self._send(msg)
        if late:
            self.transport.flush()  # out now, not when the per-peer pump task next runs
        if rd.snapshot is not None:
            self._install_snapshot(rd.snapshot, rd.snapshot_data)
        self._apply_committed(rd.committed_entries)
        self.core.advance(rd)
        self._wake_apply_waiters()
        self._maybe_snapshot()

    def _send(self, msg: Message) -> None:
        if msg.type == MessageType.SNAP and not msg.data and msg.snapshot is not None:
            path = self._snapshot_file(msg.snapshot.index)
            if not path.exists():
                log.error("node %s: snapshot file %s missing; cannot send it to %s", self.config.id, path, msg.to)
                self.core.report_snapshot(msg.to, False)
                return
            msg.data = path.read_bytes()
        self.transport.send(msg)

    # ------------------------------------------------------------------ apply

    def _apply_committed(self, entries: list[Entry]) -> None:
        """Apply in log order; runs of normal entries go to the machine as one batch
        (one SQLite transaction for the engine), membership changes one by one."""
        run: list[Entry] = []
        for entry in entries:
            if entry.type == EntryType.CONF_CHANGE:
                self._apply_run(run)
                run = []
                self._apply_conf_change(entry)
                self._settle(entry, None)
            else:
                run.append(entry)
        self._apply_run(run)

    def _apply_run(self, run: list[Entry]) -> None:
        if not run:
            return
        # Empty data is a new leader's no-op: the machine only records the index, so a
        # restart does not replay what came before it.
        started = time.perf_counter()
        results = self.sm.apply_batch([(e.index, e.data) for e in run])
        took_s = time.perf_counter() - started
        self.apply_pace.record(len(run), took_s)
        cost = self.turn_watch.cost
        cost.apply_s += took_s
        cost.applied += len(run)
        for entry, result in zip(run, results):
            self._settle(entry, result)
        self.metrics.applied_entries += len(run)

    def _settle(self, entry: Entry, result: Any) -> None:
        """Answer the proposer of `entry`, if it is waiting on this node."""
        pending = self._pending.pop(entry.index, None)
        if pending is None or pending.future.done():
            return
        if pending.term == entry.term:
            pending.future.set_result(result)
        else:
            pending.future.set_exception(ProposalDropped("a leader change replaced the entry"))

    def _drop_pending_through(self, index: int) -> None:
        """Proposals covered by an installed snapshot: their outcome is unknown here."""
        for i in [i for i in self._pending if i <= index]:
            p = self._pending.pop(i)
            if not p.future.done():
                p.future.set_exception(ProposalDropped("replaced by a snapshot from the leader"))

    def _apply_conf_change(self, entry: Entry) -> None:
        cc = decode_conf_change(entry.data)
        if cc.type == ConfChangeType.ADD_LEARNER and cc.context:
            self._learn_address(cc)
        elif cc.type == ConfChangeType.REMOVE:
            self._members.pop(cc.node_id, None)
        self.transport.set_peers(self._peer_addrs())
        self._save_members_file()
        # The core put the change in force when it appended the entry; here, once it is
        # committed, the transport learns the address. The entry still counts as applied
        # so the state machine's index stays contiguous.
        self.sm.apply_batch([(entry.index, b"")])

    def _learn_address(self, cc: ConfChange) -> None:
        info = msgpack.unpackb(cc.context, raw=False)
        self._members[cc.node_id] = Member((info["host"], int(info["port"])), info.get("url", ""))

    def _wake_apply_waiters(self) -> None:
        if not self._apply_waiters:
            return
        applied = self.sm.applied_index()
        keep = []
        for index, fut in self._apply_waiters:
            if index <= applied:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((index, fut))
        self._apply_waiters = keep

    def _fail_all_pending(self, exc: Exception) -> None:
        for p in self._pending.values():
            if not p.future.done():
                p.future.set_exception(exc)
        self._pending.clear()
        while self._proposals:
            _, fut = self._proposals.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def _note_leader(self) -> None:
        leader = self.core.leader_id
        if leader != self._last_leader:
            self._last_leader = leader
            if leader:
                self.metrics.leader_changes += 1
            log.info("node %s: leader is now %r (term %d)", self.config.id, leader, self.core.term)
            if self.core.role != Role.LEADER:
                # Entries we proposed may still commit under the new leader, but we can
                # no longer tell the caller: fail them so the caller retries idempotently.
                self._fail_all_pending(NotLeader(leader))
            if self._on_leader_change is not None:
                self._on_leader_change(leader)

    # ------------------------------------------------------------------ snapshots
    #
    # Two generations of snapshot files are kept. When the state machine has applied
    # `snapshot_every_entries` more entries, a new snapshot file is written, and the log
    # is compacted only up to the PREVIOUS snapshot. So the log always holds at least
    # `snapshot_every_entries` entries behind the applied index, and a follower that is
    # merely a little behind catches up from the log instead of needing a whole snapshot.

    def _snapshot_file(self, index: int) -> Path:
        return self._snap_dir / f"snapshot-{index:020d}.bin"

    def _maybe_snapshot(self) -> None:
        if self._snapshot_task is not None:
            return  # one at a time
        # The core's applied index, not the machine's: after advance() they are the same,
        # and the machine's may cost a query (the engine reads it from SQLite) every turn.
        if self.core.applied_index - self._taken.index < self.config.snapshot_every_entries:
            return
        copy = self.sm.snapshot_copier()
        self._snapshot_task = asyncio.create_task(self._take_snapshot(copy), name=f"raft-snapshot-{self.config.id}")

    async def _take_snapshot(self, copy: Callable[[Path], int]) -> None:
        """Copy the state into a snapshot file off the event loop (a large state takes
        seconds, and heartbeats must go on), then compact to the previous one on the loop."""
        tmp: Path | None = None
        try:
            tmp = self._new_temp_file("snapshot-copy")
            index = await asyncio.to_thread(copy, tmp)
            if index <= self._taken.index:
                return  # a snapshot from the leader overtook this one
            meta = self.core.snapshot_meta(index)  # in the log: compaction stops one snapshot behind
            size = tmp.stat().st_size
            await asyncio.to_thread(self._keep_snapshot_file, tmp, index)
            if index <= self._taken.index:
                return
            previous, self._taken = self._taken, meta
            self.metrics.snapshots_taken += 1
            log.info("node %s: snapshot at index %d (%d bytes)", self.config.id, index, size)
            if previous.index > self._snapshot_index:
                self._defer(lambda: self._compact_to(previous))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: taking a snapshot failed; will try again", self.config.id)
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)  # gone already when it became the snapshot file
            self._snapshot_task = None

    def _compact_to(self, meta: SnapshotMeta) -> None:
        if meta.index <= self._snapshot_index:  # a snapshot from the leader got there first
            return
        self.storage.save_snapshot(meta)
        self.core.compact(meta.index, meta)
        self.storage.compact(meta.index)
        self._snapshot_index = meta.index
        self._delete_snapshot_files_before(meta.index)

    def _delete_snapshot_files_before(self, index: int) -> None:
        for path in self._snap_dir.glob("snapshot-*.bin"):
            if int(path.stem.split("-")[1]) < index:
                path.unlink(missing_ok=True)

    def _new_temp_file(self, prefix: str) -> Path:
        """A new empty file in the snapshot directory, this caller's own (the loop and the
        snapshot thread may each be writing one)."""
        fd, tmp = tempfile.mkstemp(dir=self._snap_dir, prefix=prefix, suffix=".tmp")
        os.close(fd)
        return Path(tmp)

    def _write_snapshot_file(self, index: int, data: bytes) -> None:
        """Atomically: a temp file, then `_keep_snapshot_file`."""
        tmp = self._new_temp_file(self._snapshot_file(index).name)
        try:
            tmp.write_bytes(data)
            self._keep_snapshot_file(tmp, index)
        finally:
            tmp.unlink(missing_ok=True)

    def _keep_snapshot_file(self, tmp: Path, index: int) -> None:
        """Make the written temp file `tmp` the snapshot file of `index`: durable, then renamed."""
        if self.config.durability == "strict":
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, self._snapshot_file(index))
        if self.config.durability == "strict":
            fsync_dir(self._snap_dir)

    def _persist_received_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self._write_snapshot_file(meta.index, data)
        self.storage.save_snapshot(meta)
        self._snapshot_index = meta.index
        self._taken = meta
        self._delete_snapshot_files_before(meta.index)

    def _install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.sm.restore(data, meta.index)
        self._drop_pending_through(meta.index)
        self._members = {nid: m for nid, m in self._members.items() if nid in meta.conf_state.members()}
        self.metrics.snapshots_installed += 1
        log.info("node %s: installed snapshot at index %d", self.config.id, meta.index)

    # ------------------------------------------------------------------ member addresses

    def _members_path(self) -> Path:
        return self.config.data_dir / "members.msgpack"

    def _save_members_file(self) -> None:
        raw = {nid: [m.raft_addr[0], m.raft_addr[1], m.url] for nid, m in self._members.items()}
        tmp = self._members_path().with_suffix(".tmp")
        tmp.write_bytes(pack(raw))
        os.replace(tmp, self._members_path())

    def _load_members_file(self) -> None:
        path = self._members_path()
        if not path.exists():
            return
        raw = msgpack.unpackb(path.read_bytes(), raw=False)
        for nid, (host, port, url) in raw.items():
            self._members.setdefault(nid, Member((host, int(port)), url))


def member_context(host: str, port: int, url: str = "") -> bytes:
    """The ConfChange context for ADD_LEARNER: where the new member listens."""
    return pack({"host": host, "port": port, "url": url})
