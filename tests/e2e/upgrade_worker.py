"""A Worker in a process of its own, run with whichever release's code PYTHONPATH names
(the rolling-upgrade test runs it on 0.1.0 while the nodes are upgraded under it).

    python tests/e2e/upgrade_worker.py TOKEN URL [URL ...]

Its agent (AGENT) answers each user message with one call of the `put` tool, then a final
answer; `put` takes a moment, so that steps are running when a node stops.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker

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


async def main(token: str, urls: list[str]) -> None:
    worker = Worker(urls, token=token, agents=[make_agent()], poll_wait_ms=1_000, drain_timeout_s=2.0)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
