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
report lists them as not covered. A kind this machine cannot inject (no libfaketime for
`clock_step`, no tmpfs mount for `full_disk`) is put in `FaultEnv.skipped` with the reason,
never drawn, and the report says why.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dex_ha.local_cluster import stop_processes
from dex_ha.server.config import ServerConfig
from harness import wall_clock
from harness.cluster_process import cluster_view
from harness.processes import pid_alive
from harness.proxied_cluster import ProxiedCluster
from harness.small_disk import fill, mount_tmpfs, unmount, unmount_keeping_files
from tests.crash.agents import SOAK_TOOL_S
from tests.crash.columns import WorkerProcess
from tests.crash.ledger import Ledger, Run
from tests.robustness.checker import SINGLE_ATTEMPT_TOOLS

ELECTION_TIMEOUT_MAX_S = ServerConfig.election_timeout_max_ms / 1000
PAUSE_BETWEEN_FAULTS_S = (0.5, 2.5)
HOLD_S = (0.5, 4.0)  # how long a partition or a delay lasts
DOWN_S = (0.0, 3.0)  # how long a killed node or Worker stays down
LINK_DELAY_S = (0.02, 0.4)
ACTIVE_DEADLINE_S = 20.0  # the leader faults wait this long for an active node to aim at
GRACEFUL_STOP_S = 15.0
CLOCK_STEP_S = (60, 3600)  # how far a wall clock is stepped, either way
RUNNING_WRITE_WAIT_S = 10.0  # a clock step meant for a running single-attempt write waits this long for one
LEDGER_POLL_S = 0.02
FULL_DISK_S = (0.5, 6.0)  # how long a disk stays full
# Each node's data directory has a tmpfs of its own: a 60 s run writes under 10 MB there
# (Raft log, state.db and its WAL); the rest is room, and the ballast of full_disk.
MB = 1 << 20
DISK_BYTES = 64 * MB
BALLAST = "robustness-ballast"
REPLACE_WAIT_S = 60.0  # `members replace --wait`: how long the command waits for the new incarnation to catch up
REPLACE_STEP_DEADLINE_S = 30.0  # for the command to say it added the member back and what to start
REPLACE_NEXT_STEP = "Now start its new incarnation"  # the command's line that tells the operator to start it
REPLACE_DONE = "caught up and is a voter again"


@dataclass
class FaultEnv:
    """What the faults act on."""

    cluster: ProxiedCluster
    workers: list[WorkerProcess]
    ledger: Ledger | None = None  # the Workers' tool ledger: what runs now
    clocks: dict[str, wall_clock.SteppableWallClock] = field(default_factory=dict)  # node -> its wall clock
    disks: dict[str, Path] = field(default_factory=dict)  # node -> its data directory, a tmpfs of its own
    skipped: dict[str, str] = field(default_factory=dict)  # kind -> why this machine cannot inject it
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

    async def running_write(self, deadline_s: float) -> str | None:
        """A single-attempt write whose tool runs now (by the ledger), waiting up to
        `deadline_s` for one; None when none ran."""
        ends = time.monotonic() + deadline_s
        while self.ledger is not None and time.monotonic() < ends:
            call = running_single_attempt_write(self.ledger.runs("tool"), time.time())
            if call is not None:
                return call
            await asyncio.sleep(LEDGER_POLL_S)
        return None


def running_single_attempt_write(runs: list[Run], now: float) -> str | None:
    """The call of the latest single-attempt write started and not finished, if it started
    lately enough to be running still (a killed Worker's run never finishes)."""
    finished = {run.call_id for run in runs if run.moment == "finished"}
    running = [
        run.call_id
        for run in runs
        if run.moment == "started"
        and run.name in SINGLE_ATTEMPT_TOOLS
        and run.call_id not in finished
        and now - run.at < SOAK_TOOL_S[1]
    ]
    return running[-1] if running else None


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


async def clock_step(env: FaultEnv, rng: random.Random) -> str:
    """Step one node's wall clock (most often the active node's) by minutes to an hour, either
    way, and back again after a while: two steps, as an NTP step and its correction. Half the
    time it waits for a single-attempt write to be running, so the steps land while one runs
    (its heartbeats and its result then reach a stepped node). Only the wall clock moves:
    a node's monotonic clock stays real (harness/wall_clock.py)."""
    aim_at_active = rng.random() < 0.75
    any_node = rng.choice(env.cluster.node_ids)
    during_write = rng.random() < 0.5
    step_s = rng.choice((-1, 1)) * rng.randint(*CLOCK_STEP_S)
    hold_s = rng.uniform(*HOLD_S)
    node, label = await env.target(aim_at_active, any_node)
    write = await env.running_write(RUNNING_WRITE_WAIT_S) if during_write else None
    clock = env.clocks[node]
    clock.step(step_s)
    try:
        await asyncio.sleep(hold_s)
    finally:
        clock.step(-step_s)
    minutes, seconds = divmod(abs(step_s), 60)
    what = f"stepped the wall clock of {label} by {'+' if step_s > 0 else '-'}{minutes} min {seconds} s"
    ran = f", while the single-attempt write {write} ran" if write else ""
    return f"{what} for {hold_s:.1f} s, then back{ran}"


async def full_disk(env: FaultEnv, rng: random.Random) -> str:
    """Fill one node's disk (its data directory's tmpfs) with a ballast file, hold it full
    for a while, then delete the ballast: the node raises its no_space alarm, steps down if
    it was active, and resumes by itself."""
    aim_at_active = rng.random() < 0.5
    any_node = rng.choice(env.cluster.node_ids)
    hold_s = rng.uniform(*FULL_DISK_S)
    node, label = await env.target(aim_at_active, any_node)
    disk = env.disks[node]
    used = shutil.disk_usage(disk).used
    if used > DISK_BYTES // 2:  # the workload's own data would soon fill the disk, ballast or not
        raise AssertionError(f"the data of {node} takes {used} of {DISK_BYTES} bytes: make DISK_BYTES larger")
    ballast = disk / BALLAST
    filled = await asyncio.to_thread(fill, ballast)
    try:
        await asyncio.sleep(hold_s)
    finally:
        ballast.unlink(missing_ok=True)
    sizes = f"{used / MB:.1f} MB of data, {filled / MB:.1f} MB of ballast"
    return f"filled the disk of {label} ({sizes}) for {hold_s:.1f} s"


async def replace_member(env: FaultEnv, rng: random.Random) -> str:
    """Replace a standby by the documented procedure (docs/operations.md, "Replacing a node"),
    as an operator whose node lost its disk would: SIGKILL it, move its data directory aside
    (kept for the logs), run `dex-ha members replace` (admin token, every node's URL), start
    the new incarnation on the empty data directory with `--join` once the command says so,
    and wait for the command to report it caught up and promoted. Only when all three nodes
    run and the active node replicates to both standbys: while the member is out, the other
    two are the quorum. The new incarnation keeps its config, so its links run through the
    same proxies; its data directory is the same path (a tmpfs mount point stays one)."""
    order = rng.sample(env.cluster.node_ids, len(env.cluster.node_ids))
    active, reason = await unhealthy_reason(env)
    if reason is not None:
        return f"skipped: {reason} (a replacement needs all three nodes up and healthy, to keep a quorum)"
    victim = next(node for node in order if node != active)
    began = time.monotonic()
    env.cluster.kill(victim)
    await asyncio.to_thread(env.cluster.procs[victim].wait, 10)
    aside = env.cluster.dir / f"{victim}.replaced-{len(list(env.cluster.dir.glob(f'{victim}.replaced-*'))) + 1}"
    move_aside(env.cluster.plan.node(victim).data_dir, aside)
    await run_replace(env, victim)
    return (
        f"replaced the standby {victim} (active {active}): SIGKILL, its data moved to {aside.name}, "
        f"`dex-ha members replace`, the new incarnation started with --join, caught up and promoted "
        f"in {time.monotonic() - began:.1f} s"
    )


async def unhealthy_reason(env: FaultEnv) -> tuple[str | None, str | None]:
    """The active node, and why the cluster is not healthy enough to take a member out (None:
    every node runs, and the active node replicates to every voter it heard from lately)."""
    cluster = env.cluster
    down = [node for node, proc in cluster.procs.items() if proc.poll() is not None]
    if down:
        return None, f"{' '.join(down)} not running"
    active = await env.active()
    if active is None:
        return None, "no single active node"
    view = await cluster_view(cluster.urls[active], cluster.tokens["admin"])
    if view is None:
        return active, f"no cluster view from {active}"
    members = {m["id"]: m for m in view.get("members", [])}
    lagging = [node for node in cluster.node_ids if not healthy_voter(members.get(node))]
    return active, (f"{' '.join(lagging)} not a voter replicated to lately" if lagging else None)


def healthy_voter(member: dict | None) -> bool:
    """A voter in the active node's view that it replicates to and heard from lately (or itself)."""
    if member is None or not member.get("voter"):
        return False
    if member.get("replication") == "self":
        return True
    contact_ms = member.get("last_contact_ms_ago")
    recent = contact_ms is not None and contact_ms < ELECTION_TIMEOUT_MAX_S * 1000
    return member.get("replication") == "replicate" and bool(member.get("contacted")) and recent


def move_aside(data_dir: Path, aside: Path) -> None:
    """Every file of `data_dir` moved into `aside`, leaving it empty: the directory itself stays,
    as it may be a mount point (small_disks)."""
    aside.mkdir()
    for entry in data_dir.iterdir():
        shutil.move(entry, aside / entry.name)


async def run_replace(env: FaultEnv, node: str) -> None:
    """`dex-ha members replace <node>` run as an operator runs it: once it says to start the new
    incarnation, start it (empty data dir, --join); then wait for the command to promote it."""
    cluster = env.cluster
    command = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dex_ha.cli", "members", "replace", node, "--wait", f"{REPLACE_WAIT_S:g}",
        f"--token={cluster.tokens['admin']}", *(f"--url={url}" for url in cluster.urls.values()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert command.stdout is not None
    output = ""
    try:
        async with asyncio.timeout(REPLACE_STEP_DEADLINE_S):
            while REPLACE_NEXT_STEP not in output and not command.stdout.at_eof():
                output += (await command.stdout.readline()).decode(errors="replace")
        if REPLACE_NEXT_STEP in output:
            cluster.start_node(node, join=True)
        async with asyncio.timeout(REPLACE_WAIT_S + 30):
            output += (await command.stdout.read()).decode(errors="replace")
            await command.wait()
    except TimeoutError:
        output += f"\n(no end within its deadline: {REPLACE_STEP_DEADLINE_S:g} s to add it back, then {REPLACE_WAIT_S + 30:g} s)"
    finally:
        if command.returncode is None:
            command.kill()
            await command.wait()
    if command.returncode != 0 or REPLACE_DONE not in output:
        raise AssertionError(f"`dex-ha members replace {node}` failed (exit {command.returncode}):\n{output}")


FAULTS: dict[str, Fault] = {
    "kill_node": kill_node,
    "kill_worker": kill_worker,
    "pause_leader": pause_leader,
    "partition": partition,
    "delay": delay,
    "restart_all": restart_all,
    "clock_step": clock_step,
    "full_disk": full_disk,
    "replace_member": replace_member,
}
WEIGHTS = {
    "kill_node": 3,
    "kill_worker": 2,
    "pause_leader": 2,
    "partition": 3,
    "delay": 2,
    "restart_all": 1,
    "clock_step": 2,
    "full_disk": 2,
    "replace_member": 1,
}

# Fault kinds added when the product and the harness can take them: kind -> what it needs.
ADDED_WHEN_AVAILABLE: dict[str, str] = {}


def give_clocks(env: FaultEnv, directory: Path) -> None:
    """Start every node with a wall clock of its own that clock_step can step (libfaketime);
    without the library, clock_step is skipped and the report says why."""
    reason = wall_clock.unavailable_reason()
    if reason is not None:
        env.skipped["clock_step"] = reason
        return
    for node in env.cluster.node_ids:
        env.clocks[node] = wall_clock.SteppableWallClock(directory / f"{node}.clock-offset")
        env.cluster.node_env[node] = env.clocks[node].env()


@contextmanager
def small_disks(env: FaultEnv) -> Iterator[None]:
    """Every node's data directory on a tmpfs of its own (DISK_BYTES), for full_disk; at the
    end (failure or not) unmounted, with the node's files kept in the directory underneath.
    When a tmpfs cannot be mounted, full_disk is skipped and the report says why."""
    for node in env.cluster.node_ids:
        data_dir = env.cluster.plan.node(node).data_dir
        reason = mount_tmpfs(data_dir, DISK_BYTES)
        if reason is not None:
            env.skipped["full_disk"] = reason
            for mounted in env.disks.values():
                unmount(mounted)
            env.disks.clear()
            break
        env.disks[node] = data_dir
    try:
        yield
    finally:
        for data_dir in env.disks.values():
            unmount_keeping_files(data_dir, leave_out=(BALLAST,))


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
    kinds = [kind for kind in FAULTS if kind not in env.skipped]
    weights = [WEIGHTS[kind] for kind in kinds]
    while time.monotonic() - began < seconds:
        await asyncio.sleep(rng.uniform(*PAUSE_BETWEEN_FAULTS_S))
        kind = rng.choices(kinds, weights)[0]
        started = time.monotonic() - began
        what = await FAULTS[kind](env, rng)
        injected.append(Injected(kind, what, started, time.monotonic() - began))
    return injected


async def heal(env: FaultEnv) -> None:
    """Undo whatever a fault left: every link fast and whole, every wall clock true, every
    disk with room, every node running, every Worker."""
    mesh = env.cluster.mesh
    await mesh.heal()
    await mesh.delay(mesh.links, 0)
    for node in list(env.stopped):
        os.kill(env.cluster.pid(node), signal.SIGCONT)
        env.stopped.discard(node)
    for clock in env.clocks.values():
        clock.step(-clock.offset_s)
    for disk in env.disks.values():
        (disk / BALLAST).unlink(missing_ok=True)
    for node, proc in list(env.cluster.procs.items()):
        if proc.poll() is not None or not pid_alive(proc.pid):  # every fault starts again what it stops
            env.exits.append(f"{node} (pid {proc.pid}) had exited by itself with code {proc.poll()}")
            env.cluster.start_node(node)
    for worker in env.workers:
        if worker.proc is None or worker.proc.poll() is not None:
            worker.start()
