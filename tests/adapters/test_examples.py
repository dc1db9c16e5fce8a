"""The adapters' examples really run: each against a real `dex-ha dev`, with the fake OpenAI
server in place of api.openai.com (OPENAI_BASE_URL), or the fake Anthropic API in place of
api.anthropic.com (ANTHROPIC_BASE_URL) for the Claude Agent SDK's, through a whole turn of
two tool steps."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.dev_process import DevProcess
from harness.fake_models.anthropic_api import FakeAnthropic, tool_use
from harness.fake_models.anthropic_api import Reply as AnthropicReply
from harness.fake_models.openai_api import Call, FakeOpenAI, RecordedRequest, Reply
from harness.processes import REPO_ROOT, env_with_checkout
from tests.support.claude_segment import cli_missing_reason, tools_used

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


async def run_example(example: str, url: str, env: dict[str, str], cwd: Path) -> tuple[str, str, int]:
    """Run examples/`example` against `url` to its end (killed past the deadline)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO_ROOT / "examples" / example),
        url,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), DEADLINE_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return stdout.decode(), stderr.decode(), process.returncode


@pytest.mark.parametrize("example", ["openai_agents_agent.py", "pydantic_ai_agent.py"])
async def test_the_example_runs_a_turn_against_dev_and_the_fake_openai(tmp_path: Path, example: str) -> None:
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log", relaxed=True)
    server.start()
    try:
        await server.wait_ready()
        async with FakeOpenAI(support_model) as fake:
            env = {**env_with_checkout(), "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake.base_url}
            env.pop("OPENAI_MODEL", None)
            stdout, stderr, returncode = await run_example(example, server.url, env, cwd=REPO_ROOT)
    finally:
        server.stop()
    assert returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    assert lines[-1] == "answer: Order A17 is refunded: 12.99."
    assert "Let me look the order up." in lines
    assert "  -> refund({'cents': 1299, 'order_id': 'A17'})" in lines
    # The model saw both results; the refund's carried the call's idempotency key.
    assert all(request.body["model"] == "gpt-4.1-mini" for request in fake.requests)
    last = tool_outputs(fake.requests[-1])
    assert '"status": "delivered"' in last[0].replace('":"', '": "')
    assert "refunded 1299 cents on A17 (key " in last[1] and last[1].endswith(":call_refund)")


def claude_support_model(body: dict[str, Any]) -> AnthropicReply:
    """examples/claude_agent_agent.py's turn: look the order up, refund it, answer; decided
    from what the request shows, so a repeated segment gets the same answers."""
    used = tools_used(body)
    if "mcp__dex__refund" in used:
        return AnthropicReply.of("Order A17 is refunded: 12.99.")
    if "mcp__dex__lookup_order" in used:
        return AnthropicReply.of(tool_use("mcp__dex__refund", {"order_id": "A17", "cents": 1299}))
    return AnthropicReply.of("Let me look the order up.", tool_use("mcp__dex__lookup_order", {"order_id": "A17"}))


@pytest.mark.skipif(cli_missing_reason() is not None, reason=str(cli_missing_reason()))
async def test_the_claude_agent_example_runs_a_turn_against_dev_and_the_fake_anthropic(tmp_path: Path) -> None:
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log", relaxed=True)
    server.start()
    try:
        await server.wait_ready()
        async with FakeAnthropic(responder=claude_support_model) as fake:
            env = {
                **env_with_checkout(),
                "ANTHROPIC_API_KEY": "sk-test-fake",
                "ANTHROPIC_BASE_URL": fake.base_url,
                "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude-config"),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
            }
            env.pop("CLAUDE_MODEL", None)
            stdout, stderr, returncode = await run_example("claude_agent_agent.py", server.url, env, cwd=tmp_path)
            bodies = fake.bodies()
    finally:
        server.stop()
    assert returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    assert lines[-1] == "answer: Order A17 is refunded: 12.99.", stdout
    assert lines[:2] == ["  -> lookup_order({'order_id': 'A17'})", "  -> refund({'cents': 1299, 'order_id': 'A17'})"], (
        stdout
    )
    assert all(body["model"] == "claude-sonnet-4-5" for body in bodies)
    # The refund's result (a tool step of its own) reached the model, with the call's key.
    results = [
        str(block.get("content"))
        for message in bodies[-1]["messages"]
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert any("refunded 1299 cents on A17 (key " in r for r in results), results
