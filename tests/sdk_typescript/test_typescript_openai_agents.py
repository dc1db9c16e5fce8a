"""The TypeScript adapter for the OpenAI Agents SDK for JS (`@dex-ha/sdk/openai-agents`) on a
real `dex-ha dev`: a TypeScript Worker (a `node` process) serves an `@openai/agents` agent
whose model is the SDK's own OpenAI model, pointed at the fake OpenAI API
(harness/fake_models/openai_api.py) by the client's base URL; the Python DexClient drives a turn.

Evidence from outside the Worker: the turn's steps and tool calls in the snapshot, and the
requests the fake received (what each model call saw)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dex_ha.client import DexClient
from harness.dev_process import DevProcess
from harness.fake_models.openai_api import Call, FakeOpenAI, RecordedRequest, Reply
from harness.typescript_sdk import node_missing, running_node_program

pytestmark = pytest.mark.skipif(node_missing() is not None, reason=str(node_missing()))

AGENT = "ts-openai-agents"
DEADLINE_S = 30.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
def ts_worker(dev: DevProcess, fake: FakeOpenAI, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    args = ["--url", dev.url, "--agent", AGENT, "--openai-base-url", fake.base_url]
    with running_node_program("openai_agents_worker", args, tmp_path / "worker.log") as proc:
        yield proc


def has_tool_results(request: RecordedRequest) -> bool:
    return any(item.get("type") == "function_call_output" for item in request.body.get("input") or [])


async def test_an_openai_agents_turn_runs_as_model_tool_model_steps(
    dev: DevProcess, fake: FakeOpenAI, ts_worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    fake.script = lambda request: (
        Reply("Order A17 has shipped.")
        if has_tool_results(request)
        else Reply("Let me check.", [Call("lookup", {"order": "A17"}, call_id="call_look")])
    )
    async with DexClient([dev.url], backoff_max_s=0.2) as client:
        session = await client.create_session(AGENT)
        await client.send_message(session.session_id, "Where is my order A17?")
        snapshot = await client.wait_until_idle(session.session_id, timeout_s=DEADLINE_S)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert ts_worker.poll() is None, log
    [turn] = snapshot.turns
    assert turn.status == "completed", (turn, log)
    assert [(step.kind, step.status) for step in turn.steps] == [
        ("RunModel", "done"),
        ("CallTool", "done"),
        ("RunModel", "done"),
    ], log
    [call] = snapshot.tool_calls
    expected = {"order": "A17", "status": "shipped", "key": f"{session.session_id}:call_look"}
    assert (call.name, call.effect, call.status, call.output) == ("lookup", "read", "succeeded", expected)
    assert snapshot.history[-1]["type"] == "assistant"
    assert snapshot.history[-1]["content"] == "Order A17 has shipped."

    # What each model call saw: the agent's instructions, its tool, then the call and its result.
    first, second = fake.bodies("/v1/responses")
    assert first["instructions"] == "You help customers." and first["stream"] is True
    assert [tool["name"] for tool in first["tools"]][0] == "lookup"
    outputs = [item for item in second["input"] if item.get("type") == "function_call_output"]
    assert [(item["call_id"], json.loads(item["output"])) for item in outputs] == [("call_look", expected)]
