"""Row R19 of the crash matrix on `dex-ha dev`: the Worker sent a result and the node died
before or after committing it. Server failpoints (DEX_HA_FAILPOINTS) hit the moment that
timing alone cannot; the Worker keeps running and the node restarts on its data.

Either the result is committed (and the Worker's retry gets 200: the tool ran once), or
the attempt fails and follows its row (a read runs again, with the same idempotency key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient, Session
from dex_ha.failpoints import FAILPOINT_ENV, FAILPOINT_EXIT_CODE
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.dev_process import DevProcess
from harness.waiting import eventually
from tests.e2e.conftest import running

DEADLINE_S = 30.0


def script(request: ModelRequest) -> dict[str, Any]:
    if request.history[-1]["type"] == "user":
        return {"content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"q": "x"}}]}
    return {"content": "done", "tool_calls": []}


def attempts(snapshot: Session, kind: str) -> list[str]:
    steps = [s for c in snapshot.tool_calls for s in c.steps if s.kind == kind]
    return [a.status for s in steps for a in s.attempts]


@pytest.mark.parametrize(
    "failpoint, tool_runs, call_attempts",
    [
        # Died before proposing: the attempt fails at the restart's takeover; the read runs again.
        ("server.complete.before-propose", 2, ["failed", "completed"]),
        # Died after committing: the result stands; the Worker's retry is answered 200, no re-run.
        ("server.complete.after-commit", 1, ["completed"]),
    ],
)
async def test_a_result_in_flight_when_the_node_dies_is_committed_or_its_attempt_fails(
    tmp_path: Path, failpoint: str, tool_runs: int, call_attempts: list[str]
) -> None:
    runs: list[tuple[str, int]] = []
    agent = Agent("r19", model=ScriptedModel(script))

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, q: str) -> str:
        runs.append((ctx.idempotency_key or "", ctx.attempt))
        return f"found {q}"

    # The 2nd result is the tool's (the 1st is the model's call of it).
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log", extra_env={FAILPOINT_ENV: f"{failpoint}@2"})
    server.start()
    first = server.proc
    assert first is not None
    worker = Worker(server.url, agents=[agent], poll_wait_ms=1_000, heartbeat_interval_s=0.2)
    try:
        async with running(worker), DexClient(server.url) as client:
            await server.wait_ready()
            sid = (await client.create_session("r19")).session_id
            await client.send_message(sid, "look it up")
            await eventually(
                lambda: first.poll() is not None,
                "the server to exit at the failpoint",
                DEADLINE_S,
                interval_s=0.02,
            )
            assert first.poll() == FAILPOINT_EXIT_CODE, f"the failpoint was not reached\n{server.log_tail()}"
            server.extra_env = {}
            server.start()  # same port and data dir; the Worker and the client were never told
            final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    finally:
        server.stop()
    assert final.turns[-1].status == "completed"
    call = final.tool_calls[0]
    assert call.status == "succeeded" and call.output == "found x"
    assert attempts(final, "CallTool") == call_attempts
    assert [key for key, _ in runs] == [f"{sid}:c1"] * tool_runs  # same key on every run
