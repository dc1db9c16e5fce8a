"""dex_ha.adapters.claude_agent: a Claude Agent SDK agent in turn segments.

The end-to-end test runs the real Claude Code CLI (bundled with the SDK) against the fake
Anthropic API, inside a real `dex-ha dev` and an in-process Worker. The others check the
pieces: the replay of the history, the agent definition, the launcher.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient
from dex_ha.worker import Worker
from harness.dev_process import DevProcess, running_dev
from harness.fake_models.anthropic_api import FakeAnthropic
from harness.processes import pid_alive
from tests.crash.ledger import Ledger
from tests.e2e.conftest import running
from tests.support.claude_segment import (
    DEFERRED_TOOL,
    DEFERRED_TOOL_CLI_NAME,
    FINAL_TEXT,
    ScriptedCoder,
    cli_missing_reason,
    coder_agent,
    inline_runs,
    stage,
)
from tests.support.doubles import TextSink

pytestmark = pytest.mark.skipif(cli_missing_reason() is not None, reason=str(cli_missing_reason()))

if cli_missing_reason() is None:
    from claude_agent_sdk import ClaudeAgentOptions, tool

    from dex_ha.adapters import claude_launcher
    from dex_ha.adapters.claude_agent import ClaudeTurnSegment, Replay, conversation, durable_agent


DEADLINE_S = 60.0


def mcp(name: str) -> str:
    return f"mcp__dex__{name}"


# ---------------------------------------------------------------- end to end


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevProcess]:
    async with running_dev(tmp_path) as node:
        yield node


async def test_a_turn_runs_the_cli_inline_and_the_custom_tool_as_its_own_step(dev: DevProcess, tmp_path: Path) -> None:
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    async with FakeAnthropic(responder=ScriptedCoder(work_dir)) as fake:
        agent = coder_agent("coder", api_url=fake.base_url, work_dir=work_dir, ledger_path=tmp_path / "ledger.db")
        worker = Worker(dev.url, agents=[agent], poll_wait_ms=1000)
        async with running(worker), DexClient(dev.url) as client:
            sid = (await client.create_session("coder")).session_id
            await client.send_message(sid, "Write the file, then store the record.")
            snap = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
        model_calls = fake.bodies()

    assert snap.turns[0].status == "completed"
    user, first, result, final = snap.history
    call_id = first["tool_calls"][0]["id"]
    # Segment 1 (one RunModel): two model calls and the Bash run inside it; it ended on put_record.
    assert (user["type"], first["content"]) == ("user", "Writing the file.")
    assert first["tool_calls"] == [{"id": call_id, "name": DEFERRED_TOOL, "arguments": {"key": "k1", "value": "v1"}}]
    assert (result["type"], result["status"], result["output"]) == (
        "tool_result",
        "succeeded",
        {"content": [{"type": "text", "text": "stored k1"}]},
    )
    assert (final["content"], final["tool_calls"]) == (FINAL_TEXT, [])
    assert inline_runs(work_dir) == 1
    # The deferred tool ran once, as its own step (effect write: a single-attempt step), with its key.
    call = snap.tool_call(call_id)
    assert (call.status, call.raw["step_kind"]) == ("succeeded", "CallSingleAttemptTool")
    ledger = Ledger(tmp_path / "ledger.db")
    assert [(r.key, r.attempt) for r in ledger.runs("tool", DEFERRED_TOOL, "started")] == [(f"{sid}:{call_id}", 1)]
    # Three model calls: two in segment 1, one in segment 2, which replayed the history:
    # the deferred call and its result, right after each other; the inline Bash call is not replayed.
    assert [stage(body) for body in model_calls] == [1, 2, 3]
    replayed = model_calls[2]["messages"]
    uses = [b for m in replayed if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"]) for u in uses] == [(call_id, DEFERRED_TOOL_CLI_NAME)]
    answer = next(i for i, m in enumerate(replayed) if any(b.get("id") == call_id for b in m["content"]))
    first_block = replayed[answer + 1]["content"][0]
    assert (first_block["type"], first_block["tool_use_id"]) == ("tool_result", call_id)
    assert "stored k1" in str(first_block["content"])


# ---------------------------------------------------------------- the replay


HISTORY: list[dict[str, Any]] = [
    {"type": "user", "text": "deploy it"},
    {
        "type": "assistant",
        "content": "Deploying.",
        "tool_calls": [
            {"id": "toolu_1", "name": "deploy", "arguments": {"service": "web"}},
            {"id": "toolu_2", "name": "notify", "arguments": {}},
        ],
    },
    {
        "type": "tool_result",
        "call_id": "toolu_1",
        "name": "deploy",
        "status": "succeeded",
        "output": {"content": [{"type": "text", "text": "deployed"}]},
    },
    {
        "type": "tool_result",
        "call_id": "toolu_2",
        "name": "notify",
        "status": "outcome_unknown",
        "error": "the Worker died while it ran",
    },
    {"type": "note", "text": "an operator reconciled toolu_2"},
]


def test_the_history_replays_as_alternating_messages_with_each_result_after_its_call() -> None:
    messages = conversation(HISTORY, "earlier: the user asked for a plan", mcp)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["text"] for b in messages[0]["content"]] == [
        "Summary of the conversation so far:\nearlier: the user asked for a plan",
        "deploy it",
    ]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Deploying."},
        {"type": "tool_use", "id": "toolu_1", "name": "mcp__dex__deploy", "input": {"service": "web"}},
        {"type": "tool_use", "id": "toolu_2", "name": "mcp__dex__notify", "input": {}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "deployed"}]},
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "is_error": True,
            "content": "outcome_unknown: the Worker died while it ran",
        },
        {"type": "text", "text": "Note: an operator reconciled toolu_2"},
    ]


def test_a_segment_after_tool_results_continues_the_turn_and_after_a_user_message_prompts() -> None:
    after_results = Replay.of(HISTORY[:4], None, mcp, "/w", "m")
    assert after_results.prompt is None and after_results.continues_turn
    assert [e["type"] for e in after_results.entries] == ["user", "assistant", "user"]
    assert [e["parentUuid"] for e in after_results.entries] == [None, *(e["uuid"] for e in after_results.entries[:2])]
    assert {e["sessionId"] for e in after_results.entries} == {after_results.session_id}

    next_turn = Replay.of(
        [
            *HISTORY[:4],
            {"type": "assistant", "content": "Done.", "tool_calls": []},
            {"type": "user", "text": "and now?"},
        ],
        None,
        mcp,
        "/w",
        "m",
    )
    assert next_turn.prompt == "and now?" and not next_turn.continues_turn
    first_turn = Replay.of(HISTORY[:1], None, mcp, "/w", "m")
    assert (first_turn.prompt, first_turn.entries) == ("deploy it", [])
    with pytest.raises(ValueError, match="history"):
        Replay.of([], None, mcp, "/w", "m")
    with pytest.raises(ValueError, match=r"history\[0\]: unknown item type 'thought'"):
        conversation([{"type": "thought"}], None, mcp)


# ---------------------------------------------------------------- the agent


def test_the_agent_declares_each_sdk_tool_with_its_effect_and_no_cli_tool() -> None:
    @tool("deploy", "Deploy a service", {"service": str, "replicas": int})
    async def deploy(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": "ok"}]}

    @tool("lookup", "Look a thing up", {"type": "object", "properties": {"q": {"type": "string"}}})
    async def lookup(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": []}

    agent = durable_agent(
        "ops",
        ClaudeAgentOptions(allowed_tools=["Bash"]),
        tools=[deploy, lookup],
        effects={"lookup": "read"},
        approval=["deploy"],
    )
    tools = {t["name"]: t for t in agent.definition()["tools"]}
    assert sorted(tools) == ["deploy", "lookup"]  # Bash stays inside the segment: no tool step
    assert (tools["deploy"]["effect"], tools["deploy"]["approval"]) == ("write", True)  # write by default
    assert tools["deploy"]["input_schema"] == {
        "type": "object",
        "required": ["service", "replicas"],
        "properties": {"service": {"type": "string"}, "replicas": {"type": "integer"}},
    }
    assert (tools["lookup"]["effect"], tools["lookup"]["input_schema"]["properties"]) == (
        "read",
        {"q": {"type": "string"}},
    )

    with pytest.raises(ValueError, match="effects/approval: 'missing'"):
        durable_agent("ops", tools=[deploy], effects={"missing": "read"})
    with pytest.raises(ValueError, match="effect must be one of"):
        durable_agent("ops", tools=[deploy], effects={"deploy": "sometimes"})
    with pytest.raises(TypeError, match="options must be a ClaudeAgentOptions"):
        ClaudeTurnSegment({"model": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="options.resume"):
        ClaudeTurnSegment(ClaudeAgentOptions(resume="abc"))


async def test_an_sdk_tool_error_is_the_tools_own_failure() -> None:
    from dex_ha.worker import ToolContext, ToolError

    @tool("flaky", "Fails", {"n": int})
    async def flaky(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": f"no such item {args['n']}"}], "is_error": True}

    agent = durable_agent("ops", tools=[flaky])
    ctx = ToolContext(
        session_id="s", turn_id="t", step_id="st", call_id="c", attempt=1, idempotency_key="s:c", worker_id="w"
    )
    with pytest.raises(ToolError, match="no such item 7"):
        await agent.tools["flaky"].invoke(ctx, {"n": 7})


# ---------------------------------------------------------------- the launcher


def test_the_launcher_kills_the_cli_and_its_commands_when_its_parent_dies(tmp_path: Path) -> None:
    """A parent process starts the launcher with a 'CLI' that starts a command of its own; the
    parent is SIGKILLed; the launcher, the CLI and the command all end."""
    pids = tmp_path / "pids"
    fake_cli = f"sleep 60 & echo $$ $! > {pids}; wait"
    parent_code = (
        f"import os, subprocess, sys; subprocess.Popen([sys.executable, {claude_launcher.__file__!r}, "
        f"{str(tmp_path / 'launcher.pid')!r}, str(os.getpid()), 'sh', '-c', {fake_cli!r}]); "
        "import time; time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 20
        while not (pids.exists() and len(pids.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the launcher did not start the CLI"
            time.sleep(0.05)
        launcher = int((tmp_path / "launcher.pid").read_text())
        started = [launcher, *map(int, pids.read_text().split())]
        assert all(pid_alive(pid) for pid in started)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in started):
        assert time.monotonic() < deadline, f"still alive: {[pid for pid in started if pid_alive(pid)]}"
        time.sleep(0.05)


async def test_a_segment_returns_its_text_and_the_deferred_call_it_ended_on(tmp_path: Path) -> None:
    """One RunModel's work, without a server: two model calls, Bash between them, the text
    streamed as it came, and the put_record call as the response's only tool call."""
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    async with FakeAnthropic(responder=ScriptedCoder(work_dir)) as fake:
        agent = coder_agent("coder", api_url=fake.base_url, work_dir=work_dir, ledger_path=tmp_path / "ledger.db")
        from dex_ha.worker.model import ModelRequest

        tools = [t for t in agent.definition()["tools"]]

        sink = TextSink(other_deltas="ignore")
        response = await asyncio.wait_for(
            agent.model.respond(ModelRequest([{"type": "user", "text": "go"}], None, tools), sink), DEADLINE_S
        )
        assert [stage(body) for body in fake.bodies()] == [1, 2]
    assert [c.name for c in response.tool_calls] == [DEFERRED_TOOL]
    assert (response.content, sink.texts) == ("Writing the file.", ["Writing the file."])
    assert response.usage["model_calls"] == 2
    assert inline_runs(work_dir) == 1


async def test_ask_user_is_deferred_like_the_agents_tools_and_a_summary_uses_no_tools(tmp_path: Path) -> None:
    from dex_ha.adapters.claude_agent import SUMMARY_PROMPT
    from dex_ha.worker.model import ModelRequest
    from harness.fake_models.anthropic_api import Reply, tool_use

    work_dir = tmp_path / "work"
    work_dir.mkdir()
    replies = [
        Reply.of(tool_use("mcp__dex__ask_user", {"question": "Which service?"})),
        Reply.of("The user wants web."),
    ]
    async with FakeAnthropic(replies) as fake:
        agent = coder_agent("coder", api_url=fake.base_url, work_dir=work_dir, ledger_path=tmp_path / "ledger.db")
        builtin = {
            "name": "ask_user",
            "description": "Ask the user.",
            "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
        }
        tools = [*agent.definition()["tools"], builtin]

        class Quiet:
            def send_text(self, text: str) -> None:
                pass

            def send(self, delta: dict[str, Any]) -> None:
                pass

        asked = await asyncio.wait_for(
            agent.model.respond(ModelRequest([{"type": "user", "text": "deploy"}], None, tools), Quiet()), DEADLINE_S
        )
        summary = await asyncio.wait_for(
            agent.model.summarize(
                [
                    {"type": "user", "text": "deploy"},
                    {
                        "type": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": asked.tool_calls[0].id,
                                "name": "ask_user",
                                "arguments": {"question": "Which service?"},
                            }
                        ],
                    },
                    {
                        "type": "tool_result",
                        "call_id": asked.tool_calls[0].id,
                        "name": "ask_user",
                        "status": "succeeded",
                        "output": "web",
                    },
                ],
                None,
            ),
            DEADLINE_S,
        )
        ask_body, summary_body = fake.bodies()
    assert [(c.name, c.arguments) for c in asked.tool_calls] == [("ask_user", {"question": "Which service?"})]
    assert {t["name"] for t in ask_body["tools"]} == {"Bash", "mcp__dex__put_record", "mcp__dex__ask_user"}
    assert summary == "The user wants web."
    assert not summary_body.get("tools")  # the summary's CLI has no tools
    texts = json.dumps(summary_body["messages"])
    assert "Which service?" in texts and "): web" in texts and SUMMARY_PROMPT in texts
