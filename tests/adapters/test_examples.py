"""The adapters' examples really run: each against a real `dex-ha dev`, with the fake OpenAI
server in place of api.openai.com (OPENAI_BASE_URL), through a whole turn of two tool steps."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from harness.dev_process import DevProcess
from tests.crash.harness import REPO, env_with_repo
from tests.support.fake_openai import Call, FakeOpenAI, RecordedRequest, Reply

DEADLINE_S = 90.0  # the example's process imports the SDK and warms it up on its first call


def tool_outputs(request: RecordedRequest) -> list[str]:
    """The tool results a model call saw (Responses API or Chat Completions)."""
    items = request.body.get("input") or request.body.get("messages") or []
    return [
        str(item.get("output") or item.get("content"))
        for item in items
        if item.get("type") == "function_call_output" or item.get("role") == "tool"
    ]


def support_model(request: RecordedRequest) -> Reply:
    """Look the order up, then refund it, then answer."""
    seen = tool_outputs(request)
    if not seen:
        return Reply("Let me look the order up.", [Call("lookup_order", {"order_id": "A17"}, call_id="call_look")])
    if len(seen) == 1:
        return Reply(tool_calls=[Call("refund", {"order_id": "A17", "cents": 1299}, call_id="call_refund")])
    return Reply("Order A17 is refunded: 12.99.")


@pytest.mark.parametrize("example", ["openai_agents_agent.py", "pydantic_ai_agent.py"])
async def test_the_example_runs_a_turn_against_dev_and_the_fake_openai(tmp_path: Path, example: str) -> None:
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log", relaxed=True)
    server.start()
    try:
        await server.wait_ready()
        async with FakeOpenAI(support_model) as fake:
            env = env_with_repo({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake.base_url})
            env.pop("OPENAI_MODEL", None)
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(REPO / "examples" / example),
                server.url,
                env=env,
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                stdout, stderr = await asyncio.wait_for(process.communicate(), DEADLINE_S)
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    finally:
        server.stop()
    assert process.returncode == 0, stderr.decode()[-3000:]
    lines = stdout.decode().splitlines()
    assert lines[-1] == "answer: Order A17 is refunded: 12.99."
    assert "Let me look the order up." in lines
    assert "  -> refund({'cents': 1299, 'order_id': 'A17'})" in lines
    # The model saw both results; the refund's carried the call's idempotency key.
    assert all(request.body["model"] == "gpt-4.1-mini" for request in fake.requests)
    last = tool_outputs(fake.requests[-1])
    assert '"status": "delivered"' in last[0].replace('":"', '": "')
    assert "refunded 1299 cents on A17 (key " in last[1] and last[1].endswith(":call_refund)")
