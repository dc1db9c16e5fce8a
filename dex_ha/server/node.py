"""The node process: one Raft member with the engine as its state machine, the HTTP API,
and — while it is the active node — the leader services of its term.

The role a node reports (`/v1/cluster`, `/readyz`) is a `NodeRole` (roles.py): active,
draining, candidate, standby or learner.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web

from dex_ha.engine import (
    ApplyResult,
    Command,
    Engine,
    Proposal,
    SetClusterVersion,
    as_command,
    command_since,
    encode_command,
)
from dex_ha.failpoints import Failpoints
from dex_ha.raft.clock import now_ms
from dex_ha.raft.errors import NotLeader
from dex_ha.raft.node import Member, NodeConfig, member_context
from dex_ha.raft.status import MemberStatus, Status
from dex_ha.raft.threaded import RaftThread
from dex_ha.raft.types import ConfChange, ConfChangeType, NodeVersion, Role
from dex_ha.server.admission import Admission, StreamAdmission
from dex_ha.server.app import ApiRunner, build_app
from dex_ha.server.config import ServerConfig
from dex_ha.server.consistency import ConsistencyCheck
from dex_ha.server.data_dir import open_data_dir
from dex_ha.server.errors import MemberNotCaughtUp, NoSpace, NotCommitted, NotServing, StepDownFailed, UnknownMember
from dex_ha.server.http_limits import GuardedSite, HttpLimits
from dex_ha.server.leader import ActiveClock, LeaderTerm
from dex_ha.server.metrics import ServerMetrics
from dex_ha.server.node_credential import NodeCredential
from dex_ha.server.probes import ProbeServer
from dex_ha.server.replica import Replica
from dex_ha.server.retention import Retention
from dex_ha.server.roles import NodeRole
from dex_ha.server.streams import DeltaRelay
from dex_ha.server.tracing import span_sink_from_environment
from dex_ha.server.versions import GATE_OFF_FAILPOINT, ClusterVersionUpgrade, check_command, own_version, version_of

log = logging.getLogger("dex_ha.server")
V = TypeVar("V")  # the value type of a proposed command (Proposal[V])

STATE_DB = "state.db"
# The engine's WAL goes back into its database file this often, on a thread of its own
# (not inside an apply on the Raft thread): a second's writes make a short checkpoint.
ENGINE_CHECKPOINT_EVERY_S = 1.0
# Crash points of the server (armed with DEX_HA_FAILPOINTS, see dex_ha.failpoints):
# the moments of the crash matrix (R18, R19, a call that never ran) that timing alone cannot hit.
SERVER_FAILPOINTS = (
    "server.complete.before-propose",  # a Worker's result arrived; not proposed yet
    "server.complete.after-commit",  # the result is committed; the Worker has no answer yet
    "server.wait.after-commit",  # a wait ended; committed and applied, the leader not told (replica.py)
    "server.handout.after-commit",  # a hand-out is committed; the Worker has not got the task (app.py)
)
HTTP_BACKLOG = 4096


# How far behind the commit index a learner may be, in entries, to be promoted.
PROMOTE_MAX_LAG_ENTRIES = 1_000
# Writes that time out (proposal_timeout_ms) are logged at most this often: while commits
# stall, every write times out, and one line says it.
PROPOSAL_TIMEOUT_LOG_EVERY_S = 10.0


class NodeServer:
    """One node. Its Raft node runs on a thread of its own (RaftThread), so HTTP load never
    delays heartbeats; everything else here runs on the caller's event loop.

    `on_fatal(exc)` is called, on the Raft thread, when the Raft loop dies of an error it
    cannot go on from (a failed fsync): a node process exits then (see process.py), so
    that its supervisor restarts it. Without it the node only stops serving.
    """

    def __init__(self, config: ServerConfig, on_fatal: Callable[[BaseException], None] | None = None) -> None:
        config.check()
        open_data_dir(config.data_dir)  # private (0700), or refused: before anything is written
        # Bind the HTTP port first: with port 0 the URL (our leader_url) is known only now.
        self._http_socket = _bind(config.http_listen)
        self.http_port: int = self._http_socket.getsockname()[1]
        self.probes: ProbeServer | None = None
        if config.probe_listen is not None:
            self.probes = ProbeServer(_bind(config.probe_listen, "probes"), self.liveness, self.readiness)
        self.config = config = _with_bound_port(config, self.http_port)
        self.failpoints = Failpoints()
        self.version = own_version()
        engine = Engine(
            str(config.data_dir / STATE_DB),
            durable=True,
            checkpoint_every_s=ENGINE_CHECKPOINT_EVERY_S,
            state_machine_version=self.version.state_machine,
        )
        self.replica = Replica(engine, self.failpoints)
        self.metrics = ServerMetrics()
        self.admission = Admission(
            config.max_inflight_requests, f"node {config.node_id}", max_body_bytes=config.max_inflight_body_bytes
        )
        self.streams = StreamAdmission(config.max_streams, config.max_streams_per_token, f"node {config.node_id}")
        self.node_credential = NodeCredential(config.cluster_secret)
        self.relay = DeltaRelay()
        self.raft = RaftThread(
            self._raft_config(),
            self.replica,
            on_leader_change=self._on_leader_change,
            on_fsync=self.metrics.fsync_seconds.observe,
            on_fatal=on_fatal,
            on_note=lambda sender, data: self.consistency.on_note(sender, data),
        )
        self.consistency = ConsistencyCheck(
            config.node_id, self.raft, self.metrics, self.propose, config.consistency_check_interval_ms
        )
        self.cluster_version_upgrade = ClusterVersionUpgrade(
            config.node_id, self._versions_now, self.propose, gate_off=self.failpoints.armed(GATE_OFF_FAILPOINT)
        )
        self.replica.on_state_hash = self.consistency.on_own_hash
        self.replica.on_alarms = self.consistency.on_alarms
        self.consistency.on_alarms(engine.consistency_alarms())  # barred from leading before it starts
        self.metrics.add_state_gauges(self.metrics_state)
        self.clock = ActiveClock()  # every command's `at`: see ActiveClock
        self.retention = Retention(
            self.replica.reads,
            self.propose,
            self.clock.now_ms,
            config.retention_days,
            config.retention_check_interval_ms,
        )
        # Traces of turns (tracing.py): None unless the otel extra is installed and an OTLP
        # endpoint is set; then the active node exports a span per turn, step and attempt.
        self.span_sink = span_sink_from_environment(config.node_id)
        self.leader: LeaderTerm | None = None  # the services of the term we lead, if any
        self._leader_tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self.stopping = False
        self._proposal_timeout_logged_at = float("-inf")  # time.monotonic() of the last such line

    def _raft_config(self) -> NodeConfig:
        c = self.config
        secret = c.cluster_secret.encode() if c.cluster_secret else None
        return NodeConfig(
            id=c.node_id,
            data_dir=c.data_dir,
            raft_listen=c.raft_listen,
            members={p.id: Member(p.raft_addr, p.url) for p in c.peers},
            join=c.join,
            durability=c.durability,
            election_timeout_min_ms=c.election_timeout_min_ms,
            election_timeout_max_ms=c.election_timeout_max_ms,
            heartbeat_interval_ms=c.raft_heartbeat_interval_ms,
            lease_drift_margin_ms=c.lease_drift_margin_ms,
            snapshot_every_entries=c.snapshot_every_entries,
            secret=secret,
            version=self.version,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.config.insecure:
            log.warning("node %s runs INSECURE: no API tokens and no cluster secret (--insecure)", self.config.node_id)
        elif not self.config.auth_enabled:
            log.warning("node %s runs WITHOUT authentication (dev mode, no tokens configured)", self.config.node_id)
        self.replica.notify_on(asyncio.get_running_loop())
        await self.raft.start()
        self.consistency.start(self.is_serving)
        self.cluster_version_upgrade.start(self.is_serving)
        self.retention.start(self.is_serving)
        limits = HttpLimits.from_config(self.config)
        self._runner = ApiRunner(build_app(self), access_log=None, handle_signals=False, **limits.handler_args())
        await self._runner.setup()
        # A deep accept queue (HTTP_BACKLOG, see _bind): Workers open a connection per task in
        # flight, and a dropped SYN costs its request a 1 s retransmit. The site's guard accepts
        # from it: it caps the connections (with a reserve for the probes) and closes slow ones.
        await GuardedSite(self._runner, self._http_socket, limits, self.metrics).start()
        if self.probes is not None:
            await self.probes.start()
            log.info("node %s answers probes (/livez, /readyz) on port %d", self.config.node_id, self.probes.port)
        raft = (
            "no Raft listener: a single voter"
            if self.config.raft_listen is None
            else "raft on {}:{}".format(*self.config.raft_listen)
        )
        log.info(
            "node %s serves HTTP on %s:%d (%s, data in %s)",
            self.config.node_id,
            self.config.http_listen[0],
            self.http_port,
            raft,
            self.config.data_dir,
        )

    async def stop(self) -> None:
        self.stopping = True
        if self.probes is not None:
            await self.probes.stop()
        await self._stop_leader_services()
        await self.consistency.stop()
        await self.cluster_version_upgrade.stop()
        await self.retention.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        self._http_socket.close()
        await self.raft.stop()
        self.replica.close()
        if self.span_sink is not None:  # sends the spans still queued (bounded by the export timeout)
            await asyncio.to_thread(self.span_sink.close)

    # ------------------------------------------------------------------ leadership

    def _on_leader_change(self, leader_id: str) -> None:
        """Called by the Raft loop: start our term's services, or stop them."""
        task = asyncio.create_task(self._follow_leadership(), name="leadership")
        self._leader_tasks.add(task)
        task.add_done_callback(self._leader_tasks.discard)

    async def _follow_leadership(self) -> None:
        view = self.raft.view
        if self.leader is not None and (self.leader.term != view.term or not view.is_leader):
            await self._stop_leader_services()
        view = self.raft.view
        term = view.term
        if view.is_leader and self.leader is None and not self.stopping:
            log.info("node %s is leader of term %d: taking over", self.config.node_id, term)
            self.leader = LeaderTerm(
                term,
                self.replica,
                self.propose,
                self.metrics,
                clock=self.clock,
                heartbeat_timeout_ms=self.config.heartbeat_timeout_ms,
                channel_grace_ms=self.config.worker_channel_grace_ms,
                span_sink=self.span_sink,
            )
            self.leader.start()
            self.replica.wake_everyone()  # every waiter checks again under the new role

    async def _stop_leader_services(self) -> None:
        leader, self.leader = self.leader, None
        if leader is not None:
            log.info("node %s stops the leader services of term %d", self.config.node_id, leader.term)
            await leader.stop()
            # Wake the SSE streams so they notice at once that this node no longer serves.
            self.replica.wake_everyone()

    def serving(self) -> LeaderTerm:
        """The services of the term we lead, if this node is the active node; else NotServing
        (NoSpace while its disk is full)."""
        alarm = self.raft.node.disk_full
        if alarm is not None:
            raise NoSpace(
                f"this node cannot write: {alarm.describe()}; it resumes by itself once space "
                "is freed (meanwhile another node can take over)"
            )
        leader, view = self.leader, self.raft.view
        if (
            leader is None
            or not leader.takeover_done
            or not view.is_leader
            or leader.term != view.term
            or not view.lease_valid()
            or self.stopping
        ):
            raise NotServing("this node is not the active node")
        return leader

    def is_serving(self) -> bool:
        """Whether this node is the active node now (the consistency check asks each round)."""
        try:
            self.serving()
            return True
        except NotServing:
            return False

    def is_ready(self) -> bool:
        """`/readyz`: leader, lease valid, takeover done, not draining."""
        try:
            return not self.serving().draining
        except NotServing:
            return False

    def liveness(self) -> dict[str, Any]:
        """`/livez`: the process serves."""
        return {"status": "alive", "node_id": self.config.node_id}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """`/readyz`: (200, …) on the active node; (503, the role and leader_url) elsewhere.

        Reads only what other threads may read (the Raft view and plain attributes), so
        the probe listener (probes.py) answers it from its own thread."""
        node_id = self.config.node_id
        if self.is_ready():
            return 200, {"status": "ready", "node_id": node_id, "role": NodeRole.ACTIVE}
        role = self.role()
        return 503, {
            "error": "not_ready",
            "message": f"node {node_id} is {role}, not the active node",
            "leader_url": self.leader_url(),
            "role": role,
        }

    def role(self) -> NodeRole:
        if self.is_ready():
            return NodeRole.ACTIVE
        if self.leader is not None and self.leader.draining:
            return NodeRole.DRAINING
        view = self.raft.view
        if view.role in (Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER):
            return NodeRole.CANDIDATE
        return NodeRole.STANDBY if view.voter else NodeRole.LEARNER

    def leader_url(self) -> str | None:
        member = self.raft.members().get(self.raft.view.leader_id)
        return member.url or None if member is not None else None

    def redirect_url(self) -> str | None:
        """Where a client this node turns away (503 not_active) should go: the leader's URL,
        or None when this node is the leader itself (it will be active again, or will
        lose the leadership) or knows no leader."""
        return None if self.raft.view.is_leader else self.leader_url()

    # ------------------------------------------------------------------ proposals

    async def propose(self, proposal: Proposal[V], *, timeout_ms: int | None = None) -> ApplyResult[V]:
        """Replicate a command and return the engine's result (raises NotLeader or ProposalDropped):
        `ApplyResult[V]` for a command of `Proposal[V]` (see dex_ha.engine.results).

        With `timeout_ms` (a client's write: proposal_timeout_ms), NotCommitted once it has
        not applied for that long. The entry stays in the log and may still commit; its
        outcome then goes nowhere. Without it (the leader's own services), it waits."""
        cmd = as_command(proposal)
        await self.move_version_for(cmd)
        self.check_version_gate(cmd)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(None if timeout_ms is None else timeout_ms / 1000):
                result = await self.raft.propose(encode_command(cmd))
        except TimeoutError:
            assert timeout_ms is not None  # only the timeout raises it
            self._note_proposal_timeout(timeout_ms)
            raise NotCommitted(timeout_ms) from None
        self.metrics.proposal_seconds.observe(time.perf_counter() - started)
        return result  # the engine answers an entry with its command's value: a V

    async def move_version_for(self, cmd: Command) -> None:
        """Before a command newer than the cluster's state machine: move the cluster now if
        every member runs it (a new cluster's first minute would otherwise answer 503 until
        the upgrade loop's next round). SetClusterVersion is what moving proposes."""
        if isinstance(cmd, SetClusterVersion) or command_since(type(cmd)) <= self.replica.cluster_version:
            return
        await self.cluster_version_upgrade.check_once()

    def check_version_gate(self, cmd: Command) -> None:
        """No command newer than the cluster's state-machine version (versions.py): 503."""
        check_command(cmd, self.replica.cluster_version, self.failpoints.armed(GATE_OFF_FAILPOINT))

    async def _versions_now(self) -> tuple[list[str], Mapping[str, NodeVersion | None], int]:
        """(the members, what each runs, the cluster's state-machine version) for the upgrade."""
        status = await self.raft.status()
        return list(status.members), status.versions, self.replica.cluster_version

    def _note_proposal_timeout(self, timeout_ms: int) -> None:
        self.metrics.proposals_timed_out.inc()
        now = time.monotonic()
        if now - self._proposal_timeout_logged_at < PROPOSAL_TIMEOUT_LOG_EVERY_S:
            return
        self._proposal_timeout_logged_at = now
        log.warning(
            "node %s: a write was not committed within %d ms and was answered 503 unavailable "
            "(dex_raft_proposals_timed_out_total counts them): fewer than a quorum of the voters store new "
            "entries. `dex-ha members` shows which members lag or lost entries; check their logs and disks",
            self.config.node_id,
            timeout_ms,
        )

    # ------------------------------------------------------------------ step down

    async def step_down(self, to: str | None, drain_timeout_ms: int | None) -> dict[str, Any]:
        """Planned step down: stop handing out work, let running attempts finish for up to
        the drain timeout, then hand the leadership to `to` or the most caught-up voter."""
        leader = self.serving()
        if leader.draining:
            raise StepDownFailed("a step down is already running")
        target = to or await self._most_caught_up_voter()
        if target is None:
            raise StepDownFailed("no other voter to hand the leadership to")
        if target == self.config.node_id:  # not "unknown": the operator named the wrong node
            raise StepDownFailed(
                f"{target} is already the active node: name another voter in `to`, or leave it out "
                "to hand over to the most caught-up one"
            )
        members = (await self.raft.status()).members
        if target not in members or not members[target].voter:
            raise UnknownMember(f"{target!r} is not another voting member")
        if target in self.consistency.alarms:
            raise StepDownFailed(f"{target} is under the consistency alarm (its state differs): it may not lead")
        timeout_ms = self.config.drain_timeout_ms if drain_timeout_ms is None else drain_timeout_ms
        left = await self.drain(leader, timeout_ms)
        try:
            await self._transfer(target)
        finally:
            leader.end_drain()
        return {"from": self.config.node_id, "to": self.raft.view.leader_id or target, "running_attempts_left": left}

    async def drain(self, leader: LeaderTerm, timeout_ms: int) -> int:
        """Stop handing out work and wait for this term's running attempts; how many are left."""
        leader.begin_drain()
        log.info(
            "node %s drains: %d attempts running, up to %d ms",
            self.config.node_id,
            leader.running_in_term(),
            timeout_ms,
        )
        deadline = time.monotonic() + timeout_ms / 1000
        while (left := leader.running_in_term()) and time.monotonic() < deadline:
            version = self.replica.changed.version
            await self.replica.changed.wait_past(version, max(0.0, deadline - time.monotonic()))
        if left:
            log.warning("drain timeout: %d attempts still running; they follow their rows on the next leader", left)
        return left

    async def _transfer(self, target: str) -> None:
        log.info("node %s hands the leadership to %s", self.config.node_id, target)
        try:
            await self.raft.transfer_leadership(target)
        except NotLeader as exc:
            raise StepDownFailed(f"lost the leadership before the transfer (leader now {exc.leader_id!r})") from None
        deadline = time.monotonic() + 2 * self.config.election_timeout_max_ms / 1000
        # The view is written by the Raft thread, which signals nothing to this loop: poll it.
        while self.raft.view.is_leader and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self.raft.view.is_leader:
            raise StepDownFailed(f"{target} did not take the leadership in time; this node stays active")

    async def _most_caught_up_voter(self) -> str | None:
        members = (await self.raft.status()).members
        others = [
            (info.match or 0, -(info.last_contact_ms_ago or 0), node_id)
            for node_id, info in members.items()
            if info.voter and node_id != self.config.node_id and node_id not in self.consistency.alarms
        ]
        return max(others)[2] if others else None

    async def shutdown_gracefully(self) -> None:
        """SIGTERM: drain, hand the leadership over (if active), then stop."""
        try:
            leader = self.serving()
        except NotServing:
            leader = None
        if leader is not None and not leader.draining:
            await self.drain(leader, self.config.drain_timeout_ms)
            target = await self._most_caught_up_voter()
            if target is not None:
                try:
                    await self._transfer(target)
                except StepDownFailed as exc:
                    log.warning("graceful stop: %s", exc)
        await self.stop()

    # ------------------------------------------------------------------ membership

    async def add_member(self, node_id: str, raft_addr: tuple[str, int], url: str) -> None:
        await self.raft.change_membership(
            ConfChange(ConfChangeType.ADD_LEARNER, node_id, member_context(raft_addr[0], raft_addr[1], url))
        )

    async def promote_member(self, node_id: str) -> None:
        status = await self.raft.status()
        info = status.members.get(node_id)
        if info is not None and not info.voter:  # promoting a voter is refused by the core (409) below
            match, contact = info.match, info.last_contact_ms_ago
            # Caught up means applied, not only stored (a learner of the release before
            # reports no applied index: its match index then).
            done = match if not match or info.applied is None else min(match, info.applied)
            if (
                not done
                or status.commit - done > PROMOTE_MAX_LAG_ENTRIES
                or contact is None
                or contact > self.config.election_timeout_max_ms
            ):
                raise MemberNotCaughtUp(
                    f"learner {node_id!r} is not caught up (match index {match}, applied index {info.applied}, "
                    f"commit index {status.commit}, last contact {contact} ms ago); promote it once it is"
                )
        await self.raft.change_membership(ConfChange(ConfChangeType.PROMOTE, node_id))

    async def remove_member(self, node_id: str) -> None:
        await self.raft.change_membership(ConfChange(ConfChangeType.REMOVE, node_id))

    # ------------------------------------------------------------------ reads

    async def is_member(self, node_id: str) -> bool:
        return node_id in (await self.raft.status()).members

    async def members(self) -> list[dict[str, Any]]:
        """The members, ordered by id, as /v1/cluster shows them (see _member_view)."""
        return self._member_views(await self.raft.status())

    async def cluster_view(self) -> dict[str, Any]:
        """`/v1/cluster`: this node's view of the cluster."""
        status = await self.raft.status()
        view = self.raft.view
        return {
            "node_id": self.config.node_id,
            "cluster_id": self.raft.cluster_id or None,
            "role": self.role(),
            "term": status.term,
            "leader_id": view.leader_id or None,
            "leader_url": self.leader_url(),
            "commit_index": status.commit,
            "applied_index": self.replica.reads.applied_index(),
            "lease_remaining_ms": view.lease_remaining_ms(),
            "insecure": self.config.insecure or not self.config.auth_enabled,
            "durability": self.config.durability,
            "version": self.version.package,
            "state_machine_version": self.version.state_machine,
            "cluster_state_machine_version": self.replica.cluster_version,
            "alarms": self.alarms(),
            **self.consistency.view(),
            "members": self._member_views(status),
        }

    def alarms(self) -> list[dict[str, Any]]:
        """What needs an operator on this node now (`/v1/cluster`, `dex-ha status`)."""
        alarm = self.raft.node.disk_full
        if alarm is None:
            return []
        return [
            {
                "alarm": "no_space",
                "path": alarm.path,
                "free_bytes": alarm.free_bytes,
                "seconds": max(0, now_ms() - alarm.since_ms) / 1000,
                "message": f"{alarm.describe()}: this node writes nothing until space is freed",
            }
        ]

    def _member_views(self, status: Status) -> list[dict[str, Any]]:
        known = self.raft.members()
        return [
            {
                **self._member_view(node_id, info, known.get(node_id), status.snapshots_sending.get(node_id)),
                **_member_version(status.versions, node_id),
                "consistency_alarm": node_id in self.consistency.alarms,
            }
            for node_id, info in sorted(status.members.items())
        ]

    @staticmethod
    def _member_view(
        node_id: str, info: MemberStatus, member: Member | None, sending: tuple[int, int] | None
    ) -> dict[str, Any]:
        """One member as /v1/cluster shows it. `contacted` is False when this (leader) node never
        heard from it, None when unknown (not the leader); `replication` is the leader's
        progress state (probe, replicate, snapshot; self); `snapshot_bytes` is [sent, total]
        while a snapshot streams to it (a learner catching up). `applied_index` is what the
        member last said it applied; `lost_entries` counts the times in this leader's term
        its answers showed it lacked entries it had acknowledged, and
        `lost_acknowledged_index` is the match index it had before, until it has it again."""
        return {
            "id": node_id,
            "voter": info.voter,
            "url": member.url or None if member is not None else None,
            "raft_addr": "{}:{}".format(*member.raft_addr) if member is not None else None,
            "match_index": info.match,
            "applied_index": info.applied,
            "lost_entries": info.lost_entries,
            "lost_acknowledged_index": info.lost_acknowledged,
            "last_contact_ms_ago": info.last_contact_ms_ago,
            "contacted": info.contacted,
            "replication": info.state,
            "snapshot_bytes": list(sending) if sending is not None else None,
        }

    def metrics_state(self) -> dict[str, Any]:
        view = self.raft.view
        stats = self.replica.reads.stats()
        leader = self.leader
        return {
            "dex_raft_term": view.term,
            "dex_raft_is_leader": int(view.is_leader),
            "dex_active": int(self.is_ready()),
            "dex_raft_commit_index": view.commit,
            "dex_raft_applied_index": self.replica.reads.applied_index(),
            "dex_lease_remaining_seconds": view.lease_remaining_ms() / 1000,
            "dex_raft_leader_contact_gap_max_seconds": self.raft.node.metrics.leader_contact_gap_max_ms / 1000,
            "dex_timers_pending": stats["timers_pending"],
            "dex_engine_wal_bytes": self.replica.engine.wal_bytes(),
            "dex_state_bytes": self.replica.engine.state_bytes(),
            "dex_state_free_bytes": stats["free_bytes"],
            "dex_workers_connected": leader.workers_connected() if leader is not None else 0,
            "dex_worker_channels_open": leader.channels_open() if leader is not None else 0,
            "dex_disk_full": int(self.raft.node.disk_full is not None),
            "dex_raft_leader_changes_total": self.raft.node.metrics.leader_changes,
            "dex_raft_follower_lost_entries_total": self._follower_lost_entries(),
            "dex_raft_slow_turns_total": {
                "long": self.raft.node.turn_watch.slow_turns,
                "late": self.raft.node.turn_watch.late_turns,
            },
            "dex_http_requests_in_flight": self.admission.in_flight,
            "dex_http_request_body_bytes_in_flight": self.admission.body_bytes,
            "dex_http_requests_shed_total": self.admission.shed_total,
            "dex_sse_streams": self.streams.open_total,
            "dex_sse_streams_shed_total": self.streams.shed_total,
            "steps_queued": stats["steps_queued"],
            "sessions": stats["sessions"],
            "sessions_deleted": stats["sessions_deleted"],
            "tool_calls": stats["tool_calls"],
            "followers": self._follower_progress(view.commit),
            "consistency_alarms": self.consistency.alarms,
        }

    def _follower_lost_entries(self) -> dict[str, int]:
        """By member, the times this node, as leader, saw it lose entries it had acknowledged;
        0 for each member it tracks now, so that a first loss shows as an increase."""
        tracked = {p.id: 0 for p in self.raft.node.peer_progress}
        return {**tracked, **self.raft.node.metrics.follower_lost_entries}

    def _follower_progress(self, commit: int) -> dict[str, tuple[int, float]]:
        """On the leader: each other member's (entries behind the commit index, seconds since
        it last answered); empty elsewhere. Feeds the follower-lag and unreachable alerts."""
        now = now_ms()
        return {
            p.id: (max(0, commit - p.match), max(0, now - p.last_contact_ms) / 1000)
            for p in self.raft.node.peer_progress
        }


class CannotListen(OSError):
    """A listen address is taken or not allowed: the node cannot start, and the command
    says so in one line (the address and why) instead of a traceback."""


def _bind(address: tuple[str, int], what: str = "HTTP") -> socket.socket:
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CannotListen(
            exc.errno, f"cannot listen for {what} on {address[0]}:{address[1]}: {exc.strerror}"
        ) from None
    sock.listen(HTTP_BACKLOG)
    sock.setblocking(False)
    return sock


def _with_bound_port(config: ServerConfig, port: int) -> ServerConfig:
    """A config asked for port 0: put the bound port into its URL and its own peer entry."""
    if config.http_listen[1] != 0:
        return config
    host = config.http_listen[0]
    url = f"http://{host}:{port}"
    peers = tuple(replace(p, url=url) if p.id == config.node_id else p for p in config.peers)
    return replace(config, http_listen=(host, port), url=url, peers=peers)


def _member_version(versions: Mapping[str, NodeVersion | None], node_id: str) -> dict[str, Any]:
    """A member's release and state machine as its latest message said; None when this
    node has not heard from it."""
    if node_id not in versions:
        return {"version": None, "state_machine_version": None}
    version = version_of(versions[node_id])
    return {"version": version.package, "state_machine_version": version.state_machine}
