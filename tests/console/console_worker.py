"""The agent of a Worker process for the console's browser tests, which SIGKILL it
(started with harness.worker_process.start_worker):

    python -m harness.worker_process tests.console.console_worker --urls URL --ledger FILE [--token T]

The agent is `console`, whose model streams its words and answers by the last user
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

import argparse
import asyncio
from typing import Any

from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", required=True)


def agents(args: argparse.Namespace) -> list[Agent]:
    return [console_agent(Ledger(args.ledger))]
