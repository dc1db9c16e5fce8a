"""`dex-ha demo`: one scripted agent session through a failover, on a local three-node cluster.

    dex-ha demo [--dir DIR] [--keep]
    python -m dex_ha.cli.demo worker --url URL [--url URL …] --ledger FILE    (the demo's Worker)

The script:

1. Three nodes start on free loopback ports (relaxed durability) and one becomes active.
2. A Worker starts in a CHILD process (so that it is separate from the nodes and the
   client). Its agent has a scripted model and three tools: `lookup_order` (read),
   `reserve_stock` (idempotent_write, slow: it works for a few seconds, heartbeating) and
   `charge_card` (write, needs approval).
3. The client (this process) creates a session and sends a message. The model calls the
   three tools at once; the demo approves `charge_card`.
4. Once the card is charged and `reserve_stock` is running, the demo SIGKILLs the active
   node. A standby takes over; `reserve_stock` attempt 1 fails (its node died), and
   attempt 2 runs on the new active node with the SAME idempotency key.
5. The turn completes. All along, the demo prints its timeline as it happens: each of its
   own actions and each of the session's events (which node handed out each attempt, which
   key it carried) on a line of its own when it occurs. At the end it prints the tool calls'
   outcomes and what the Worker's tools recorded in their ledger (evidence from outside the
   server).
6. Everything is stopped by pid (unless --keep), also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dex_ha.cli.common import format_table
from dex_ha.client import Connection, DexClient, Session, SessionEvent
from dex_ha.local_cluster import (
    ClusterError,
    ClusterPlan,
    check_ports_free,
    free_ports,
    node_env,
    plan_cluster,
    start_node,
    stop_processes,
    wait_for_one_active,
    write_cluster_files,
    write_pids,
)
from dex_ha.worker import (
    Agent,
    ModelResponse,
    ScriptedModel,
    ToolCall,
    ToolContext,
    Worker,
)

AGENT = "demo-shop"
USER_MESSAGE = "Please reserve and pay for order 42."
SLOW_TOOL_S = 3.0  # how long reserve_stock works: long enough to kill a node in the middle
TOOL_HEARTBEAT_S = 0.2  # reserve_stock heartbeats this often (a stale attempt stops quickly)
DRAIN_TIMEOUT_MS = 2_000  # the demo's nodes drain briefly when stopped
WORKER_READY = "dex-ha demo worker: ready"
DEMO_DEADLINE_S = 100.0  # the whole demo, start to finish
STEP_TIMEOUT_S = 30.0  # any one wait inside it
STOP_TIMEOUT_S = 10.0
TERM_WAIT_S = 10.0  # how long an event's line waits to learn which node was active in its term


class DemoFailed(Exception):
    """The demo could not go on; the message says where it stood."""


# ---------------------------------------------------------------- the Worker side (child process)


class Ledger:
    """What the tools really did, one JSON line each: the side effects as seen from outside the server."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, ctx: ToolContext, tool: str, event: str) -> None:
        entry = {
            "at": time.time(),
            "tool": tool,
            "event": event,
            "attempt": ctx.attempt,
            "idempotency_key": ctx.idempotency_key,
            "worker_pid": os.getpid(),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build_agent(ledger: Ledger, slow_tool_s: float = SLOW_TOOL_S) -> Agent:
    """The demo agent: a scripted model that calls three tools at once, then answers."""
    model = ScriptedModel(
        [
            ModelResponse(
                "I'll look up the order, reserve the stock and charge the card.",
                [
                    ToolCall(None, "lookup_order", {"order_id": "42"}),
                    ToolCall(None, "reserve_stock", {"order_id": "42", "seconds": slow_tool_s}),
                    ToolCall(None, "charge_card", {"order_id": "42", "amount_cents": 4200}),
                ],
            ),
            ModelResponse("Order 42 is reserved and paid."),
        ]
    )
    agent = Agent(AGENT, model, description="Reserves and charges orders (dex-ha demo)")

    @agent.tool(effect="read")
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
        """Read an order (safe to repeat)."""
        ledger.record(ctx, "lookup_order", "ran")
        return {"order_id": order_id, "items": 2, "total_cents": 4200}

    @agent.tool(effect="idempotent_write")
    async def reserve_stock(ctx: ToolContext, order_id: str, seconds: float) -> dict[str, Any]:
        """Reserve the order's stock; slow. A repeat carries the same idempotency key, so a
        real stock service would reserve once."""
        ledger.record(ctx, "reserve_stock", "started")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(TOOL_HEARTBEAT_S)
            await ctx.heartbeat()  # raises AttemptCancelled once the attempt is stale
        ledger.record(ctx, "reserve_stock", "finished")
        return {"order_id": order_id, "reservation": f"rsv-{ctx.idempotency_key}"}

    @agent.tool(effect="write", approval=True)
    async def charge_card(ctx: ToolContext, order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge the card (a write: at most one attempt, after a human approved it)."""
        ledger.record(ctx, "charge_card", "ran")
        return {"order_id": order_id, "charged_cents": amount_cents}

    return agent


async def run_worker(urls: Sequence[str], token: str | None, ledger_path: Path) -> None:
    """The child process: register the agent, say ready, run until SIGTERM/SIGINT."""
    agent = build_agent(Ledger(ledger_path))
    # Registered here before "ready" (the Worker registers again, a no-op): the demo must not
    # send the user message before the server knows the tools' policies.
    async with Connection(list(urls), token) as conn:
        await conn.request("PUT", f"/v1/agents/{AGENT}", agent.definition())
    worker = Worker(list(urls), token, agents=[agent], worker_id=f"demo-worker-{os.getpid()}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    running = asyncio.create_task(worker.run())
    print(WORKER_READY, flush=True)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    await worker.stop(drain_timeout_s=1.0)
    stopping.cancel()
    await running


def start_worker(plan: ClusterPlan) -> subprocess.Popen[bytes]:
    """The Worker child process; its token travels in the environment, not on the command line."""
    cmd = [sys.executable, "-m", "dex_ha.cli.demo", "worker", "--ledger", str(plan.cluster_dir / "ledger.jsonl")]
    for url in plan.urls:
        cmd += ["--url", url]
    env = {**node_env(), "DEX_HA_TOKEN": plan.tokens["worker"]}
    with open(plan.cluster_dir / "worker.log", "ab") as log:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


# ---------------------------------------------------------------- the client side (this process)


@dataclass
class DemoProcesses:
    """Every process the demo started, so that they are stopped whatever happens."""

    nodes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker: subprocess.Popen[bytes] | None = None

    def first_exited_node(self) -> str | None:
        """A node process that already exited (while the cluster starts, a reason to give up)."""
        return next((node_id for node_id, p in self.nodes.items() if p.poll() is not None), None)

    def stop_all(self) -> None:
        everything = dict(self.nodes)
        if self.worker is not None:
            everything["worker"] = self.worker
        stop_processes(everything, timeout_s=STOP_TIMEOUT_S)


@dataclass
class Timeline:
    """The demo's timeline, printed as it happens: each line when its action or event occurs,
    in seconds since the demo started."""

    start_wall: float
    out: TextIO
    started: bool = False

    def add(self, text: str, at: float | None = None) -> None:
        """Print an action of the demo's, done at `at` (wall-clock seconds; default now)."""
        self.line(time.time() if at is None else at, f"[demo] {text}")

    def line(self, at: float, text: str) -> None:
        """Print one line of the timeline for something that happened at `at` (wall-clock seconds)."""
        if not self.started:
            print("TIMELINE (seconds since the demo started)", file=self.out, flush=True)
            self.started = True
        print(f"{at - self.start_wall:7.2f}s  {text}", file=self.out, flush=True)


async def _changed_within(changed: asyncio.Event, deadline: float) -> bool:
    """Wait for `changed` until `deadline` (monotonic); False when the deadline passed first."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    changed.clear()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(remaining):
            await changed.wait()
    return True


class TermNodes:
    """Which node was active in which term, as the demo learns it. An event's line may need a
    term the demo is about to learn (the failover's), so it can wait for one, with a deadline."""

    def __init__(self) -> None:
        self.nodes: dict[int, str] = {}
        self._changed = asyncio.Event()

    def record(self, term: int, node_id: str) -> None:
        self.nodes[term] = node_id
        self._changed.set()

    async def node(self, term: int | None, timeout_s: float = TERM_WAIT_S) -> str:
        if term is None:
            return "?"
        deadline = time.monotonic() + timeout_s
        while term not in self.nodes:
            if not await _changed_within(self._changed, deadline):
                return f"the leader of term {term}"
        return self.nodes[term]


class EventLog:
    """Follows the session's committed events (through failovers), hands each to `on_event` as
    it arrives (the timeline), and lets the demo wait for one."""

    def __init__(self, client: DexClient, session_id: str, on_event: Callable[[SessionEvent], Awaitable[None]]) -> None:
        self.events: list[SessionEvent] = []
        self._changed = asyncio.Event()
        self._on_event = on_event
        self._task = asyncio.create_task(self._follow(client, session_id))

    async def _follow(self, client: DexClient, session_id: str) -> None:
        async for event in client.events(session_id):
            if event.id is not None:  # live deltas are not part of the timeline
                await self._on_event(event)
                self.events.append(event)
                self._changed.set()

    async def wait_for(
        self, predicate: Callable[[SessionEvent], bool], what: str, timeout_s: float = STEP_TIMEOUT_S
    ) -> SessionEvent:
        deadline = time.monotonic() + timeout_s
        while True:
            found = next((e for e in self.events if predicate(e)), None)
            if found is not None:
                return found
            if self._task.done():
                self._task.result()  # raises what stopped the stream
                raise DemoFailed("the event stream ended")
            if not await _changed_within(self._changed, deadline):
                raise DemoFailed(f"no {what} within {timeout_s:.0f} s")

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def wait_for_worker(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while WORKER_READY not in (log_path.read_text(errors="replace") if log_path.exists() else ""):
        if proc.poll() is not None:
            raise DemoFailed(f"the Worker exited with {proc.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            raise DemoFailed(f"the Worker was not ready within {timeout_s:.0f} s; see {log_path}")
        await asyncio.sleep(0.05)


async def leader_of(url: str, token: str) -> tuple[str, int]:
    """(leader id, term) as the node at `url` sees it."""
    async with Connection(url, token, give_up_after_s=5.0) as conn:
        view = await conn.request("GET", "/v1/cluster")
    return view["leader_id"], view["term"]


def _is_call_event(event_type: str, call_id: str, **match: Any) -> Callable[[SessionEvent], bool]:
    return lambda e: (
        e.type == event_type and e.data.get("call_id") == call_id and all(e.data.get(k) == v for k, v in match.items())
    )


@dataclass
class DemoOutcome:
    """What the run produced, for the report."""

    session_id: str
    events: list[SessionEvent]
    snapshot: Session
    killed: str


async def start_cluster(cluster_dir: Path, procs: DemoProcesses, timeline: Timeline, out: TextIO) -> ClusterPlan:
    ports = free_ports(9)
    plan = plan_cluster(
        cluster_dir, ports[:3], ports[3:6], ports[6:], durability="relaxed", drain_timeout_ms=DRAIN_TIMEOUT_MS
    )
    check_ports_free(plan)
    write_cluster_files(plan)
    print(f"starting 3 nodes in {plan.cluster_dir} …", file=out, flush=True)
    for node in plan.nodes:
        procs.nodes[node.node_id] = start_node(node)
    write_pids(plan.cluster_dir, {node_id: p.pid for node_id, p in procs.nodes.items()})
    active = await wait_for_one_active(plan.nodes, STEP_TIMEOUT_S, procs.first_exited_node)
    timeline.add(f"cluster up: {', '.join(n.node_id for n in plan.nodes)} on loopback; {active} is the active node")
    return plan


async def run_session(plan: ClusterPlan, procs: DemoProcesses, timeline: Timeline) -> DemoOutcome:
    """Steps 3–5 of the script; returns what the report needs."""
    terms = TermNodes()
    leader, term = await leader_of(plan.urls[0], plan.tokens["admin"])
    terms.record(term, leader)
    async with DexClient(plan.urls, token=plan.tokens["client"]) as client:
        session_id = (await client.create_session(AGENT)).session_id
        log = EventLog(client, session_id, Narrator(client, session_id, timeline, terms))
        try:
            await client.send_message(session_id, USER_MESSAGE)
            asked = await log.wait_for(lambda e: e.type == "approval_requested", "approval request")
            approved_at = time.time()
            await client.approve(session_id, asked.data["call_id"], reason="approved by the demo")
            timeline.add(f"the demo approves {asked.data.get('name')}", at=approved_at)
            killed = await kill_during_slow_tool(plan, procs, log, timeline, terms)
            snapshot = await client.wait_until_idle(session_id, timeout_s=STEP_TIMEOUT_S)
            await log.wait_for(lambda e: e.type.startswith("turn_") and e.type != "turn_started", "end of the turn")
        finally:
            await log.close()
        return DemoOutcome(session_id, list(log.events), snapshot, killed)


async def kill_during_slow_tool(
    plan: ClusterPlan, procs: DemoProcesses, log: EventLog, timeline: Timeline, terms: TermNodes
) -> str:
    """SIGKILL the active node once the card is charged and reserve_stock runs; wait for the next one."""
    response = await log.wait_for(
        lambda e: e.type == "assistant_message" and bool(e.data.get("tool_calls")), "model response with tool calls"
    )
    call_ids = {c["name"]: c["id"] for c in response.data["tool_calls"]}
    await log.wait_for(_is_call_event("tool_call_finished", call_ids["charge_card"]), "charge_card result")
    await log.wait_for(_is_call_event("attempt_started", call_ids["reserve_stock"], attempt=1), "reserve_stock attempt")
    victim, _ = await leader_of(plan.urls[0], plan.tokens["admin"])
    proc = procs.nodes[victim]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STOP_TIMEOUT_S)
    killed_at = time.monotonic()
    timeline.add(f"node {victim} (the active node, pid {proc.pid}) killed with SIGKILL while reserve_stock runs")
    survivors = [n for n in plan.nodes if n.node_id != victim]
    active = await wait_for_one_active(survivors, STEP_TIMEOUT_S)
    took_ms = (time.monotonic() - killed_at) * 1000
    leader, term = await leader_of(plan.node(active).url, plan.tokens["admin"])
    terms.record(term, leader)
    timeline.add(f"{active} is the active node {took_ms:.0f} ms after the kill (term {term})")
    return victim


# ---------------------------------------------------------------- the timeline and the report


@dataclass
class RenderContext:
    """What the event lines need that events alone do not say (read from the session's snapshot)."""

    names: dict[str, str] = field(default_factory=dict)  # call_id -> tool name, and step_id -> tool name
    effects: dict[str, str] = field(default_factory=dict)  # call_id -> effect (and approval)
    keys: dict[tuple[str, int], str | None] = field(default_factory=dict)  # (step_id, attempt) -> idempotency key

    @classmethod
    def of(cls, snapshot: Session) -> RenderContext:
        calls = snapshot.tool_calls
        keys = {
            (step.step_id, a.number): a.idempotency_key for call in calls for step in call.steps for a in step.attempts
        }
        effects = {
            c.call_id: f"{c.effect}" + (", needs approval" if (c.policy or {}).get("approval") else "") for c in calls
        }
        names = {c.call_id: c.name for c in calls}
        names.update({step.step_id: c.name for c in calls for step in c.steps})
        return cls(names, effects, keys)

    def key(self, step_id: str | None, attempt: int | None) -> str | None:
        """The idempotency key of an attempt, None when unknown."""
        if step_id is None or attempt is None:
            return None
        return self.keys.get((step_id, attempt))


class Narrator:
    """Prints each committed event's timeline line as it arrives. The tool names, effects and
    idempotency keys come from the session's snapshot, read again when an event needs them."""

    def __init__(self, client: DexClient, session_id: str, timeline: Timeline, terms: TermNodes) -> None:
        self.client, self.session_id, self.timeline, self.terms = client, session_id, timeline, terms
        self.ctx = RenderContext()

    async def __call__(self, event: SessionEvent) -> None:
        if event.data.get("call_id") or (event.type == "assistant_message" and event.data.get("tool_calls")):
            self.ctx = RenderContext.of(await self.client.get_session(self.session_id))
        node = await self.terms.node(event.data.get("term")) if event.type == "attempt_started" else "?"
        text = describe(event, self.ctx, node)
        if text is not None and event.at is not None:
            self.timeline.line(event.at / 1000, text)


def describe(event: SessionEvent, ctx: RenderContext, node: str = "?") -> str | None:
    """One timeline line for a committed event, or None for the ones left out (queueing, timers
    fired). `node`: the node that was active in the event's term (for attempts)."""
    d = event.data
    name = ctx.names.get(d.get("call_id") or d.get("step_id") or "", d.get("name") or d.get("kind") or "?")
    if event.type == "session_created":
        return f"session created (agent {d.get('agent')})"
    if event.type == "message_received":
        return f"user message sent: {d.get('text')!r}"
    if event.type == "turn_started":
        return f"turn {d.get('number')} started"
    if event.type == "attempt_started":
        return _describe_attempt(event, ctx, name, node)
    if event.type == "assistant_message":
        calls = d.get("tool_calls") or []
        if not calls:
            return f"model answered: {d.get('content')!r}"
        listed = ", ".join(f"{c['name']} ({ctx.effects.get(c['id'], '?')})" for c in calls)
        return f"model calls {len(calls)} tools in parallel: {listed}"
    if event.type == "approval_requested":
        return f"approval requested for {name}"
    if event.type == "approval_decided":
        return f"approval {'given' if d.get('approved') else 'denied'} for {name}"
    if event.type == "attempt_failed":
        return f"{name} attempt {d.get('attempt')} failed ({d.get('attempt_progress')}): {d.get('error')}"
    if event.type == "timer_set" and d.get("purpose") == "backoff" and event.at is not None:
        return f"{name} queued again after a {d.get('due_at', event.at) - event.at} ms backoff"
    if event.type == "tool_call_finished":
        return f"tool {name} finished: {d.get('status')}"
    if event.type.startswith("turn_"):
        return f"turn {event.type.removeprefix('turn_')}" + (f": {d['error']}" if d.get("error") else "")
    return None


def _describe_attempt(event: SessionEvent, ctx: RenderContext, name: str, node: str) -> str:
    d = event.data
    attempt = event.attempt
    if d.get("kind") == "RunModel":
        return f"model call started on {node} (attempt {attempt})"
    key = ctx.key(event.step_id, attempt)
    if attempt and attempt > 1:
        earlier = ctx.key(event.step_id, attempt - 1)
        same = "same" if key == earlier else "NEW"
        return f"tool {name} re-run on {node}: attempt {attempt}, {same} idempotency key {key}"
    return f"tool {name} started on {node} (attempt {attempt}, idempotency key {key})"


def ledger_lines(entries: list[dict[str, Any]]) -> list[str]:
    """What the tools recorded in the Worker process, per tool."""
    runs = Counter((e["tool"], e["event"]) for e in entries)
    lines = []
    for tool in dict.fromkeys(e["tool"] for e in entries):
        keys = sorted({e["idempotency_key"] for e in entries if e["tool"] == tool})
        counts = ", ".join(f"{event} {n}x" for (name, event), n in runs.items() if name == tool)
        lines.append(f"  {tool}: {counts}; idempotency keys: {', '.join(map(str, keys))}")
    return lines


def report(outcome: DemoOutcome, ledger: list[dict[str, Any]]) -> str:
    """The summary after the timeline: the tool calls' outcomes and the Worker's ledger."""
    calls = [
        [c.name, f"{c.effect}", c.status, str(sum(len(step.attempts) for step in c.steps))]
        for c in outcome.snapshot.tool_calls
    ]
    return "\n".join(
        [
            "",
            f"session {outcome.session_id}: {outcome.snapshot.status}; tool calls:",
            format_table(["tool", "effect", "outcome", "attempts"], calls),
            "",
            "what the Worker's tools recorded (outside the server):",
            *ledger_lines(ledger),
        ]
    )


# ---------------------------------------------------------------- entry points


async def _demo(cluster_dir: Path, procs: DemoProcesses, out: TextIO, keep: bool) -> None:
    timeline = Timeline(start_wall=time.time(), out=out)
    async with asyncio.timeout(DEMO_DEADLINE_S):
        plan = await start_cluster(cluster_dir, procs, timeline, out)
        procs.worker = start_worker(plan)
        await wait_for_worker(procs.worker, plan.cluster_dir / "worker.log")
        timeline.add(f"Worker started in a child process (pid {procs.worker.pid})")
        outcome = await run_session(plan, procs, timeline)
        if keep:  # leave a whole cluster behind: the killed node rejoins as a standby
            procs.nodes[outcome.killed] = start_node(plan.node(outcome.killed))
            write_pids(plan.cluster_dir, {node_id: p.pid for node_id, p in procs.nodes.items()})
            timeline.add(
                f"node {outcome.killed} restarted (pid {procs.nodes[outcome.killed].pid}); it rejoins as a standby"
            )
    print(report(outcome, Ledger.read(plan.cluster_dir / "ledger.jsonl")), file=out, flush=True)
    if outcome.snapshot.status != "idle" or not any(e.type == "turn_completed" for e in outcome.events):
        raise DemoFailed("the turn did not complete")


def run_demo(cluster_dir: Path | None = None, keep: bool = False, out: TextIO = sys.stdout) -> int:
    """Run the demo; 0 when the turn completed through the failover. Stops what it started
    (unless `keep`), also on Ctrl-C, SIGTERM or an error."""
    own_dir = cluster_dir is None
    if cluster_dir is None:
        cluster_dir = Path(tempfile.mkdtemp(prefix="dex-ha-demo-"))
    elif cluster_dir.exists() and any(cluster_dir.iterdir()):
        print(f"dex-ha demo: {cluster_dir} is not empty; give a new or empty --dir", file=sys.stderr)
        return 2
    cluster_dir = cluster_dir.resolve()
    procs = DemoProcesses()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    ok = False
    try:
        asyncio.run(_demo(cluster_dir, procs, out, keep))
        ok = True
    except (DemoFailed, ClusterError) as exc:
        print(f"dex-ha demo: {exc}\n  logs: {cluster_dir}", file=sys.stderr)
    except TimeoutError:
        print(f"dex-ha demo: did not finish within {DEMO_DEADLINE_S:.0f} s\n  logs: {cluster_dir}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"dex-ha demo: interrupted; stopping everything\n  logs: {cluster_dir}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _finish(procs, cluster_dir, keep=keep and ok, remove_dir=own_dir and ok and not keep, out=out)
    return 0 if ok else 1


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _finish(procs: DemoProcesses, cluster_dir: Path, *, keep: bool, remove_dir: bool, out: TextIO) -> None:
    if keep:
        worker = f"kill {procs.worker.pid}    # the Worker" if procs.worker is not None else ""
        print(
            f"\nthe cluster and the Worker keep running (--keep). Stop them with:\n"
            f"  dex-ha cluster down --dir {cluster_dir}\n  {worker}",
            file=out,
        )
        return
    with _signals_ignored():  # a second Ctrl-C must not cut the cleanup short (it has deadlines)
        procs.stop_all()
    print(
        f"stopped every process the demo started (pids "
        f"{', '.join(str(p.pid) for p in [*procs.nodes.values(), procs.worker] if p is not None)})",
        file=out,
    )
    (cluster_dir / "pids").unlink(missing_ok=True)
    if remove_dir:
        shutil.rmtree(cluster_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m dex_ha.cli.demo worker …` (the demo's child) or `python -m dex_ha.cli.demo` (= dex-ha demo)."""
    parser = argparse.ArgumentParser(prog="python -m dex_ha.cli.demo")
    sub = parser.add_subparsers(dest="role")
    worker = sub.add_parser("worker", help="the demo's Worker process")
    worker.add_argument("--url", action="append", required=True, help="a node URL (repeat)")
    worker.add_argument("--ledger", required=True, help="where the tools record what they did")
    args = parser.parse_args(argv)
    if args.role != "worker":
        return run_demo()
    import logging

    from dex_ha.server.process import use_uvloop  # the server's choice of loop: uvloop when installed

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    use_uvloop()
    asyncio.run(run_worker(args.url, os.environ.get("DEX_HA_TOKEN") or None, Path(args.ledger)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
