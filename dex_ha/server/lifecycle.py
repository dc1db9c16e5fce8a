"""A node's life: start its parts, stop them, and hand the active role over.

- `start` / `stop`: the Raft thread, the background checks, the HTTP app and the probes,
  in that order, and back;
- `step_down`: a planned step down (`POST /v1/cluster/step-down`): drain, then transfer
  the leadership to another voter;
- `shutdown_gracefully`: SIGTERM, the same drain and handover, then stop;
- `drain`: stop handing out work and wait for the running attempts, up to a timeout.

Each takes the node (`NodeServer`, node.py); its `start`, `stop`, `shutdown_gracefully` and
`step_down` call these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from dex_ha.raft.errors import NotLeader
from dex_ha.server.app import ApiRunner, build_app
from dex_ha.server.errors import NotServing, StepDownFailed, UnknownMember
from dex_ha.server.http_limits import GuardedSite, HttpLimits
from dex_ha.server.leader import LeaderTerm

if TYPE_CHECKING:  # the node calls these; they name it for the type checker only
    from dex_ha.server.node import NodeServer

log = logging.getLogger("dex_ha.server")


async def start(node: NodeServer) -> None:
    config = node.config
    if config.insecure:
        log.warning("node %s runs INSECURE: no API tokens and no cluster secret (--insecure)", config.node_id)
    elif not config.auth_enabled:
        log.warning("node %s runs WITHOUT authentication (dev mode, no tokens configured)", config.node_id)
    node.replica.notify_on(asyncio.get_running_loop())
    await node.raft.start()
    node.consistency.start(node.is_serving)
    node.cluster_version_upgrade.start(node.is_serving)
    node.retention.start(node.is_serving)
    limits = HttpLimits.from_config(config)
    node.runner = ApiRunner(build_app(node), access_log=None, handle_signals=False, **limits.handler_args())
    await node.runner.setup()
    # A deep accept queue (HTTP_BACKLOG, see _bind): Workers open a connection per task in
    # flight, and a dropped SYN costs its request a 1 s retransmit. The site's guard accepts
    # from it: it caps the connections (with a reserve for the probes) and closes slow ones.
    await GuardedSite(node.runner, node.http_socket, limits, node.metrics).start()
    if node.probes is not None:
        await node.probes.start()
        log.info("node %s answers probes (/livez, /readyz) on port %d", config.node_id, node.probes.port)
    raft = (
        "no Raft listener: a single voter"
        if config.raft_listen is None
        else "raft on {}:{}".format(*config.raft_listen)
    )
    log.info(
        "node %s serves HTTP on %s:%d (%s, data in %s)",
        config.node_id,
        config.http_listen[0],
        node.http_port,
        raft,
        config.data_dir,
    )


async def stop(node: NodeServer) -> None:
    node.stopping = True
    if node.probes is not None:
        await node.probes.stop()
    await node.stop_leader_services()
    await node.consistency.stop()
    await node.cluster_version_upgrade.stop()
    await node.retention.stop()
    if node.runner is not None:
        await node.runner.cleanup()
    node.http_socket.close()
    await node.raft.stop()
    node.replica.close()
    if node.span_sink is not None:  # sends the spans still queued (bounded by the export timeout)
        await asyncio.to_thread(node.span_sink.close)


async def step_down(node: NodeServer, to: str | None, drain_timeout_ms: int | None) -> dict[str, Any]:
    """Planned step down: stop handing out work, let running attempts finish for up to
    the drain timeout, then hand the leadership to `to` or the most caught-up voter."""
    leader = node.serving()
    if leader.draining:
        raise StepDownFailed("a step down is already running")
    target = to or await node.membership.most_caught_up_voter()
    if target is None:
        raise StepDownFailed("no other voter to hand the leadership to")
    if target == node.config.node_id:  # not "unknown": the operator named the wrong node
        raise StepDownFailed(
            f"{target} is already the active node: name another voter in `to`, or leave it out "
            "to hand over to the most caught-up one"
        )
    members = (await node.raft.status()).members
    if target not in members or not members[target].voter:
        raise UnknownMember(f"{target!r} is not another voting member")
    if target in node.consistency.alarms:
        raise StepDownFailed(f"{target} is under the consistency alarm (its state differs): it may not lead")
    timeout_ms = node.config.drain_timeout_ms if drain_timeout_ms is None else drain_timeout_ms
    left = await drain(node, leader, timeout_ms)
    try:
        await _transfer(node, target)
    finally:
        leader.end_drain()
    return {"from": node.config.node_id, "to": node.raft.view.leader_id or target, "running_attempts_left": left}


async def drain(node: NodeServer, leader: LeaderTerm, timeout_ms: int) -> int:
    """Stop handing out work and wait for this term's running attempts; how many are left."""
    leader.begin_drain()
    log.info(
        "node %s drains: %d attempts running, up to %d ms",
        node.config.node_id,
        leader.running_in_term(),
        timeout_ms,
    )
    deadline = time.monotonic() + timeout_ms / 1000
    while (left := leader.running_in_term()) and time.monotonic() < deadline:
        version = node.replica.changed.version
        await node.replica.changed.wait_past(version, max(0.0, deadline - time.monotonic()))
    if left:
        log.warning("drain timeout: %d attempts still running; they follow their rows on the next leader", left)
    return left


async def _transfer(node: NodeServer, target: str) -> None:
    log.info("node %s hands the leadership to %s", node.config.node_id, target)
    try:
        await node.raft.transfer_leadership(target)
    except NotLeader as exc:
        raise StepDownFailed(f"lost the leadership before the transfer (leader now {exc.leader_id!r})") from None
    deadline = time.monotonic() + 2 * node.config.election_timeout_max_ms / 1000
    # The view is written by the Raft thread, which signals nothing to this loop: poll it.
    while node.raft.view.is_leader and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    if node.raft.view.is_leader:
        raise StepDownFailed(f"{target} did not take the leadership in time; this node stays active")


async def shutdown_gracefully(node: NodeServer) -> None:
    """SIGTERM: drain, hand the leadership over (if active), then stop."""
    try:
        leader: LeaderTerm | None = node.serving()
    except NotServing:
        leader = None
    if leader is not None and not leader.draining:
        await drain(node, leader, node.config.drain_timeout_ms)
        target = await node.membership.most_caught_up_voter()
        if target is not None:
            try:
                await _transfer(node, target)
            except StepDownFailed as exc:
                log.warning("graceful stop: %s", exc)
    await stop(node)
