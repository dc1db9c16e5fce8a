"""A real Prometheus (Debian's `prometheus`) scrapes a three-node `dex-ha cluster up` with the
shipped deploy/prometheus.yml and deploy/prometheus/alerts.yml, and we read what it sees
through its HTTP API:

- every target is up and exactly one node counts as active (`sum(dex_active)`, what
  DexHaNoActiveNode reads);
- every dashboard panel's query (deploy/grafana/dex-ha.json) returns data for a cluster
  under load (a Worker running turns whose tool fails its first attempt);
- a planned step-down fires no page-level (severity=critical) alert;
- a standby that falls behind (SIGSTOP while writes go on) fires DexHaFollowerLagging;
- a SIGKILL of the active node fires DexHaMemberUnreachable (the alert of an unplanned
  failover: the new leader cannot reach the old one), which resolves once the killed node
  is restarted; the leader-changes panel then shows the failover.

The generated config differs from the shipped one only in the targets (loopback, free
ports) and the intervals (1 s instead of 5 s). The rule file is the shipped one with the
`for:` of the two warning alerts above shortened (SHORT_FOR): as shipped they wait 30 s and
2 min, longer than this whole test; their expressions and thresholds are unchanged. The
critical alerts keep their shipped `for:`, so "no page on a step-down" is the shipped rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import Connection, DexClient
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.cluster_process import LocalCluster
from harness.prometheus_process import Prometheus, prometheus_binary, prometheus_scraping
from harness.waiting import eventually
from tests.deploy.monitoring_files import dashboard_expressions
from tests.e2e.conftest import running

pytestmark = pytest.mark.skipif(
    prometheus_binary() is None, reason="prometheus is not installed (scripts/test installs the Debian package)"
)

AGENT = "observed"
UNSERVED = "unserved"  # an agent no Worker serves: its steps wait in the dispatch queue
# The `for:` of the shipped warning alerts this test waits for, shortened in the test's copy.
SHORT_FOR = {"DexHaMemberUnreachable": "1s", "DexHaFollowerLagging": "1s"}
ALERT_DEADLINE_S = 20.0


def script(request: ModelRequest) -> dict[str, Any]:
    last = request.history[-1]
    if last["type"] == "user":
        return {"content": "", "tool_calls": [{"name": "flaky_put", "arguments": {"item": last["text"]}}]}
    return {"content": "done", "tool_calls": []}


def observed_agent() -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(script))

    @agent.tool(effect="idempotent_write")
    async def flaky_put(ctx: ToolContext, item: str) -> str:
        if ctx.attempt == 1:  # every call fails once: the dashboard's failed-attempts panel has data
            raise RuntimeError("first attempts fail")
        return item

    return agent


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """Three nodes from `dex-ha cluster up` with strict durability, so fsyncs are measured
    (the fsync panel is empty on a relaxed cluster)."""
    local = LocalCluster(tmp_path / "cluster", relaxed=False)
    try:
        local.up()
        yield local
    finally:
        local.down()


async def queue_a_step_nobody_takes(cluster: LocalCluster, client: DexClient) -> None:
    """A turn of an agent without a Worker: its RunModel step stays queued (the dispatch
    queue panel shows it)."""
    async with Connection(list(cluster.urls.values()), token=cluster.tokens["worker"]) as worker_conn:
        await worker_conn.request(
            "PUT", f"/v1/agents/{UNSERVED}", Agent(UNSERVED, model=ScriptedModel(script)).definition()
        )
    sid = (await client.create_session(UNSERVED)).session_id
    await client.send_message(sid, "wait")


async def turns_forever(client: DexClient) -> None:
    """One session after another, a turn each: steps queue, run, fail once and complete."""
    while True:
        sid = (await client.create_session(AGENT)).session_id
        await client.send_message(sid, "x")
        await client.wait_until_idle(sid, timeout_s=60)


async def writes_forever(client: DexClient) -> None:
    """Committed entries as fast as one loop gets them: sessions nobody sends to."""
    while True:
        with contextlib.suppress(Exception):  # a write during a leader change may fail; go on
            await client.create_session(AGENT, session_id=f"w-{uuid.uuid4().hex}")


@contextlib.asynccontextmanager
async def background(*coros: Any) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


async def one_active_node(prom: Prometheus) -> bool:
    answer = await prom.query("sum(dex_active)")
    return bool(answer) and value(answer[0]) == 1


async def pages(prom: Prometheus) -> list[dict[str, Any]]:
    """Critical alerts pending or firing."""
    return [a for a in await prom.alerts() if a["labels"].get("severity") == "critical"]


async def panels_without_data(prom: Prometheus) -> dict[str, Any]:
    """Dashboard panel queries whose answer has no number (NaN is none: a quantile of a
    histogram that observed nothing): "<panel> / <refId>" -> (the query, its answer)."""
    empty = {}
    for where, expr in dashboard_expressions().items():
        samples = await prom.query(expr)
        if not any(not math.isnan(value(s)) for s in samples):
            empty[where] = (expr, samples)
    return empty


async def assert_panels_get_data(prom: Prometheus, deadline_s: float = 20.0) -> None:
    """Every panel returns data within the deadline (the rates need two scrapes)."""
    empty: dict[str, Any] = {}

    async def every_panel_has_data() -> bool:
        empty.clear()
        empty.update(await panels_without_data(prom))
        return not empty

    with contextlib.suppress(AssertionError):
        await eventually(every_panel_has_data, "every dashboard panel to return data", deadline_s=deadline_s)
    assert not empty, f"dashboard panels without data: {empty}"


async def test_prometheus_scrapes_the_cluster_and_its_alerts_fire_and_resolve(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    targets = {node: url.removeprefix("http://") for node, url in cluster.urls.items()}
    async with prometheus_scraping(targets, tmp_path / "prometheus", SHORT_FOR) as prom:
        urls = list(cluster.urls.values())
        worker = Worker(urls, token=cluster.tokens["worker"], agents=[observed_agent()], max_concurrency=4)
        async with running(worker), DexClient(urls, token=cluster.tokens["client"]) as client:

            async def every_target_up() -> bool:
                active = (await prom.api("targets"))["activeTargets"]
                return len(active) == 3 and all(t["health"] == "up" for t in active)

            await eventually(every_target_up, "Prometheus to scrape all three nodes", deadline_s=20)
            await eventually(lambda: one_active_node(prom), "sum(dex_active) == 1", deadline_s=20)

            await queue_a_step_nobody_takes(cluster, client)
            async with background(*(turns_forever(client) for _ in range(6))):
                # Under load (a step queued for no Worker, turns retrying a tool): every panel has data.
                await assert_panels_get_data(prom)
                await step_down_without_a_page(cluster, prom)
            await lagging_standby_fires_the_lag_alert(cluster, prom, client)
            await failover_alert_fires_and_resolves(cluster, prom)


async def step_down_without_a_page(cluster: LocalCluster, prom: Prometheus) -> None:
    old = await cluster.active_node()
    done = await asyncio.to_thread(
        cluster.run_cli, "step-down", "--url", cluster.urls[old], "--token", cluster.tokens["admin"]
    )
    assert done.returncode == 0, done.stderr
    await cluster.active_node(not_=old)
    await eventually(lambda: one_active_node(prom), "one active node after the step-down", deadline_s=10)
    # Two scrapes taken either side of the move may both show an active node, so
    # DexHaSeveralActiveNodes may go pending: its `for:` (15 s, as shipped) is there to absorb
    # that. A pending alert whose condition clears never fires; wait for every critical alert
    # to clear, and check that none fired meanwhile.
    fired: list[dict[str, Any]] = []

    async def no_page_pending() -> bool:
        now = await pages(prom)
        fired.extend(a for a in now if a["state"] == "firing")
        return not now

    await eventually(no_page_pending, "critical alerts to clear after the step-down", deadline_s=20)
    assert fired == []
    assert await prom.query('ALERTS{severity="critical", alertstate="firing"}') == []
    assert await prom.query('max_over_time(ALERTS{severity="critical", alertstate="firing"}[5m])') == []


async def lagging_standby_fires_the_lag_alert(cluster: LocalCluster, prom: Prometheus, client: DexClient) -> None:
    active = await cluster.active_node()
    standby = next(n for n in cluster.urls if n != active)
    os.kill(cluster.pid(standby), signal.SIGSTOP)
    try:
        async with background(*(writes_forever(client) for _ in range(16))):

            async def lag_alert_firing() -> bool:
                return any(
                    a["labels"]["alertname"] == "DexHaFollowerLagging"
                    and a["labels"]["member"] == standby
                    and a["state"] == "firing"
                    for a in await prom.alerts()
                )

            await eventually(lag_alert_firing, f"DexHaFollowerLagging for {standby}", deadline_s=40)
    finally:
        os.kill(cluster.pid(standby), signal.SIGCONT)
    await eventually(
        lambda: prom_has_no("DexHaFollowerLagging", prom), "the lag alert to resolve after SIGCONT", deadline_s=30
    )


async def prom_has_no(alert: str, prom: Prometheus) -> bool:
    return all(a["labels"]["alertname"] != alert for a in await prom.alerts())


async def failover_alert_fires_and_resolves(cluster: LocalCluster, prom: Prometheus) -> None:
    old = await cluster.active_node()
    cluster.kill(old)
    await cluster.active_node(not_=old, deadline_s=20)

    async def unreachable_firing() -> bool:
        return any(
            a["labels"]["alertname"] == "DexHaMemberUnreachable"
            and a["labels"]["member"] == old
            and a["state"] == "firing"
            for a in await prom.alerts()
        )

    # The expression waits for 5 s of silence (unchanged), then `for:` 1 s.
    await eventually(unreachable_firing, f"DexHaMemberUnreachable for the killed {old}", deadline_s=ALERT_DEADLINE_S)
    changes = await prom.query("max(increase(dex_raft_leader_changes_total[1m]))")
    assert changes and value(changes[0]) > 0, changes
    cluster.restart(old)
    await eventually(
        lambda: prom_has_no("DexHaMemberUnreachable", prom), "DexHaMemberUnreachable to resolve", deadline_s=30
    )
    await eventually(lambda: one_active_node(prom), "one active node after the restart", deadline_s=20)
