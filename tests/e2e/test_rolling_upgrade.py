"""A rolling upgrade from release 0.1.0 to this code, under load, on real processes
(docs/operations.md, "Upgrade a running cluster").

Three nodes start on 0.1.0's code (its tree from git, `git archive`). A 0.1.0 Worker
process and a Worker of this code run the sessions that three clients keep creating.
One node at a time (standbys first, the active node last, after a step down) is stopped
with SIGTERM and started on this code, and waits until it has caught up.

Asserted: no acknowledged write is lost and every session settles; while a 0.1.0 node is
a member the cluster stays at state machine v1 and the Worker channel (whose entries are
v2) answers 404; the cluster moves to v2 only after the last node, after which a Worker
uses the channel; the 0.1.0 Worker keeps working against the new nodes throughout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest

from dex_ha.client import DexClient
from dex_ha.client.connection import DexError
from dex_ha.engine import STATE_MACHINE_VERSION
from dex_ha.worker import Worker
from harness.cluster_process import LocalCluster, cluster_view
from harness.processes import REPO_ROOT, pid_alive, stop
from harness.releases import RELEASE_0_1_0_COMMIT, checkout_release, release_env
from harness.waiting import eventually
from harness.worker_process import WorkerOptions, start_worker
from tests.e2e.conftest import running
from tests.e2e.test_version_gate import _channel_status
from tests.e2e.upgrade_worker import AGENT, make_agent

DEADLINE_S = 60.0
CLIENTS = 3
SETTLE_S = 120.0


class Load:
    """Clients that create sessions and send each one message until stopped; what the
    cluster acknowledged is recorded (a write that raised may or may not have happened)."""

    def __init__(self, client: DexClient) -> None:
        self.client = client
        self.sessions: set[str] = set()
        self.messages: dict[str, str] = {}  # session -> the text of its acknowledged message
        self.failures = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._user(k)) for k in range(CLIENTS)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _user(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            sid, text = f"u{k}-{i}", f"m{k}-{i}"
            i += 1
            try:
                await self.client.create_session(AGENT, session_id=sid)
                self.sessions.add(sid)
                await self.client.send_message(sid, text, message_id=f"msg-{sid}")
                self.messages[sid] = text
            except (DexError, aiohttp.ClientError, OSError, TimeoutError):
                self.failures += 1
            await asyncio.sleep(0.05)


async def _views(cluster: LocalCluster) -> dict[str, dict | None]:
    return {node: await cluster_view(url, cluster.tokens["admin"]) for node, url in cluster.urls.items()}


async def _upgrade(cluster: LocalCluster, node: str) -> None:
    """The procedure of docs/operations.md for one node: step down if active, SIGTERM, start
    on the new code, wait until it has caught up."""
    admin = cluster.tokens["admin"]
    if await cluster.active_node(deadline_s=DEADLINE_S) == node:
        done = await asyncio.to_thread(cluster.run_cli, "step-down", "--url", cluster.urls[node], "--token", admin)
        assert done.returncode == 0, done.stdout + done.stderr
        await cluster.active_node(deadline_s=DEADLINE_S, not_=node)
    pid = cluster.pid(node)
    os.kill(pid, signal.SIGTERM)
    await eventually(lambda: not pid_alive(pid), f"{node} to stop after SIGTERM", deadline_s=DEADLINE_S)
    cluster.restart(node, extra_env={"PYTHONPATH": str(REPO_ROOT)})
    active = await cluster.active_node(deadline_s=DEADLINE_S)
    target = (await cluster_view(cluster.urls[active], admin) or {}).get("commit_index", 0)

    async def caught_up() -> bool:
        view = await cluster_view(cluster.urls[node], admin)
        return view is not None and view.get("version") is not None and view["applied_index"] >= target

    await eventually(caught_up, f"{node} on the new code to catch up to index {target}", deadline_s=DEADLINE_S)


async def _cluster_versions(cluster: LocalCluster) -> set[int]:
    """The cluster's state machine as each node on the new code reports it."""
    return {
        v["cluster_state_machine_version"]
        for v in (await _views(cluster)).values()
        if v is not None and "cluster_state_machine_version" in v
    }


async def _settled(client: DexClient, load: Load) -> None:
    """Every acknowledged session exists; each acknowledged message got its turn, completed."""
    for sid in sorted(load.sessions):
        session = await client.get_session(sid)
        if sid not in load.messages:
            continue
        done = await client.wait_until_idle(sid, timeout_s=SETTLE_S)
        texts = [item.get("text") for item in done.history if item.get("type") == "user"]
        assert load.messages[sid] in texts, (sid, done.history)
        assert done.turns and done.turns[-1].status == "completed", (sid, session.status, done.turns)


@pytest.mark.timeout(900)
async def test_a_rolling_upgrade_from_0_1_0_under_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = checkout_release(RELEASE_0_1_0_COMMIT, tmp_path / "0.1.0")
    if tree is None:
        pytest.skip("this checkout has no git history with release 0.1.0 (a source archive or a shallow clone)")
    monkeypatch.setenv("PYTHONPATH", str(tree))  # `cluster up` and its nodes run 0.1.0...
    monkeypatch.chdir(tmp_path)  # ...not this checkout, which `python -m` puts first from the working directory
    cluster = LocalCluster(tmp_path / "cluster")
    old_worker: subprocess.Popen[bytes] | None = None
    try:
        await asyncio.to_thread(cluster.up)
        monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
        views = await _views(cluster)
        assert all(v is not None and "version" not in v for v in views.values()), "the nodes do not run 0.1.0"
        urls = list(cluster.urls.values())
        old_worker = start_worker(
            str(Path(__file__).with_name("upgrade_worker.py")),
            urls,
            options=WorkerOptions(token=cluster.tokens["worker"], drain_timeout_s=2.0),
            log=tmp_path / "old-worker.log",
            env=release_env(tree),
        )
        new_worker = Worker(urls, token=cluster.tokens["worker"], agents=[make_agent()], poll_wait_ms=1_000)
        async with running(new_worker), DexClient(urls, token=cluster.tokens["client"]) as client:
            await eventually(lambda: _agent_registered(client), "the agent to be registered", deadline_s=DEADLINE_S)
            load = Load(client)
            load.start()
            active = await cluster.active_node(deadline_s=DEADLINE_S)
            order = [*sorted(n for n in cluster.urls if n != active), active]
            for upgraded, node in enumerate(order, 1):
                await _upgrade(cluster, node)
                if upgraded < len(order):  # a 0.1.0 member is left: the cluster stays at v1
                    assert await _cluster_versions(cluster) == {1}
                    now_active = await cluster.active_node(deadline_s=DEADLINE_S)
                    status, body = await _channel_status(cluster.urls[now_active], cluster.tokens["worker"])
                    assert status == 404, (status, body)

            async def moved() -> bool:
                return await _cluster_versions(cluster) == {STATE_MACHINE_VERSION}

            await eventually(moved, "the cluster to move to the new state machine", deadline_s=DEADLINE_S)
            await load.stop()
            assert load.sessions and load.messages, "the load acknowledged nothing"
            # A Worker of this code now uses the channel (ReportResults entries).
            channel_worker = Worker(
                urls, token=cluster.tokens["worker"], agents=[make_agent()], poll_wait_ms=1_000, transport="channel"
            )
            async with running(channel_worker):
                await client.create_session(AGENT, session_id="after")
                await client.send_message("after", "after-upgrade", message_id="msg-after")
                load.sessions.add("after")
                load.messages["after"] = "after-upgrade"
                await _settled(client, load)
            assert old_worker.poll() is None, "the 0.1.0 Worker stopped"
        views = await _views(cluster)
        assert all(v is not None and not v["consistency_alarms"] for v in views.values()), views
        print(f"sessions {len(load.sessions)}, messages {len(load.messages)}, failed writes {load.failures}")
    finally:
        if old_worker is not None:
            stop(old_worker)
        cluster.down()


async def _agent_registered(client: DexClient) -> bool:
    try:
        await client.create_session(AGENT, session_id="probe")
        return True
    except DexError:
        return False
