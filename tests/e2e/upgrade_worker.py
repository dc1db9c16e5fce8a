"""The agent of a Worker process run with whichever release's code PYTHONPATH names (the
rolling-upgrade test runs it on 0.1.0 while the nodes are upgraded under it), so the
launcher loads this file by its path and it imports nothing but `dex_ha.worker`:

    python harness/worker_process.py tests/e2e/upgrade_worker.py --urls URL[,URL...] --token TOKEN

Its agent (AGENT) answers each user message with one call of the `put` tool, then a final
answer; `put` takes a moment, so that steps are running when a node stops.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext

AGENT = "upgrade"


def script(request: ModelRequest) -> dict[str, Any]:
    last = request.history[-1]
    if last["type"] == "user":
        call = {"id": "c-" + last["text"], "name": "put", "arguments": {"item": last["text"]}}
        return {"content": "storing", "tool_calls": [call]}
    return {"content": "stored", "tool_calls": []}


def make_agent() -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(script))

    @agent.tool(effect="idempotent_write")
    async def put(ctx: ToolContext, item: str) -> str:
        await asyncio.sleep(0.05)
        return f"stored {item}"

    return agent


def agents(args: argparse.Namespace) -> list[Agent]:
    return [make_agent()]
