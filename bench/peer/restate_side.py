"""Restate for bench/peer/run.py: start one node or three, the Python service, and the load.

One node: a restate-server with replication 1 (its defaults: replicated loglet and
metadata server on the one node, RocksDB with fsync of its WAL). Three nodes: three
restate-server processes on loopback forming one cluster (node n1 provisions it), with
`default-replication = 2`, as Restate's cluster deployment guide configures a cluster
without external dependencies. Every listener is bound to 127.0.0.1, telemetry is off
(`disable-telemetry = true`) and so is the web UI.

The service (bench/peer/restate_service.py) runs in one hypercorn process tree, registered
through the admin API of n1. The load: `concurrency` lanes, each keeping one invocation of
`Steps/run` (N durable steps) in flight, sent to the nodes' ingresses in turn.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import cpu_pressure_us, cpu_seconds, process_tree
from bench.steps_bench import machine_busy_seconds, steal_seconds
from harness.ports import free_ports

SERVICE_DIR = Path(__file__).resolve().parent  # hypercorn imports restate_service from here
START_DEADLINE_S = 90.0
STOP_DEADLINE_S = 15.0
INVOCATION_DEADLINE_S = 60.0


@dataclass
class RestateNode:
    name: str
    fabric_port: int
    admin_port: int
    ingress_port: int
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class RestateDeployment:
    """Running Restate nodes and the service process; how to reach and stop them."""

    name: str  # "one node" | "three nodes"
    replication: int
    nodes: list[RestateNode]
    sdk_proc: subprocess.Popen[bytes] | None = None
    sdk_port: int = 0
    commands: list[str] = field(default_factory=list)

    @property
    def ingress_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{n.ingress_port}" for n in self.nodes]

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.nodes[0].admin_port}"

    def server_pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None]

    def sdk_pids(self) -> list[int]:
        """hypercorn and the worker process it forks."""
        return process_tree(self.sdk_proc.pid) if self.sdk_proc is not None else []

    def stop(self) -> list[int]:
        """SIGTERM every process, SIGKILL after the deadline; the pids it had to kill."""
        procs = [n.proc for n in self.nodes if n.proc is not None]
        if self.sdk_proc is not None:
            procs.append(self.sdk_proc)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        killed = []
        deadline = time.monotonic() + STOP_DEADLINE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(proc.pid)
                proc.kill()
                proc.wait(timeout=10)
        return killed


def node_config(node: RestateNode, nodes: list[RestateNode], cluster: str, replication: int, first: bool) -> str:
    """restate.toml of one node (keys from `restate-server --dump-config` of 1.7.12)."""
    metadata = ", ".join(f'"http://127.0.0.1:{n.fabric_port}/"' for n in nodes)
    return f"""node-name = "{node.name}"
cluster-name = "{cluster}"
auto-provision = {"true" if first else "false"}
default-replication = {replication}
disable-telemetry = true
listen-mode = "tcp"
bind-address = "127.0.0.1:{node.fabric_port}"
advertised-address = "http://127.0.0.1:{node.fabric_port}/"

[metadata-client]
addresses = [{metadata}]

[admin]
bind-address = "127.0.0.1:{node.admin_port}"
disable-web-ui = true

[ingress]
bind-address = "127.0.0.1:{node.ingress_port}"

[bifrost]
default-provider = "replicated"
"""


async def start_restate(
    manifest: dict[str, Any], name: str, node_count: int, root: Path, pids: list[int]
) -> RestateDeployment:
    """Start `node_count` nodes and the service, register it; every pid goes into `pids`."""
    ports = free_ports(3 * node_count + 1)
    nodes = [
        RestateNode(f"n{i + 1}", fabric_port=ports[3 * i], admin_port=ports[3 * i + 1], ingress_port=ports[3 * i + 2])
        for i in range(node_count)
    ]
    replication = 1 if node_count == 1 else 2
    deployment = RestateDeployment(name, replication, nodes, sdk_port=ports[-1])
    cluster = f"dexpeer-{uuid.uuid4().hex[:8]}"
    home = root / f"restate-{node_count}"
    try:
        for i, node in enumerate(nodes):
            node_dir = home / node.name
            node_dir.mkdir(parents=True, exist_ok=True)
            config = node_dir / "restate.toml"
            config.write_text(node_config(node, nodes, cluster, replication, first=i == 0))
            command = [
                manifest["restate_server"],
                "--config-file",
                str(config),
                "--base-dir",
                str(node_dir / "data"),
                "--no-logo",
                "--log-disable-ansi-codes",
                "true",
            ]
            node.proc = spawn(command, node_dir / "server.log", env={"RESTATE_DISABLE_TELEMETRY": "true"})
            pids.append(node.proc.pid)
            deployment.commands.append(" ".join(command))
        command = [
            manifest["hypercorn"],
            "--bind",
            f"127.0.0.1:{deployment.sdk_port}",
            "--workers",
            "1",
            "restate_service:app",
        ]
        deployment.sdk_proc = spawn(command, home / "sdk.log", cwd=SERVICE_DIR)
        pids.append(deployment.sdk_proc.pid)
        deployment.commands.append(" ".join(command))
        await register_service(deployment)
        await wait_invocable(deployment)
        pids.extend(p for p in deployment.sdk_pids() if p not in pids)
    except BaseException:
        await asyncio.to_thread(deployment.stop)
        raise
    return deployment


def spawn(
    command: list[str], log_path: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )


async def register_service(deployment: RestateDeployment) -> None:
    """POST the service's URL to the admin API until it is accepted (the admin API and the
    service come up in their own time)."""
    body = {"uri": f"http://127.0.0.1:{deployment.sdk_port}", "force": True}
    last = ""
    deadline = time.monotonic() + START_DEADLINE_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            check_alive(deployment)
            try:
                async with http.post(
                    deployment.admin_url + "/deployments", json=body, timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    if resp.status in (200, 201):
                        return
                    last = f"{resp.status} {(await resp.text())[:300]}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
    raise TimeoutError(f"Restate did not register the service within {START_DEADLINE_S:.0f} s: {last}")


async def wait_invocable(deployment: RestateDeployment) -> None:
    """One invocation of one step answers on every ingress (partitions are placed and led)."""
    deadline = time.monotonic() + START_DEADLINE_S
    async with aiohttp.ClientSession() as http:
        for url in deployment.ingress_urls:
            last = ""
            while True:
                check_alive(deployment)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} ran no invocation within {START_DEADLINE_S:.0f} s: {last}")
                try:
                    async with http.post(url + "/Steps/run", json=1, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                        if resp.status == 200:
                            break
                        last = f"{resp.status} {(await resp.text())[:300]}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = repr(exc)
                await asyncio.sleep(0.2)


def check_alive(deployment: RestateDeployment) -> None:
    raise_if_exited([n.proc for n in deployment.nodes] + [deployment.sdk_proc], "logs under its directory")


def raise_if_exited(procs: Iterable[subprocess.Popen[bytes] | None], logs: str) -> None:
    """RuntimeError naming the first of `procs` that has exited (and where its logs are)."""
    for proc in procs:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{_program(proc)} exited with {proc.returncode} ({logs})")


def _program(proc: subprocess.Popen[bytes]) -> str:
    """The program `proc` runs: the first word of its command."""
    command = proc.args
    if isinstance(command, (str, bytes, os.PathLike)):
        return os.fsdecode(command)
    return os.fsdecode(command[0])


# ---------------------------------------------------------------- the load


@dataclass
class InvocationLog:
    """Step completion times (CLOCK_MONOTONIC ns) of every invocation that answered."""

    steps_by_invocation: list[list[int]] = field(default_factory=list)
    failed: int = 0
    started: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def run_lane(http: aiohttp.ClientSession, urls: list[str], first: int, steps: int, log: InvocationLog) -> None:
    """One in-flight invocation at a time until `log.stop`; the ingresses in turn."""
    turn = first
    while not log.stop.is_set():
        url = urls[turn % len(urls)]
        turn += 1
        log.started += 1
        try:
            async with http.post(
                url + "/Steps/run", json=steps, timeout=aiohttp.ClientTimeout(total=INVOCATION_DEADLINE_S)
            ) as resp:
                if resp.status == 200:
                    log.steps_by_invocation.append(await resp.json())
                    continue
        except (aiohttp.ClientError, TimeoutError):
            pass
        log.failed += 1
        await asyncio.sleep(0.05)


@dataclass
class CpuSample:
    """Counters at one edge of the window (what steps_bench.Sample is for dex-ha)."""

    at_ns: int
    server_cpu_s: float
    sdk_cpu_s: float
    bench_cpu_s: float
    machine_busy_s: float
    steal_s: float
    cpu_pressure_us: int | None


def cpu_sample(deployment: RestateDeployment) -> CpuSample:
    times = os.times()
    return CpuSample(
        time.monotonic_ns(),
        sum(cpu_seconds(p) for p in deployment.server_pids()),
        sum(cpu_seconds(p) for p in deployment.sdk_pids()),
        times.user + times.system,
        machine_busy_seconds(),
        steal_seconds(),
        cpu_pressure_us(),
    )


async def drive(
    deployment: RestateDeployment, concurrency: int, steps: int, warmup_s: float, duration_s: float
) -> tuple[InvocationLog, CpuSample, CpuSample]:
    """Run the load: warm-up, then the window between the two samples; then every lane
    finishes the invocation it is in (its steps may fall inside the window)."""
    log = InvocationLog()
    connector = aiohttp.TCPConnector(limit=0)  # aiohttp's default of 100 connections would cap c
    async with aiohttp.ClientSession(connector=connector) as http:
        lanes = [
            asyncio.create_task(run_lane(http, deployment.ingress_urls, i, steps, log)) for i in range(concurrency)
        ]
        try:
            await asyncio.sleep(warmup_s)
            first = cpu_sample(deployment)
            await asyncio.sleep(duration_s)
            last = cpu_sample(deployment)
            log.stop.set()
            await asyncio.wait(lanes, timeout=INVOCATION_DEADLINE_S)
        finally:
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
    return log, first, last
