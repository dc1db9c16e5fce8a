"""Task tokens across a SIGKILL of the active node, on a three-node `dex-ha cluster up`
(real processes). The test plays the Worker with plain HTTP, so it sees every status code.

Before the kill the active node hands two tasks to Worker A: one keeps running, one is
completed. After the kill the new active node, which never handed anything out, knows both
tokens (their secrets were replicated with the hand-outs) and answers consistently:

- the running task's heartbeat from A: 409 stale_attempt (the takeover failed the attempt),
  not 404 (an unknown token) or 403 (someone else's task);
- A's retry of the completed task's result: 200, the result stands (crash row R19);
- the same tokens from Worker B: 403; a made-up secret: 404;
- and the tasks it hands out itself work as well.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from harness.cluster_process import LocalCluster

AGENT = "tokens"
OWNER, OTHER = "worker-a", "worker-b"
MADE_UP_SECRET = "0123456789abcdef" * 2
DEADLINE_S = 30.0


class Http:
    """Plain HTTP to one node with the cluster's tokens; answers are (status, JSON body)."""

    def __init__(self, session: aiohttp.ClientSession, cluster: LocalCluster, node_id: str) -> None:
        self.session, self.url, self.tokens = session, cluster.urls[node_id], cluster.tokens

    async def call(self, method: str, path: str, role: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"}
        async with self.session.request(
            method, self.url + path, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=DEADLINE_S)
        ) as response:
            return response.status, await response.json()

    async def report(self, token: str, action: str, worker_id: str, **body: Any) -> tuple[int, Any]:
        return await self.call("POST", f"/v1/worker/tasks/{token}/{action}", "worker", {"worker_id": worker_id, **body})

    async def poll(self, worker_id: str, want: int) -> list[dict[str, Any]]:
        """Poll until `want` tasks were handed to `worker_id` (each poll waits up to 5 s)."""
        tasks: list[dict[str, Any]] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(tasks) < want and time.monotonic() < deadline:
            status, body = await self.call(
                "POST",
                "/v1/worker/poll",
                "worker",
                {"worker_id": worker_id, "agents": [AGENT], "max_tasks": want - len(tasks), "wait_ms": 5_000},
            )
            assert status == 200, body
            tasks += body["tasks"]
        assert len(tasks) == want, f"expected {want} tasks within {DEADLINE_S} s, got {tasks}"
        return tasks

    async def start_turn(self, session_id: str) -> None:
        created = await self.call("POST", "/v1/sessions", "client", {"agent": AGENT, "session_id": session_id})
        assert created[0] == 201, created
        sent = await self.call("POST", f"/v1/sessions/{session_id}/messages", "client", {"text": "hi"})
        assert sent[0] == 202, sent

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/v1/sessions/{session_id}", "client")
        assert status == 200, body
        return body


def answer(text: str) -> dict[str, Any]:
    return {"content": text, "tool_calls": []}


def forged(token: str) -> str:
    """The same attempt with a made-up secret."""
    return token.rsplit("-", 1)[0] + "-" + MADE_UP_SECRET


async def test_the_new_active_node_answers_the_old_ones_tokens_consistently(cluster: LocalCluster) -> None:
    old = await cluster.active_node()
    async with aiohttp.ClientSession() as session:
        before = Http(session, cluster, old)
        assert (await before.call("PUT", f"/v1/agents/{AGENT}", "worker", {"tools": []}))[0] == 200
        await before.start_turn("s-running")
        await before.start_turn("s-done")
        tasks = {t["session_id"]: t for t in await before.poll(OWNER, want=2)}
        running, done = tasks["s-running"]["task_token"], tasks["s-done"]["task_token"]
        assert await before.report(running, "heartbeat", OWNER) == (200, {"cancel": False})
        assert (await before.report(done, "complete", OWNER, result=answer("before the kill")))[0] == 200

        cluster.kill(old)
        new = await cluster.active_node(not_=old)  # ready: its takeover is done
        after = Http(session, cluster, new)

        status, body = await after.report(running, "heartbeat", OWNER)
        assert (status, body["error"]) == (409, "stale_attempt"), body
        status, body = await after.report(done, "complete", OWNER, result=answer("before the kill"))
        assert status == 200, body  # R19: the retry of a committed result is ok
        for token, action, extra in (
            (running, "heartbeat", {}),
            (running, "fail", {"error": "x"}),
            (done, "complete", {"result": answer("B's answer")}),
        ):
            status, body = await after.report(token, action, OTHER, **extra)
            assert (status, body["error"]) == (403, "forbidden") and "worker_id" in body["message"], body
            status, body = await after.report(forged(token), action, OWNER, **extra)
            assert (status, body["error"]) == (404, "not_found"), body

        finished = await after.snapshot("s-done")
        assert finished["history"][-1]["content"] == "before the kill"
        assert finished["turns"][-1]["status"] == "completed"
        [step] = (await after.snapshot("s-running"))["current_turn"]["steps"]
        assert [a["status"] for a in step["attempts"]] == ["failed"]
        assert "lost its lease" in step["attempts"][0]["error"]

        # The step runs again (after its backoff) from the new node, whose tokens work too.
        [again] = await after.poll(OWNER, want=1)
        assert (again["session_id"], again["attempt"]) == ("s-running", 2)
        assert await after.report(again["task_token"], "heartbeat", OWNER) == (200, {"cancel": False})
        completed = await after.report(again["task_token"], "complete", OWNER, result=answer("after the kill"))
        assert completed[0] == 200, completed
        assert (await after.snapshot("s-running"))["history"][-1]["content"] == "after the kill"
