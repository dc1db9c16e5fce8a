"""A Pydantic AI agent, run durably by dex-ha: each model call is a RunModel step, each tool
call its own tool step with the effect declared for it.

    pip install -e '.[pydantic-ai]'
    dex-ha dev &                                   # in another terminal: the server on :8801
    OPENAI_API_KEY=sk-... python examples/pydantic_ai_agent.py [URL]

OPENAI_MODEL picks the model (default gpt-4.1-mini); OPENAI_BASE_URL points the client at
another OpenAI-compatible server.
"""

from __future__ import annotations

import asyncio
import os
import sys

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from dex_ha.adapters.pydantic_ai import durable_agent, effect, tool_context
from dex_ha.client import DexClient
from dex_ha.worker import Worker

# The client's own retries are off: the dex-ha server decides when a model call runs again.
model = OpenAIChatModel(
    os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"), provider=OpenAIProvider(openai_client=AsyncOpenAI(max_retries=0))
)
support = Agent(
    model, name="support", instructions="You help customers with their orders. Look an order up before you refund it."
)


@effect("read")  # safe to run again after a crash
@support.tool_plain
def lookup_order(order_id: str) -> dict:
    """Look up an order by its id."""
    return {"order_id": order_id, "status": "delivered", "total_cents": 1299}


@support.tool_plain  # no effect declared: "write", at most once (outcome_unknown if a crash hits it)
def refund(order_id: str, cents: int) -> str:
    """Refund part or all of an order."""
    # The same key on every attempt of this call: hand it to the payment API.
    return f"refunded {cents} cents on {order_id} (key {tool_context().idempotency_key})"


async def main(url: str) -> None:
    worker = Worker(url, agents=[durable_agent(support)])
    running = asyncio.create_task(worker.run())
    async with DexClient(url) as client:
        sid = (await client.create_session("support")).session_id
        await client.send_message(sid, "Please refund order A17 in full.")
        async for event in client.events(sid):
            if event.type == "delta":
                print(event.data.get("text", ""), end="", flush=True)
            elif event.type == "assistant_message":
                print()
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
