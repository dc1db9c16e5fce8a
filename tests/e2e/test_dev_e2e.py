"""End to end on `dex-ha dev` (a real child process) with a scripted-model agent run by the
Worker SDK and driven by the Client SDK.

Evidence comes from outside the server: a ledger of tool runs kept by the tools themselves
(which tool ran, how often, with which idempotency key), the SSE stream, and the agent
snapshot.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient, Session, SessionEvent, ToolCallRecord
from dex_ha.worker import Agent, ModelRequest, ScriptedModel, ToolContext, ToolError, Worker
from harness.dev_process import DevProcess
from harness.waiting import eventually
from tests.e2e.conftest import running

AGENT = "e2e"
DEADLINE_S = 30.0

FIRST_ROUND = [  # one model response with parallel calls of every kind the engine routes
    {"id": "c-lookup", "name": "lookup", "arguments": {"q": "order 7"}},
    {"id": "c-put", "name": "put_item", "arguments": {"item": "book"}},
    {"id": "c-mail", "name": "send_email", "arguments": {"to": "ann@example.com"}},
    {"id": "c-wire-yes", "name": "wire_money", "arguments": {"amount": 10}},
    {"id": "c-wire-no", "name": "wire_money", "arguments": {"amount": 99999}},
    {"id": "c-ask", "name": "ask_user", "arguments": {"question": "Which color?"}},
    {"id": "c-sleep", "name": "sleep", "arguments": {"ms": 300}},
    {"id": "c-build", "name": "build", "arguments": {"target": "app"}},
    {"id": "c-bad", "name": "fragile", "arguments": {}},
]


class Ledger:
    """What the tools did, recorded by the tools (outside the server)."""

    def __init__(self) -> None:
        self.runs: collections.Counter[tuple[str, str | None]] = collections.Counter()  # (tool, idempotency key)
        self.polls: collections.Counter[str] = collections.Counter()
        self.cancelled: list[str] = []
        self.blocking_started = asyncio.Event()

    def ran(self, name: str, ctx: ToolContext) -> None:
        self.runs[(name, ctx.idempotency_key)] += 1

    def count(self, name: str) -> int:
        return sum(n for (tool, _), n in self.runs.items() if tool == name)


def script(request: ModelRequest) -> dict[str, Any]:
    """The model sees the latest history item (even after compaction): a user message
    starts a round of calls, a tool result gets the final answer."""
    last = request.history[-1]
    if last["type"] == "user" and last["text"] == "run everything":
        return {"content": "Working on it now.", "tool_calls": FIRST_ROUND}
    if last["type"] == "user" and last["text"] == "block":
        return {"content": "", "tool_calls": [{"id": "c-slow", "name": "slow_write", "arguments": {"x": "1"}}]}
    return {"content": f"done after {last['type']}", "tool_calls": []}


def make_agent(ledger: Ledger) -> Agent:
    agent = Agent(AGENT, model=ScriptedModel(script, delta_delay_s=0.005), compaction={"max_items": 8})

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, q: str) -> dict[str, str]:
        ledger.ran("lookup", ctx)
        return {"found": q}

    @agent.tool(effect="idempotent_write")
    async def put_item(ctx: ToolContext, item: str) -> str:
        ledger.ran("put_item", ctx)
        return f"stored {item}"

    @agent.tool(effect="write")
    async def send_email(ctx: ToolContext, to: str) -> str:
        ledger.ran("send_email", ctx)
        return f"sent to {to}"

    @agent.tool(effect="write", approval=True)
    async def wire_money(ctx: ToolContext, amount: int) -> str:
        ledger.ran("wire_money", ctx)
        return f"wired {amount}"

    @agent.tool(effect="read")
    async def fragile(ctx: ToolContext) -> str:
        ledger.ran("fragile", ctx)
        raise ToolError("the backend said no")

    @agent.tool(effect="idempotent_write")
    async def build(ctx: ToolContext, target: str) -> Any:
        ledger.ran("build", ctx)
        return ctx.task_handle({"target": target}, poll_after_ms=50)

    @build.poll
    async def poll_build(ctx: ToolContext, handle: dict[str, str]) -> Any:
        ledger.polls[handle["target"]] += 1
        if ledger.polls[handle["target"]] < 3:
            return ctx.pending(poll_after_ms=50)
        return {"artifact": f"{handle['target']}.tar"}

    @agent.tool(effect="write")
    async def slow_write(ctx: ToolContext, x: str) -> str:
        ledger.ran("slow_write", ctx)
        ledger.blocking_started.set()
        try:
            await asyncio.Event().wait()  # runs until the server tells the Worker to cancel
        except asyncio.CancelledError:
            ledger.cancelled.append(ctx.call_id or "")
            raise
        return "unreachable"

    return agent


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevProcess]:
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log")
    server.start()
    try:
        await server.wait_ready()
        yield server
    finally:
        assert server.stop() == 0, f"dex-ha dev did not stop cleanly on SIGTERM\n{server.log_tail()}"


@pytest.fixture
async def stack(dev: DevProcess) -> AsyncIterator[tuple[DexClient, Ledger, Worker]]:
    ledger = Ledger()
    worker = Worker(
        dev.url,
        agents=[make_agent(ledger)],
        max_concurrency=16,
        poll_wait_ms=2_000,
        heartbeat_interval_s=0.2,
        drain_timeout_s=1.0,
    )
    async with running(worker), DexClient(dev.url) as client:
        yield client, ledger, worker


async def collect_events(client: DexClient, session_id: str, until: str, sink: list[SessionEvent]) -> None:
    async for event in client.events(session_id):
        sink.append(event)
        if event.type == until:
            return


def calls_by_id(snapshot: Session) -> dict[str, ToolCallRecord]:
    return {c.call_id: c for c in snapshot.tool_calls}


async def test_a_turn_through_every_route_of_a_tool_call(stack: tuple[DexClient, Ledger, Worker]) -> None:
    client, ledger, _ = stack
    session = await client.create_session(AGENT)
    sid = session.session_id
    events: list[SessionEvent] = []
    reader = asyncio.create_task(collect_events(client, sid, "turn_completed", events))
    await client.send_message(sid, "run everything")

    async def approvals_and_question() -> Any:
        snap = await client.get_session(sid)
        return snap if len(snap.pending_approvals) == 2 and snap.pending_questions else None

    snap = await eventually(approvals_and_question, "two approvals and a question")
    assert ledger.count("wire_money") == 0, "a tool that needs approval ran before it was approved"
    await client.approve(sid, "c-wire-yes")
    await client.deny(sid, "c-wire-no", reason="too much")
    await client.answer(sid, snap.pending_questions[0].question_id, "blue")
    final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    await asyncio.wait_for(reader, DEADLINE_S)

    calls = calls_by_id(final)
    expected = {
        "c-lookup": "succeeded",
        "c-put": "succeeded",
        "c-mail": "succeeded",
        "c-wire-yes": "succeeded",
        "c-wire-no": "failed",
        "c-ask": "succeeded",
        "c-sleep": "succeeded",
        "c-build": "succeeded",
        "c-bad": "failed",
    }
    assert {cid: calls[cid].status for cid in expected} == expected
    assert calls["c-wire-no"].error and "too much" in calls["c-wire-no"].error
    assert calls["c-bad"].error == "the backend said no"
    assert calls["c-build"].output == {"artifact": "app.tar"}
    assert calls["c-ask"].output == "blue"
    # Each tool ran exactly once, with the contract idempotency key; the denied one never.
    assert ledger.runs == {
        ("lookup", f"{sid}:c-lookup"): 1,
        ("put_item", f"{sid}:c-put"): 1,
        ("send_email", f"{sid}:c-mail"): 1,
        ("wire_money", f"{sid}:c-wire-yes"): 1,
        ("build", f"{sid}:c-build"): 1,
        ("fragile", f"{sid}:c-bad"): 1,
    }
    assert ledger.polls["app"] == 3  # two pending answers, then ok: one task, several polls
    kinds = {c.call_id: c.raw["step_kind"] for c in final.tool_calls}
    assert kinds["c-mail"] == "CallSingleAttemptTool" and kinds["c-lookup"] == "CallTool"
    assert kinds["c-sleep"] == "AwaitTimer" and kinds["c-ask"] == "AwaitQuestionAnswer"
    assert kinds["c-build"] == "PollToolTask"
    # Ten history items before the second model call is over the limit of 8: compaction ran.
    assert final.summary is not None and final.summary["text"].startswith("summary of")
    assert [s.kind for s in calls["c-build"].steps].count("PollToolTask") == 3
    assert final.history[-1]["type"] == "assistant"

    types = [e.type for e in events]
    for expected_type in (
        "turn_started",
        "approval_requested",
        "approval_decided",
        "question_asked",
        "question_answered",
        "timer_set",
        "timer_fired",
        "tool_task_started",
        "summary_updated",
        "turn_completed",
    ):
        assert expected_type in types, f"no {expected_type} event in {types}"
    deltas = [e for e in events if e.type == "delta"]
    assert deltas and all(e.id is None and e.step_id for e in deltas)
    assert "".join(e.data.get("text", "") for e in deltas).startswith("Working on it now.")
    ids = [int(e.id) for e in events if e.id is not None]
    assert ids == sorted(ids) and len(ids) == len(set(ids))

    # Resume from the middle: exactly the events after that id, none twice.
    middle = ids[len(ids) // 2]
    resumed: list[int] = []
    async for event in client.events(sid, after=str(middle)):
        if event.id is not None:
            resumed.append(int(event.id))
        if event.type == "turn_completed":
            break
    assert resumed == [i for i in ids if i > middle]


async def test_cancel_stops_a_running_write_and_reconcile_settles_it(stack: tuple[DexClient, Ledger, Worker]) -> None:
    client, ledger, _ = stack
    sid = (await client.create_session(AGENT)).session_id
    await client.send_message(sid, "block")
    await asyncio.wait_for(ledger.blocking_started.wait(), DEADLINE_S)
    await client.cancel(sid)
    final = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    call = calls_by_id(final)["c-slow"]
    # A running single-attempt write that was cancelled may have done its work.
    assert call.status == "outcome_unknown"
    assert final.turns[-1].status == "cancelled"

    async def tool_was_cancelled() -> bool:
        return ledger.cancelled == ["c-slow"]

    await eventually(tool_was_cancelled, "the Worker to cancel the running tool")
    assert ledger.count("slow_write") == 1

    async def attempt_ended() -> bool:
        call = calls_by_id(await client.get_session(sid))["c-slow"]
        return [a.status for s in call.steps for a in s.attempts] == ["failed"]

    # The Worker reports that it stopped, so the attempt ends now, not at its heartbeat timeout.
    await eventually(attempt_ended, "the cancelled attempt to end", deadline_s=5.0)

    await client.reconcile(sid, "c-slow", "succeeded", result={"checked": "by hand"})
    call = calls_by_id(await client.get_session(sid))["c-slow"]
    assert call.status == "succeeded" and call.output == {"checked": "by hand"}
    assert call.raw["reconciled_at"] is not None
    again = await client.reconcile(sid, "c-slow", "succeeded", result={"checked": "by hand"})
    assert again["noop"] is True
    assert ledger.count("slow_write") == 1  # reconcile never runs the tool


async def test_a_restart_keeps_the_session_and_the_next_message_runs(tmp_path: Path) -> None:
    """SIGKILL of the only node while the session is idle (row R15, server_restart)."""
    server = DevProcess(tmp_path / "data", tmp_path / "dev.log")
    server.start()
    ledger = Ledger()
    worker = Worker(server.url, agents=[make_agent(ledger)], poll_wait_ms=1_000, heartbeat_interval_s=0.2)
    try:
        async with running(worker), DexClient(server.url) as client:
            await server.wait_ready()
            sid = (await client.create_session(AGENT)).session_id
            await client.send_message(sid, "hello")
            first = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
            server.kill()
            server.start()
            await server.wait_ready()
            await client.send_message(sid, "again")
            second = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
    finally:
        server.stop()
    assert [t.status for t in second.turns] == ["completed", "completed"]
    assert second.history[: len(first.history)] == first.history
