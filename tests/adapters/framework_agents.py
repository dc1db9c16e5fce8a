"""The framework agents the adapter tests run, one per framework, with the same three tools:

- `lookup(order)`, effect read;
- `put_note(text)`, effect idempotent_write (declared with @effect);
- `refund(order)`, undeclared: the default, write.

Each tool writes its runs to the ledger (tests/crash/ledger.py) with the dex-ha context the
adapter gives it (`tool_context()`: idempotency key, attempt), and *hangs* on attempt 1 when
it is the `hang` tool, sending heartbeats and recording each ("beat"), until the Worker
process is killed. The model is the framework's own OpenAI model on the fake OpenAI server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from dex_ha.worker import Agent
from tests.crash.ledger import Ledger

FRAMEWORKS = ("openai_agents", "pydantic_ai")
INSTRUCTIONS = "You help customers with their orders."
HANG_TICK_S = 0.1


class ToolKit:
    """What the tools share: the ledger, and which tool hangs on its first attempt."""

    def __init__(self, ledger: Ledger, hang: str | None = None) -> None:
        self.ledger = ledger
        self.hang = hang

    async def run(self, name: str, arguments: dict[str, Any], output: Any) -> Any:
        from dex_ha.adapters import tool_context

        ctx = tool_context()
        record: dict[str, Any] = dict(call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt, data=arguments)
        self.ledger.record("tool", name, "started", **record)
        if name == self.hang and ctx.attempt == 1:
            while True:  # until SIGKILL
                await ctx.heartbeat()
                self.ledger.record("tool", name, "beat", **record)
                await asyncio.sleep(HANG_TICK_S)
        self.ledger.record("tool", name, "finished", **record)
        return output


async def warm_up(framework: str, ledger_path: Path) -> None:
    """One model call of `framework`'s agent against a throwaway fake server.

    The openai SDK builds the schemas of the API's stream events on the first streamed
    answer a process parses, blocking its event loop for seconds on a loaded machine: long
    enough for the server to fail the first RunModel attempt of a Worker whose heartbeat
    timeout is 2 s. The tests warm the SDK up before their Worker starts."""
    from dex_ha.worker import ModelRequest
    from harness.fake_models.openai_api import Call, FakeOpenAI, Reply

    async with FakeOpenAI(lambda request: Reply("warm", [Call("lookup", {"order": "W"})])) as fake:
        agent = build(framework, "warm-up", fake.base_url, ToolKit(Ledger(ledger_path)))
        assert agent.model is not None
        await agent.model.respond(ModelRequest([{"type": "user", "text": "warm up"}], None, []), _NoSink())


class _NoSink:
    def send_text(self, text: str) -> None:
        pass

    def send(self, delta: dict[str, Any]) -> None:
        pass


def openai_client(base_url: str) -> AsyncOpenAI:
    """A client for the fake server with the SDK's retries off (dex-ha decides retries)."""
    return AsyncOpenAI(api_key="sk-test", base_url=base_url, max_retries=0)


def build(framework: str, name: str, base_url: str, kit: ToolKit) -> Agent:
    """The dex-ha agent of `framework`'s agent, its model on the fake server at `base_url`."""
    if framework == "openai_agents":
        return _openai_agents(name, base_url, kit)
    if framework == "pydantic_ai":
        return _pydantic_ai(name, base_url, kit)
    raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")


def _openai_agents(name: str, base_url: str, kit: ToolKit) -> Agent:
    from agents import Agent as SDKAgent
    from agents import OpenAIProvider, function_tool

    from dex_ha.adapters.openai_agents import durable_agent, effect

    @function_tool(failure_error_function=None)
    async def lookup(order: str) -> dict:
        """Find an order by its id."""
        return await kit.run("lookup", {"order": order}, {"order": order, "status": "shipped"})

    @effect("idempotent_write")
    @function_tool(failure_error_function=None)
    async def put_note(text: str) -> str:
        """Add a note to the customer's file."""
        return await kit.run("put_note", {"text": text}, "noted")

    @function_tool(failure_error_function=None)
    async def refund(order: str) -> str:
        """Refund an order."""
        return await kit.run("refund", {"order": order}, "refunded")

    agent = SDKAgent(name=name, instructions=INSTRUCTIONS, model="gpt-test", tools=[lookup, put_note, refund])
    provider = OpenAIProvider(openai_client=openai_client(base_url), use_responses=True)
    return durable_agent(agent, effects={"lookup": "read"}, model_provider=provider)


def _pydantic_ai(name: str, base_url: str, kit: ToolKit) -> Agent:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from dex_ha.adapters.pydantic_ai import durable_agent, effect

    model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=openai_client(base_url)))
    agent = PydanticAgent(model, name=name, instructions=INSTRUCTIONS)

    @agent.tool_plain
    async def lookup(order: str) -> dict:
        """Find an order by its id."""
        return await kit.run("lookup", {"order": order}, {"order": order, "status": "shipped"})

    @effect("idempotent_write")
    @agent.tool_plain
    async def put_note(text: str) -> str:
        """Add a note to the customer's file."""
        return await kit.run("put_note", {"text": text}, "noted")

    @agent.tool_plain
    async def refund(order: str) -> str:
        """Refund an order."""
        return await kit.run("refund", {"order": order}, "refunded")

    return durable_agent(agent, effects={"lookup": "read"})
