"""OpenAIModel end to end: a real `dex-ha dev`, a Worker running an agent whose model is
OpenAIModel, the fake OpenAI server as the model API, and a client following the session.

Evidence from outside the server: the request bodies the fake received (what the model
saw), the tools' own record of their runs, the client's event stream and the snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient, Session, SessionEvent
from dex_ha.models.openai import DEFAULT_SUMMARY_INSTRUCTIONS, OpenAIModel
from dex_ha.worker import Agent, ToolContext, Worker
from harness.dev_process import DevProcess, running_dev
from harness.fake_models.openai_api import Call, Failure, FakeOpenAI, Reply
from tests.e2e.conftest import running

AGENT = "support"
DEADLINE_S = 30.0


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevProcess]:
    async with running_dev(tmp_path) as server:
        yield server


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


class ToolRuns:
    """What the tools did, recorded by the tools themselves."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, dict[str, Any], str | None]] = []  # name, arguments, idempotency key


def make_agent(model: OpenAIModel, tool_runs: ToolRuns, **options: Any) -> Agent:
    agent = Agent(AGENT, model=model, **options)

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, order: str) -> dict[str, str]:
        """Find an order by its id."""
        tool_runs.runs.append(("lookup", {"order": order}, ctx.idempotency_key))
        return {"order": order, "status": "shipped"}

    @agent.tool(effect="idempotent_write")
    async def put_note(ctx: ToolContext, text: str) -> str:
        tool_runs.runs.append(("put_note", {"text": text}, ctx.idempotency_key))
        return "noted"

    return agent


async def run_turn(
    dev: DevProcess, agent: Agent, text: str, until: str = "turn_completed", session_id: str | None = None
) -> tuple[str, list[SessionEvent], Session]:
    """Send `text` to a session of `agent` (a new one unless given) with a Worker running;
    the session's events until `until`, and the snapshot after."""
    worker = Worker(dev.url, agents=[agent], poll_wait_ms=1_000, drain_timeout_s=1.0)
    async with running(worker), DexClient(dev.url) as client:
        sid = session_id or (await client.create_session(AGENT)).session_id
        turn_number = len((await client.get_session(sid)).turns) + 1
        events: list[SessionEvent] = []
        reader = asyncio.create_task(follow_turn(client, sid, turn_number, until, events))
        await client.send_message(sid, text)
        await asyncio.wait_for(reader, DEADLINE_S)
        return sid, events, await client.wait_until_idle(sid, timeout_s=DEADLINE_S)


async def follow_turn(client: DexClient, session_id: str, number: int, until: str, sink: list[SessionEvent]) -> None:
    """The session's events into `sink`, from the start of turn `number` to its `until` event."""
    turn_id = None
    async for event in client.events(session_id):
        if event.type == "turn_started" and event.data["number"] == number:
            turn_id = event.data["turn_id"]
        if turn_id is None:
            continue
        sink.append(event)
        if event.type == until and event.data.get("turn_id") == turn_id:
            return


def streamed_text(events: list[SessionEvent], step_id: str, attempt: int | None = None) -> str:
    return "".join(
        e.data.get("text", "")
        for e in events
        if e.type == "delta" and e.step_id == step_id and attempt in (None, e.attempt)
    )


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_a_turn_with_two_tool_calls(dev: DevProcess, fake: FakeOpenAI, api: str) -> None:
    fake.queue(
        Reply(
            "Let me check that order.",
            [
                Call("lookup", {"order": "A17"}, call_id="call_look"),
                Call("put_note", {"text": "asked about A17"}, call_id="call_note"),
            ],
            delta_delay_s=0.01,
        ),
        Reply("Order A17 has shipped.", delta_delay_s=0.01),
    )
    model = OpenAIModel(
        "gpt-test", api=api, instructions="You help customers.", api_key="sk-test", base_url=fake.base_url
    )
    tool_runs = ToolRuns()
    sid, events, snapshot = await run_turn(dev, make_agent(model, tool_runs), "Where is my order A17?")
    await model.aclose()

    # Each tool ran once, with the arguments the model gave and the contract idempotency key.
    assert sorted(tool_runs.runs) == [
        ("lookup", {"order": "A17"}, f"{sid}:call_look"),
        ("put_note", {"text": "asked about A17"}, f"{sid}:call_note"),
    ]
    history = snapshot.history
    assert [h["type"] for h in history] == ["user", "assistant", "tool_result", "tool_result", "assistant"]
    assert [c["id"] for c in history[1]["tool_calls"]] == ["call_look", "call_note"]
    assert history[-1]["content"] == "Order A17 has shipped."

    # The second model call saw both results, each right after the calls.
    first, second = fake.requests
    if api == "responses":
        assert first.body["input"] == [{"type": "message", "role": "user", "content": "Where is my order A17?"}]
        items = second.body["input"]
        assert [(i["type"], i.get("call_id")) for i in items] == [
            ("message", None),
            ("message", None),
            ("function_call", "call_look"),
            ("function_call", "call_note"),
            ("function_call_output", "call_look"),
            ("function_call_output", "call_note"),
        ]
        assert items[4]["output"] == '{"order": "A17", "status": "shipped"}' and items[5]["output"] == "noted"
    else:
        messages = second.body["messages"]
        assert [(m["role"], m.get("tool_call_id")) for m in messages] == [
            ("system", None),
            ("user", None),
            ("assistant", None),
            ("tool", "call_look"),
            ("tool", "call_note"),
        ]
        assert messages[3]["content"] == '{"order": "A17", "status": "shipped"}'
    assert {t["name"] for t in tools_of(first.body)} == {"lookup", "put_note", "ask_user", "sleep"}

    # The text streamed to the client as deltas of each model step, word by word.
    steps = [e.data["step_id"] for e in events if e.type == "assistant_message"]
    assert [streamed_text(events, step) for step in steps] == ["Let me check that order.", "Order A17 has shipped."]
    assert len([e for e in events if e.type == "delta" and e.step_id == steps[0]]) >= 2


def tools_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [t.get("function", t) for t in body["tools"]]


async def test_a_rate_limit_fails_attempt_1_and_attempt_2_completes(dev: DevProcess, fake: FakeOpenAI) -> None:
    fake.queue(Failure(429, "Rate limit reached for gpt-test", retry_after=1), Reply("Here I am."))
    model = OpenAIModel("gpt-test", api_key="sk-test", base_url=fake.base_url)
    _, events, snapshot = await run_turn(dev, make_agent(model, ToolRuns()), "hello")
    await model.aclose()

    [failed] = [e for e in events if e.type == "attempt_failed"]
    assert failed.attempt == 1 and "Rate limit reached for gpt-test" in failed.data["error"]
    [answer] = [e for e in events if e.type == "assistant_message"]
    assert answer.data["step_id"] == failed.step_id and answer.data["content"] == "Here I am."
    started = [e.attempt for e in events if e.type == "attempt_started" and e.step_id == failed.step_id]
    assert started == [1, 2]
    assert failed.step_id is not None  # an attempt event names its step
    assert streamed_text(events, failed.step_id, attempt=2) == "Here I am."
    assert snapshot.turns[-1].status == "completed"
    first, second = fake.requests  # one request per attempt: the SDK did not retry by itself
    assert first.body == second.body


async def test_a_bad_request_fails_the_turn_with_the_providers_message(dev: DevProcess, fake: FakeOpenAI) -> None:
    message = "The model `gpt-nope` does not exist or you do not have access to it."
    fake.queue(Failure(400, message, code="model_not_found"))
    model = OpenAIModel("gpt-nope", api_key="sk-test", base_url=fake.base_url)
    _, events, snapshot = await run_turn(dev, make_agent(model, ToolRuns()), "hello", until="turn_failed")
    await model.aclose()

    [turn_failed] = [e for e in events if e.type == "turn_failed"]
    assert message in turn_failed.data["error"]
    failed_turn = snapshot.turns[-1]
    assert failed_turn.status == "failed" and failed_turn.error is not None and message in failed_turn.error
    assert [e.attempt for e in events if e.type == "attempt_started"] == [1]  # no retry
    assert len(fake.requests) == 1


async def test_compaction_asks_the_model_api_for_the_summary(dev: DevProcess, fake: FakeOpenAI) -> None:
    fake.queue(
        Reply("Hello! How can I help?"),
        Reply("The user greeted the assistant."),  # the summary call of the second turn
        Reply("I am fine, thanks."),
    )
    model = OpenAIModel("gpt-test", api_key="sk-test", base_url=fake.base_url)
    agent = make_agent(model, ToolRuns(), compaction={"max_items": 2})
    sid, _, _ = await run_turn(dev, agent, "hi")
    _, events, snapshot = await run_turn(dev, agent, "how are you?", session_id=sid)
    await model.aclose()

    assert "summary_updated" in [e.type for e in events]
    assert snapshot.summary is not None and snapshot.summary["text"] == "The user greeted the assistant."
    _, summary_call, after = fake.requests
    assert summary_call.body["instructions"] == DEFAULT_SUMMARY_INSTRUCTIONS and not summary_call.stream
    transcript = summary_call.body["input"][0]["content"]
    assert "User: hi" in transcript and "Assistant: Hello! How can I help?" in transcript
    # The next model call sees the summary instead of the summarised items.
    assert after.body["input"] == [
        {
            "type": "message",
            "role": "developer",
            "content": "Summary of the conversation before the messages below:\nThe user greeted the assistant.",
        },
        {"type": "message", "role": "user", "content": "how are you?"},
    ]
    assert snapshot.history[-1]["content"] == "I am fine, thanks."
