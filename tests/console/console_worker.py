"""A Worker as its own process for the console's browser tests; the tests SIGKILL it.

    python -m tests.console.console_worker URL LEDGER [TOKEN]

It runs the agent `console`, whose model streams its words and answers by the last user
message:
  - "refund ..." calls `refund`, a write that needs approval: it records its run in the
    ledger and returns;
  - "charge ..." calls `charge`, a write that records its start in the ledger and then
    never returns, so the test can kill this process while the call runs (the call then
    ends as outcome_unknown);
  - "story ...": a long text answer (about half a second of streamed words);
  - anything else, or a tool result: a short text answer.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker
from tests.crash.ledger import Ledger

AGENT = "console"
WORD_DELAY_S = 0.02  # the words stream live, one by one
STORY = " ".join(["Once upon a time an agent ran a long turn while its page read the session."] * 2)


def answer(request: ModelRequest) -> dict[str, Any]:
    last = request.history[-1]
    if last["type"] == "user" and last["text"].startswith("refund"):
        return {
            "content": "I will refund order A17 once you approve.",
            "tool_calls": [{"id": None, "name": "refund", "arguments": {"order_id": "A17", "cents": 500}}],
        }
    if last["type"] == "user" and last["text"].startswith("charge"):
        return {
            "content": "Charging the card now.",
            "tool_calls": [{"id": None, "name": "charge", "arguments": {"order_id": "B9", "cents": 900}}],
        }
    if last["type"] == "user" and last["text"].startswith("story"):
        return {"content": STORY}
    if last["type"] == "tool_result":
        return {"content": f"The {last['name']} call ended: {last['status']}."}
    return {"content": "Hello from the console agent."}


def console_agent(ledger: Ledger) -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(answer, delta_delay_s=WORD_DELAY_S))

    @agent.tool(effect="write", approval=True)
    async def refund(ctx: ToolContext, order_id: str, cents: int) -> str:
        ledger.record(
            "tool",
            "refund",
            "finished",
            call_id=ctx.call_id,
            key=ctx.idempotency_key,
            attempt=ctx.attempt,
            data={"order_id": order_id, "cents": cents},
        )
        return f"refunded {cents} cents on {order_id}"

    @agent.tool(effect="write")
    async def charge(ctx: ToolContext, order_id: str, cents: int) -> str:
        ledger.record(
            "tool",
            "charge",
            "started",
            call_id=ctx.call_id,
            key=ctx.idempotency_key,
            attempt=ctx.attempt,
            data={"order_id": order_id, "cents": cents},
        )
        await asyncio.Event().wait()  # never set: the test kills this process here
        raise AssertionError("unreachable")

    return agent


async def main(url: str, ledger_path: str, token: str | None = None) -> None:
    worker = Worker(
        url,
        token,
        agents=[console_agent(Ledger(ledger_path))],
        poll_wait_ms=1_000,
        drain_timeout_s=0.1,
        backoff_max_s=0.2,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
