"""Quick start: an agent with two tools, run by a Worker, driven by a client.

    dex-ha dev &                      # in another terminal: the server on :8801
    python examples/quickstart.py     # or: python examples/quickstart.py http://127.0.0.1:8801

With a cluster that has tokens, source the file that `dex-ha cluster up` wrote first; the
SDKs then read the node URLs (DEX_HA_URLS) and the tokens (DEX_HA_WORKER_TOKEN for the
Worker, DEX_HA_CLIENT_TOKEN for the client, else DEX_HA_TOKEN) from the environment:

    dex-ha cluster up --dir ./dex-cluster && source ./dex-cluster/tokens.env
    python examples/quickstart.py

The model is scripted (no API key needed): it calls a read tool and a write tool that
needs approval, the script approves it, and the model answers. Swap ScriptedModel for
your own class with `respond(request, stream)` and `summarize(history, summary)` to use a
real model.
"""

from __future__ import annotations

import asyncio
import sys

from dex_ha.client import DexClient
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, Worker


def script(request: ModelRequest) -> dict:
    last = request.history[-1]
    if last["type"] == "user":
        return {
            "content": "Let me check the order and refund it.",
            "tool_calls": [
                {"id": "lookup-1", "name": "lookup_order", "arguments": {"order_id": "A17"}},
                {"id": "refund-1", "name": "refund", "arguments": {"order_id": "A17", "cents": 1299}},
            ],
        }
    return {"content": "Done: order A17 is refunded.", "tool_calls": []}


agent = Agent("support", model=ScriptedModel(script))


@agent.tool(effect="read")
async def lookup_order(ctx: ToolContext, order_id: str) -> dict:
    return {"order_id": order_id, "status": "delivered"}


@agent.tool(effect="write", approval=True)  # runs at most once, after a person approves
async def refund(ctx: ToolContext, order_id: str, cents: int) -> str:
    # ctx.idempotency_key is "{session_id}:{call_id}": pass it to the payment API.
    return f"refunded {cents} cents on {order_id} (key {ctx.idempotency_key})"


async def main(urls: str | None) -> None:
    # None: DEX_HA_URLS, else http://127.0.0.1:8801 (the SDKs read the tokens the same way).
    worker = Worker(urls, agents=[agent])
    running = asyncio.create_task(worker.run())
    async with DexClient(urls) as client:
        session = await client.create_session("support")
        sid = session.session_id
        await client.send_message(sid, "Please refund order A17")
        async for event in client.events(sid):
            print(f"{event.type:>20}  {event.data if event.type != 'delta' else event.data.get('text', '')}")
            if event.type == "approval_requested":
                await client.approve(sid, event.data["call_id"])
            if event.type in ("turn_completed", "turn_failed"):
                break
        snapshot = await client.wait_until_idle(sid)
        print("answer:", snapshot.history[-1]["content"])
    await worker.stop()
    await running


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
