"""`dex-ha sessions show` on a real `dex-ha dev` process: a finished session with a tool call
prints its whole conversation (the user's messages, each tool's input and output, the final
answers) and every turn with its steps and attempts; `--history N` prints the latest N items
and says how many earlier ones it left out."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from harness.dev_process import DevProcess, running_dev
from tests.cli import run_cli
from tests.e2e.conftest import running


def script(request: ModelRequest) -> dict[str, Any]:
    """Each user message: look the order up, then answer with what the tool returned."""
    last = request.history[-1]
    if last["type"] == "user":
        order = last["text"].split()[-1]
        return {"content": "Looking it up.", "tool_calls": [{"name": "lookup_order", "arguments": {"order": order}}]}
    return {"content": f"Order {last['output']['order']} has {last['output']['items']} items.", "tool_calls": []}


def make_agent() -> Agent:
    agent = Agent("shop", model=ScriptedModel(script))

    @agent.tool(effect="read")
    async def lookup_order(ctx: ToolContext, order: str) -> dict[str, Any]:
        return {"order": order, "items": len(order)}

    return agent


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevProcess]:
    async with running_dev(tmp_path) as node:
        yield node


async def show(url: str, *args: str) -> str:
    done = await asyncio.to_thread(run_cli, "sessions", "show", *args, "--url", url, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_show_prints_the_whole_conversation_and_every_turn(dev: DevProcess) -> None:
    async with running(Worker([dev.url], agents=[make_agent()], poll_wait_ms=500)):
        async with DexClient(dev.url) as client:
            sid = (await client.create_session("shop", session_id="s-show")).session_id
            for order in ("A17", "B2345"):
                await client.send_message(sid, f"How many items are in order {order}")
                await client.wait_until_idle(sid, timeout_s=30)

    text = await show(dev.url, sid)
    conversation = text.split("conversation (8 items):")[1].split("turns (2):")[0]
    assert "#1 user:\n  How many items are in order A17\n" in conversation
    assert re.search(r'calls lookup_order \(call \S+\) with input \{"order": "A17"\}', conversation)
    assert re.search(r'tool lookup_order \(call \S+\) succeeded, output: \{"items": 3, "order": "A17"\}', conversation)
    assert "#4 assistant:\n  Order A17 has 3 items." in conversation
    assert "#8 assistant:\n  Order B2345 has 5 items." in conversation  # the final answer

    turns = text.split("turns (2):")[1].split("tool calls:")[0]
    for number in (1, 2):  # every turn, not only the current one (there is none: the session is idle)
        steps = turns.split(f"turn {number} ")[1].split("\n\n")[0]
        assert steps.splitlines()[0].split()[1:3] == ["completed", "started"]
        kinds = re.findall(r"^  \S+\s+(RunModel|CallTool)\s+done\s", steps, re.MULTILINE)
        assert kinds == ["RunModel", "CallTool", "RunModel"], steps
        assert re.search(r"CallTool\s+done\s+\S+\s+succeeded\s+1/\d+\s+#1 completed\s+\S+ \(term \d+\)", steps)
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\s+\d+ ms", steps)  # UTC, marked Z
    assert "(times UTC)" in text.splitlines()[0]

    latest = await show(dev.url, sid, "--history", "2")
    conversation = latest.split("conversation (8 items):")[1].split("turns (2):")[0]
    assert "6 earlier items not shown" in conversation
    assert "#7 tool lookup_order" in conversation and "#8 assistant" in conversation
    assert "#6 " not in conversation and "A17" not in conversation
