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

A full disk (a write of the log, a snapshot file or the state machine fails with ENOSPC or
SQLITE_FULL) does not stop the node: the Ready it was handling is held, nothing further is
stepped, ticked or proposed (a node that cannot persist must not vote, ack or lead), and the
held Ready is tried again every DISK_FULL_RETRY_MS until it goes through (see `disk_full`).
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypedDict, TypeVar, Unpack

import msgpack

from dex_ha.background import cancel_and_wait
from dex_ha.diskspace import free_bytes, is_disk_full

from .clock import now_ms
from .core import (
    DEFAULT_ELECTION_TIMEOUT_MAX_MS,
    DEFAULT_ELECTION_TIMEOUT_MIN_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_LEASE_DRIFT_MARGIN_MS,
    RaftConfig,
    RaftCore,
    check_timing,
)
from .errors import ConfChangeRefused, EntryTooLarge, NotLeader, ProposalDropped
from .handshake import HandshakeError
from .identity import (
    CLUSTER_ID_ENTRY_PREFIX,
    Found,
    FreshVoter,
    Identity,
    IdentityFile,
    IdentityRefused,
    LostData,
    Wait,
    lost_data_line,
    mismatch_line,
    new_id,
)
from .peer import LogBudget
from .snapshot_file import SnapshotCorruptionError, seal_file, verify
from .status import LostEntries, RaftView, Status, view_of
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
    NodeVersion,
    Ready,
    Role,
    SnapshotMeta,
    decode_conf_change,
    pack,
)

log = logging.getLogger("dex_ha.raft.node")

Address = tuple[str, int]

# How often a fresh voter that waits for its peers says so (see identity.py).
FRESH_WAIT_REMINDER_MS = 30_000

# An AppendEntries carrying one entry of max_entry_bytes must fit in one transport frame,
# or the follower never gets it and replication stalls for good. The rest of such a
# message (ids, terms, indexes, msgpack headers) is well under this headroom.
APP_FRAME_HEADROOM = 64 << 10
MAX_ENTRY_BYTES_LIMIT = DEFAULT_MAX_FRAME_BYTES - APP_FRAME_HEADROOM

# While the disk is full: how often the held Ready is tried again, how often the log says
# it is still full, and how long a snapshot that found the disk full waits to try again.
DISK_FULL_RETRY_MS = 1_000
DISK_FULL_LOG_EVERY_MS = 60_000
SNAPSHOT_DISK_FULL_BACKOFF_MS = 30_000


class NoSpace(ProposalDropped):
    """The node's disk is full: it takes no proposal until space is freed (then by itself)."""


@dataclass(frozen=True)
class DiskFullAlarm:
    """Why and since when this node writes nothing: published like RaftView, for the HTTP side."""

    path: str  # where the failed write went (the data directory when the error names none)
    free_bytes: int | None  # on that file system, when last tried
    since_ms: int  # on the `now_ms()` clock

    def describe(self) -> str:
        free = "free space unknown" if self.free_bytes is None else f"{self.free_bytes} bytes free"
        return f"the disk of {self.path} is full ({free})"


@dataclass
class _HeldReady:
    """A Ready being handled, kept across turns while the disk is full: what is done of it."""

    rd: Ready
    late: list[Message]  # the messages that wait for the persist
    persisted: bool = False
    installed: bool = False  # its snapshot, if any, is in the state machine
    applied_through: int = 0  # its committed entries up to this index are applied


# What a state machine answers for one entry (the engine: an ApplyResult); the node hands
# it to the entry's proposer as it is, so `RaftNode[R].propose` returns an R.
R = TypeVar("R")


class StateMachine(Protocol[R]):
    """What the node applies committed entries to (the engine implements this)."""

    def apply_batch(self, entries: list[tuple[int, bytes]]) -> list[R]:
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

    def restore(self, data: bytes | memoryview, index: int) -> None:
        """Replace the whole state with a snapshot taken at `index` (`data`: what the copier
        wrote; the node has checked it against the snapshot file's checksum)."""


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
    # What this node runs (sent on every message); the peers' show in status().versions.
    version: NodeVersion | None = None

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
    # Snapshots that failed their checksum: received ones not installed, and this node's
    # own files found damaged before sending (see snapshot_file.py).
    snapshots_refused: int = 0
    # The largest gap between two messages from the leader of the current term, measured
    # where they arrive (on a follower): how close load brought the cluster to an election.
    leader_contact_gap_max_ms: int = 0
    # On a leader: by member, the times its answers showed it lost entries it had
    # acknowledged (RaftCore.take_lost_entries); each is logged as an error.
    follower_lost_entries: dict[str, int] = field(default_factory=dict)


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


class NodeHooks(TypedDict, total=False):
    """The optional callbacks of a RaftNode (and a RaftThread) into the layer above it.

    `on_leader_change(leader_id)` and `on_fsync(seconds)` let the server layer feed its
    metrics (a histogram of fsync time) without raft/ importing anything of ours.
    `on_fatal(exc)` is called when the loop dies of an error it cannot go on from (a failed
    fsync): the node then serves nothing, and a process should exit.
    `on_note(sender, data)` gets the application's notes from other members (send_note)."""

    on_leader_change: Callable[[str], None] | None
    on_fsync: Callable[[float], None] | None
    on_fatal: Callable[[BaseException], None] | None
    on_note: Callable[[str, bytes], None] | None


class RaftNode(Generic[R]):
    """One member of a Raft group, running its loop on the current event loop; `R` is what
    its state machine answers for an entry, and so what `propose` returns."""

    def __init__(self, config: NodeConfig, state_machine: StateMachine[R], **hooks: Unpack[NodeHooks]) -> None:
        self.config = config
        self.sm = state_machine
        self.metrics = NodeMetrics()
        # Slow turns and late turns are logged when they reach a quarter of the election timeout.
        self.turn_watch = TurnWatch(config.id, slow_ms=config.election_timeout_min_ms / 4)
        self.apply_pace = ApplyPace(config.apply_budget_ms / 1000, config.max_apply_entries_per_ready)
        self._on_leader_change = hooks.get("on_leader_change")
        self._on_fsync = hooks.get("on_fsync")
        self._on_fatal = hooks.get("on_fatal")
        self._on_note = hooks.get("on_note")
        self.failure: BaseException | None = None  # why the loop died, if it did
        self.disk_full: DiskFullAlarm | None = None  # set while a write waits for space
        self._held: _HeldReady | None = None
        self._disk_retry_at_ms = 0
        self._disk_logged_at_ms = 0
        self._snapshot_not_before_ms = 0
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
        # What each peer runs, from its latest message (None: a release before versions).
        self._peer_versions: dict[str, NodeVersion | None] = {}
        self._taken = SnapshotMeta(0, 0, ConfState())  # the newest snapshot file written
        self._snapshot_task: asyncio.Task[None] | None = None
        self._snapshot_repair = False  # a snapshot file was found damaged: take a new one now
        self._damaged_snapshots: set[int] = set()  # their indexes (logged once)
        self._background: set[asyncio.Task[None]] = set()  # snapshot sends and checks
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
        self.identity_file, _ = IdentityFile.load_or_create(config.data_dir, durable=config.durability == "strict")
        self._peer_identities: dict[str, Identity] = {}
        self._other_clusters: dict[str, str] = {}  # peer -> its cluster id, for peers we refuse
        self._seen_own_cluster = False
        self._mismatch_log = LogBudget(burst=3, window_s=60.0)
        self.fresh_voter = self._fresh_voter()
        self._waiting_since_ms = now_ms()
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
            identity=self.identity,
            check_identity=self._check_peer_identity,
            version=config.version,
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
        data = path.read_bytes()
        try:
            payload = verify(data, snap_meta.index, str(path))
        except SnapshotCorruptionError as exc:
            log.error(
                "node %s: cannot start: its snapshot at index %d is damaged: %s", self.config.id, snap_meta.index, exc
            )
            raise
        self.sm.restore(payload, snap_meta.index)

    def _peer_addrs(self) -> dict[str, Address]:
        return {nid: m.raft_addr for nid, m in self._members.items() if nid != self.config.id}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.config.raft_listen is not None and self.config.secret is None and self.config.ssl_server is None:
            log.warning("raft transport of %s runs WITHOUT peer authentication (insecure)", self.config.id)
        await self.transport.start()
        self._task = asyncio.create_task(self._run(), name=f"raft-{self.config.id}")
        if self.fresh_voter is not None:
            log.info(
                "node %s has an empty data directory: it does not vote until its peers (%s) say "
                "whether a cluster exists",
                self.config.id,
                ", ".join(self.fresh_voter.voters),
            )
            self._act_on(self.fresh_voter.decide())

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
        for task in list(self._background):
            task.cancel()
        try:
            await cancel_and_wait(self._task)
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
            versions={**self._peer_versions, self.config.id: self.config.version},
        )

    async def propose(self, data: bytes) -> R:
        """Replicate `data`, apply it, and return the state machine's result.

        Raises NotLeader when this node is not the leader, ProposalDropped when the
        entry was lost to a leader change (it may or may not commit later: callers make
        commands idempotent), EntryTooLarge above max_entry_bytes (nothing appended).
        """
        result: R = await self._submit(data)  # the apply_batch result of its entry (_settle)
        return result

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
        if self.disk_full is not None:
            reply.set_exception(self._no_space())
            return
        self._proposals.append((payload, reply))
        self._wake.set()

    def send_note(self, to: str, data: bytes) -> None:
        """Send the application's own message to member `to` over the authenticated Raft
        transport (best effort: a note to an unreachable member is lost). On the loop only."""
        self.transport.send(Message(MessageType.NOTE, to=to, frm=self.config.id, term=self.core.term, data=data))

    def set_barred(self, members: frozenset[str]) -> None:
        """Members that must not become leader (see RaftCore.set_barred). On the loop only."""
        self._defer(lambda: self.core.set_barred(members))

    def _on_message(self, msg: Message) -> None:
        if not self._same_cluster(msg):
            return
        self._peer_versions[msg.frm] = msg.version
        if msg.type == MessageType.NOTE:
            if self._on_note is not None:
                self._on_note(msg.frm, msg.data)
            return
        self._note_contact(msg)
        if msg.type == MessageType.SNAP and msg.snapshot is not None:
            self._in_background(
                self._check_received_snapshot(msg, msg.snapshot.index), f"raft-check-snapshot-{msg.frm}"
            )
            return
        self._inbox.append(msg)
        self._wake.set()

    async def _check_received_snapshot(self, msg: Message, index: int) -> None:
        """Step a received snapshot only once its checksum holds (checked off the loop). A
        damaged one is dropped: the leader's next probe finds this node still behind and
        sends a snapshot again."""
        try:
            await asyncio.to_thread(verify, msg.data, index, f"snapshot from {msg.frm}")
        except SnapshotCorruptionError as exc:
            self.metrics.snapshots_refused += 1
            log.error(
                "node %s: refused the snapshot at index %d from %s, NOT installed: %s; the leader will send one again",
                self.config.id,
                index,
                msg.frm,
                exc,
            )
            return
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
        if self._held is not None and not self._retry_held_ready():
            self.turn_watch.turn_ends()
            return
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
        if self.fresh_voter is not None:
            # Not known yet whether a cluster with data exists (see identity.py): no vote,
            # no campaign, no entry acknowledged.
            self._inbox.clear()
        while self._inbox:
            self.core.step(self._inbox.popleft())
        for lost in self.core.take_lost_entries():
            self._report_lost_entries(lost)
        if self.fresh_voter is None:
            self.core.tick(now)
        else:
            self._remind_waiting(now)
        self._take_proposals()
        while self.core.has_ready():
            self._in_ready = True
            try:
                rd = self.core.ready(max_committed_entries=self.apply_pace.limit())
                self.view = self._current_view()  # before any message of this Ready leaves
                done = self._handle_ready(rd)
            finally:
                self._in_ready = self._held is not None  # a held Ready still defers changes
            if not done:
                break
            if rd.committed_entries and self.core.has_ready():
                self._wake.set()
                break
        self.view = self._current_view()
        self.peer_progress = self._current_peer_progress()
        self._note_leader()
        self.turn_watch.turn_ends()

    def _report_lost_entries(self, lost: LostEntries) -> None:
        counts = self.metrics.follower_lost_entries
        # A new dict, not an update in place: the HTTP thread reads it for /metrics.
        self.metrics.follower_lost_entries = {**counts, lost.member: counts.get(lost.member, 0) + 1}
        log.error(
            "node %s (leader of term %d): member %s lost entries it had acknowledged: it had stored up to "
            "index %d, its answer shows it holds %s. Its data directory was wiped or replaced, or its disk "
            "lost writes; entries counted as stored on it are not. The leader sends them again (it catches "
            "up; `dex-ha members` shows its progress). Find out what happened to that node's disk.",
            self.config.id,
            lost.term,
            lost.member,
            lost.acknowledged,
            f"up to index {lost.has}" if lost.has else "none of them",
        )

    def _current_view(self) -> RaftView:
        view = view_of(self.core)
        if self.disk_full is not None:
            # It cannot persist, so it leads nothing: no lease, and no leader it could name
            # as itself (clients are sent elsewhere or told no_space, never back here).
            leader_id = "" if view.leader_id == self.config.id else view.leader_id
            return replace(view, role=Role.FOLLOWER, leader_id=leader_id, lease_end_ms=None)
        return view

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

    def _handle_ready(self, rd: Ready) -> bool:
        """Persist, send, apply, advance. False when the disk is full: the Ready is held."""
        early, late = split_early_messages(rd, self.core.role, self._durable_hs)
        if early:
            # Raft thesis §10.2.1: a leader may replicate entries while it writes them to
            # its own disk; it counts itself toward commit only after advance(). A
            # follower's heartbeat acks depend on nothing in this Ready (split_early_messages).
            # So these bytes go to the sockets before the fsync.
            for msg in early:
                self._send(msg)
            self.transport.flush()
        self._held = _HeldReady(rd, late)
        return self._finish_held_ready()

    def _finish_held_ready(self) -> bool:
        """Take the held Ready on from where it stopped. Every stage can be run again after
        a full disk interrupted it: the log's write was cut back, the snapshot file and the
        members file are rewritten whole, and the engine rolled back its whole batch."""
        held = self._held
        assert held is not None
        rd = held.rd
        try:
            if not held.persisted:
                self._persist(rd)
                held.persisted = True
                for msg in held.late:
                    self._send(msg)
                if held.late:
                    self.transport.flush()  # out now, not when the per-peer pump task next runs
            if rd.snapshot is not None and not held.installed:
                self._install_snapshot(rd.snapshot, rd.snapshot_data)
                held.installed = True
            self._apply_committed(rd.committed_entries, held)
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._note_disk_full(exc)
            return False
        self._held = None
        self.core.advance(rd)
        self._wake_apply_waiters()
        self._maybe_snapshot()
        if self.disk_full is not None:
            self._note_disk_space_back()
        return True

    def _persist(self, rd: Ready) -> None:
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

    # ------------------------------------------------------------------ full disk

    def _retry_held_ready(self) -> bool:
        """A turn while a Ready is held: drop what came in (Raft resends what matters; a node
        that cannot persist must not answer), refuse proposals, and now and then try the held
        Ready again. True once it went through: the turn then goes on as usual."""
        self._inbox.clear()
        self._unreachable.clear()
        self._refuse_proposals()
        now = now_ms()
        if now < self._disk_retry_at_ms:
            return False
        self._disk_retry_at_ms = now + DISK_FULL_RETRY_MS
        self._in_ready = True
        try:
            return self._finish_held_ready()
        finally:
            self._in_ready = self._held is not None

    def _refuse_proposals(self) -> None:
        while self._proposals:
            _, fut = self._proposals.popleft()
            if not fut.done():
                fut.set_exception(self._no_space())

    def _no_space(self) -> NoSpace:
        alarm = self.disk_full
        what = alarm.describe() if alarm is not None else "the disk is full"
        return NoSpace(f"{what}: this node writes nothing until space is freed, then resumes by itself")

    def _note_disk_full(self, exc: BaseException) -> None:
        now = now_ms()
        path = str(getattr(exc, "path", None) or getattr(exc, "filename", None) or self.config.data_dir)
        first = self.disk_full is None
        self.disk_full = DiskFullAlarm(path, free_bytes(path), self.disk_full.since_ms if self.disk_full else now)
        if first:
            self._disk_retry_at_ms = now + DISK_FULL_RETRY_MS
            self._disk_logged_at_ms = now
            log.error(
                "node %s: %s (%s). It writes nothing, answers writes with no_space and steps "
                "down; it tries again every %d ms and resumes by itself once space is freed",
                self.config.id,
                self.disk_full.describe(),
                exc,
                DISK_FULL_RETRY_MS,
            )
            was_leader = self.view.is_leader
            self.view = self._current_view()
            self._fail_all_pending(self._no_space())  # their outcome is unknown: retried idempotently
            if was_leader and self._on_leader_change is not None:
                self._on_leader_change("")  # the server stops this term's services
        elif now - self._disk_logged_at_ms >= DISK_FULL_LOG_EVERY_MS:
            self._disk_logged_at_ms = now
            log.warning("node %s: still waiting for space: %s", self.config.id, self.disk_full.describe())

    def _note_disk_space_back(self) -> None:
        alarm, self.disk_full = self.disk_full, None
        took_s = (now_ms() - alarm.since_ms) / 1000 if alarm is not None else 0.0
        log.warning("node %s: disk space is back after %.1f s: writing again", self.config.id, took_s)
        self.view = self._current_view()
        if self._on_leader_change is not None:
            self._on_leader_change(self.core.leader_id)  # the server follows the view again

    def _send(self, msg: Message) -> None:
        if msg.type == MessageType.SNAP:
            msg.cluster_id = self.identity_file.cluster_id
            if not msg.data and msg.snapshot is not None:
                self._in_background(self._send_snapshot(msg, msg.snapshot.index), f"raft-send-snapshot-{msg.to}")
                return
        self.transport.send(msg)

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_snapshot(self, msg: Message, index: int) -> None:
        """Read the snapshot file and check its checksum off the loop (a large one takes a
        while), then send it: a SNAP is the one message later ones may overtake. A damaged
        file is never sent: the send is reported failed, and a new snapshot replaces it."""
        path = self._snapshot_file(index)
        try:
            data = await asyncio.to_thread(path.read_bytes)
            await asyncio.to_thread(verify, data, index, str(path))
        except FileNotFoundError:
            if index not in self._damaged_snapshots:
                log.error("node %s: snapshot file %s missing; cannot send it to %s", self.config.id, path, msg.to)
            self._defer(lambda: self.core.report_snapshot(msg.to, False))
            return
        except SnapshotCorruptionError as exc:
            self._on_damaged_snapshot(path, index, msg.to, exc)
            self._defer(lambda: self.core.report_snapshot(msg.to, False))
            return
        msg.data = data
        self.transport.send(msg)
        self.transport.flush()

    def _on_damaged_snapshot(self, path: Path, index: int, to: str, exc: SnapshotCorruptionError) -> None:
        """Keep the damaged file aside for inspection, and take a new snapshot to send instead."""
        self.metrics.snapshots_refused += 1
        self._damaged_snapshots.add(index)
        kept = path.with_name(path.name + ".damaged")
        os.replace(path, kept)
        self._snapshot_repair = True
        self._wake.set()
        log.error(
            "node %s: its snapshot file at index %d is damaged, NOT sent to %s: %s. The file is kept as "
            "%s; a new snapshot is being taken to send instead (check the disk of this node)",
            self.config.id,
            index,
            to,
            exc,
            kept,
        )

    # ------------------------------------------------------------------ apply

    def _apply_committed(self, entries: list[Entry], held: _HeldReady) -> None:
        """Apply in log order; runs of normal entries go to the machine as one batch
        (one SQLite transaction for the engine), membership changes one by one. What was
        applied before a full disk stopped it (`held.applied_through`) is not applied twice."""
        run: list[Entry] = []
        for entry in entries:
            if entry.index <= held.applied_through:
                continue
            if entry.type == EntryType.CONF_CHANGE:
                self._apply_run(run, held)
                run = []
                self._apply_conf_change(entry)
                held.applied_through = entry.index
                self._settle(entry, None)
            else:
                run.append(entry)
        self._apply_run(run, held)

    def _apply_run(self, run: list[Entry], held: _HeldReady) -> None:
        if not run:
            return
        # Empty data is a new leader's no-op: the machine only records the index, so a
        # restart does not replay what came before it.
        started = time.perf_counter()
        results = self.sm.apply_batch([(e.index, self._command_of(e)) for e in run])
        held.applied_through = run[-1].index
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
            elif not self.identity_file.cluster_id:
                self._propose_cluster_id()
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
        due = self.core.applied_index - self._taken.index >= self.config.snapshot_every_entries
        if not (due or self._snapshot_repair):
            return
        if now_ms() < self._snapshot_not_before_ms:  # the last one found the disk full
            return
        copy = self.sm.snapshot_copier()
        self._snapshot_task = asyncio.create_task(self._take_snapshot(copy), name=f"raft-snapshot-{self.config.id}")

    async def _take_snapshot(self, copy: Callable[[Path], int]) -> None:
        """Copy the state into a snapshot file off the event loop (a large state takes
        seconds, and heartbeats must go on), then compact to the previous one on the loop."""
        tmp: Path | None = None
        # Replacing a damaged snapshot file: compact to the new one at once (rather than
        # one snapshot behind), so that the next send to a follower uses it.
        repair, self._snapshot_repair = self._snapshot_repair, False
        try:
            tmp = self._new_temp_file("snapshot-copy")
            index = await asyncio.to_thread(copy, tmp)
            if index < self._taken.index or (index == self._taken.index and not repair):
                return  # a snapshot from the leader overtook this one
            meta = self.core.snapshot_meta(index)  # in the log: compaction stops one snapshot behind
            await asyncio.to_thread(seal_file, tmp, index)  # the checksum, before it becomes the file
            size = tmp.stat().st_size
            await asyncio.to_thread(self._keep_snapshot_file, tmp, index)
            if index < self._taken.index:
                return
            previous, self._taken = self._taken, meta
            self._damaged_snapshots.discard(index)
            self.metrics.snapshots_taken += 1
            log.info("node %s: snapshot at index %d (%d bytes)", self.config.id, index, size)
            if repair:
                self._defer(lambda: self._compact_to(meta))
            elif previous.index > self._snapshot_index:
                self._defer(lambda: self._compact_to(previous))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._snapshot_repair = self._snapshot_repair or repair
            if not is_disk_full(exc):
                log.exception("node %s: taking a snapshot failed; will try again", self.config.id)
            else:
                self._snapshot_not_before_ms = now_ms() + SNAPSHOT_DISK_FULL_BACKOFF_MS
                log.warning(
                    "node %s: no space for a snapshot in %s (%s); trying again in %d s",
                    self.config.id,
                    self._snap_dir,
                    exc,
                    SNAPSHOT_DISK_FULL_BACKOFF_MS // 1000,
                )
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
        # `data` is the leader's whole file, trailer included, checked on arrival.
        self._write_snapshot_file(meta.index, data)
        self.storage.save_snapshot(meta)
        self._snapshot_index = meta.index
        self._taken = meta
        self._delete_snapshot_files_before(meta.index)

    def _install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        where = f"snapshot at index {meta.index}"
        self.sm.restore(verify(data, meta.index, where, digest=False), meta.index)  # hashed on arrival
        self._drop_pending_through(meta.index)
        self._members = {nid: m for nid, m in self._members.items() if nid in meta.conf_state.members()}
        self.metrics.snapshots_installed += 1
        log.info("node %s: installed snapshot at index %d", self.config.id, meta.index)

    # ------------------------------------------------------------------ identity (identity.py)

    def identity(self) -> Identity:
        """What the handshake says of this node now."""
        has_log = self.core.last_index > 0 or self.core.term > 0
        return self.identity_file.identity(has_log)

    @property
    def cluster_id(self) -> str:
        return self.identity_file.cluster_id

    def _fresh_voter(self) -> FreshVoter | None:
        """The decision state of a voter with an empty data directory, else None."""
        own = self.identity()
        if self.config.join or not own.fresh:
            return None
        return FreshVoter(self.config.id, own, tuple(sorted(self.config.members)))

    def _remind_waiting(self, now: int) -> None:
        """A fresh voter that waits long says for whom (a new cluster starts once all its
        configured voters run)."""
        if now - self._waiting_since_ms < FRESH_WAIT_REMINDER_MS or self.fresh_voter is None:
            return
        self._waiting_since_ms = now
        decision = self.fresh_voter.decide()
        if isinstance(decision, Wait):
            log.warning(
                "node %s (empty data directory) still does not vote: no answer yet from %s. A new cluster "
                "starts once all its members run; a node that lost its data must be replaced instead",
                self.config.id,
                ", ".join(decision.waiting_for),
            )

    def _check_peer_identity(self, peer: str, theirs: Identity) -> None:
        """A peer authenticated in a handshake: learn what it says, refuse another cluster's
        (HandshakeError). On the loop, from the transport."""
        before = self._peer_identities.get(peer)
        if before is not None and before.incarnation != theirs.incarnation:
            log.warning(
                "node %s: peer %s came back as a new incarnation %s (was %s)%s",
                self.config.id,
                peer,
                theirs.incarnation,
                before.incarnation,
                " with an empty data directory" if theirs.fresh else "",
            )
        self._peer_identities[peer] = theirs
        ours = self.identity_file.cluster_id
        if ours and theirs.cluster_id and theirs.cluster_id != ours:
            self._refuse_other_cluster(peer, theirs.cluster_id)
        if ours and theirs.cluster_id == ours:
            self._seen_own_cluster = True
        if self.fresh_voter is not None:
            self._act_on(self.fresh_voter.heard(peer, theirs))

    def _refuse_other_cluster(self, peer: str, theirs: str) -> None:
        line = mismatch_line(self.config.id, self.identity_file.cluster_id, peer, theirs)
        allowed, unlogged = self._mismatch_log.take(now_ms() / 1000)
        if allowed:
            log.error("%s%s", line, f" ({unlogged} more refusals not logged)" if unlogged else "")
        self._other_clusters[peer] = theirs
        # A node that reaches no member of its own cluster, and a majority of its peers
        # belong to another one, is in the wrong place (e.g. restored beside another
        # cluster's members): it stops rather than wait there for ever.
        others = [m for m in self.config.members if m != self.config.id]
        if not self._seen_own_cluster and others and len(self._other_clusters) > len(others) // 2:
            ids = ", ".join(f"{p} (cluster {c})" for p, c in sorted(self._other_clusters.items()))
            self._refuse(
                f"node {self.config.id} belongs to cluster {self.identity_file.cluster_id}, but its peers {ids} "
                f"belong to another cluster: it will not join them. Check this node's data_dir and peers; "
                f"a data dir restored from a backup makes a new cluster (see `dex-ha restore`)"
            )
        raise HandshakeError(f"peer {peer} is of cluster {theirs}, not ours ({self.identity_file.cluster_id})")

    def _act_on(self, decision: object) -> None:
        """Follow a fresh voter's decision (see identity.FreshVoter)."""
        if isinstance(decision, Found):
            self.identity_file.cluster_id = decision.cluster_id
            self.identity_file.founders = decision.founders
            self.identity_file.save(self.config.durability == "strict")
            self.fresh_voter = None
            how = f"as {decision.adopted_from} says" if decision.adopted_from else "with every configured voter"
            log.info("node %s founds cluster %s (%s): it votes from now on", self.config.id, decision.cluster_id, how)
            self._wake.set()
        elif isinstance(decision, LostData):
            self._refuse(lost_data_line(self.config.id, decision))

    def _refuse(self, line: str) -> None:
        """Stop this node for good: it must not run as configured (IdentityRefused)."""
        if isinstance(self.failure, IdentityRefused):
            return  # said once
        log.critical("%s", line)
        exc = IdentityRefused(line)
        self.failure = exc
        self._stopping = True
        self.view = replace(self.view, role=Role.FOLLOWER, lease_end_ms=None)
        self._fail_all_pending(ProposalDropped("node refused to run"))
        self._wake.set()
        if self._on_fatal is not None:
            self._on_fatal(exc)

    def _same_cluster(self, msg: Message) -> bool:
        """A message from a peer of this cluster (the rest is dropped). A node without an
        id yet (joining, or data from before ids) learns it from a leader's snapshot, or
        from the handshake of a leader that sends it entries."""
        ours = self.identity_file.cluster_id
        theirs = msg.cluster_id if msg.type == MessageType.SNAP else ""
        if not theirs and msg.type in (MessageType.APP, MessageType.SNAP) and self.fresh_voter is None:
            known = self._peer_identities.get(msg.frm)
            theirs = known.cluster_id if known is not None else ""
        if not theirs or theirs == ours:
            return True
        if ours:
            log.error(
                "node %s: dropped a %s of cluster %s from %s (we are cluster %s)",
                self.config.id,
                msg.type.name,
                theirs,
                msg.frm,
                ours,
            )
            return False
        if self.fresh_voter is None:
            self._adopt_cluster_id(theirs, f"from leader {msg.frm}")
        return True

    def _adopt_cluster_id(self, cluster_id: str, source: str) -> None:
        self.identity_file.cluster_id = cluster_id
        self.identity_file.save(self.config.durability == "strict")
        log.info("node %s: cluster id is %s (%s)", self.config.id, cluster_id, source)

    def _propose_cluster_id(self) -> None:
        """A cluster from before ids gets one: its leader proposes it once per term; the
        first such entry applied wins, on every node alike."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.enqueue(CLUSTER_ID_ENTRY_PREFIX + new_id().encode(), reply)

    def _command_of(self, entry: Entry) -> bytes:
        """What the state machine applies of `entry`: a cluster-id entry is the node's own
        (the machine sees a no-op)."""
        if not entry.data.startswith(CLUSTER_ID_ENTRY_PREFIX):
            return entry.data
        if not self.identity_file.cluster_id:
            self._adopt_cluster_id(entry.data[len(CLUSTER_ID_ENTRY_PREFIX) :].decode(), f"entry {entry.index}")
        return b""

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
