"""The agents the crash cells run, one per row, built inside the worker process.

Every tool and model call writes to the ledger (tests/crash/ledger.py) before and after it
does its work, so the cell sees what ran from outside the server. A call that must be
interrupted *hangs* on the attempts the row names: it stays in the Worker until the failure
hits it (a killed Worker, or the server's 409 after a restart or a takeover).

- `beats=True`: the hanging call sends heartbeats itself and records each one that got
  through ("beat"), so a cell can wait until the server has heard from the attempt
  ("while the tool runs").
- `beats=False`: the call sends none; with the worker's long heartbeat interval (or the
  first-heartbeat failpoint) the failure comes before the first heartbeat.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dex_ha.worker import Agent, DeltaSink, ModelRequest, ModelResponse, ScriptedModel, ToolContext
from tests.crash.ledger import Ledger
from tests.support.claude_segment import coder_agent

HANG_TICK_S = 0.1
LONG_TASK_POLL_MS = 100


class Kit:
    """What an agent's tools share: the ledger, and the failure column of the cell; for the
    R21 agent also the fake model API it calls and the work directory of its CLI."""

    def __init__(self, ledger: Ledger, column: str, api_url: str = "", work_dir: Path | None = None) -> None:
        self.ledger = ledger
        self.column = column
        self.api_url = api_url
        self.work_dir = work_dir

    async def hang(self, kind: str, name: str, ctx: ToolContext | None, beats: bool) -> None:
        """Never return: the failure ends this attempt (cancel, 409, or the process dies)."""
        while True:
            if beats and ctx is not None:
                await ctx.heartbeat()  # AttemptCancelled once the server says the attempt is over
                self.ledger.record(
                    kind, name, "beat", call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt
                )
            await asyncio.sleep(HANG_TICK_S)

    def tool_started(self, name: str, ctx: ToolContext, data: Any) -> None:
        """Record that the tool `name` started, with the attempt's call id, key and number."""
        self.ledger.record(
            "tool", name, "started", call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt, data=data
        )

    def tool(
        self,
        agent: Agent,
        name: str,
        *,
        effect: str,
        hang_on: Callable[[int], bool] = lambda _: False,
        beats: bool = False,
        output: Any = "done",
        **policy: Any,
    ) -> None:
        """A tool `name(ctx, **arguments)` that records its runs and hangs on the attempts `hang_on` picks."""

        async def run(ctx: ToolContext, **arguments: Any) -> Any:
            record: dict[str, Any] = dict(call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt)
            self.ledger.record("tool", name, "started", data=arguments, **record)
            if hang_on(ctx.attempt):
                await self.hang("tool", name, ctx, beats)
            self.ledger.record("tool", name, "finished", data=arguments, **record)
            return output

        agent.tool(effect=effect, name=name, input_schema={"type": "object"}, **policy)(run)

    def long_running_tool(
        self,
        agent: Agent,
        name: str,
        poll: Callable[[ToolContext, Any, int], Awaitable[Any]],
        poll_after_ms: int = LONG_TASK_POLL_MS,
    ) -> None:
        """A tool that starts a task (recorded as a tool run) and is then polled by `poll(ctx,
        handle, n)`, n counting the polls that ran before this one (in any attempt)."""

        async def start(ctx: ToolContext, **arguments: Any) -> Any:
            self.tool_started(name, ctx, arguments)
            return ctx.task_handle(f"task-of-{ctx.idempotency_key}", poll_after_ms=poll_after_ms)

        async def poll_task(ctx: ToolContext, handle: Any) -> Any:
            before = self.ledger.count("poll", name)
            self.ledger.record(
                "poll", name, "started", call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt, data=handle
            )
            value = await poll(ctx, handle, before)
            self.ledger.record("poll", name, "finished", call_id=ctx.call_id, attempt=ctx.attempt, data=handle)
            return value

        tool = agent.tool(effect="idempotent_write", name=name, input_schema={"type": "object"})(start)
        tool.poll(poll_task)


Script = Callable[[ModelRequest, int, DeltaSink], Awaitable[dict[str, Any]]]
Summarizer = Callable[[list[dict[str, Any]], str | None, int], Awaitable[str]]


class LedgerModel:
    """A model that records every call with what it saw, then answers from `script(request,
    nth, stream)`; nth is 1 for the first call with this exact input, 2 for its repeat (the
    model cannot see the attempt number, but a repeated attempt gets the same input)."""

    def __init__(self, kit: Kit, name: str, script: Script, summarizer: Summarizer | None = None) -> None:
        self._kit, self._name, self._script, self._summarizer = kit, name, script, summarizer

    def _nth(self, kind: str, seen: dict[str, Any]) -> int:
        return 1 + sum(1 for run in self._kit.ledger.runs(kind, self._name, "started") if run.data == seen)

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        seen = {"history": request.history, "summary": request.summary}
        nth = self._nth("model", seen)
        self._kit.ledger.record("model", self._name, "started", attempt=nth, data=seen)
        reply = await self._script(request, nth, stream)
        self._kit.ledger.record("model", self._name, "finished", attempt=nth, data=reply)
        return ModelResponse.coerce(reply)

    async def summarize(self, history: list[dict[str, Any]], summary: str | None) -> str:
        seen = {"history": history, "summary": summary}
        nth = self._nth("summary", seen)
        self._kit.ledger.record("summary", self._name, "started", attempt=nth, data=seen)
        text = await self._summarizer(history, summary, nth) if self._summarizer else f"summary {nth}"
        self._kit.ledger.record("summary", self._name, "finished", attempt=nth, data=text)
        return text


# ---------------------------------------------------------------- script helpers


def turn_items(request: ModelRequest) -> list[dict[str, Any]]:
    """The history items of the current turn (after the last user message)."""
    users = [i for i, item in enumerate(request.history) if item["type"] == "user"]
    return request.history[users[-1] :] if users else list(request.history)


def results_in_turn(request: ModelRequest) -> int:
    return sum(1 for item in turn_items(request) if item["type"] == "tool_result")


def user_text(request: ModelRequest) -> str:
    return turn_items(request)[0].get("text", "")


def answer(text: str) -> dict[str, Any]:
    return {"content": text, "tool_calls": []}


def calls(*specs: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"id": i, "name": n, "arguments": a} for i, n, a in specs]}


def calls_then_done(*specs: tuple[str, str, dict[str, Any]]) -> Script:
    """The model calls the tools `specs` at once, then answers "done" once it sees a result."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        return calls(*specs) if results_in_turn(request) == 0 else answer("done")

    return script


def first_attempt(attempt: int) -> bool:
    return attempt == 1


def every_attempt(attempt: int) -> bool:
    return True


def never(attempt: int) -> bool:
    return False


# ---------------------------------------------------------------- one agent per row


def r01(kit: Kit, name: str) -> Agent:
    """A tool runs, then the next model call hangs on every attempt; a later turn answers."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        if user_text(request) == "again":
            return answer("ok")
        if results_in_turn(request) == 0:
            return calls(("c1", "lookup", {"q": "x"}))
        await kit.hang("model", name, None, beats=False)  # no output reaches the server
        raise AssertionError("unreachable")

    agent = Agent(name, LedgerModel(kit, name, script))
    kit.tool(agent, "lookup", effect="read")
    return agent


def r02(kit: Kit, name: str) -> Agent:
    """The first attempt streams deltas, then hangs; the next one answers."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        if nth == 1:
            for word in ("partial ", "answer ", "of attempt one"):
                stream.send_text(word)
            await kit.hang("model", name, None, beats=False)
        stream.send_text("final answer")
        return answer("final answer")

    return Agent(name, LedgerModel(kit, name, script))


def single_tool_row(
    tool: str, effect: str, *, hang_on: Callable[[int], bool], beats: bool, **policy: Any
) -> Callable[[Kit, str], Agent]:
    """R03–R05, R07, R08, R19: the model calls `tool` once; the tool hangs where the row says."""

    def build(kit: Kit, name: str) -> Agent:
        agent = Agent(name, LedgerModel(kit, name, calls_then_done(("c1", tool, {"id": 7}))))
        kit.tool(agent, tool, effect=effect, hang_on=hang_on, beats=beats, **policy)
        return agent

    return build


def r06(kit: Kit, name: str) -> Agent:
    """A read and an idempotent write in one response, both hanging on every attempt."""

    agent = Agent(
        name, LedgerModel(kit, name, calls_then_done(("r", "lookup", {"q": "x"}), ("w", "put_item", {"id": 7})))
    )
    kit.tool(agent, "lookup", effect="read", hang_on=every_attempt, beats=True)
    kit.tool(agent, "put_item", effect="idempotent_write", hang_on=every_attempt, beats=True)
    return agent


def r09(kit: Kit, name: str) -> Agent:
    agent = Agent(name, LedgerModel(kit, name, calls_then_done(("c1", "wire_money", {"amount": 5}))))
    kit.tool(agent, "wire_money", effect="write", approval=True, output="wired")
    return agent


def r10(kit: Kit, name: str) -> Agent:
    """The model asks the user (ask_user) and a tool asks a question mid-run."""

    script = calls_then_done(("ask", "ask_user", {"question": "which colour?"}), ("b", "build_branch", {"x": 1}))

    async def build_branch(ctx: ToolContext, **arguments: Any) -> Any:
        kit.tool_started("build_branch", ctx, {"answer": ctx.answer, "has_answer": ctx.has_answer})
        branch = await ctx.ask("which branch?")
        kit.ledger.record("tool", "build_branch", "finished", call_id=ctx.call_id, attempt=ctx.attempt)
        return f"built {branch}"

    agent = Agent(name, LedgerModel(kit, name, script))
    agent.tool(effect="idempotent_write", name="build_branch", input_schema={"type": "object"})(build_branch)
    return agent


SLEEP_MS = 1500


def r11(kit: Kit, name: str) -> Agent:
    return Agent(name, LedgerModel(kit, name, calls_then_done(("z", "sleep", {"ms": SLEEP_MS}))))


def r12(kit: Kit, name: str) -> Agent:
    """A long-running task: the first poll says pending (next poll in 1.5 s), the second done."""

    async def poll(ctx: ToolContext, handle: Any, before: int) -> Any:
        return ctx.pending(1500) if before == 0 else "artifact"

    agent = Agent(name, LedgerModel(kit, name, calls_then_done(("t", "build", {"target": "all"}))))
    kit.long_running_tool(agent, "build", poll)
    return agent


def r13(kit: Kit, name: str) -> Agent:
    """The first poll is interrupted: with a Worker kill the poll function returns and the
    worker dies before delivering (failpoint); otherwise the poll hangs with heartbeats."""

    async def poll(ctx: ToolContext, handle: Any, before: int) -> Any:
        if before == 0 and kit.column != "worker_kill":
            await kit.hang("poll", "build", ctx, beats=True)
        return "artifact"

    agent = Agent(name, LedgerModel(kit, name, calls_then_done(("t", "build", {"target": "all"}))))
    kit.long_running_tool(agent, "build", poll)
    return agent


def hang_first_summary(kit: Kit, name: str) -> Summarizer:
    async def summarize(history: list[dict[str, Any]], summary: str | None, nth: int) -> str:
        if kit.ledger.count("summary", name) == 1:  # the very first summary call of the session
            await kit.hang("summary", name, None, beats=False)
        return f"summary of {len(history)} items"

    return summarize


async def numbered_answer(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
    return answer(f"answer to {user_text(request)}")


R14_MAX_ITEMS = 3  # the third user message finds 5 visible items: compaction


def r14(kit: Kit, name: str) -> Agent:
    return Agent(
        name,
        LedgerModel(kit, name, numbered_answer, hang_first_summary(kit, name)),
        compaction={"max_items": R14_MAX_ITEMS},
    )


def r15(kit: Kit, name: str) -> Agent:
    return Agent(name, LedgerModel(kit, name, numbered_answer))


R17_MAX_ITEMS = 6  # turn 1 ends with 6 visible items; the second message compacts


def r17(kit: Kit, name: str) -> Agent:
    """A read, then a long-running task, then (next turn) a compaction: the first run of
    each hangs without a heartbeat."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        if user_text(request) != "go":
            return answer("done again")
        done = results_in_turn(request)
        return [calls(("r", "lookup", {"q": "x"})), calls(("t", "build", {"target": "all"})), answer("done")][done]

    async def poll(ctx: ToolContext, handle: Any, before: int) -> Any:
        if before == 0:
            await kit.hang("poll", "build", ctx, beats=False)
        return "artifact"

    agent = Agent(
        name, LedgerModel(kit, name, script, hang_first_summary(kit, name)), compaction={"max_items": R17_MAX_ITEMS}
    )
    kit.tool(agent, "lookup", effect="read", hang_on=first_attempt, beats=False)
    kit.long_running_tool(agent, "build", poll)
    return agent


R18_SLEEP_MS = 300


def r18(kit: Kit, name: str) -> Agent:
    """Three waits: a timer, an approval and a question. With a Worker kill they come in one
    response; otherwise one per model round, so each can end on a node armed to die: the
    timer first (the node is armed before the turn starts), then the two the test ends."""

    waits: list[tuple[str, str, dict[str, Any]]] = [
        ("z", "sleep", {"ms": R18_SLEEP_MS}),
        ("a", "wire_money", {"amount": 5}),
        ("q", "ask_user", {"question": "sure?"}),
    ]

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        done = results_in_turn(request)
        if kit.column == "worker_kill":
            return calls(*waits) if done == 0 else answer("done")
        return calls(waits[done]) if done < len(waits) else answer("done")

    agent = Agent(name, LedgerModel(kit, name, script))
    kit.tool(agent, "wire_money", effect="write", approval=True, output="wired")
    return agent


def r20(kit: Kit, name: str) -> Agent:
    """An inline tool runs inside RunModel; its first run hangs."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        return calls(("i1", "search", {"q": "x"})) if results_in_turn(request) == 0 else answer("found")

    agent = Agent(name, LedgerModel(kit, name, script))

    async def search(ctx: ToolContext, **arguments: Any) -> Any:
        runs_before = kit.ledger.count("tool", "search")
        kit.tool_started("search", ctx, arguments)
        if runs_before == 0:
            await kit.hang("tool", "search", ctx, beats=False)
        kit.ledger.record("tool", "search", "finished", call_id=ctx.call_id, attempt=ctx.attempt)
        return ["hit"]

    agent.tool(effect="read", inline=True, name="search", input_schema={"type": "object"})(search)
    return agent


def r16_busy(kit: Kit, name: str) -> Agent:
    """The session whose message is "go" calls an idempotent write that hangs (with
    heartbeats) on attempt 1; the model answers any other session's message at once."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        if user_text(request) != "go":
            return answer(f"answer to {user_text(request)}")
        return calls(("c1", "put_item", {"id": 7})) if results_in_turn(request) == 0 else answer("done")

    agent = Agent(name, LedgerModel(kit, name, script))
    kit.tool(agent, "put_item", effect="idempotent_write", hang_on=first_attempt, beats=True)
    return agent


# ---------------------------------------------------------------- calls that never ran, and the exception

# The call the model makes for each first message of a NEVER_RAN session.
NEVER_RAN_CALLS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "refused": ("c1", "send_to", {"address": "a@example.com", "unexpected": True}),  # not in its signature
    "handout": ("c1", "send_email", {"id": 7}),
    "denied": ("c1", "wire_money", {"amount": 5}),
}


def never_ran(kit: Kit, name: str) -> Agent:
    """Single-attempt writes that do not run: one whose arguments the Worker refuses, one
    whose hand-out never reaches the Worker, one the user denies."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        call = NEVER_RAN_CALLS.get(user_text(request))
        return calls(call) if call is not None and results_in_turn(request) == 0 else answer("done")

    def send_to(ctx: ToolContext, address: str) -> str:  # the Worker binds the arguments first
        kit.ledger.record("tool", "send_to", "started", call_id=ctx.call_id, key=ctx.idempotency_key)
        return "sent"

    agent = Agent(name, LedgerModel(kit, name, script))
    kit.tool(agent, "send_email", effect="write")
    kit.tool(agent, "wire_money", effect="write", approval=True, output="wired")
    agent.tool(effect="write", name="send_to", input_schema={"type": "object"})(send_to)
    return agent


RELEASE = "release"  # the ledger signal that lets a KEEPS_RUNNING tool finish
RELEASE_DEADLINE_S = 60.0


def keeps_running(kit: Kit, name: str) -> Agent:
    """ "go": the model calls a single-attempt write, a sync function (so it runs in a thread
    that a cancel cannot interrupt) that finishes only once the test writes the release
    signal to the ledger. Any other message is answered at once."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        if user_text(request) != "go":
            return answer(f"answer to {user_text(request)}")
        return calls(("c1", "send_slowly", {"id": 7})) if results_in_turn(request) == 0 else answer("done")

    def send_slowly(ctx: ToolContext, **arguments: Any) -> str:
        ledger = Ledger(kit.ledger.path)  # this thread's own connection
        try:
            record: dict[str, Any] = dict(call_id=ctx.call_id, key=ctx.idempotency_key, attempt=ctx.attempt)
            ledger.record("tool", "send_slowly", "started", data=arguments, **record)
            wait_for_signal(ledger, RELEASE)
            ledger.record("tool", "send_slowly", "finished", data=arguments, **record)
        finally:
            ledger.close()
        return "sent"

    agent = Agent(name, LedgerModel(kit, name, script))
    agent.tool(effect="write", name="send_slowly", input_schema={"type": "object"})(send_slowly)
    return agent


def wait_for_signal(ledger: Ledger, name: str) -> None:
    """Block until the test wrote the signal `name` to the ledger (a thread has no event loop)."""
    deadline = time.monotonic() + RELEASE_DEADLINE_S
    while not ledger.runs("signal", name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name!r} signal in the ledger within {RELEASE_DEADLINE_S} s")
        time.sleep(HANG_TICK_S)


# ---------------------------------------------------------------- the soak's agent

SOAK_TOOLS = (("lookup", "read"), ("put_item", "idempotent_write"), ("send_note", "write"))
SOAK_TOOL_S = (0.05, 0.6)  # how long one tool run takes: long enough to be killed mid-run


def soak(kit: Kit, name: str) -> Agent:
    """tests/crash/test_soak.py: each turn calls one tool of every effect at once, each
    running a random while (with heartbeats), then answers. Call ids carry the user's text
    (unique per session), so every call of the session is told apart; the ledger names a
    run by `session:call` and records the key the Worker was given."""

    async def script(request: ModelRequest, nth: int, stream: DeltaSink) -> dict[str, Any]:
        text = user_text(request)
        if results_in_turn(request) == 0:
            return calls(*((f"{text}-{tool}", tool, {"text": text}) for tool, _ in SOAK_TOOLS))
        return answer(f"done {text}")

    agent = Agent(name, LedgerModel(kit, name, script))
    for tool, effect in SOAK_TOOLS:
        agent.tool(effect=effect, name=tool, input_schema={"type": "object"})(soak_tool(kit, tool))
    return agent


def soak_tool(kit: Kit, name: str) -> Callable[..., Awaitable[Any]]:
    async def run(ctx: ToolContext, **arguments: Any) -> Any:
        record: dict[str, Any] = dict(
            call_id=f"{ctx.session_id}:{ctx.call_id}", key=ctx.idempotency_key, attempt=ctx.attempt
        )
        kit.ledger.record("tool", name, "started", data=arguments, **record)
        loop = asyncio.get_running_loop()
        # Drawn from the call and the attempt, not from the process: the session ids carry the
        # run's seed, so a replayed seed gives every run the same length.
        until = loop.time() + random.Random(f"{record['call_id']}/{ctx.attempt}").uniform(*SOAK_TOOL_S)
        while loop.time() < until:
            await ctx.heartbeat()  # AttemptCancelled once the server failed this attempt
            await asyncio.sleep(min(HANG_TICK_S, max(0.0, until - loop.time())))
        kit.ledger.record("tool", name, "finished", data=arguments, **record)
        return f"{name} ok"

    return run


# ---------------------------------------------------------------- the robustness suite's agent

# What a user message of tests/robustness asks for: "<message id> <step> <step> ...", each
# step one tool call of the turn's first model response (all at once), then an answer.
ROBUSTNESS_STEPS = {
    "read": ("lookup", "read"),
    "idem": ("put_item", "idempotent_write"),
    "write": ("send_note", "write"),
    "approve": ("wire_money", "write"),  # a single-attempt write that waits for approval
}
ROBUSTNESS_SLEEP_MS = 300  # the "sleep" step: the server's built-in timer tool


def robustness(kit: Kit, name: str) -> Agent:
    """tests/robustness: the steps the user's text names, then "done". Call ids are the
    message id and the step (unique in the session); the tools record their runs in the
    ledger as the soak's do (`session:call`), with heartbeats while they run."""

    def script(request: ModelRequest) -> dict[str, Any]:
        message_id, *steps = user_text(request).split()
        if results_in_turn(request) or not steps:
            return answer(f"done {message_id}")
        return calls(*(robustness_call(message_id, step) for step in steps))

    agent = Agent(name, ScriptedModel(script))
    for step, (tool, effect) in ROBUSTNESS_STEPS.items():
        policy: dict[str, Any] = {"approval": True} if step == "approve" else {}
        agent.tool(effect=effect, name=tool, input_schema={"type": "object"}, **policy)(soak_tool(kit, tool))
    return agent


def robustness_call(message_id: str, step: str) -> tuple[str, str, dict[str, Any]]:
    if step == "sleep":
        return (f"{message_id}-sleep", "sleep", {"ms": ROBUSTNESS_SLEEP_MS})
    return (f"{message_id}-{step}", ROBUSTNESS_STEPS[step][0], {"text": message_id})


def r21(kit: Kit, name: str) -> Agent:
    """The Claude Agent SDK coder (tests/support/claude_segment.py): its CLI runs Bash inline
    and calls the deferred write put_record, which records its runs in the ledger."""
    assert kit.api_url and kit.work_dir is not None, "the R21 agent needs --api-url and --work-dir"
    agent: Agent = coder_agent(name, api_url=kit.api_url, work_dir=kit.work_dir, ledger_path=kit.ledger.path)
    return agent


AgentBuilder = Callable[[Kit, str], Agent]

# The agents of the suites that are not crash cells; a cell's agent is named by its row
# (tests/crash/rows.py).
OTHER_AGENTS: dict[str, AgentBuilder] = {"SOAK": soak, "ROBUSTNESS": robustness}
