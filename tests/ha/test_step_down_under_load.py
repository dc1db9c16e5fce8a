"""A planned step down under load: while several sessions have a tool
running, an operator runs `dex-ha step-down` with a short drain timeout.

- Tools that finish inside the drain: their steps have no failed attempt at all (RunModel
  included), and each tool ran once.
- Tools still running when the drain ends follow their rows: the attempt fails
  NOT_COMPLETED and the tool runs again, on the new active node (a later term), and the
  turn completes.
- Readiness moves without overlap: the old node answers 503 (draining) before the new one
  answers 200.
The evidence: the Worker's own ledger of tool runs, and every attempt in the nodes' state
databases.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from dex_ha.client import DexClient
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.cluster_process import cluster_view
from harness.proxied_cluster import ProxiedCluster
from harness.readiness_record import ReadinessRecorder
from harness.scenario import all_caught_up, attempts_on_disk
from harness.waiting import eventually
from tests.e2e.conftest import running

AGENT = "drain"
QUICK_SESSIONS = 4
SLOW_SESSIONS = 2
QUICK_TOOL_S = 0.3  # after the drain began
DRAIN_TIMEOUT_MS = 2_500  # well past the quick tools, well before the slow ones would end
DEADLINE_S = 45.0


class Ledger:
    """What the Worker ran (outside the server): (tool, session id, attempt)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, int]] = []
        self.running = 0
        self.all_running = asyncio.Event()
        self.draining = asyncio.Event()  # set by the test once the old node says it drains

    def started(self, tool: str, ctx: ToolContext) -> None:
        self.runs.append((tool, ctx.session_id, ctx.attempt))
        self.running += 1
        if self.running == QUICK_SESSIONS + SLOW_SESSIONS:
            self.all_running.set()


def script(request: ModelRequest) -> dict[str, Any]:
    last = request.history[-1]
    if last["type"] == "user":
        tool = last["text"].split("-")[0]  # "quick-1" -> quick
        return {"content": "working", "tool_calls": [{"id": f"c-{last['text']}", "name": tool, "arguments": {}}]}
    return {"content": "done", "tool_calls": []}


def make_agent(ledger: Ledger) -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(script))

    @agent.tool(effect="idempotent_write")
    async def quick(ctx: ToolContext) -> str:
        ledger.started("quick", ctx)
        await ledger.draining.wait()  # so that it surely finishes inside the drain, not before it
        await asyncio.sleep(QUICK_TOOL_S)
        return "quick done"

    @agent.tool(effect="idempotent_write")
    async def slow(ctx: ToolContext) -> str:
        ledger.started("slow", ctx)
        if ctx.attempt == 1:
            await asyncio.Event().wait()  # runs until the Worker learns the attempt was failed
        return "slow done"

    return agent


async def test_step_down_under_load_keeps_finished_steps_and_moves_the_rest(proxied: ProxiedCluster) -> None:
    ledger = Ledger()
    urls = list(proxied.urls.values())
    worker = Worker(
        urls,
        token=proxied.tokens["worker"],
        agents=[make_agent(ledger)],
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.2,
        drain_timeout_s=1.0,
    )
    async with running(worker), DexClient(urls, token=proxied.tokens["client"]) as client:
        texts = [f"quick-{i}" for i in range(QUICK_SESSIONS)] + [f"slow-{i}" for i in range(SLOW_SESSIONS)]
        sessions = {text: (await client.create_session(AGENT)).session_id for text in texts}
        for text, sid in sessions.items():
            await client.send_message(sid, text)
        await asyncio.wait_for(ledger.all_running.wait(), DEADLINE_S)
        old = await proxied.active_node()
        async with ReadinessRecorder(proxied.probe_urls) as record:
            step_down = asyncio.create_task(
                asyncio.to_thread(
                    proxied.run_cli,
                    "step-down",
                    "--url",
                    proxied.urls[old],
                    f"--token={proxied.tokens['admin']}",
                    "--drain-timeout-ms",
                    str(DRAIN_TIMEOUT_MS),
                )
            )
            await eventually(lambda: role_of(proxied, old, "draining"), f"{old} to drain")
            ledger.draining.set()
            done = await step_down
            assert done.returncode == 0, f"step-down failed:\n{done.stdout}\n{done.stderr}"
            new = await proxied.active_node(DEADLINE_S, not_=old)
            await record.next_round()
        finals = {text: await client.wait_until_idle(sid, timeout_s=DEADLINE_S) for text, sid in sessions.items()}

    assert all(final.turns[-1].status == "completed" for final in finals.values())
    assert_readiness_moved_once(record, old, new)
    await all_caught_up(proxied, proxied.node_ids)
    attempts = attempts_on_disk(proxied.plan.node(new).data_dir)
    runs = Counter((tool, sid) for tool, sid, _ in ledger.runs)
    for text, sid in sessions.items():
        mine = [a for a in attempts if a.session_id == sid]
        if text.startswith("quick"):
            assert [a.status for a in mine] == ["completed"] * len(mine) and len(mine) >= 3, mine  # model, tool, model
            assert runs[("quick", sid)] == 1
        else:
            tool = [a for a in mine if a.call_id == f"c-{text}"]
            assert [(a.status, a.progress) for a in tool] == [("failed", "NOT_COMPLETED"), ("completed", None)]
            assert tool[1].term > tool[0].term, "the second attempt was not handed out by the new active node"
            assert runs[("slow", sid)] == 2


async def role_of(cluster: ProxiedCluster, node_id: str, role: str) -> bool:
    view = await cluster_view(cluster.urls[node_id], cluster.tokens["admin"])
    return view is not None and view["role"] == role


def assert_readiness_moved_once(record: ReadinessRecorder, old: str, new: str) -> None:
    assert record.overlapping_rounds() == []
    last_old = record.last_ready(old)
    first_new = record.first_ready(0.0, {new})
    assert last_old is not None and first_new is not None
    assert last_old.round < first_new.round, record.describe_around(first_new.at)
