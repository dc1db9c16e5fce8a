"""The node process: one Raft member with the engine as its state machine, the HTTP API,
and — while it is the active node — the leader services of its term.

The role a node reports (`/v1/cluster`, `/readyz`) is a `NodeRole` (roles.py): active,
draining, candidate, standby or learner.

Around this core: lifecycle.py starts and stops the node's parts and hands the active role
over (step down, drain, SIGTERM); readiness.py is what `/readyz` and `/livez` answer;
membership.py changes and shows the members.
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
from dex_ha.raft.node import Member, NodeConfig
from dex_ha.raft.threaded import RaftThread
from dex_ha.raft.types import NodeVersion
from dex_ha.server import lifecycle
from dex_ha.server.admission import Admission, StreamAdmission
from dex_ha.server.config import ServerConfig
from dex_ha.server.consistency import ConsistencyCheck
from dex_ha.server.data_dir import open_data_dir
from dex_ha.server.errors import NoSpace, NotCommitted, NotServing
from dex_ha.server.leader import ActiveClock, LeaderTerm
from dex_ha.server.membership import Membership
from dex_ha.server.metrics import ServerMetrics
from dex_ha.server.node_credential import NodeCredential
from dex_ha.server.probes import ProbeServer
from dex_ha.server.readiness import Readiness, liveness, node_role
from dex_ha.server.replica import Replica
from dex_ha.server.retention import Retention
from dex_ha.server.roles import NodeRole
from dex_ha.server.streams import DeltaRelay
from dex_ha.server.tracing import span_sink_from_environment
from dex_ha.server.versions import GATE_OFF_FAILPOINT, ClusterVersionUpgrade, check_command, own_version

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
        self.http_socket = _bind(config.http_listen)
        self.http_port: int = self.http_socket.getsockname()[1]
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
        self.membership = Membership(self.raft, config, self.consistency)
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
        self.runner: web.AppRunner | None = None  # the HTTP app's, once started
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

    # ------------------------------------------------------------------ lifecycle (lifecycle.py)

    async def start(self) -> None:
        await lifecycle.start(self)

    async def stop(self) -> None:
        await lifecycle.stop(self)

    async def shutdown_gracefully(self) -> None:
        """SIGTERM: drain, hand the leadership over (if active), then stop."""
        await lifecycle.shutdown_gracefully(self)

    async def step_down(self, to: str | None, drain_timeout_ms: int | None) -> dict[str, Any]:
        """Planned step down: drain, then hand the leadership to `to` or the most caught-up voter."""
        return await lifecycle.step_down(self, to, drain_timeout_ms)

    # ------------------------------------------------------------------ leadership

    def _on_leader_change(self, leader_id: str) -> None:
        """Called by the Raft loop: start our term's services, or stop them."""
        task = asyncio.create_task(self._follow_leadership(), name="leadership")
        self._leader_tasks.add(task)
        task.add_done_callback(self._leader_tasks.discard)

    async def _follow_leadership(self) -> None:
        view = self.raft.view
        if self.leader is not None and (self.leader.term != view.term or not view.is_leader):
            await self.stop_leader_services()
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

    async def stop_leader_services(self) -> None:
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
        return liveness(self.config.node_id)

    def readiness(self) -> Readiness:
        """`/readyz` (readiness.py): ready on the active node; elsewhere the role and leader_url.

        Reads only what other threads may read (the Raft view and plain attributes), so
        the probe listener (probes.py) answers it from its own thread."""
        role = self.role()
        return Readiness(self.config.node_id, role, None if role is NodeRole.ACTIVE else self.leader_url())

    def role(self) -> NodeRole:
        view = self.raft.view
        draining = self.leader is not None and self.leader.draining
        return node_role(ready=self.is_ready(), draining=draining, raft_role=view.role, voter=view.voter)

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

    # ------------------------------------------------------------------ views

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
            "members": self.membership.views(status),
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
