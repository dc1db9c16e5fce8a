"""A Claude Agent SDK agent, run durably by dex-ha in turn segments: the Claude Code CLI's
own loop (its model calls, its Read and Grep) runs inside one RunModel step, and each call
of your tools is its own tool step with the effect declared for it
(docs/adapter-claude-agent.md says what runs again after a crash).

    pip install -e '.[claude-agent]'               # bundles the Claude Code CLI
    dex-ha dev &                                   # in another terminal: the server on :8801
    ANTHROPIC_API_KEY=sk-ant-... python examples/claude_agent_agent.py [URL]

CLAUDE_MODEL picks the model (default claude-sonnet-4-5); ANTHROPIC_BASE_URL points the CLI
at another Anthropic-compatible server.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, tool

from dex_ha.adapters.claude_agent import durable_agent
from dex_ha.client import DexClient
from dex_ha.worker import ToolContext, Worker


@tool("lookup_order", "Look up an order by its id", {"order_id": str})
async def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
    order = {"order_id": args["order_id"], "status": "delivered", "total_cents": 1299}
    return {"content": [{"type": "text", "text": str(order)}]}


@tool("refund", "Refund part or all of an order", {"order_id": str, "cents": int})
async def refund(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    # The same key on every attempt of this call: hand it to the payment API.
    done = f"refunded {args['cents']} cents on {args['order_id']} (key {ctx.idempotency_key})"
    return {"content": [{"type": "text", "text": done}]}


def support_agent() -> Any:
    options = ClaudeAgentOptions(
        model=os.environ.get("CLAUDE_MODEL", "claude-sonnet-4-5"),
        system_prompt="You help customers with their orders. Look an order up before you refund it.",
        allowed_tools=["Read", "Grep"],  # the CLI's own tools: inline, repeated with their segment
    )
    return durable_agent(
        "support",
        options,
        tools=[lookup_order, refund],
        effects={"lookup_order": "read", "refund": "write"},  # write: at most once, outcome_unknown on a crash
    )


async def main(url: str) -> None:
    worker = Worker(url, agents=[support_agent()])
    running = asyncio.create_task(worker.run())
    async with DexClient(url) as client:
        sid = (await client.create_session("support")).session_id
        await client.send_message(sid, "Please refund order A17 in full.")
        async for event in client.events(sid):
            if event.type == "assistant_message":
                for call in event.data["tool_calls"]:
                    print(f"  -> {call['name']}({call['arguments']})")
            if event.type in ("turn_completed", "turn_failed"):
                break
        snapshot = await client.wait_until_idle(sid)
        print("answer:", snapshot.history[-1].get("content"))
    await worker.stop()
    await running


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8801"))
