"""An in-process agent for failover tests: each user message makes the model call one
idempotent-write tool. "failover" calls `slow_put`, whose first attempt runs until its node
dies under it (the test kills the node once `first_attempt_running` is set); any other text
calls `steady_put`, which takes a second (well inside a drain). `Ledger` records every run
with its idempotency key and attempt."""

from __future__ import annotations

import asyncio
from typing import Any

from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext

AGENT = "ha"


class Ledger:
    def __init__(self) -> None:
        self.runs: list[tuple[str, str, int]] = []  # (tool, idempotency key, attempt)
        self.first_attempt_running = asyncio.Event()
        self.cancelled: list[int] = []


def script(request: ModelRequest) -> dict[str, Any]:
    last = request.history[-1]
    if last["type"] == "user":
        tool = "slow_put" if last["text"] == "failover" else "steady_put"
        return {
            "content": "on it",
            "tool_calls": [{"id": f"c-{last['text']}", "name": tool, "arguments": {"item": last["text"]}}],
        }
    return {"content": "all done", "tool_calls": []}


def make_agent(ledger: Ledger) -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(script))

    @agent.tool(effect="idempotent_write")
    async def slow_put(ctx: ToolContext, item: str) -> str:
        ledger.runs.append(("slow_put", ctx.idempotency_key or "", ctx.attempt))
        if ctx.attempt == 1:  # the first attempt runs until its node dies under it
            ledger.first_attempt_running.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                ledger.cancelled.append(ctx.attempt)
                raise
        return f"stored {item}"

    @agent.tool(effect="idempotent_write")
    async def steady_put(ctx: ToolContext, item: str) -> str:
        ledger.runs.append(("steady_put", ctx.idempotency_key or "", ctx.attempt))
        ledger.first_attempt_running.set()
        await asyncio.sleep(1.0)  # well within the drain timeout
        return f"stored {item}"

    return agent


def attempts_of(snapshot: dict[str, Any], call_id: str) -> list[dict[str, Any]]:
    call = next(c for c in snapshot["tool_calls"] if c["call_id"] == call_id)
    return [a for step in call["steps"] for a in step["attempts"]]
