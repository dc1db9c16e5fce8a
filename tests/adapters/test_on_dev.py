"""Both adapters on a real `dex-ha dev`: a whole turn with two tool calls, and each adapter's
Worker-kill cells (crash matrix: "Each adapter package repeats the Worker kill cases for
RunModel and its tool Steps in its own test suite").

The agents are framework agents (tests/adapters/framework_agents.py) whose model is the
framework's own OpenAI model talking to the fake OpenAI server. Evidence from outside the
server: the requests the fake received (what each model call saw), the ledger the tools
write (what ran, with which idempotency key and attempt), and the session snapshot.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dex_ha.client import DexClient, SessionEvent
from dex_ha.worker import Worker
from harness.dev_process import DevProcess
from harness.fake_models.openai_api import Call, FakeOpenAI, RecordedRequest, Reply
from harness.processes import REPO_ROOT, stop
from harness.waiting import eventually
from harness.worker_process import WorkerOptions, start_worker
from tests.adapters.framework_agents import FRAMEWORKS, INSTRUCTIONS, ToolKit, build, warm_up
from tests.crash.cell import attempts, call_of
from tests.crash.ledger import Ledger
from tests.e2e.conftest import running

DEADLINE_S = 30.0
# A killed Worker's attempt fails after this long without heartbeats (default 30 s).
HEARTBEAT_TIMEOUT_MS = 2_000
_agent_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevProcess]:
    """One `dex-ha dev` for the module; each test uses agents of its own names."""
    directory = tmp_path_factory.mktemp("dev")
    server = DevProcess(
        directory / "data",
        directory / "dev.log",
        relaxed=True,
        extra_env={"DEX_HA_HEARTBEAT_TIMEOUT_MS": str(HEARTBEAT_TIMEOUT_MS)},
    )
    server.start()
    try:
        asyncio.run(server.wait_ready())
        yield server
    finally:
        assert server.stop() == 0, server.log_tail()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    book = Ledger(tmp_path / "ledger.sqlite")
    yield book
    book.close()


def agent_name(framework: str) -> str:
    return f"{framework.replace('_', '-')}-{next(_agent_numbers)}"


def has_tool_results(request: RecordedRequest) -> bool:
    """Whether the model call saw tool results (Responses API or Chat Completions)."""
    items = request.body.get("input") or request.body.get("messages") or []
    return any(item.get("type") == "function_call_output" or item.get("role") == "tool" for item in items)


def calls_then_answer(calls: list[Call], answer: str) -> Any:
    """The fake's script: the calls until the model has seen tool results, then `answer`."""
    return lambda request: (
        Reply(answer, delta_delay_s=0.01) if has_tool_results(request) else Reply("Let me check.", calls)
    )


def model_input(request: RecordedRequest) -> Any:
    return request.body.get("input") or request.body.get("messages")


# ---------------------------------------------------------------- a whole turn


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_turn_with_two_tool_calls(
    dev: DevProcess, fake: FakeOpenAI, ledger: Ledger, tmp_path: Path, framework: str
) -> None:
    fake.script = calls_then_answer(
        [
            Call("lookup", {"order": "A17"}, call_id="call_look"),
            Call("put_note", {"text": "asked about A17"}, call_id="call_note"),
        ],
        "Order A17 has shipped.",
    )
    name = agent_name(framework)
    await warm_up(framework, tmp_path / "warm-up.sqlite")
    worker = Worker(
        dev.url,
        agents=[build(framework, name, fake.base_url, ToolKit(ledger))],
        poll_wait_ms=1_000,
        drain_timeout_s=1.0,
    )
    async with running(worker), DexClient(dev.url) as client:
        sid = (await client.create_session(name)).session_id
        deltas: list[str] = []
        reader = asyncio.create_task(collect_deltas(client, sid, deltas))
        await client.send_message(sid, "Where is my order A17?")
        snapshot = await client.wait_until_idle(sid, timeout_s=DEADLINE_S)
        await eventually(lambda: "".join(deltas).endswith("Order A17 has shipped."), "the answer's deltas")
        reader.cancel()

    # Each tool ran once, in its own step, with the model's arguments and the contract key.
    runs = [(r.name, r.data, r.key) for r in ledger.runs("tool", moment="finished")]
    assert sorted(runs) == [
        ("lookup", {"order": "A17"}, f"{sid}:call_look"),
        ("put_note", {"text": "asked about A17"}, f"{sid}:call_note"),
    ]
    assert [[step.kind for step in call.steps] for call in snapshot.tool_calls] == [["CallTool"]] * 2
    assert {c.call_id: (c.status, c.effect) for c in snapshot.tool_calls} == {
        "call_look": ("succeeded", "read"),
        "call_note": ("succeeded", "idempotent_write"),
    }
    history = snapshot.history
    assert [h["type"] for h in history] == ["user", "assistant", "tool_result", "tool_result", "assistant"]
    assert history[-1]["content"] == "Order A17 has shipped."

    # The framework built the model calls: its instructions and tools, then both results.
    first, second = fake.requests
    assert INSTRUCTIONS in str(first.body.get("instructions")) + str(first.body.get("messages"))
    tool_names = {t.get("name") or t["function"]["name"] for t in first.body["tools"]}
    assert tool_names == {"lookup", "put_note", "refund", "ask_user", "sleep"}
    assert not has_tool_results(first) and has_tool_results(second)
    assert '"status": "shipped"' in str(model_input(second))


async def collect_deltas(client: DexClient, session_id: str, sink: list[str]) -> None:
    async for event in client.events(session_id):
        if event.type == "delta":
            sink.append(event.data.get("text", ""))


# ---------------------------------------------------------------- Worker kill cells


class WorkerProcess:
    """`python -m tests.adapters.worker_proc` for one cell; SIGKILLed and stopped by pid."""

    def __init__(
        self,
        framework: str,
        agent: str,
        dev: DevProcess,
        fake: FakeOpenAI,
        ledger: Ledger,
        log_path: Path,
        hang: str | None = None,
    ) -> None:
        self.url = dev.url
        self.args = [
            *("--framework", framework, "--agent", agent, "--base-url", fake.base_url),
            *("--ledger", str(ledger.path), *(["--hang", hang] if hang else [])),
        ]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        options = WorkerOptions(backoff_max_s=0.2)
        self.proc = start_worker(
            "tests.adapters.worker_proc", self.url, self.args, options=options, log=self.log_path, cwd=REPO_ROOT
        )

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "the worker process died before the kill"
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, timeout=5)


class KillCell:
    """One cell: a session of a fresh agent, a Worker process to kill and one to recover."""

    def __init__(
        self,
        framework: str,
        dev: DevProcess,
        fake: FakeOpenAI,
        ledger: Ledger,
        directory: Path,
        hang: str | None = None,
    ) -> None:
        self.name = agent_name(framework)
        self.dev, self.ledger = dev, ledger
        self.worker = WorkerProcess(framework, self.name, dev, fake, ledger, directory / "worker.log", hang)
        self.client = DexClient(dev.url)
        self.session_id = ""
        self.events: list[SessionEvent] = []
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KillCell:
        self.worker.start()
        self.session_id = (await self.client.create_session(self.name)).session_id
        self._reader = asyncio.create_task(self._read_events())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.worker.stop()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.client.close()

    async def _read_events(self) -> None:
        async for event in self.client.events(self.session_id):
            self.events.append(event)

    def model_attempts(self) -> list[tuple[str, str | None]]:
        """(status, attempt_progress) of each RunModel attempt, from the committed events (the
        snapshot of an ended turn lists no steps). Call it once the session is idle."""
        failed = {
            (e.data["step_id"], e.data["attempt"]): e.data["attempt_progress"]
            for e in self.events
            if e.type == "attempt_failed"
        }
        started = [
            (e.data["step_id"], e.data["attempt"])
            for e in self.events
            if e.type == "attempt_started" and e.data["kind"] == "RunModel"
        ]
        return [("failed", failed[key]) if key in failed else ("completed", None) for key in started]

    async def kill_and_recover(self) -> None:
        """SIGKILL the Worker process, and start a new one (same agent, same ledger)."""
        self.worker.kill()
        self.worker.start()

    async def until_ledger(self, name: str, moment: str) -> None:
        await eventually(lambda: self.ledger.count("tool", name, moment), f"{name} {moment}", DEADLINE_S)

    async def idle(self) -> dict[str, Any]:
        """The idle snapshot (its JSON), once the event stream has seen the end of the turn too."""
        snapshot = (await self.client.wait_until_idle(self.session_id, timeout_s=DEADLINE_S)).raw
        await eventually(
            lambda: any(e.type in ("turn_completed", "turn_failed") for e in self.events),
            "the event stream to reach the end of the turn",
            DEADLINE_S,
        )
        return snapshot


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_run_model_killed_mid_stream_runs_again_and_the_turn_completes(
    dev: DevProcess, fake: FakeOpenAI, ledger: Ledger, tmp_path: Path, framework: str
) -> None:
    fake.queue(Reply("Let me look at", stall_after=2))  # attempt 1: two deltas, then the stream hangs
    fake.script = lambda request: Reply("Hello, how can I help?")
    async with KillCell(framework, dev, fake, ledger, tmp_path) as cell:
        await cell.client.send_message(cell.session_id, "hello")
        await fake.wait_stalled(DEADLINE_S)
        await cell.kill_and_recover()
        snapshot = await cell.idle()

    assert snapshot["turns"][-1]["status"] == "completed"
    assert snapshot["history"][-1]["content"] == "Hello, how can I help?"
    assert cell.model_attempts() == [("failed", "NOT_COMPLETED"), ("completed", None)]
    first, second = fake.requests  # the model call ran again, with the same input
    assert model_input(first) == model_input(second)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("tool", ["put_note", "lookup"])
async def test_a_repeatable_tool_killed_mid_run_runs_again_with_the_same_key(
    dev: DevProcess, fake: FakeOpenAI, ledger: Ledger, tmp_path: Path, framework: str, tool: str
) -> None:
    arguments = {"text": "call me"} if tool == "put_note" else {"order": "A17"}
    fake.script = calls_then_answer([Call(tool, arguments, call_id="call_1")], "Done.")
    async with KillCell(framework, dev, fake, ledger, tmp_path, hang=tool) as cell:
        await cell.client.send_message(cell.session_id, "please")
        await cell.until_ledger(tool, "beat")  # the server has heard from the running tool
        await cell.kill_and_recover()
        snapshot = await cell.idle()

    started = ledger.runs("tool", tool, "started")
    assert [(r.attempt, r.key) for r in started] == [(1, f"{cell.session_id}:call_1"), (2, f"{cell.session_id}:call_1")]
    assert len({r.pid for r in started}) == 2  # the second run was the new Worker's
    assert ledger.count("tool", tool, "finished") == 1
    call = call_of(snapshot, "call_1")
    assert call["status"] == "succeeded"
    assert attempts(call["steps"], "CallTool") == [("failed", "NOT_COMPLETED"), ("completed", None)]
    assert snapshot["history"][-1]["content"] == "Done."


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_write_tool_killed_mid_run_is_outcome_unknown_and_never_runs_again(
    dev: DevProcess, fake: FakeOpenAI, ledger: Ledger, tmp_path: Path, framework: str
) -> None:
    fake.script = calls_then_answer(
        [Call("refund", {"order": "A17"}, call_id="call_1")], "I could not confirm the refund."
    )
    async with KillCell(framework, dev, fake, ledger, tmp_path, hang="refund") as cell:
        await cell.client.send_message(cell.session_id, "refund A17")
        await cell.until_ledger("refund", "beat")
        await cell.kill_and_recover()
        snapshot = await cell.idle()

    call = call_of(snapshot, "call_1")
    assert (call["status"], call["effect"]) == ("outcome_unknown", "write")  # undeclared: the default
    assert attempts(call["steps"], "CallSingleAttemptTool") == [("failed", "NOT_COMPLETED")]
    assert ledger.count("tool", "refund", "started") == 1  # the new Worker never ran it
    # The model's next call saw the unknown outcome, and the turn went on to its answer.
    assert "outcome_unknown" in str(model_input(fake.requests[-1]))
    assert snapshot["history"][-1]["content"] == "I could not confirm the refund."
