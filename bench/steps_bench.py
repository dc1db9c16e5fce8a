"""Durable steps benchmark: steps per second and per-step latency, one node and three.

A step is one task step handed out to the Worker, run by it, and its result committed.
The workload is N concurrent sessions ("lanes"); each turn of a session is three steps:
RunModel (the scripted model calls one no-op `read` tool, not inline), CallTool, RunModel
(the model answers). Each lane creates a session, queues `--turns-per-session` user
messages at once (they run one turn after the other without a client round trip) and,
when the Worker has completed all of that session's steps, starts the next session (so
histories stay short and every turn costs the same). The lanes' first sessions have 1 to
`--turns-per-session` turns (see first_session_turns), so that the lanes do not all start
their sessions at the same moments.

Both deployments use `strict` durability (fsync), started with the command line:
- dev:     `dex-ha dev` (one node);
- cluster: `dex-ha cluster up --nodes 3` (three nodes on loopback), stopped with
           `dex-ha cluster down`.

The Worker is the Python Worker SDK in its own process (bench/steps_worker.py), with
max_concurrency = the number of lanes, so server and Worker CPU are separate processes.
For each concurrency the bench reports, over a window after a warm-up. The warm-up lasts
`--warmup-s` and at least until every lane has queued its first session's messages: all lanes
start at once, so the row begins with a burst of session requests (c × (1 + turns) before
the first sessions were staggered: at c=1024 about 30 s of them on 2 cores), and a window
inside that burst measures the burst, not the steady state (it made throughput look as if it
fell past c=256).
- durable steps per second, counted from the Worker's accepted results (and, as a
  cross-check over the whole row, warm-up included, the steps the Worker completed against
  the delta of the server's `dex_attempts_started_total` summed over the nodes, both read
  while nothing runs: /metrics is rendered at most once a second, so a scrape mid-window
  would be up to a second stale);
- per-step latency p50/p99: the time between consecutive step completions of one session
  (each gap is one hand-out + run + commit; at concurrency 1 nothing else waits);
- CPU milliseconds per step of the server node processes (utime+stime from /proc), of the
  Worker process, and the load of everything else on the machine (other people's work).

With `--rounds N` every concurrency is measured N times, the order reversed every other
round, and the summary takes the median per concurrency: rows of the same code differ by
±15% within minutes on a small shared machine, so one row per concurrency cannot tell a
plateau from a fall. The summary's past-peak ratio is the lowest median above the peak's
concurrency over the peak (the goal: throughput stays within 10% of its peak as concurrency
rises).

It prints a table and writes JSON (default bench/results/steps_bench.json).

    python bench/steps_bench.py [--duration-s 20] [--concurrency 1,16,64,128] [--only dev|cluster]
    python bench/steps_bench.py --only dev --concurrency 256,1024 --rounds 3 --duration-s 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.common import (  # noqa: E402
    CLK_TCK,
    cpu_pressure_us,
    cpu_probe_ms,
    cpu_seconds,
    fmt,
    fmt_pct,
    positive_ints,
)
from dex_ha.client import DexClient  # noqa: E402
from dex_ha.local_cluster import read_pids as read_cluster_pids  # noqa: E402  (the `pids` file format)
from dex_ha.server.metrics import RENDER_INTERVAL_S  # noqa: E402
from harness.cluster_process import port_args  # noqa: E402  (the one layout of cluster up's ports)
from harness.ports import free_port_range  # noqa: E402  (the one free-port helper)
from harness.processes import pid_alive  # noqa: E402  (the one pid-alive check of tests and benches)
from harness.readiness import wait_ready  # noqa: E402  (the one readiness wait of tests and benches)

WORKER_SCRIPT = REPO_ROOT / "bench" / "steps_worker.py"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "steps_bench.json"
STEPS_PER_TURN = 3  # RunModel, CallTool, RunModel

TARGETS = {
    "dev_steps_per_second": ">= 1500",
    "dev_p50_ms_c1": "<= 2.0",
    "dev_past_peak_ratio": ">= 0.90",
    "cluster_steps_per_second": ">= 800",
    "cluster_p50_ms_c1": "<= 3.0",
    "cluster_past_peak_ratio": ">= 0.90",
}

# Deadlines (seconds) for the processes this bench starts and stops.
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 15.0  # a node drains running attempts on SIGTERM (none are left: see stop_lanes)
WORKER_READY_DEADLINE_S = 30.0
WORKER_STOP_DEADLINE_S = 15.0
SESSION_STALL_S = 60.0  # a session none of whose steps came for this long is abandoned (and counted)
WARM_UP_MAX_S = 60.0  # the longest warm-up (see warm_up)
LANES_FINISH_DEADLINE_S = 60.0  # after a row's window, sessions still running then are cut (counted apart)
WARM_UP_CHECK_S = 0.25  # how often the warm-up looks whether every lane is under way


# ---------------------------------------------------------------- processes and CPU


class ProcessRegistry:
    """Every pid this bench started (directly or through `cluster up`), so that the last
    line of defence can kill what is still alive, and the JSON can list them."""

    def __init__(self) -> None:
        self.pids: list[int] = []

    def add(self, pid: int) -> None:
        self.pids.append(pid)

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every recorded pid that still runs; the ones it had to kill."""
        killed = []
        for pid in self.pids:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        return killed


def _proc_stat_cpu() -> list[int]:
    with open("/proc/stat") as f:
        return ([int(v) for v in f.readline().split()[1:]] + [0] * 8)[:8]


def machine_busy_seconds() -> float:
    """CPU seconds all cores ran a process of this machine since boot (/proc/stat)."""
    user, nice, system, _idle, _iowait, irq, softirq, _steal = _proc_stat_cpu()
    return (user + nice + system + irq + softirq) / CLK_TCK


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave to other guests while this machine wanted to run
    (/proc/stat "steal"): on a shared VM, cores this run did not get."""
    return _proc_stat_cpu()[7] / CLK_TCK


def wait_gone(pids: list[int], deadline_s: float) -> list[int]:
    """Poll until every pid is gone or the deadline passes; the ones still running."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


# ---------------------------------------------------------------- deployments


@dataclass
class Deployment:
    """Running server nodes: where they answer, their pids, and how to stop them."""

    name: str  # "dev" | "cluster"
    urls: list[str]
    node_pids: list[int]
    worker_token: str | None
    client_token: str | None
    stop: Callable[[], list[int]]  # stops every node; returns the pids it had to SIGKILL
    command: str = ""


def cli_command(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "dex_ha.cli", *args]


async def start_dev(
    root: Path, registry: ProcessRegistry, python: str = sys.executable, env: dict[str, str] | None = None
) -> Deployment:
    """`dex-ha dev` (strict durability) on a free port; its URL from its start line. `python`
    and `env` (default: this interpreter and this environment) let a bench run the node in
    another environment, e.g. a venv without an optional extra (bench/tracing_cost_bench.py);
    it runs this checkout's code either way (`-m` from the repository root)."""
    log_path = root / "dev.log"
    command = cli_command("dev", "--data-dir", str(root / "dev-data"), "--port", "0", python=python)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    registry.add(proc.pid)

    def stop() -> list[int]:
        return stop_child(proc, STOP_DEADLINE_S)

    try:
        url = await read_dev_url(log_path, proc, START_DEADLINE_S)
        await wait_ready([url], START_DEADLINE_S)
    except BaseException:
        stop()
        raise
    return Deployment("dev", [url], [proc.pid], None, None, stop, shlex.join(command))


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a log, for an error message: the bench deletes its temp dir on exit, so a
    path alone would point at nothing."""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f" (its log {path} cannot be read: {exc})"
    return "; the last lines of its log:\n" + "\n".join(f"  {line}" for line in tail)


async def read_dev_url(log_path: Path, proc: subprocess.Popen[bytes], deadline_s: float) -> str:
    """The URL `dex-ha dev` prints when it serves ("dex-ha dev: serving http://...")."""
    pattern = re.compile(r"dex-ha dev: serving (http://\S+)")
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        match = pattern.search(log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"dex-ha dev exited with {proc.returncode}{log_tail(log_path)}")
        await asyncio.sleep(0.05)
    raise TimeoutError(f"dex-ha dev printed no URL within {deadline_s:.0f} s{log_tail(log_path)}")


def stop_child(proc: subprocess.Popen[bytes], deadline_s: float) -> list[int]:
    """SIGTERM (graceful stop: the node drains), a second SIGTERM (stop now) after the
    deadline, SIGKILL as the last resort; reaps it. The pids it had to SIGKILL."""
    for signum, wait_s in ((signal.SIGTERM, deadline_s), (signal.SIGTERM, 5.0)):
        if proc.poll() is not None:
            return []
        proc.send_signal(signum)
        try:
            proc.wait(timeout=wait_s)
            return []
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    proc.wait(timeout=10)
    return [proc.pid]


async def start_cluster(root: Path, registry: ProcessRegistry, nodes: int = 3) -> Deployment:
    """`dex-ha cluster up --nodes 3` (strict durability) on free ports; its pids and tokens
    from the files it writes. Retries with other ports if one was taken meanwhile."""
    last_error = ""
    for attempt in range(1, 4):
        cluster_dir = root / f"cluster-{attempt}"  # a failed `up` leaves a layout that a retry may not reuse
        # One run of free ports cut in three, so the three ranges cannot overlap.
        http_base = free_port_range(3 * nodes)
        command = cli_command(
            "cluster", "up", "--nodes", str(nodes), "--dir", str(cluster_dir), *port_args(http_base, nodes)
        )
        try:
            done = await asyncio.to_thread(
                subprocess.run,
                command,
                cwd=REPO_ROOT,
                check=False,
                capture_output=True,
                text=True,
                timeout=START_DEADLINE_S + 30,
                stdin=subprocess.DEVNULL,
            )
        finally:  # also on a timeout or Ctrl-C: whatever it started is ours to stop
            pids = list(read_cluster_pids(cluster_dir).values()) if (cluster_dir / "pids").exists() else []
            for pid in pids:
                registry.add(pid)
        if done.returncode == 0:
            break
        last_error = (done.stderr or done.stdout).strip()
        stop_cluster(cluster_dir, pids)
    else:
        raise RuntimeError(f"dex-ha cluster up failed 3 times; the last time: {last_error}")
    urls = [f"http://127.0.0.1:{http_base + i}" for i in range(nodes)]
    tokens = read_tokens(cluster_dir)

    def stop() -> list[int]:
        return stop_cluster(cluster_dir, pids)

    try:
        if len(pids) != nodes:
            raise RuntimeError(f"dex-ha cluster up recorded {len(pids)} pids, expected {nodes}")
        await wait_ready(urls, START_DEADLINE_S)
    except BaseException:
        stop()
        raise
    return Deployment("cluster", urls, pids, tokens.get("worker"), tokens.get("client"), stop, shlex.join(command))


def read_tokens(cluster_dir: Path) -> dict[str, str]:
    """Role → token from the DIR/tokens.env that `cluster up` writes for its users
    (lines `export DEX_HA_WORKER_TOKEN=...`)."""
    tokens: dict[str, str] = {}
    try:
        lines = (cluster_dir / "tokens.env").read_text().splitlines()
    except FileNotFoundError:
        return tokens
    for line in lines:
        match = re.fullmatch(r"(?:export\s+)?DEX_HA_(CLIENT|WORKER|ADMIN)_TOKEN=['\"]?([^'\"\s]+)['\"]?", line.strip())
        if match:
            tokens[match.group(1).lower()] = match.group(2)
    return tokens


def stop_cluster(cluster_dir: Path, pids: list[int]) -> list[int]:
    """`dex-ha cluster down --dir DIR`, then make sure: SIGKILL what still runs."""
    try:
        subprocess.run(
            cli_command("cluster", "down", "--dir", str(cluster_dir)),
            cwd=REPO_ROOT,
            check=False,
            capture_output=True,
            timeout=STOP_DEADLINE_S + 20,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pass
    stragglers = wait_gone(pids, 5.0)
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_gone(stragglers, 5.0)
    return stragglers


# ---------------------------------------------------------------- the Worker process


@dataclass(frozen=True, slots=True)
class Completion:
    """One result the server accepted for a step of a session (a line of the Worker)."""

    session_id: str
    kind: str
    at_ns: int  # CLOCK_MONOTONIC, the same clock as time.monotonic_ns() here
    ok: bool


class CompletionTracker:
    """Collects the Worker's completions and wakes the lane whose session is done."""

    def __init__(self) -> None:
        self.completions: list[Completion] = []
        self.ready = asyncio.Event()
        self.ended: int | None = None  # the Worker's own count, from its `end` line
        self._remaining: dict[str, int] = {}
        self._done: dict[str, asyncio.Event] = {}

    def expect(self, session_id: str, steps: int) -> asyncio.Event:
        """An event set once `steps` completions of `session_id` have arrived."""
        self._remaining[session_id] = steps
        self._done[session_id] = event = asyncio.Event()
        return event

    async def wait_until_done_or_stalled(self, session_id: str, done: asyncio.Event, stall_s: float) -> bool:
        """True once every step of the session came; False when none came for `stall_s`.
        (A whole session may take minutes at high concurrency: only a stall is a failure.)"""
        while True:
            left = self._remaining.get(session_id)
            try:
                await asyncio.wait_for(done.wait(), stall_s)
                return True
            except TimeoutError:
                if done.is_set():
                    return True
                if self._remaining.get(session_id) == left:
                    return False

    def forget(self, session_id: str) -> None:
        self._remaining.pop(session_id, None)
        self._done.pop(session_id, None)

    def on_line(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        if parts[0] == "c" and len(parts) == 5:
            done = Completion(parts[1], parts[2], int(parts[3]), parts[4] == "1")
            self.completions.append(done)
            if done.ok:
                self._count(done.session_id)
        elif parts[0] == "ready":
            self.ready.set()
        elif parts[0] == "end" and len(parts) == 2:
            self.ended = int(parts[1])

    def _count(self, session_id: str) -> None:
        left = self._remaining.get(session_id)
        if left is None:
            return
        self._remaining[session_id] = left - 1
        if left <= 1:
            self._done.pop(session_id).set()
            del self._remaining[session_id]

    async def read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.on_line(line.decode(errors="replace"))


class WorkerProcess:
    """bench/steps_worker.py in a child process, its stdout read by a CompletionTracker."""

    def __init__(
        self, proc: asyncio.subprocess.Process, tracker: CompletionTracker, reader: asyncio.Task[None], log_path: Path
    ) -> None:
        self.proc = proc
        self.tracker = tracker
        self.reader = reader
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(
        cls,
        deployment: Deployment,
        agent: str,
        concurrency: int,
        turns_per_session: int,
        log_path: Path,
        registry: ProcessRegistry,
        transport: str | None = None,
        hang: bool = False,
    ) -> WorkerProcess:
        command = [
            sys.executable,
            str(WORKER_SCRIPT),
            "--agent",
            agent,
            "--max-concurrency",
            str(concurrency),
            "--turns-per-session",
            str(turns_per_session),
        ]
        for url in deployment.urls:
            command += ["--url", url]
        if hang:
            command.append("--hang")
        env = dict(os.environ)
        if transport is not None:  # how the SDK reaches the server: the channel or HTTP
            env["DEX_HA_WORKER_TRANSPORT"] = transport
        if deployment.worker_token:
            env["DEX_HA_WORKER_TOKEN"] = deployment.worker_token
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *command,
                cwd=REPO_ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
            )
        registry.add(proc.pid)
        tracker = CompletionTracker()
        assert proc.stdout is not None  # stdout=PIPE
        worker = cls(proc, tracker, asyncio.create_task(tracker.read(proc.stdout)), log_path)
        try:
            await worker.wait_ready()
        except BaseException:
            await worker.stop()
            raise
        return worker

    async def wait_ready(self) -> None:
        ready = asyncio.create_task(self.tracker.ready.wait())
        try:
            await asyncio.wait(
                {ready, self.reader}, timeout=WORKER_READY_DEADLINE_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if not self.tracker.ready.is_set():
            raise RuntimeError(f"the Worker process did not get ready{log_tail(self.log_path)}")

    async def stop(self) -> bool:
        """SIGTERM (the Worker drains and says `end`), then SIGKILL after the deadline.
        True when it stopped by itself."""
        graceful = True
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), WORKER_STOP_DEADLINE_S)
            except TimeoutError:
                graceful = False
                self.proc.kill()
                await asyncio.wait_for(self.proc.wait(), 10)
        try:
            await asyncio.wait_for(self.reader, 5)
        except (TimeoutError, asyncio.CancelledError):
            pass
        return graceful and self.proc.returncode == 0


# ---------------------------------------------------------------- one measurement


@dataclass
class Sample:
    """Counters read at one moment of a measurement."""

    at_ns: int
    node_cpu_s: list[float]
    worker_cpu_s: float
    bench_cpu_s: float
    machine_busy_s: float
    steal_s: float
    cpu_pressure_us: int | None


@dataclass
class Row:
    """The result of one measurement (one deployment, one concurrency)."""

    deployment: str
    concurrency: int
    round: int  # 0, 1, ... (--rounds)
    duration_s: float
    steps: int
    steps_per_second: float
    p50_ms: float | None
    p99_ms: float | None
    gaps: int
    p50_ms_by_kind: dict[str, float | None]
    warmup_s: float  # how long the warm-up lasted (see `warm_up`)
    row_steps: int  # steps the Worker completed over the whole row, warm-up included
    row_attempts_started: float | None  # the server's hand-outs over the same row
    failed_results: int
    sessions_started: int
    sessions_abandoned: int
    sessions_cut_at_end: int
    server_cpu_ms_per_step: float | None
    server_cpu_ms_per_step_by_node: list[float]
    server_busiest_node_cores: float  # CPU seconds per second of the busiest node (1.0 = a full core)
    worker_cpu_ms_per_step: float | None
    worker_cores: float
    bench_cpu_ms_per_step: float | None
    other_load_cores: float
    steal_cores: float  # cores the hypervisor gave to other guests while this machine wanted them
    cpu_wait_fraction: float | None  # PSI: share of the window in which some task waited for a CPU
    load_average: list[float]  # 1, 5, 15 min at the end of the window
    cpu_probe_ms: list[float]  # bench.common.cpu_probe_ms before and after the row: the machine's speed
    worker_pid: int
    worker_stopped_cleanly: bool
    worker_completed_total: int | None
    transport: str = "auto"  # how the Worker reached the server: channel (the SDK's default) or http


async def scrape_attempts_started(http: aiohttp.ClientSession, urls: list[str]) -> float | None:
    """Sum of `dex_attempts_started_total` over every node (only the active one counts
    hand-outs; the sum stays right across a change of leader). None if a node is silent."""
    total = 0.0
    for url in urls:
        try:
            async with http.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        for line in text.splitlines():
            if line.startswith("dex_attempts_started_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def quiet_attempts_started(http: aiohttp.ClientSession, urls: list[str]) -> float | None:
    """`dex_attempts_started_total` summed over the nodes, read while no step runs. /metrics
    serves text rendered up to RENDER_INTERVAL_S ago, so the read comes that long after the
    caller stopped the load: the text was then rendered after the last hand-out."""
    await asyncio.sleep(RENDER_INTERVAL_S + 0.05)
    return await scrape_attempts_started(http, urls)


async def take_sample(http: aiohttp.ClientSession, deployment: Deployment, worker: WorkerProcess) -> Sample:
    at_ns, times = time.monotonic_ns(), os.times()
    sample = Sample(
        at_ns=at_ns,
        node_cpu_s=[cpu_seconds(p) for p in deployment.node_pids],
        worker_cpu_s=cpu_seconds(worker.pid),
        bench_cpu_s=times.user + times.system,
        machine_busy_s=machine_busy_seconds(),
        steal_s=steal_seconds(),
        cpu_pressure_us=cpu_pressure_us(),
    )
    return sample


@dataclass
class LaneStats:
    started: int = 0
    lanes_under_way: int = 0  # lanes that have queued the messages of their first session
    abandoned: int = 0  # stalled: no step for SESSION_STALL_S
    cut_at_end: int = 0  # still making progress when the row stopped waiting (LANES_FINISH_DEADLINE_S)
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set: start no new session


def first_session_turns(lane: int, turns: int) -> int:
    """Turns of lane `lane`'s first session: 1, 2, ..., `turns`, 1, 2, ... over the lanes.

    Its later sessions have `turns` each. With equal first sessions every lane would start
    its next session at the same moment, and keep doing so: the row would come in waves of
    c × (1 + turns) requests, one session's length apart (at c=1024 about 35 s, as long as a
    window), and whether one wave or two fell inside the window swung a row by 10–30%.
    Staggered, the lanes' sessions end at different moments, at every concurrency."""
    return 1 + lane % turns


async def run_lane(
    client: DexClient, agent: str, tracker: CompletionTracker, turns: int, stats: LaneStats, first_turns: int
) -> None:
    """One concurrent session slot: a session with `first_turns` queued messages, then ones
    with `turns`, until `stats.stop`; the session it is in then runs to its end (see
    stop_lanes)."""
    first_session = True
    while not stats.stop.is_set():
        session_turns = first_turns if first_session else turns
        session_id = f"bench-{uuid.uuid4().hex[:16]}"
        done = tracker.expect(session_id, session_turns * STEPS_PER_TURN)
        await client.create_session(agent, session_id)
        # Queue every message now: the server starts each turn as the previous one ends.
        # One after another, not all at once: a lane is one client, so c lanes keep at most
        # c requests in flight. (Sent at once, c=512 meant 5120 requests against the node's
        # bound of 512: most were shed, and their 1 s Retry-After, not the server, set the
        # pace of the row.)
        for i in range(session_turns):
            await client.send_message(session_id, f"turn {i}", message_id=f"{session_id}-m{i}")
        if first_session:
            stats.lanes_under_way += 1
            first_session = False
        stats.started += 1
        if not await tracker.wait_until_done_or_stalled(session_id, done, SESSION_STALL_S):
            stats.abandoned += 1  # a step failed for good or stalled; the report shows it
            tracker.forget(session_id)


async def stop_lanes(lanes: list[asyncio.Task[None]], stats: LaneStats) -> None:
    """Let every lane finish its session, so that nothing is queued or running when the
    Worker stops. (Cancelling a turn would start the next queued one; and a step queued
    after the Worker stopped could be handed to its last long poll, which the server still
    holds, and then wait for its heartbeat timeout, as would a node's graceful stop.)"""
    stats.stop.set()
    if lanes:
        _, late = await asyncio.wait(lanes, timeout=LANES_FINISH_DEADLINE_S)
        stats.cut_at_end += len(late)
    await cancel_all(lanes)


async def measure(
    deployment: Deployment,
    concurrency: int,
    args: argparse.Namespace,
    root: Path,
    registry: ProcessRegistry,
    round_index: int = 0,
    window_start: asyncio.Barrier | None = None,
    transport: str | None = None,
) -> Row:
    """One row: a Worker and `concurrency` lanes, a warm-up, the window, every lane's session
    run to its end. With `window_start`, the window begins once every party of the barrier
    has warmed up (bench/plateau_bench.py measures two rows at the same time)."""
    agent = f"bench-{deployment.name}-c{concurrency}-{uuid.uuid4().hex[:6]}"  # leftovers of other rows stay away
    probes = [cpu_probe_ms()]
    worker = await WorkerProcess.start(
        deployment, agent, concurrency, args.turns_per_session, root / f"worker-{agent}.log", registry, transport
    )
    lanes: list[asyncio.Task[None]] = []
    stats = LaneStats()
    try:
        async with DexClient(deployment.urls, deployment.client_token) as client, aiohttp.ClientSession() as http:
            started_before = await quiet_attempts_started(http, deployment.urls)
            lanes = [
                asyncio.create_task(
                    run_lane(
                        client,
                        agent,
                        worker.tracker,
                        args.turns_per_session,
                        stats,
                        first_session_turns(lane, args.turns_per_session),
                    )
                )
                for lane in range(concurrency)
            ]
            warmup_s = await warm_up(worker, lanes, stats, args.warmup_s)
            if window_start is not None:
                await window_start.wait()
            first = await take_sample(http, deployment, worker)
            await watch(worker, lanes, args.duration_s)
            last = await take_sample(http, deployment, worker)
            load_average = [round(v, 2) for v in os.getloadavg()]
            await stop_lanes(lanes, stats)
            started_after = await quiet_attempts_started(http, deployment.urls)
    finally:
        await cancel_all(lanes)
        stopped_cleanly = await worker.stop()
    probes.append(cpu_probe_ms())
    started = None if started_before is None or started_after is None else started_after - started_before
    row = summarize(
        deployment,
        concurrency,
        worker,
        first,
        last,
        stats,
        stopped_cleanly,
        load_average,
        started,
        warmup_s,
        round_index,
        probes,
    )
    row.transport = transport or "auto"
    return row


async def warm_up(worker: WorkerProcess, lanes: list[asyncio.Task[None]], stats: LaneStats, min_s: float) -> float:
    """Wait `min_s`, then until every lane has queued its first session's messages (at most
    WARM_UP_MAX_S in all); return how long it took. See the module docstring for why."""
    started = time.monotonic()
    await watch(worker, lanes, min_s)
    while stats.lanes_under_way < len(lanes) and time.monotonic() - started < WARM_UP_MAX_S:
        await watch(worker, lanes, WARM_UP_CHECK_S)
    return round(time.monotonic() - started, 3)


async def watch(worker: WorkerProcess, lanes: list[asyncio.Task[None]], seconds: float) -> None:
    """Wait `seconds`, but fail at once if the Worker process or a lane died."""
    watched = {worker.reader, *lanes}
    done, _ = await asyncio.wait(watched, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is worker.reader:
            raise RuntimeError(
                f"the Worker process ended early (exit {worker.proc.returncode}){log_tail(worker.log_path)}"
            )
        task.result()  # a lane that raised: its error (a lane never ends on its own)


async def cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def summarize(
    deployment: Deployment,
    concurrency: int,
    worker: WorkerProcess,
    first: Sample,
    last: Sample,
    stats: LaneStats,
    stopped_cleanly: bool,
    load_average: list[float],
    row_attempts_started: float | None,
    warmup_s: float,
    round_index: int,
    cpu_probes_ms: list[float],
) -> Row:
    window_s = (last.at_ns - first.at_ns) / 1e9
    in_window = [c for c in worker.tracker.completions if first.at_ns <= c.at_ns < last.at_ns]
    steps = sum(1 for c in in_window if c.ok)
    gaps_by_kind = completion_gaps(worker.tracker.completions, first.at_ns, last.at_ns)
    all_gaps = sorted(g for gaps in gaps_by_kind.values() for g in gaps)
    node_cpu = [b - a for a, b in zip(first.node_cpu_s, last.node_cpu_s)]
    worker_cpu = last.worker_cpu_s - first.worker_cpu_s
    bench_cpu = last.bench_cpu_s - first.bench_cpu_s
    other_cpu = max(0.0, last.machine_busy_s - first.machine_busy_s - sum(node_cpu) - worker_cpu - bench_cpu)

    def per_step_ms(cpu_s: float) -> float | None:
        return round(cpu_s / steps * 1000, 3) if steps else None

    def cores(cpu_s: float) -> float:
        return round(cpu_s / window_s, 2)

    cpu_wait = None
    if last.cpu_pressure_us is not None and first.cpu_pressure_us is not None:
        cpu_wait = round((last.cpu_pressure_us - first.cpu_pressure_us) / 1e6 / window_s, 3)
    return Row(
        deployment=deployment.name,
        concurrency=concurrency,
        round=round_index,
        duration_s=round(window_s, 3),
        steps=steps,
        steps_per_second=round(steps / window_s, 1),
        p50_ms=percentile_ms(all_gaps, 50),
        p99_ms=percentile_ms(all_gaps, 99),
        gaps=len(all_gaps),
        p50_ms_by_kind={kind: percentile_ms(sorted(g), 50) for kind, g in gaps_by_kind.items() if g},
        warmup_s=warmup_s,
        row_steps=sum(1 for c in worker.tracker.completions if c.ok),
        row_attempts_started=row_attempts_started,
        failed_results=sum(1 for c in in_window if not c.ok),
        sessions_started=stats.started,
        sessions_abandoned=stats.abandoned,
        sessions_cut_at_end=stats.cut_at_end,
        server_cpu_ms_per_step=per_step_ms(sum(node_cpu)),
        server_cpu_ms_per_step_by_node=[per_step_ms(c) or 0.0 for c in node_cpu],
        server_busiest_node_cores=cores(max(node_cpu)),
        worker_cpu_ms_per_step=per_step_ms(worker_cpu),
        worker_cores=cores(worker_cpu),
        bench_cpu_ms_per_step=per_step_ms(bench_cpu),
        other_load_cores=cores(other_cpu),
        steal_cores=cores(last.steal_s - first.steal_s),
        cpu_wait_fraction=cpu_wait,
        load_average=load_average,
        cpu_probe_ms=cpu_probes_ms,
        worker_pid=worker.pid,
        worker_stopped_cleanly=stopped_cleanly,
        worker_completed_total=worker.tracker.ended,
    )


def completion_gaps(completions: list[Completion], start_ns: int, end_ns: int) -> dict[str, list[float]]:
    """Seconds between consecutive accepted results of the same session, for the results
    inside [start, end), keyed by the kind of the later step. The first step of a session
    has no gap (it was queued by a user message, not by a previous result)."""
    last_by_session: dict[str, int] = {}
    gaps: dict[str, list[float]] = {}
    for c in sorted((c for c in completions if c.ok), key=lambda c: c.at_ns):
        previous = last_by_session.get(c.session_id)
        last_by_session[c.session_id] = c.at_ns
        if previous is not None and start_ns <= c.at_ns < end_ns:
            gaps.setdefault(c.kind, []).append((c.at_ns - previous) / 1e9)
    return gaps


def percentile_ms(sorted_values: list[float], pct: float) -> float | None:
    """The nearest-rank percentile of seconds, in ms (None for no values)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return round(sorted_values[min(rank, len(sorted_values)) - 1] * 1000, 3)


# ---------------------------------------------------------------- the run


async def bench_deployment(
    name: str, args: argparse.Namespace, root: Path, registry: ProcessRegistry
) -> dict[str, Any]:
    start = start_dev if name == "dev" else start_cluster
    print(f"[{name}] starting ...", flush=True)
    deployment = await start(root, registry)
    rows: list[Row] = []
    leftovers: list[int] = []
    try:
        for round_index in range(args.rounds):
            for concurrency in round_order(args.concurrency, round_index):
                for transport in args.transports:  # interleaved: the same minute of the machine for both
                    print(
                        f"[{name}] round {round_index + 1}/{args.rounds}, concurrency {concurrency}, {transport}: "
                        f"warm-up of at least {args.warmup_s:g} s (until every lane is under way) + "
                        f"{args.duration_s:g} s ...",
                        flush=True,
                    )
                    row = await measure(deployment, concurrency, args, root, registry, round_index, None, transport)
                    rows.append(row)
                    print(
                        f"[{name}] concurrency {concurrency}, {transport}: {row.steps_per_second:.0f} steps/s, "
                        f"p50 {fmt(row.p50_ms, '.2f')} ms, server {fmt(row.server_cpu_ms_per_step, '.3f')} ms/step",
                        flush=True,
                    )
    finally:
        leftovers = await asyncio.to_thread(deployment.stop)
    return {
        "command": deployment.command,
        "urls": deployment.urls,
        "node_pids": deployment.node_pids,
        "killed_after_deadline": leftovers,
        "rows": [asdict(r) for r in rows],
    }


# How long the Worker-kill timing waits for each of its moments.
KILL_TIMING_DEADLINE_S = 30.0
# The defaults the timing runs with: the node's worker_channel_grace_ms, and the RunModel
# row's first retry backoff (dex_ha/engine/kinds.py), which the grace covers (a lost
# Worker's backoff counts from its channel's close); printed next to the figure.
CHANNEL_GRACE_MS = 1_000
RUN_MODEL_FIRST_BACKOFF_MS = 1_000


async def worker_kill_timing(root: Path, registry: ProcessRegistry) -> dict[str, Any]:
    """`dex-ha dev` and two Worker processes on the channel whose model never answers; the
    one holding the step is SIGKILLed, and the time from the kill to the start of the step's
    next attempt (on the other Worker, read from the session every 5 ms) is measured."""
    root.mkdir(parents=True, exist_ok=True)
    deployment = await start_dev(root, registry)
    agent = f"bench-kill-{uuid.uuid4().hex[:6]}"
    workers: list[WorkerProcess] = []
    try:
        for n in range(2):
            workers.append(
                await WorkerProcess.start(
                    deployment, agent, 1, 1, root / f"kill-worker-{n}.log", registry, "channel", True
                )
            )
        async with DexClient(deployment.urls, deployment.client_token) as client:
            sid = (await client.create_session(agent)).session_id
            await client.send_message(sid, "hello")
            first = await wait_for_attempt(client, sid, 1)
            holder = next(w for w in workers if f"-{w.pid}-" in first["worker_id"])
            killed_at = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)
            second = await wait_for_attempt(client, sid, 2)
            took_ms = (time.monotonic() - killed_at) * 1000
        return {
            "kill_to_next_attempt_ms": round(took_ms, 1),
            "next_attempt_on_the_other_worker": second["worker_id"] != first["worker_id"],
            "grace_ms": CHANNEL_GRACE_MS,
            "backoff_ms": RUN_MODEL_FIRST_BACKOFF_MS,
        }
    finally:
        for worker in workers:
            await worker.stop()
        await asyncio.to_thread(deployment.stop)


async def wait_for_attempt(client: DexClient, session_id: str, number: int) -> dict[str, str]:
    """The Worker of running attempt `number` of the session's step, once it started."""
    deadline = time.monotonic() + KILL_TIMING_DEADLINE_S
    while time.monotonic() < deadline:
        turn = (await client.get_session(session_id)).current_turn
        for step in turn.steps if turn is not None else ():
            for attempt in step.attempts:
                if attempt.number == number and attempt.status == "running":
                    return {"worker_id": attempt.worker_id or ""}
        await asyncio.sleep(0.005)
    raise RuntimeError(f"attempt {number} of session {session_id} did not start within {KILL_TIMING_DEADLINE_S} s")


def round_order(concurrencies: list[int], round_index: int) -> list[int]:
    """The concurrencies of one round: as given in even rounds, reversed in odd ones, so that
    a machine that slows down (or speeds up) over the run does not favour the concurrencies
    measured first."""
    return list(concurrencies) if round_index % 2 == 0 else list(reversed(concurrencies))


def median_steps_per_second(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Per concurrency, the median steps/s of its rows (one per round)."""
    by_concurrency: dict[int, list[float]] = {}
    for r in rows:
        by_concurrency.setdefault(r["concurrency"], []).append(r["steps_per_second"])
    return {c: statistics.median(values) for c, values in sorted(by_concurrency.items())}


def past_peak_ratio(medians: dict[int, float]) -> float | None:
    """The lowest steps/s at a concurrency above the peak's, as a share of the peak (1.0 when
    the peak is at the highest concurrency). Throughput should plateau, not fall, as
    concurrency rises; None with fewer than two concurrencies."""
    if len(medians) < 2:
        return None
    peak_c = max(medians, key=lambda c: medians[c])
    above = [v for c, v in medians.items() if c > peak_c]
    if not above or medians[peak_c] <= 0:
        return 1.0
    return round(min(above) / medians[peak_c], 3)


def transport_comparison(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The channel against HTTP over rows of one run: server CPU per step (median over the
    concurrencies measured), best steps/s, p50 at c=1, each as channel / HTTP."""

    def of(transport: str) -> tuple[float | None, float | None, float | None]:
        mine = [r for r in rows if r.get("transport") == transport]
        cpu = [r["server_cpu_ms_per_step"] for r in mine if r["server_cpu_ms_per_step"] is not None]
        best = max(median_steps_per_second(mine).values(), default=None)
        c1 = [r["p50_ms"] for r in mine if r["concurrency"] == 1 and r["p50_ms"] is not None]
        return (statistics.median(cpu) if cpu else None, best, statistics.median(c1) if c1 else None)

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    channel, http = of("channel"), of("http")
    return {
        "server_cpu_ms_per_step_ratio": ratio(channel[0], http[0]),
        "best_steps_per_second_ratio": ratio(channel[1], http[1]),
        "p50_ms_c1_ratio": ratio(channel[2], http[2]),
    }


def summary_of(results: dict[str, Any]) -> dict[str, float | None]:
    summary: dict[str, float | None] = {}
    for name in ("dev", "cluster"):
        all_rows = results.get(name, {}).get("rows", [])
        for key, value in transport_comparison(all_rows).items():
            summary[f"{name}_channel_vs_http_{key}"] = value
        # The targets concern the SDK's default transport (the channel) when both ran.
        rows = [r for r in all_rows if r.get("transport") in ("channel", "auto")] or all_rows
        medians = median_steps_per_second(rows)
        c1 = sorted(r["p50_ms"] for r in rows if r["concurrency"] == 1 and r["p50_ms"] is not None)
        summary[f"{name}_steps_per_second"] = max(medians.values(), default=None)
        summary[f"{name}_p50_ms_c1"] = statistics.median(c1) if c1 else None
        summary[f"{name}_past_peak_ratio"] = past_peak_ratio(medians)
    return summary


def meets(value: float | None, goal: str) -> str:
    if value is None:
        return "not measured"
    op, number = goal.split()
    ok = value >= float(number) if op == ">=" else value <= float(number)
    return "met" if ok else "MISSED"


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nDurable steps benchmark (strict durability; a turn = RunModel, CallTool (no-op read), RunModel; "
        f"{result['turns_per_session']} turns per session; Worker in its own process)"
    )
    print(
        f"machine: {result['cores']} cores. CPU columns: ms of CPU per step, and cores busy (1.00 = one full "
        f"core) of the busiest server node, of the Worker, and of processes outside this bench (other); cpu wait = "
        f"share of the time some runnable process waited for a CPU (PSI); steal = cores the hypervisor gave to "
        f"other guests; probe = ms of a fixed piece of Python work before and after the row (higher: a slower "
        f"machine at that moment)"
    )
    print(
        f"{'deployment':<10} {'via':<7} {'conc':>5} {'steps':>7} {'steps/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'row done/started':>16} {'srv ms/step':>11} {'srv cores':>9} {'wrk ms/step':>11} {'wrk cores':>9} "
        f"{'other':>6} {'steal':>6} {'cpu wait':>8} {'probe ms':>11}"
    )
    for name in ("dev", "cluster"):
        for r in result.get(name, {}).get("rows", []):
            print(
                f"{name:<10} {r.get('transport', 'auto'):<7} {r['concurrency']:>5} {r['steps']:>7} {r['steps_per_second']:>8.0f} "
                f"{fmt(r['p50_ms'], '.2f'):>7} {fmt(r['p99_ms'], '.2f'):>7} {r['row_steps']:>7}/{fmt(r['row_attempts_started'], '.0f'):<8} "
                f"{fmt(r['server_cpu_ms_per_step'], '.3f'):>11} {r['server_busiest_node_cores']:>9.2f} "
                f"{fmt(r['worker_cpu_ms_per_step'], '.3f'):>11} {r['worker_cores']:>9.2f} "
                f"{r['other_load_cores']:>6.2f} {r.get('steal_cores', 0.0):>6.2f} {fmt_pct(r['cpu_wait_fraction']):>8} "
                f"{'/'.join(f'{p:.0f}' for p in r.get('cpu_probe_ms', [])):>11}"
            )
            notes = [
                f"{r['failed_results']} failed results" if r["failed_results"] else "",
                f"{r['sessions_abandoned']} sessions abandoned (stalled)" if r["sessions_abandoned"] else "",
                f"{r['sessions_cut_at_end']} sessions still running when the row ended"
                if r.get("sessions_cut_at_end")
                else "",
                "" if r["worker_stopped_cleanly"] else "the Worker had to be killed",
            ]
            if any(notes):
                print(f"{'':<10} warning: {', '.join(n for n in notes if n)}")
    for name in ("dev", "cluster"):
        ratios = {k: v for k, v in result["summary"].items() if k.startswith(f"{name}_channel_vs_http_")}
        if any(v is not None for v in ratios.values()):
            print(
                f"{name}: channel / HTTP, same run: server CPU per step {fmt(ratios[f'{name}_channel_vs_http_server_cpu_ms_per_step_ratio'], '.2f')}x "
                f"(target <= 0.55), best steps/s {fmt(ratios[f'{name}_channel_vs_http_best_steps_per_second_ratio'], '.2f')}x "
                f"(target >= 1.5), p50 at c=1 {fmt(ratios[f'{name}_channel_vs_http_p50_ms_c1_ratio'], '.2f')}x (target <= 0.7)"
            )
    kill = result.get("worker_kill")
    if kill:
        print(
            f"Worker kill -> next attempt started on the other Worker: {fmt(kill['kill_to_next_attempt_ms'], '.0f')} ms "
            f"(the grace of {kill['grace_ms']} ms, which covers the RunModel row's first retry backoff of "
            f"{kill['backoff_ms']} ms; target <= 1500)"
        )
    if result.get("rounds", 1) > 1:
        for name in ("dev", "cluster"):
            medians = median_steps_per_second(result.get(name, {}).get("rows", []))
            if medians:
                listed = ", ".join(f"c={c} {v:.0f}" for c, v in medians.items())
                print(f"{name}: median steps/s of {result['rounds']} rounds: {listed}")
    print("\ntarget                        measured    goal")
    for name, goal in TARGETS.items():
        value = result["summary"].get(name)
        print(f"{name:<28} {fmt(value, '10.2f'):>10}    {goal:<9} {meets(value, goal)}")
    # No figure of another system is printed here: a ratio counts only when both ran side by
    # side in the same run on the same machine.


async def main_async(args: argparse.Namespace, registry: ProcessRegistry) -> dict[str, Any]:
    # SIGTERM stops the bench like Ctrl-C: the finally blocks stop every process by pid.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    names = [args.only] if args.only else ["dev", "cluster"]
    result: dict[str, Any] = {
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "turns_per_session": args.turns_per_session,
        "transports": args.transports,
        "cores": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "targets": TARGETS,
    }
    with tempfile.TemporaryDirectory(prefix="dex-steps-bench-") as tmp:
        for name in names:
            result[name] = await bench_deployment(name, args, Path(tmp), registry)
        if args.kill_timing:
            print("[kill] Worker kill -> next attempt ...", flush=True)
            result["worker_kill"] = await worker_kill_timing(Path(tmp) / "kill", registry)
    result["summary"] = summary_of(result)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=20.0, help="measured seconds per concurrency")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="unmeasured seconds before each window")
    parser.add_argument(
        "--concurrency",
        type=positive_ints("--concurrency"),
        default=[1, 16, 64, 128],
        help="comma-separated session concurrencies (default 1,16,64,128)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every concurrency this many times, the order reversed every other round; "
        "the summary takes the median per concurrency (default 1)",
    )
    parser.add_argument("--only", choices=("dev", "cluster"), help="measure one deployment only")
    parser.add_argument(
        "--turns-per-session",
        type=int,
        default=10,
        help="turns queued in each session before the lane starts a new one",
    )
    parser.add_argument(
        "--transports",
        type=lambda text: [t for t in text.split(",") if t],
        default=["channel", "http"],
        help="how the Worker reaches the server, each measured at every concurrency in turn "
        "(default channel,http: the channel against HTTP in the same run)",
    )
    parser.add_argument(
        "--no-kill-timing",
        dest="kill_timing",
        action="store_false",
        help="skip the Worker-kill -> next-attempt timing (a dev node and two Workers, a few seconds)",
    )
    parser.add_argument("--json", default=str(DEFAULT_JSON), help=f"where to write the JSON (default {DEFAULT_JSON})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.duration_s <= 0 or args.warmup_s < 0 or args.turns_per_session < 1 or args.rounds < 1:
        build_parser().error("--duration-s must be > 0, --warmup-s >= 0, --turns-per-session >= 1, --rounds >= 1")
    result = run_stopping_every_process(lambda registry: main_async(args, registry))
    if result is None:
        return 130
    print_table(result)
    print(f"\nwrote {write_json(result, args.json)}")
    return 0


def run_stopping_every_process(
    bench: Callable[[ProcessRegistry], Coroutine[Any, Any, dict[str, Any]]],
) -> dict[str, Any] | None:
    """Run `bench` on uvloop when installed (the server and the Worker use it too); then, however
    it ended, kill every process it started and left running. Its result with the pids it
    started, or None when it was interrupted (Ctrl-C, SIGTERM)."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    registry = ProcessRegistry()
    try:
        result = asyncio.run(bench(registry))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: stopped every process this bench started", file=sys.stderr)
        return None
    finally:
        killed = registry.kill_leftovers()
        if killed:
            print(f"killed leftover processes: {killed}", file=sys.stderr)
    result["pids"] = registry.pids
    return result


def write_json(result: dict[str, Any], path: str) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(main())
