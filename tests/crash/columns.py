"""Real processes for the crash cells: the worker process, and the three failure columns.

- `WorkerKillColumn`: one `dex-ha dev` shared by the column; the failure is the Worker
  process (SIGKILL, or its own exit at an armed Worker failpoint); recovery starts a new one.
- `ServerRestartColumn`: one `dex-ha dev` data dir shared by the column, cell after cell;
  the failure is SIGKILL of the node (or its exit at an armed server failpoint); recovery
  starts it again on the same data dir and port. The Worker process runs on.
- `TakeoverColumn`: one three-node cluster (`dex-ha cluster up`) shared by the column; the
  failure is SIGKILL of the active node (or its exit at a failpoint); a hot standby takes
  the lease; recovery restarts the dead node, so the next failure again has three nodes.
  The Worker process, given every node URL, follows the leader.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp

from dex_ha.failpoints import FAILPOINT_ENV, FAILPOINT_EXIT_CODE
from dex_ha.local_cluster import node_process_alive, read_pids
from harness.cluster_process import LocalCluster
from harness.cluster_state import observe_settled
from harness.dev_process import DevProcess
from harness.processes import REPO_ROOT, env_with_checkout, stop
from harness.typescript_sdk import CRASH_WORKER
from harness.waiting import eventually
from harness.worker_process import WorkerOptions, start_worker

DEADLINE_S = 45.0
# Short heartbeat timeouts of the dev nodes, so the attempt of a killed Worker fails in
# about two seconds (default 30 s; 1 s proved too tight on a loaded 2-core machine). The
# server_restart column keeps more slack: its Worker runs on, and a cell's "before the
# first heartbeat" Worker beats rarely.
WORKER_KILL_HEARTBEAT_TIMEOUT_MS = 2_000
SERVER_RESTART_HEARTBEAT_TIMEOUT_MS = 4_000
# The crash Worker's connection options: short polls and a short drain (the launcher's
# defaults), and a fast reconnect after a server restart or a takeover.
CRASH_WORKER_OPTIONS = WorkerOptions(poll_wait_ms=1_000, drain_timeout_s=1.0, backoff_max_s=0.2)


async def exit_code(proc: subprocess.Popen[bytes], what: str, deadline_s: float = DEADLINE_S) -> int:
    """Wait for `proc` to exit by itself (a failpoint) and return its exit code."""
    await eventually(lambda: proc.poll() is not None, f"{what} to exit", deadline_s)
    return proc.returncode


async def died_at_failpoint(proc: subprocess.Popen[bytes], what: str) -> None:
    code = await exit_code(proc, what)
    assert code == FAILPOINT_EXIT_CODE, f"{what} exited with {code}, not at its failpoint"


class WorkerProcess:
    """One cell's Worker process, killed by pid: `tests.crash.worker_proc` run by the Worker
    launcher (harness.worker_process), or with `language="ts"` the TypeScript Worker (`node
    sdk/typescript/dist/test/crash/worker_proc.js`, with the same agent arguments). `row` is
    the cell key that names the agent (rows.CELL_RUNS); `agent_args` are more arguments for
    that agent (R21: the fake model API, the work dir). Its output goes to `log_path`."""

    def __init__(
        self,
        urls: list[str],
        token: str | None,
        *,
        ledger: Path,
        row: str,
        agent: str,
        column: str,
        log_path: Path,
        failpoints: str = "",
        heartbeat_interval_s: float | None = None,
        max_concurrency: int | None = None,
        language: str = "python",
        agent_args: Sequence[str] = (),
    ) -> None:
        self.urls, self.language = urls, language
        self.options = replace(
            CRASH_WORKER_OPTIONS,
            token=token or None,
            heartbeat_interval_s=heartbeat_interval_s or None,
            max_concurrency=max_concurrency or None,
        )
        self.agent_args = ["--ledger", str(ledger), "--row", row, "--agent", agent, "--column", column, *agent_args]
        self.failpoints = failpoints
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = env_with_checkout()
        env.pop(FAILPOINT_ENV, None)  # armed only when this worker says so
        if self.failpoints:
            env[FAILPOINT_ENV] = self.failpoints
        if self.language == "python":
            self.proc = start_worker(
                "tests.crash.worker_proc",
                self.urls,
                self.agent_args,
                options=self.options,
                log=self.log_path,
                env=env,
                cwd=REPO_ROOT,
            )
            return
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.ts_command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
            )

    def ts_command(self) -> list[str]:
        """The TypeScript Worker's command line: its own flags for the options it has."""
        options = self.options
        return [
            "node",
            str(CRASH_WORKER),
            "--urls",
            ",".join(self.urls),
            *self.agent_args,
            *(["--token", options.token] if options.token else []),
            *(["--heartbeat-interval", str(options.heartbeat_interval_s)] if options.heartbeat_interval_s else []),
            *(["--max-concurrency", str(options.max_concurrency)] if options.max_concurrency else []),
        ]

    async def die(self) -> str:
        """The crash: wait for the armed failpoint's exit, or SIGKILL. Says which."""
        assert self.proc is not None
        if self.failpoints:
            await died_at_failpoint(self.proc, "the worker process")
            return "exit 99 at a Worker failpoint"
        self.kill()
        return "SIGKILL"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, timeout=5)


class Column:
    """One failure column. `fail` is the crash; `recover` undoes it (and may arm a server
    failpoint on the restarted node); `arm` makes the node a cell talks to die at a point."""

    name = ""
    urls: list[str]
    client_token: str | None = None
    worker_token: str | None = None
    admin_token: str | None = None

    async def ready(self) -> None:
        """Before a cell: the server (or all three nodes) up, one active."""
        raise NotImplementedError

    async def fail(self, worker: WorkerProcess | None) -> str:
        raise NotImplementedError

    async def recover(self, worker: WorkerProcess | None, arm: str = "") -> None:
        raise NotImplementedError

    async def arm(self, spec: str) -> None:
        raise NotImplementedError(f"{self.name}: no server failpoints in this column")

    def close(self) -> None:
        raise NotImplementedError


def dev_env(heartbeat_timeout_ms: int) -> dict[str, str]:
    return {"DEX_HA_HEARTBEAT_TIMEOUT_MS": str(heartbeat_timeout_ms)}


class WorkerKillColumn(Column):
    name = "worker_kill"

    def __init__(self, directory: Path) -> None:
        self.dev = DevProcess(
            directory / "data", directory / "dev.log", relaxed=True, extra_env=dev_env(WORKER_KILL_HEARTBEAT_TIMEOUT_MS)
        )
        self.dev.start()
        self.urls = [self.dev.url]

    async def ready(self) -> None:
        await self.dev.wait_ready()

    async def fail(self, worker: WorkerProcess | None) -> str:
        assert worker is not None
        return await worker.die()

    async def recover(self, worker: WorkerProcess | None, arm: str = "") -> None:
        assert worker is not None and not arm
        worker.start()  # a new process: same agent, same ledger, same failpoints

    def close(self) -> None:
        self.dev.stop()


class ServerRestartColumn(Column):
    name = "server_restart"

    def __init__(self, directory: Path) -> None:
        self.base_env = dev_env(SERVER_RESTART_HEARTBEAT_TIMEOUT_MS)
        self.dev = DevProcess(directory / "data", directory / "dev.log", relaxed=True, extra_env=self.base_env)
        self.dev.start()
        self.urls = [self.dev.url]
        self.armed = False

    async def ready(self) -> None:
        """Heal what a failed cell may have left: a dead node, or one still armed."""
        assert self.dev.proc is not None
        if self.armed or self.dev.proc.poll() is not None:
            self.dev.kill()
            await self.recover(None)
        await self.dev.wait_ready()

    async def fail(self, worker: WorkerProcess | None) -> str:
        assert self.dev.proc is not None
        if self.armed:
            await died_at_failpoint(self.dev.proc, "dex-ha dev")
            return "exit 99 at a server failpoint"
        self.dev.kill()
        return "SIGKILL"

    async def recover(self, worker: WorkerProcess | None, arm: str = "") -> None:
        self.dev.extra_env = {**self.base_env, **({FAILPOINT_ENV: arm} if arm else {})}
        self.armed = bool(arm)
        self.dev.start()  # the same port and data dir: the Worker and the client are not told
        await self.dev.wait_ready()

    async def arm(self, spec: str) -> None:
        self.dev.kill()
        await self.recover(None, arm=spec)

    def close(self) -> None:
        self.dev.stop()


class TakeoverColumn(Column):
    name = "takeover"

    def __init__(self, directory: Path) -> None:
        self.cluster = LocalCluster(directory)
        self.cluster.up()
        self.urls = list(self.cluster.urls.values())
        tokens = self.cluster.tokens
        self.client_token, self.worker_token, self.admin_token = tokens["client"], tokens["worker"], tokens["admin"]
        self.dead: str | None = None
        self.armed: tuple[str, subprocess.Popen[bytes]] | None = None  # the node armed to die

    async def ready(self) -> None:
        """Heal what a failed cell may have left (a node still armed, a dead node), then wait
        for all three nodes to agree on one active node."""
        if self.armed is not None:
            node_id, proc = self.armed
            self.armed = None
            proc.kill()
            proc.wait(timeout=10)
        for node_id, pid in read_pids(self.cluster.dir).items():
            if not node_process_alive(pid):
                self.cluster.restart(node_id)
        await observe_settled(self.cluster.urls, self.admin_token, deadline_s=DEADLINE_S)

    async def fail(self, worker: WorkerProcess | None) -> str:
        if self.armed is not None:
            node_id, proc = self.armed
            await died_at_failpoint(proc, f"node {node_id}")
            self.dead, self.armed = node_id, None
            return "exit 99 at a server failpoint (the active node)"
        self.dead = await self.cluster.active_node(deadline_s=DEADLINE_S)
        self.cluster.kill(self.dead)
        return "SIGKILL of the active node"

    async def recover(self, worker: WorkerProcess | None, arm: str = "") -> None:
        assert self.dead is not None
        await self.cluster.active_node(deadline_s=DEADLINE_S, not_=self.dead)  # a standby took the lease
        dead, self.dead = self.dead, None
        proc = self.cluster.restart(dead, {FAILPOINT_ENV: arm} if arm else None)
        await observe_settled(self.cluster.urls, self.admin_token, deadline_s=DEADLINE_S)
        if arm:
            await self.step_down_to(dead)
            self.armed = (dead, proc)

    async def arm(self, spec: str) -> None:
        """Restart a standby with the failpoint armed, then hand it the leadership."""
        active = await self.cluster.active_node(deadline_s=DEADLINE_S)
        self.dead = next(node_id for node_id in self.cluster.urls if node_id != active)
        self.cluster.kill(self.dead)
        await self.recover(None, arm=spec)

    async def step_down_to(self, node_id: str) -> None:
        active = await self.cluster.active_node(deadline_s=DEADLINE_S)
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        async with aiohttp.ClientSession() as http:
            async with http.post(
                self.cluster.urls[active] + "/v1/cluster/step-down",
                headers=headers,
                json={"to": node_id, "drain_timeout_ms": 0},
            ) as resp:
                assert resp.status == 200, await resp.text()
        deadline = time.monotonic() + DEADLINE_S
        while await self.cluster.active_node(deadline_s=DEADLINE_S) != node_id:
            assert time.monotonic() < deadline, f"{node_id} did not become active after the step down"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        self.cluster.down()


COLUMNS = {column.name: column for column in (WorkerKillColumn, ServerRestartColumn, TakeoverColumn)}
