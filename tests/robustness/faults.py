"""The faults of a robustness run, and the schedule that injects them.

A fault is one async function `fault(env, rng) -> str`: it draws every choice it makes
from `rng` first (so the run's seed decides them, however the cluster is timed), then
injects the fault, holds it, undoes it, and returns one line saying what it did. The
schedule runs one fault at a time, with a random pause between two, until its time is up;
`heal` then undoes anything a fault may have left (a stopped process, a cut or slow link,
a dead node or Worker).

Adding a fault kind: write such a function and put it in FAULTS under its kind (and give
it a weight in WEIGHTS). The kinds the product cannot take yet are named in
ADDED_WHEN_AVAILABLE, with what each one needs; they are never injected, and a run's
report lists them as not covered.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dex_ha.cli.cluster import stop_processes
from dex_ha.server.config import ServerConfig
from harness.processes import pid_alive
from harness.proxied_cluster import ProxiedCluster
from tests.crash.harness import WorkerProcess

ELECTION_TIMEOUT_MAX_S = ServerConfig.election_timeout_max_ms / 1000
PAUSE_BETWEEN_FAULTS_S = (0.5, 2.5)
HOLD_S = (0.5, 4.0)  # how long a partition or a delay lasts
DOWN_S = (0.0, 3.0)  # how long a killed node or Worker stays down
LINK_DELAY_S = (0.02, 0.4)
ACTIVE_DEADLINE_S = 20.0  # the leader faults wait this long for an active node to aim at
GRACEFUL_STOP_S = 15.0


@dataclass
class FaultEnv:
    """What the faults act on."""

    cluster: ProxiedCluster
    workers: list[WorkerProcess]
    stopped: set[str] = field(default_factory=set)  # nodes under SIGSTOP right now
    exits: list[str] = field(default_factory=list)  # nodes that had exited by themselves when healed

    async def active(self) -> str | None:
        """The active node, or None when no single node is ready within the deadline (the
        readiness record judges two ready at once; a fault only needs a target)."""
        try:
            return await self.cluster.active_node(deadline_s=ACTIVE_DEADLINE_S)
        except AssertionError:
            return None

    async def target(self, aim_at_active: bool, any_node: str) -> tuple[str, str]:
        """The node a fault hits (the active one when aimed at it and there is one, else
        `any_node`), and how the fault's line names it."""
        active = await self.active() if aim_at_active else None
        return (active, f"{active} (active)") if active else (any_node, any_node)


Fault = Callable[[FaultEnv, random.Random], Awaitable[str]]


async def kill_node(env: FaultEnv, rng: random.Random) -> str:
    """SIGKILL of one node (the active one, or any), started again on its data dir."""
    aim_at_active = rng.random() < 0.5
    any_node = rng.choice(env.cluster.node_ids)
    down_s = rng.uniform(*DOWN_S)
    node, label = await env.target(aim_at_active, any_node)
    env.cluster.kill(node)
    await asyncio.sleep(down_s)
    env.cluster.start_node(node)
    return f"SIGKILL {label}, started again after {down_s:.1f} s"


async def kill_worker(env: FaultEnv, rng: random.Random) -> str:
    """SIGKILL of one Worker process, started again (same agent, same ledger)."""
    index = rng.randrange(len(env.workers))
    down_s = rng.uniform(*DOWN_S)
    env.workers[index].kill()
    await asyncio.sleep(down_s)
    env.workers[index].start()
    return f"SIGKILL worker {index}, started again after {down_s:.1f} s"


async def pause_leader(env: FaultEnv, rng: random.Random) -> str:
    """SIGSTOP of the active node for up to four election timeouts, then SIGCONT."""
    pause_s = rng.uniform(0.1, 4 * ELECTION_TIMEOUT_MAX_S)
    node = await env.active()
    if node is None:
        return "skipped: no single active node to stop"
    pid = env.cluster.pid(node)
    os.kill(pid, signal.SIGSTOP)
    env.stopped.add(node)
    try:
        await asyncio.sleep(pause_s)
    finally:
        os.kill(pid, signal.SIGCONT)
        env.stopped.discard(node)
    return f"SIGSTOP {node} (active) for {pause_s:.1f} s"


async def partition(env: FaultEnv, rng: random.Random) -> str:
    """Cut Raft links through the fault proxy, then heal them: one node cut off both ways
    (its open connections held or reset), or only the links into it, or out of it."""
    mesh = env.cluster.mesh
    shape = rng.choice(["isolate", "inbound", "outbound"])
    any_node = rng.choice(env.cluster.node_ids)
    aim_at_active = rng.random() < 0.5
    close = rng.random() < 0.5
    hold_s = rng.uniform(*HOLD_S)
    node, label = await env.target(aim_at_active, any_node)
    links = {"isolate": mesh.outbound(node) + mesh.inbound(node), "inbound": mesh.inbound(node)}.get(
        shape, mesh.outbound(node)
    )
    await mesh.cut(links, close=close)
    await asyncio.sleep(hold_s)
    await mesh.heal(links)
    return f"cut the {shape} links of {label}{' with resets' if close else ''} for {hold_s:.1f} s"


async def delay(env: FaultEnv, rng: random.Random) -> str:
    """Slow Raft links (every link of one node, or every link), then fast again."""
    mesh = env.cluster.mesh
    every_link = rng.random() < 0.3
    node = rng.choice(env.cluster.node_ids)
    seconds = rng.uniform(*LINK_DELAY_S)
    hold_s = rng.uniform(*HOLD_S)
    links = list(mesh.links) if every_link else mesh.outbound(node) + mesh.inbound(node)
    await mesh.delay(links, seconds)
    await asyncio.sleep(hold_s)
    await mesh.delay(links, 0)
    where = "every link" if every_link else f"the links of {node}"
    return f"delay {seconds * 1000:.0f} ms on {where} for {hold_s:.1f} s"


async def restart_all(env: FaultEnv, rng: random.Random) -> str:
    """Every node stopped (SIGKILL, or SIGTERM: a graceful stop), then started again."""
    graceful = rng.random() < 0.5
    order = rng.sample(env.cluster.node_ids, len(env.cluster.node_ids))
    if graceful:
        await asyncio.to_thread(stop_processes, env.cluster.procs, GRACEFUL_STOP_S)
    else:
        for node in order:
            env.cluster.kill(node)
    for node in order:
        env.cluster.start_node(node)
    return f"restart of every node ({'SIGTERM' if graceful else 'SIGKILL'}), started in the order {' '.join(order)}"


FAULTS: dict[str, Fault] = {
    "kill_node": kill_node,
    "kill_worker": kill_worker,
    "pause_leader": pause_leader,
    "partition": partition,
    "delay": delay,
    "restart_all": restart_all,
}
WEIGHTS = {"kill_node": 3, "kill_worker": 2, "pause_leader": 2, "partition": 3, "delay": 2, "restart_all": 1}

# Fault kinds added when the product and the harness can take them: kind -> what it needs.
ADDED_WHEN_AVAILABLE = {
    "replace_member": "the documented member replacement (`dex-ha members replace <node>`) of a random node",
    "full_disk": "a data directory on a small filesystem that a fault fills, and frees again",
    "clock_step": "the harness helper that steps one node process's wall clock by +-1 h",
}


@dataclass(frozen=True)
class Injected:
    kind: str
    what: str
    started_s: float  # since the schedule began
    ended_s: float


async def inject_until(env: FaultEnv, rng: random.Random, seconds: float) -> list[Injected]:
    """Faults one after the other until `seconds` have passed (a fault under way finishes)."""
    began = time.monotonic()
    injected: list[Injected] = []
    kinds = list(FAULTS)
    weights = [WEIGHTS[kind] for kind in kinds]
    while time.monotonic() - began < seconds:
        await asyncio.sleep(rng.uniform(*PAUSE_BETWEEN_FAULTS_S))
        kind = rng.choices(kinds, weights)[0]
        started = time.monotonic() - began
        what = await FAULTS[kind](env, rng)
        injected.append(Injected(kind, what, started, time.monotonic() - began))
    return injected


async def heal(env: FaultEnv) -> None:
    """Undo whatever a fault left: every link fast and whole, every node running, every Worker."""
    mesh = env.cluster.mesh
    await mesh.heal()
    await mesh.delay(mesh.links, 0)
    for node in list(env.stopped):
        os.kill(env.cluster.pid(node), signal.SIGCONT)
        env.stopped.discard(node)
    for node, proc in list(env.cluster.procs.items()):
        if proc.poll() is not None or not pid_alive(proc.pid):  # every fault starts again what it stops
            env.exits.append(f"{node} (pid {proc.pid}) had exited by itself with code {proc.poll()}")
            env.cluster.start_node(node)
    for worker in env.workers:
        if worker.proc is None or worker.proc.poll() is not None:
            worker.start()
