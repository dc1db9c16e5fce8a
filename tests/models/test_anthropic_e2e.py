"""AnthropicModel end to end: a real `dex-ha dev`, a Worker running an agent on
AnthropicModel, the fake Anthropic API (harness/fake_models/anthropic_api.py) and a client.

What the fake recorded (the requests the model sent) and what the tools recorded are the
evidence from outside the server; the session's events and snapshot are what dex-ha says.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dex_ha.client import DexClient, SessionEvent, StreamText
from dex_ha.models.anthropic import AnthropicModel
from dex_ha.worker import Agent, ToolContext, Worker
from harness.dev_process import DevProcess
from harness.fake_models.anthropic_api import ApiError, FakeAnthropic, Reply, tool_use
from harness.processes import env_with_checkout, stop
from harness.waiting import eventually
from harness.worker_process import WorkerOptions, start_worker
from tests.crash.ledger import Ledger
from tests.e2e.conftest import running
from tests.e2e.test_stream_after_kill import follow, sigkill, texts_of
from tests.models.anthropic_worker_proc import MODEL_NAME

AGENT = "orders"
DEADLINE_S = 30.0


@dataclass
class Stack:
    dev: DevProcess
    fake: FakeAnthropic
    client: DexClient
    lookups: list[str]  # the orders the lookup tool was called for, in order


def orders_agent(fake: FakeAnthropic, lookups: list[str], **agent_kwargs: Any) -> Agent:
    agent = Agent(
        AGENT,
        model=AnthropicModel(
            MODEL_NAME, system="You track orders.", max_tokens=300, api_key="sk-test", base_url=fake.base_url
        ),
        **agent_kwargs,
    )

    @agent.tool(effect="read", description="Find an order by its id.")
    async def lookup(ctx: ToolContext, order: str) -> dict:
        lookups.append(order)
        return {"order": order, "status": "shipped"}

    return agent


@contextlib.asynccontextmanager
async def stack(
    tmp_path: Path, *, extra_env: dict[str, str] | None = None, **agent_kwargs: object
) -> AsyncIterator[Stack]:
    """`dex-ha dev`, the fake API and a Worker running the orders agent, for the block."""
    dev = DevProcess(tmp_path / "data", tmp_path / "dev.log", relaxed=True, extra_env=extra_env)
    dev.start()
    try:
        await dev.wait_ready()
        async with FakeAnthropic() as fake, DexClient(dev.url) as client:
            lookups: list[str] = []
            worker = Worker(
                dev.url, agents=[orders_agent(fake, lookups, **agent_kwargs)], poll_wait_ms=1_000, drain_timeout_s=1.0
            )
            async with running(worker):
                yield Stack(dev, fake, client, lookups)
    finally:
        assert dev.stop() == 0, dev.log_tail()


async def turn(stack: Stack, session_id: str, text: str) -> list[SessionEvent]:
    """Send `text` and return the session's events of the turn it starts, until it ended."""
    earlier_turns = len((await stack.client.get_session(session_id)).turns)
    events: list[SessionEvent] = []

    async def collect() -> None:
        ended = 0
        async for event in stack.client.events(session_id):  # replays from the start
            if ended == earlier_turns:
                events.append(event)
            if event.type in ("turn_completed", "turn_failed"):
                ended += 1
                if ended > earlier_turns:
                    return

    reader = asyncio.create_task(collect())
    await stack.client.send_message(session_id, text)
    await asyncio.wait_for(reader, DEADLINE_S)
    return events


async def test_a_turn_with_two_tool_calls_streams_and_sends_valid_requests(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.fake.queue(
            Reply.of(
                "Let me check both orders.",
                tool_use("lookup", {"order": "A17"}, id="toolu_a"),
                tool_use("lookup", {"order": "B2"}, id="toolu_b"),
            ),
            Reply.of("Both orders have shipped."),
        )
        sid = (await s.client.create_session(AGENT)).session_id
        events = await turn(s, sid, "Where are A17 and B2?")
        snapshot = await s.client.get_session(sid)

    assert events[-1].type == "turn_completed"
    assert sorted(s.lookups) == ["A17", "B2"]
    # Streaming: the client got the text as deltas, more than one per response.
    deltas = [e for e in events if e.type == "delta"]
    assert "".join(e.data["text"] for e in deltas) == "Let me check both orders.Both orders have shipped."
    assert len({e.step_id for e in deltas}) == 2 and len(deltas) > 2
    # The session recorded the calls with the provider's ids and the final answer.
    history = snapshot.history
    assert [h["type"] for h in history] == ["user", "assistant", "tool_result", "tool_result", "assistant"]
    assert [(c["id"], c["arguments"]) for c in history[1]["tool_calls"]] == [
        ("toolu_a", {"order": "A17"}),
        ("toolu_b", {"order": "B2"}),
    ]
    assert history[-1]["content"] == "Both orders have shipped."
    # The second request carried the calls and both results right after them (the fake
    # refuses anything else), plus the agent's tool and the built-ins.
    first, second = s.fake.bodies()
    assert first["system"] == "You track orders." and first["model"] == MODEL_NAME
    assert [t["name"] for t in first["tools"]] == ["lookup", "ask_user", "sleep"]
    assert first["tools"][0]["input_schema"]["properties"]["order"]["type"] == "string"
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    results = second["messages"][2]["content"]
    assert [(r["type"], r["tool_use_id"]) for r in results] == [("tool_result", "toolu_a"), ("tool_result", "toolu_b")]
    assert '"status": "shipped"' in results[0]["content"]


async def test_a_429_fails_attempt_one_and_attempt_two_completes(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.fake.queue(ApiError.rate_limited(retry_after=0), Reply.of("Here is your answer."))
        sid = (await s.client.create_session(AGENT)).session_id
        events = await turn(s, sid, "hello")

    assert events[-1].type == "turn_completed"
    failed = [e for e in events if e.type == "attempt_failed"]
    assert [(e.data["kind"], e.attempt) for e in failed] == [("RunModel", 1)]
    assert "RateLimitError" in failed[0].data["error"]
    started = [(e.step_id, e.attempt) for e in events if e.type == "attempt_started"]
    assert started == [(failed[0].step_id, 1), (failed[0].step_id, 2)]
    [answer] = [e for e in events if e.type == "assistant_message"]
    assert answer.data["step_id"] == failed[0].step_id and answer.data["content"] == "Here is your answer."
    assert len(s.fake.bodies()) == 2  # one request per attempt: the SDK did not retry on its own


async def test_a_400_fails_the_turn_with_the_providers_message_and_no_retry(tmp_path: Path) -> None:
    async with stack(tmp_path) as s:
        s.fake.queue(
            ApiError(400, "invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum"),
            Reply.of("never used"),
        )
        sid = (await s.client.create_session(AGENT)).session_id
        events = await turn(s, sid, "hello")

    assert events[-1].type == "turn_failed"
    assert "prompt is too long: 250000 tokens > 200000 maximum" in events[-1].data["error"]
    assert [e.attempt for e in events if e.type == "attempt_started"] == [1]
    assert len(s.fake.bodies()) == 1


async def test_compaction_asks_the_fake_for_the_summary_and_the_next_call_carries_it(tmp_path: Path) -> None:
    summary = "The user asked about order A17; lookup said it shipped."
    async with stack(tmp_path, compaction={"max_items": 3}) as s:
        s.fake.queue(
            Reply.of(tool_use("lookup", {"order": "A17"})),
            Reply.of("A17 has shipped."),
            Reply.of(summary),
            Reply.of("You are welcome."),
        )
        sid = (await s.client.create_session(AGENT)).session_id
        assert (await turn(s, sid, "Where is A17?"))[-1].type == "turn_completed"
        events = await turn(s, sid, "Thanks!")
        snapshot = await s.client.get_session(sid)

    assert events[-1].type == "turn_completed" and any(e.type == "summary_updated" for e in events)
    assert snapshot.summary is not None and snapshot.summary["text"] == summary
    summary_call, after = s.fake.bodies()[2:]
    transcript = summary_call["messages"][0]["content"][0]["text"]
    assert "Where is A17?" in transcript and "A17 has shipped." in transcript and "tools" not in summary_call
    # The next call sees the summary and the new message only, as one user message.
    assert after["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"Summary of the conversation so far:\n{summary}"},
                {"type": "text", "text": "Thanks!"},
            ],
        }
    ]


LOST_TEXT = "attempt one starts to answer and is cut off here"
FINAL_TEXT = "attempt two gives the whole answer"


def start_worker_process(url: str, fake: FakeAnthropic, ledger: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {**env_with_checkout(), "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "sk-test"}
    return start_worker(
        "tests.models.anthropic_worker_proc",
        url,
        ["--agent", AGENT, "--ledger", str(ledger)],
        options=WorkerOptions(backoff_max_s=0.2),
        log=log_path,
        env=env,
    )


async def test_r02_a_worker_killed_mid_stream_leaves_only_attempt_twos_text(tmp_path: Path) -> None:
    """Crash-matrix R02 (RunModel after output reached the server), Worker kill."""
    dev = DevProcess(
        tmp_path / "data", tmp_path / "dev.log", relaxed=True, extra_env={"DEX_HA_HEARTBEAT_TIMEOUT_MS": "2000"}
    )
    ledger_path = tmp_path / "ledger.sqlite"
    ledger = Ledger(ledger_path)
    first = second = None
    dev.start()
    try:
        await dev.wait_ready()
        async with (
            FakeAnthropic([Reply.of(LOST_TEXT, stall_after_deltas=4), Reply.of(FINAL_TEXT)]) as fake,
            DexClient(dev.url) as client,
        ):
            sid = (await client.create_session(AGENT)).session_id
            raw: list[SessionEvent] = []
            text = StreamText()
            reader = asyncio.create_task(follow(client, sid, raw, text))
            await client.send_message(sid, "hello")
            first = start_worker_process(dev.url, fake, ledger_path, tmp_path / "worker1.log")

            # Attempt 1 streamed four words and its stream stalls: kill its Worker there.
            await eventually(
                lambda: fake.stalls == 1 and len(texts_of(raw, 1).split()) == 4,
                "attempt 1's deltas and the stall",
                DEADLINE_S,
            )
            sigkill(first)
            # The new Worker starts now: its imports take seconds, as the heartbeat timeout does.
            second = start_worker_process(dev.url, fake, ledger_path, tmp_path / "worker2.log")
            [step_id] = {e.step_id for e in raw if e.type == "delta"}
            assert step_id is not None  # a delta names its step
            await eventually(lambda: any(e.type == "attempt_failed" for e in raw), "attempt 1 failing", DEADLINE_S)
            assert text.text(step_id) == ""  # attempt 1's text is dropped as soon as its failure is known
            await asyncio.wait_for(reader, DEADLINE_S)
            snapshot = await client.get_session(sid)

        assert texts_of(raw, 1) == "attempt one starts to " and texts_of(raw, 2) == FINAL_TEXT
        assert text.text(step_id) == FINAL_TEXT and text.attempt(step_id) == 2
        assert [h["content"] for h in snapshot.history if h["type"] == "assistant"] == [FINAL_TEXT]
        # From outside: two model calls on the same input, each by its own process; the
        # killed one never finished, and the fake got exactly two requests.
        started, finished = ledger.runs("model", AGENT, "started"), ledger.runs("model", AGENT, "finished")
        assert [r.pid for r in started] == [first.pid, second.pid] and started[0].data == started[1].data
        assert [r.pid for r in finished] == [second.pid]
        assert len(fake.bodies()) == 2 and fake.bodies()[0]["messages"] == fake.bodies()[1]["messages"]
    finally:
        sigkill(first)
        if second is not None:
            stop(second, timeout=5)
        ledger.close()
        assert dev.stop() == 0, dev.log_tail()
