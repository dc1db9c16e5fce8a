"""Backup under load and restore into a fresh three-node cluster (real processes).

A three-node cluster serves clients that keep creating sessions and a Worker that runs
their turns (a tool call each, and compaction, so sessions carry a summary). While that
goes on, `dex-ha backup` takes a backup. A NEW three-node cluster is then seeded with
`dex-ha restore` on each node from that one file, and:

- every session whose work had ended before the backup started is there, identical
  (`GET /v1/sessions/{id}`, summary and history included) to the source's;
- every session the backup holds is the source session at one earlier point: its history
  is a prefix of the source's (the backup is one point in the log, never a mix);
- every session acknowledged before the backup started is there;
- the restored cluster runs a new turn on a restored session, after its summary.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from dex_ha.client import DexClient, SessionSummary
from dex_ha.server.backup import read_backup
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.cluster_process import LocalCluster
from harness.waiting import eventually
from tests.e2e.conftest import cluster, running  # noqa: F401  (cluster: the source's fixture)

AGENT = "bk"
TURNS_PER_SESSION = 2
CLIENTS = 3
DEADLINE_S = 45.0
# The sessions a client finished before the backup began; enough for a meaningful check.
SETTLED_BEFORE_BACKUP = 6


def script(request: ModelRequest) -> dict[str, Any]:
    """Each user message: one tool call, then a closing answer that names the message."""
    last = request.history[-1]
    if last["type"] == "user":
        return {"content": f"saving {last['text']}", "tool_calls": [{"name": "put", "arguments": {"v": last["text"]}}]}
    return {"content": f"saved ({last['type']})", "tool_calls": []}


def make_agent() -> Agent:
    # Compaction after a few items: a session's second turn starts with a summary of its first.
    agent = Agent(AGENT, model=ScriptedModel(script), compaction={"max_items": 4})

    @agent.tool(effect="idempotent_write")
    async def put(ctx: ToolContext, v: str) -> str:
        await asyncio.sleep(0.02)
        return f"stored {v}"

    return agent


class Load:
    """Clients that create sessions and run TURNS_PER_SESSION turns in each, recording when
    each session was acknowledged and when its last turn was seen finished."""

    def __init__(self, client: DexClient) -> None:
        self.client = client
        self.created: dict[str, float] = {}  # session id -> when its creation was acknowledged
        self.settled: dict[str, float] = {}  # session id -> when it was seen idle after its last turn
        self.stop = asyncio.Event()

    async def run_client(self, number: int) -> None:
        n = 0
        while not self.stop.is_set():
            sid = f"c{number}-s{n}"
            n += 1
            await self.client.create_session(AGENT, session_id=sid)
            self.created[sid] = time.monotonic()
            for turn in range(TURNS_PER_SESSION):
                await self.client.send_message(sid, f"{sid} turn {turn}", message_id=f"{sid}-m{turn}")
                await self.client.wait_until_idle(sid, timeout_s=DEADLINE_S)
            self.settled[sid] = time.monotonic()


def history_texts(snapshot: dict[str, Any]) -> list[tuple[int, str, Any]]:
    return [
        (item["seq"], item["type"], item.get("text") or item.get("content") or item.get("output"))
        for item in snapshot["history"]
    ]


def restore_into(target: LocalCluster, backup: Path) -> None:
    """`dex-ha restore` on each node of the target cluster: same file, same member list."""
    for node_id in ("n1", "n2", "n3"):
        done = target.run_cli(
            "restore",
            str(backup),
            "--data-dir",
            str(target.dir / node_id),
            "--node-id",
            node_id,
            "--members",
            "n1,n2,n3",
            "--relaxed",
        )
        assert done.returncode == 0, f"restore {node_id} failed:\n{done.stdout}\n{done.stderr}"


async def test_backup_under_load_restores_into_a_new_cluster(
    cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    source_urls = list(cluster.urls.values())
    worker = Worker(
        source_urls,
        token=cluster.tokens["worker"],
        agents=[make_agent()],
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.2,
        drain_timeout_s=1.0,
    )
    backup = tmp_path / "cluster.dexbak"
    async with running(worker), DexClient(source_urls, token=cluster.tokens["client"]) as client:
        load = Load(client)
        clients = [asyncio.create_task(load.run_client(n)) for n in range(CLIENTS)]
        await eventually(
            lambda: len(load.settled) >= SETTLED_BEFORE_BACKUP, "sessions to finish before the backup", DEADLINE_S
        )
        backup_started = time.monotonic()
        settled_before = {sid for sid, at in load.settled.items() if at < backup_started}
        created_before = {sid for sid, at in load.created.items() if at < backup_started}
        done = await asyncio.to_thread(
            cluster.run_cli,
            "backup",
            "--url",
            source_urls[0],
            f"--token={cluster.tokens['admin']}",
            "--out",
            str(backup),
        )
        assert done.returncode == 0, f"backup failed:\n{done.stdout}\n{done.stderr}"
        assert "backup written to" in done.stdout
        # The load went on during the backup, and goes on a little after it.
        created_at_backup = len(load.created)
        await eventually(
            lambda: len(load.created) > created_at_backup + 1, "more sessions after the backup", DEADLINE_S
        )
        load.stop.set()
        await asyncio.wait_for(asyncio.gather(*clients), DEADLINE_S)
        source = {sid: (await client.get_session(sid)).raw for sid in load.created}
    header, _ = read_backup(backup)

    target = LocalCluster(tmp_path / "restored")
    restore_into(target, backup)
    try:
        target.up()
        urls = list(target.urls.values())
        async with DexClient(urls, token=target.tokens["client"]) as restored_client:
            restored_ids = {s.session_id for s in await list_all(restored_client)}
            restored = {sid: (await restored_client.get_session(sid)).raw for sid in restored_ids}
            check_restored_sessions(source, restored, settled_before, created_before)
            await run_a_new_turn(target, restored_client, sorted(settled_before)[0], restored)
        assert await target_term(target) > header.term  # a new cluster, above the backup's term
    finally:
        target.down()


async def list_all(client: DexClient) -> list[SessionSummary]:
    sessions: list[SessionSummary] = []
    after = None
    while True:
        page = await client.list_sessions(agent=AGENT, limit=1000, after=after)
        sessions += page.sessions
        after = page.next_after
        if after is None:
            return sessions


def check_restored_sessions(
    source: dict[str, dict[str, Any]],
    restored: dict[str, dict[str, Any]],
    settled_before: set[str],
    created_before: set[str],
) -> None:
    assert created_before <= set(restored), f"acknowledged before the backup, missing: {created_before - set(restored)}"
    assert set(restored) <= set(source), "the restore holds sessions the source never had"
    for sid in settled_before:
        assert restored[sid] == source[sid], f"session {sid} differs from the source"
        assert restored[sid]["summary"] is not None and restored[sid]["summary"]["text"], sid
        assert len(restored[sid]["turns"]) == TURNS_PER_SESSION
    for sid, snapshot in restored.items():  # one point in the log: each session at some earlier state
        mine, theirs = history_texts(snapshot), history_texts(source[sid])
        assert mine == theirs[: len(mine)], f"session {sid}: the restored history is not a prefix of the source's"
    assert len(restored) > len(settled_before), "the backup should have caught sessions mid-way, under load"


async def run_a_new_turn(
    target: LocalCluster, client: DexClient, sid: str, restored: dict[str, dict[str, Any]]
) -> None:
    before = restored[sid]
    worker = Worker(
        list(target.urls.values()),
        token=target.tokens["worker"],
        agents=[make_agent()],
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.2,
        drain_timeout_s=1.0,
    )
    async with running(worker):
        await client.send_message(sid, "after the restore", message_id=f"{sid}-restored")
        after = (await client.wait_until_idle(sid, timeout_s=DEADLINE_S)).raw
    assert len(after["turns"]) == TURNS_PER_SESSION + 1 and after["turns"][-1]["status"] == "completed"
    assert history_texts(after)[: len(before["history"])] == history_texts(before)
    new_items = [item for item in after["history"] if item["seq"] > before["history"][-1]["seq"]]
    assert [i["type"] for i in new_items] == ["user", "assistant", "tool_result", "assistant"], new_items
    assert new_items[0]["text"] == "after the restore"
    assert after["summary"]["upto_seq"] >= before["summary"]["upto_seq"]


async def target_term(target: LocalCluster) -> int:
    from harness.cluster_process import cluster_view

    views = [await cluster_view(url, target.tokens["admin"]) for url in target.urls.values()]
    return max(v["term"] for v in views if v is not None)
