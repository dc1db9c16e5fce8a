"""The Worker against a fake server: registration, polling, every task kind's result,
heartbeats and deltas, cancellation, result delivery across 503/409/400, and stop()."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dex_ha.client import DexError
from dex_ha.worker import Agent, AttemptCancelled, NonRetryableError, ScriptedModel, ToolContext, ToolError, Worker
from tests.worker.fake_server import FakeServer

SCRIPT = [
    {
        "content": "Searching now",
        "tool_calls": [
            {"name": "search", "arguments": {"query": "shoes"}},
            {"name": "search", "arguments": {"query": "fail"}},
            {"name": "lookup", "arguments": {"order_id": "7"}},
        ],
    }
]


class Toolbox:
    """The `support` agent's tools, and what they observed while running."""

    def __init__(self, model: Any = None) -> None:
        self.gates: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.active = 0
        self.max_active = 0
        self.polls = 0
        self.agent = agent = Agent("support", model=model or ScriptedModel(SCRIPT))

        @agent.tool(effect="read")
        async def lookup(ctx: ToolContext, order_id: str) -> dict[str, Any]:
            return {
                "order_id": order_id,
                "session_id": ctx.session_id,
                "step_id": ctx.step_id,
                "call_id": ctx.call_id,
                "attempt": ctx.attempt,
                "key": ctx.idempotency_key,
                "worker_id": ctx.worker_id,
            }

        @agent.tool(effect="write")
        async def refund(ctx: ToolContext, amount: int) -> str:
            if amount > 100:
                raise ToolError(f"refund of {amount} is over the limit")
            return f"refunded {amount}"

        @agent.tool(effect="read")
        async def confirm(ctx: ToolContext, item: str) -> dict[str, Any]:
            answer = await ctx.ask(f"Ship {item}?")
            return {"item": item, "answer": answer}

        @agent.tool(effect="idempotent_write")
        async def build(ctx: ToolContext, target: str) -> Any:
            return ctx.task_handle({"job": target, "key": ctx.idempotency_key}, poll_after_ms=500)

        @build.poll
        async def poll_build(ctx: ToolContext, handle: dict[str, Any]) -> Any:
            self.polls += 1
            if self.polls == 1:
                return ctx.pending()
            if self.polls == 2:
                return ctx.pending(poll_after_ms=250)
            return {"built": handle["job"]}

        @agent.tool(effect="idempotent_write")
        async def start_job(ctx: ToolContext) -> Any:  # breaks the protocol: a handle, no poll function
            return ctx.task_handle("job-1")

        @agent.tool(effect="read", inline=True)
        async def search(ctx: ToolContext, query: str) -> list[str]:
            if query == "fail":
                raise ToolError("search index offline")
            return [query.upper(), ctx.idempotency_key or ""]

        @agent.tool(effect="read")
        async def crash(ctx: ToolContext) -> None:
            raise RuntimeError("database down")

        @agent.tool(effect="read")
        async def wait_gate(ctx: ToolContext, name: str) -> str:
            self.started.append(name)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                await self.gates[name].wait()
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise
            finally:
                self.active -= 1
            return name

        @agent.tool(effect="read")
        def crunch(ctx: ToolContext, seconds: float) -> str:
            time.sleep(seconds)  # a blocking tool: the Worker must run it in a thread
            return "crunched"

        @agent.tool(effect="read")
        async def beat_until_told(ctx: ToolContext) -> str:
            try:
                while True:
                    await ctx.heartbeat(stage="working")
                    await asyncio.sleep(0.01)
            except AttemptCancelled:
                self.cancelled.append("beat_until_told")
                return "cleaned up"


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    async with FakeServer() as server:
        yield server


def make_worker(fake: FakeServer, *agents: Agent, **overrides: Any) -> Worker:
    # One poll at a time unless a test says otherwise: the tests count polls and their sizes.
    settings: dict[str, Any] = dict(
        worker_id="w-test",
        max_concurrency=4,
        poll_wait_ms=1000,
        heartbeat_interval_s=0.05,
        drain_timeout_s=5.0,
        poll_concurrency=1,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )
    settings.update(overrides)
    return Worker(fake.url, agents=list(agents), **settings)


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Run the worker for the body of the block; stop it (short drain) afterwards."""
    runner = asyncio.create_task(worker.run())
    try:
        yield runner
    finally:
        await asyncio.wait_for(worker.stop(drain_timeout_s=1.0), 10)
        await asyncio.wait_for(runner, 5)


async def run_one(fake: FakeServer, box: Toolbox, add: Any, **worker_settings: Any) -> str:
    """Queue one task (add(fake) -> token), run a worker until its result arrives."""
    token = add(fake)
    async with running(make_worker(fake, box.agent, **worker_settings)):
        await fake.wait_for(lambda: fake.completes[token] or fake.fails[token], f"a result for {token}")
    return token


# ---------------------------------------------------------------- registration and polling


async def test_registers_every_agent_then_long_polls_for_all_of_them(fake: FakeServer) -> None:
    support, billing = Toolbox().agent, Agent("billing", compaction={"max_tokens": 8000})
    worker = make_worker(fake, support, billing)
    async with running(worker):
        await fake.wait_for(lambda: fake.polls, "a poll")
    assert fake.registrations == {"support": [support.definition()], "billing": [billing.definition()]}
    assert {k: v for k, v in fake.polls[0].items() if k != "outstanding"} == {
        "worker_id": "w-test",
        "agents": ["support", "billing"],
        "max_tasks": 4,
        "wait_ms": 1000,
    }


async def test_registration_and_polls_are_retried_across_503(fake: FakeServer) -> None:
    box = Toolbox()
    fake.unavailable["register"] = 2
    fake.unavailable["poll"] = 2
    token = await run_one(fake, box, lambda f: f.add_tool_task("refund", {"amount": 5}))
    assert fake.registrations["support"] == [box.agent.definition()]
    assert fake.completes[token] == [{"status": "ok", "output": "refunded 5"}]


@pytest.mark.parametrize("route, status", [("register", 400), ("poll", 401), ("poll", 403)])
async def test_run_raises_what_retrying_cannot_fix(fake: FakeServer, route: str, status: int) -> None:
    fake.refused[route] = status
    with pytest.raises(DexError) as refused:
        await asyncio.wait_for(make_worker(fake, Toolbox().agent).run(), 5)
    assert refused.value.status == status and refused.value.code == "refused"


async def test_a_server_that_does_not_hold_polls_is_not_polled_in_a_tight_loop(fake: FakeServer) -> None:
    async with running(make_worker(fake, Toolbox().agent, poll_wait_ms=0)):
        started = time.monotonic()
        await fake.wait_for(lambda: len(fake.polls) >= 5, "5 polls")
        elapsed = time.monotonic() - started
    assert elapsed >= 4 * 0.05  # a pause after each quick empty answer


async def test_worker_id_defaults_to_host_pid_and_random_suffix(fake: FakeServer) -> None:
    import os

    first, second = (Worker(fake.url, agents=[Toolbox().agent]) for _ in range(2))
    assert f"-{os.getpid()}-" in first.worker_id and first.worker_id != second.worker_id


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"agents": []}, "agents"),
        ({"agents": ["support"]}, r"agents\[0\]"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"poll_wait_ms": -1}, "poll_wait_ms"),
        ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
        ({"drain_timeout_s": -1}, "drain_timeout_s"),
        ({"worker_id": ""}, "worker_id"),
    ],
)
def test_bad_worker_arguments_name_the_argument(kwargs: dict[str, Any], match: str) -> None:
    settings: dict[str, Any] = {"agents": [Agent("support")], **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        Worker("http://127.0.0.1:1", **settings)


def test_two_agents_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="agents: two agents are named 'a'"):
        Worker("http://127.0.0.1:1", agents=[Agent("a"), Agent("a")])


# ---------------------------------------------------------------- results by kind


async def test_call_tool_ok_result_and_the_context_it_ran_with(fake: FakeServer) -> None:
    token = await run_one(
        fake, Toolbox(), lambda f: f.add_tool_task("lookup", {"order_id": "7"}, call_id="c9", session_id="s5")
    )
    assert fake.completes[token] == [
        {
            "status": "ok",
            "output": {
                "order_id": "7",
                "session_id": "s5",
                "step_id": f"st-{token}",
                "call_id": "c9",
                "attempt": 1,
                "key": "s5:c9",
                "worker_id": "w-test",
            },
        }
    ]
    assert fake.fails[token] == []


async def test_single_attempt_tool_ok_and_tool_error(fake: FakeServer) -> None:
    box = Toolbox()
    ok = fake.add_tool_task("refund", {"amount": 5}, kind="CallSingleAttemptTool", call_id="c1")
    refused = fake.add_tool_task("refund", {"amount": 500}, kind="CallSingleAttemptTool", call_id="c2")
    async with running(make_worker(fake, box.agent)):
        await fake.wait_for(lambda: fake.completes[ok] and fake.completes[refused], "both results")
    assert fake.completes[ok] == [{"status": "ok", "output": "refunded 5"}]
    assert fake.completes[refused] == [{"status": "error", "error": "refund of 500 is over the limit"}]
    assert fake.fails[refused] == []  # a ToolError is the tool's answer, not a failed attempt


async def test_a_question_ends_the_run_and_the_answer_resumes_it(fake: FakeServer) -> None:
    box = Toolbox()
    asked = fake.add_tool_task("confirm", {"item": "box"})
    answered = fake.add_tool_task("confirm", {"item": "box"}, answer="yes")
    null_answer = fake.add_tool_task("confirm", {"item": "box"}, answer=None)
    async with running(make_worker(fake, box.agent)):
        await fake.wait_for(lambda: all(fake.completes[t] for t in (asked, answered, null_answer)), "3 results")
    assert fake.completes[asked] == [{"status": "question", "question": "Ship box?"}]
    assert fake.completes[answered] == [{"status": "ok", "output": {"item": "box", "answer": "yes"}}]
    assert fake.completes[null_answer] == [{"status": "ok", "output": {"item": "box", "answer": None}}]


async def test_a_long_running_tool_returns_a_handle_then_polls_pending_then_ok(fake: FakeServer) -> None:
    box = Toolbox()
    started = fake.add_tool_task("build", {"target": "app"}, call_id="c3")
    handle = {"job": "app", "key": "s1:c3"}
    polls = [
        fake.add_task("PollToolTask", {"call_id": "c3", "name": "build", "handle": handle}, idempotency_key="s1:c3")
        for _ in range(3)
    ]
    async with running(make_worker(fake, box.agent, max_concurrency=1)):  # one at a time: polls in order
        await fake.wait_for(lambda: all(fake.completes[t] for t in polls), "3 poll results")
    assert fake.completes[started] == [{"status": "task", "handle": handle, "poll_after_ms": 500}]
    assert [fake.completes[t] for t in polls] == [
        [{"status": "pending"}],  # no poll_after_ms: the server keeps the previous interval
        [{"status": "pending", "poll_after_ms": 250}],
        [{"status": "ok", "output": {"built": "app"}}],
    ]


async def test_run_model_result_carries_inline_tool_results(fake: FakeServer) -> None:
    box = Toolbox()
    history = [{"type": "user", "text": "find shoes and order 7"}]
    token = await run_one(
        fake, box, lambda f: f.add_task("RunModel", {"history": history, "tools": []}, session_id="s2")
    )
    assert fake.completes[token] == [
        {
            "content": "Searching now",
            "tool_calls": [
                {
                    "id": "c0_0",
                    "name": "search",
                    "arguments": {"query": "shoes"},
                    "result": {"status": "ok", "output": ["SHOES", "s2:c0_0"]},
                },
                {
                    "id": "c0_1",
                    "name": "search",
                    "arguments": {"query": "fail"},
                    "result": {"status": "error", "error": "search index offline"},
                },
                {"id": "c0_2", "name": "lookup", "arguments": {"order_id": "7"}},
            ],  # not inline: no result
            "usage": {"input_items": 1, "output_words": 2},
        }
    ]


async def test_compact_context_result_is_the_summary(fake: FakeServer) -> None:
    history = [
        {"type": "user", "text": "a"},
        {"type": "assistant", "content": "b", "tool_calls": []},
        {"type": "note", "text": "c"},
    ]
    token = await run_one(fake, Toolbox(), lambda f: f.add_task("CompactContext", {"history": history}))
    assert fake.completes[token] == [{"summary": "summary of 3 items (model responses so far: 1)"}]


# A task the Worker never called a tool or model function for says so (`not_started`), so
# the server can record the call as not run instead of outcome_unknown.
NOT_STARTED = {"not_started": True}


@pytest.mark.parametrize(
    "add, message, extra",
    [
        (lambda f: f.add_tool_task("no_such_tool", {}), "agent 'support' has no tool 'no_such_tool'", NOT_STARTED),
        (
            lambda f: f.add_tool_task("lookup", {"order": "7"}),
            "tool 'lookup': bad arguments: missing a required argument: 'order_id'",
            NOT_STARTED,
        ),
        (
            lambda f: f.add_task("CallTool", {"call_id": "c1", "name": "lookup", "arguments": {}}, named_agent="ghost"),
            "this Worker has no agent 'ghost'",
            NOT_STARTED,
        ),
        (lambda f: f.add_task("Dance", {}), "this Worker does not know the task kind 'Dance'", NOT_STARTED),
        (
            lambda f: f.add_tool_task("start_job", {}),
            "tool 'start_job' returned a task handle but has no poll function",
            {},
        ),  # the tool function ran
        (
            lambda f: f.add_task("PollToolTask", {"call_id": "c1", "name": "lookup", "handle": 1}),
            "tool 'lookup' has no poll function",
            NOT_STARTED,
        ),
        (
            lambda f: f.add_task("RunModel", {"history": [], "tools": []}, agent="modelless"),
            "agent 'modelless' has no model",
            NOT_STARTED,
        ),
    ],
)
async def test_tasks_the_worker_cannot_run_fail_without_retry(
    fake: FakeServer, add: Any, message: str, extra: dict[str, Any]
) -> None:
    token = add(fake)
    async with running(make_worker(fake, Toolbox().agent, Agent("modelless"))):
        await fake.wait_for(lambda: fake.fails[token], "the failure report")
    assert fake.fails[token] == [{"worker_id": "w-test", "error": message, "retryable": False, **extra}]
    assert fake.completes[token] == []


async def test_a_raised_exception_fails_the_attempt_as_retryable(fake: FakeServer) -> None:
    def overloaded(request: Any) -> Any:
        raise RuntimeError("429 too many requests")

    box = Toolbox(model=ScriptedModel(overloaded))
    tool = fake.add_tool_task("crash", {})
    model = fake.add_task("RunModel", {"history": [], "tools": []})
    async with running(make_worker(fake, box.agent)):
        await fake.wait_for(lambda: fake.fails[tool] and fake.fails[model], "two failures")
    assert fake.fails[tool] == [{"worker_id": "w-test", "error": "RuntimeError: database down", "retryable": True}]
    assert fake.fails[model] == [
        {"worker_id": "w-test", "error": "RuntimeError: 429 too many requests", "retryable": True}
    ]
    assert fake.completes[tool] == fake.completes[model] == []


async def test_a_non_retryable_error_fails_the_attempt_with_no_retry(fake: FakeServer) -> None:
    def refused(request: Any) -> Any:
        raise NonRetryableError("400 invalid_request_error: messages: tool_use ids must be unique")

    box = Toolbox(model=ScriptedModel(refused))
    model = fake.add_task("RunModel", {"history": [], "tools": []})
    async with running(make_worker(fake, box.agent)):
        await fake.wait_for(lambda: fake.fails[model], "the failure report")
    assert fake.fails[model] == [
        {
            "worker_id": "w-test",
            "retryable": False,
            "error": "NonRetryableError: 400 invalid_request_error: messages: tool_use ids must be unique",
        }
    ]
    assert fake.completes[model] == []


# ---------------------------------------------------------------- concurrency


async def test_never_more_tasks_running_than_max_concurrency(fake: FakeServer) -> None:
    box = Toolbox()
    tokens = [fake.add_tool_task("wait_gate", {"name": f"g{i}"}, call_id=f"c{i}") for i in range(7)]
    worker = make_worker(fake, box.agent, max_concurrency=3)
    async with running(worker):
        for i in range(7):  # open the gates one by one, each only once its tool runs

            def started(name: str = f"g{i}") -> bool:
                return name in box.started

            await fake.wait_for(started, f"g{i} started")
            assert worker.running <= 3 and box.active <= 3
            box.gates[f"g{i}"].set()
        await fake.wait_for(lambda: all(fake.completes[t] for t in tokens), "all results")
    assert box.max_active == 3 and fake.counters.max_outstanding == 3
    assert all(0 < poll["max_tasks"] <= 3 - poll["outstanding"] for poll in fake.polls)
    assert worker.completed == 7


async def test_each_poll_asks_for_exactly_the_free_slots(fake: FakeServer) -> None:
    box = Toolbox()
    worker = make_worker(fake, box.agent, max_concurrency=3)
    async with running(worker):
        await fake.wait_for(lambda: fake.polls, "the first poll")
        assert fake.polls[0]["max_tasks"] == 3
        fake.add_tool_task("wait_gate", {"name": "a"}, call_id="ca")
        # A poll answered with a task is followed at once by one for the 2 slots left.
        await fake.wait_for(lambda: len(fake.polls) == 2, "the second poll")
        assert fake.polls[1]["max_tasks"] == 2
        fake.add_tool_task("wait_gate", {"name": "b"}, call_id="cb")
        fake.add_tool_task("wait_gate", {"name": "c"}, call_id="cc")
        await fake.wait_for(lambda: box.active == 3, "3 tools running")
        polls_while_full = len(fake.polls)
        box.gates["b"].set()
        await fake.wait_for(lambda: len(fake.polls) > polls_while_full, "a poll after a slot freed")
        assert fake.polls[polls_while_full]["max_tasks"] == 1
        assert all(poll["max_tasks"] > 0 for poll in fake.polls)
        box.gates["a"].set()
        box.gates["c"].set()


async def test_a_task_handed_out_with_a_result_runs_without_a_poll(fake: FakeServer) -> None:
    """Eager dispatch: `complete` asks for the session's next step (next_tasks = 1, the
    slot it frees); the task in the answer runs at once in that slot."""
    box = Toolbox()
    first = fake.add_tool_task("refund", {"amount": 5}, call_id="c1")
    # Queued for an agent no poll asks for: only the eager answer can deliver it.
    second = fake.add_task(
        "CallTool",
        {"call_id": "c2", "name": "refund", "arguments": {"amount": 7}},
        agent="eager-only",
        named_agent="support",
        idempotency_key="s1:c2",
    )
    fake.eager_after[first] = second
    worker = make_worker(fake, box.agent, max_concurrency=1)
    async with running(worker):
        await fake.wait_for(lambda: fake.completes[second], "the eager task's result")
    assert fake.next_tasks_asked[first] == 1
    assert fake.completes[first] == [{"status": "ok", "output": "refunded 5"}]
    assert fake.completes[second] == [{"status": "ok", "output": "refunded 7"}]
    assert worker.completed == 2


async def test_without_eager_a_result_asks_for_nothing(fake: FakeServer) -> None:
    box = Toolbox()
    token = await run_one(fake, box, lambda f: f.add_tool_task("refund", {"amount": 5}), eager=False)
    assert fake.next_tasks_asked[token] is None


async def test_concurrent_polls_share_the_free_slots_and_never_promise_more(fake: FakeServer) -> None:
    """Two polls in flight at once (the server can hand out to one while the other's
    answer travels back); together they never ask for more than the free slots."""
    box = Toolbox()
    worker = make_worker(fake, box.agent, max_concurrency=5, poll_concurrency=2, poll_wait_ms=3000)
    async with running(worker):
        await fake.wait_for(lambda: len(fake.polls) >= 2, "two polls")
        first, second = fake.polls[0], fake.polls[1]
        assert first["max_tasks"] + second["max_tasks"] == 5  # ceil(5/2) and the 2 left
        assert sorted([first["max_tasks"], second["max_tasks"]]) == [2, 3]
        for name in "abcde":
            fake.add_tool_task("wait_gate", {"name": name}, call_id=f"c{name}")
        await fake.wait_for(lambda: box.active == 5, "5 tools running")
        assert box.max_active <= 5 and worker.running == 5
        for gate in box.gates.values():
            gate.set()


# ---------------------------------------------------------------- heartbeats and deltas


async def test_every_report_carries_the_worker_id_that_polled_the_task(fake: FakeServer) -> None:
    """Only the Worker that took a task may heartbeat, complete or fail it:
    the server checks the body's worker_id against the one the poll recorded."""
    box = Toolbox()
    slow = fake.add_tool_task("wait_gate", {"name": "slow"})
    crashed = fake.add_tool_task("crash", {}, call_id="c2")
    async with running(make_worker(fake, box.agent, worker_id="w-owner", heartbeat_interval_s=0.02)):
        await fake.wait_for(lambda: fake.heartbeats[slow] and fake.fails[crashed], "a heartbeat and a failure")
        box.gates["slow"].set()
        await fake.wait_for(lambda: fake.completes[slow], "the result")
    assert fake.taken_by == {slow: "w-owner", crashed: "w-owner"}
    assert {body["worker_id"] for body in fake.heartbeats[slow] + fake.fails[crashed]} == {"w-owner"}
    assert fake.counters.outstanding == set()  # the result and the failure were accepted (not 403)


def heartbeats_before_result(fake: FakeServer, token: str) -> int:
    entries = [route for route, t in fake.log if t == token]
    return entries.index("complete") if "complete" in entries else len(entries)


async def test_heartbeats_arrive_while_a_slow_tool_runs(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_tool_task("wait_gate", {"name": "slow"})
    async with running(make_worker(fake, box.agent, heartbeat_interval_s=0.02)):
        await fake.wait_for(lambda: len(fake.heartbeats[token]) >= 3, "3 heartbeats")
        assert fake.completes[token] == []
        box.gates["slow"].set()
        await fake.wait_for(lambda: fake.completes[token], "the result")
    assert fake.completes[token] == [{"status": "ok", "output": "slow"}]
    # Nothing to stream: each heartbeat names only the Worker.
    assert all(body == {"worker_id": "w-test"} for body in fake.heartbeats[token])


async def test_default_heartbeat_interval_is_a_third_of_the_tasks_timeout(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_task(
        "CallTool", {"call_id": "c1", "name": "wait_gate", "arguments": {"name": "slow"}}, heartbeat_timeout_ms=90
    )  # → one heartbeat every 30 ms
    async with running(make_worker(fake, box.agent, heartbeat_interval_s=None)):
        await fake.wait_for(lambda: len(fake.heartbeats[token]) >= 3, "3 heartbeats", timeout_s=2.0)
        box.gates["slow"].set()


async def test_a_blocking_sync_tool_does_not_stop_the_heartbeats(fake: FakeServer) -> None:
    token = await run_one(
        fake, Toolbox(), lambda f: f.add_tool_task("crunch", {"seconds": 0.3}), heartbeat_interval_s=0.03
    )
    assert fake.completes[token] == [{"status": "ok", "output": "crunched"}]
    assert heartbeats_before_result(fake, token) >= 3


async def test_model_deltas_reach_the_server_live_in_heartbeats(fake: FakeServer) -> None:
    content = "one two three four five six"
    box = Toolbox(model=ScriptedModel([{"content": content}], delta_delay_s=0.04))
    # A long interval: only the deltas themselves can trigger these heartbeats.
    token = await run_one(
        fake, box, lambda f: f.add_task("RunModel", {"history": [], "tools": []}), heartbeat_interval_s=30.0
    )
    assert fake.completes[token][0]["content"] == content
    texts = [delta["text"] for delta in fake.deltas_of(token)]
    assert "".join(texts) == content and len(texts) == 6
    with_deltas = [body for body in fake.heartbeats[token] if body.get("deltas")]
    assert len(with_deltas) >= 2  # streamed live in several heartbeats, not one at the end
    assert heartbeats_before_result(fake, token) == len(fake.heartbeats[token])  # all before the result


async def test_a_burst_of_deltas_travels_in_one_heartbeat(fake: FakeServer) -> None:
    box = Toolbox(model=ScriptedModel([{"content": "one two three four five six"}]))
    token = await run_one(
        fake, box, lambda f: f.add_task("RunModel", {"history": [], "tools": []}), heartbeat_interval_s=30.0
    )
    with_deltas = [body["deltas"] for body in fake.heartbeats[token] if body.get("deltas")]
    assert sum(len(d) for d in with_deltas) == 6 and 1 <= len(with_deltas) <= 2
    assert len(with_deltas[0]) >= 3  # the heartbeat waited a moment for the burst instead of sending one delta


async def test_progress_from_ctx_heartbeat_is_sent_at_once_as_a_delta(fake: FakeServer) -> None:
    box = Toolbox()
    agent = box.agent

    @agent.tool(effect="read")
    async def report(ctx: ToolContext) -> str:
        await ctx.heartbeat(done=1, total=2)
        await ctx.heartbeat(done=2, total=2)
        return "reported"

    token = await run_one(fake, box, lambda f: f.add_tool_task("report", {}), heartbeat_interval_s=30.0)
    assert fake.deltas_of(token) == [{"progress": {"done": 1, "total": 2}}, {"progress": {"done": 2, "total": 2}}]
    assert fake.completes[token] == [{"status": "ok", "output": "reported"}]


# ---------------------------------------------------------------- cancellation


CANCELLED_FAIL = {
    "worker_id": "w-test",
    "error": "cancelled: the Worker stopped the attempt at the server's request",
    "retryable": False,
}


@pytest.mark.parametrize("answer", ["cancel", "409"])
async def test_a_stop_answer_to_a_heartbeat_cancels_the_tool_and_sends_no_result(fake: FakeServer, answer: str) -> None:
    """Neither answer delivers the tool's result. After a cancel the Worker says the
    attempt stopped (one non-retryable fail, so the attempt ends now, not at its heartbeat
    timeout); after a 409 the attempt is no longer ours, so it sends nothing at all."""
    box = Toolbox()
    token = fake.add_tool_task("wait_gate", {"name": "doomed"})
    (fake.cancel_tokens if answer == "cancel" else fake.stale_heartbeat_tokens).add(token)
    worker = make_worker(fake, box.agent)
    async with running(worker):
        await fake.wait_for(lambda: box.cancelled == ["doomed"], "the tool cancelled")
        await fake.wait_for(lambda: worker.running == 0, "the task ended")
        assert len(fake.heartbeats[token]) == 1  # no heartbeat after the stop answer
    assert fake.completes[token] == []
    assert fake.fails[token] == ([CANCELLED_FAIL] if answer == "cancel" else [])


async def test_ctx_heartbeat_raises_attempt_cancelled_and_the_return_value_is_dropped(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_tool_task("beat_until_told", {})
    worker = make_worker(fake, box.agent, heartbeat_interval_s=30.0)
    async with running(worker):
        await fake.wait_for(lambda: len(fake.heartbeats[token]) >= 3, "a few heartbeats")
        fake.cancel_tokens.add(token)
        await fake.wait_for(lambda: box.cancelled == ["beat_until_told"], "the tool saw the cancel")
        await fake.wait_for(lambda: worker.running == 0, "the task ended")
    assert fake.completes[token] == [] and fake.fails[token] == [CANCELLED_FAIL]
    assert fake.deltas_of(token)[0] == {"progress": {"stage": "working"}}


# ---------------------------------------------------------------- result delivery


async def test_complete_is_retried_across_a_503_window_until_accepted(fake: FakeServer) -> None:
    box = Toolbox()
    fake.unavailable["complete"] = 3
    worker = make_worker(fake, box.agent)
    token = fake.add_tool_task("refund", {"amount": 5})
    async with running(worker):
        await fake.wait_for(lambda: worker.completed == 1, "the result accepted")
    assert fake.complete_tries[token] == 4
    assert fake.completes[token] == [{"status": "ok", "output": "refunded 5"}]
    assert fake.fails[token] == [] and token not in fake.counters.outstanding


async def test_heartbeat_503s_do_not_stop_the_task(fake: FakeServer) -> None:
    box = Toolbox()
    fake.unavailable["heartbeat"] = 3
    token = fake.add_tool_task("wait_gate", {"name": "g"})
    async with running(make_worker(fake, box.agent, heartbeat_interval_s=0.02)):
        await fake.wait_for(
            lambda: fake.unavailable["heartbeat"] == 0 and fake.heartbeats[token], "heartbeats through the 503s"
        )
        box.gates["g"].set()
        await fake.wait_for(lambda: fake.completes[token], "the result")
    assert fake.completes[token] == [{"status": "ok", "output": "g"}] and box.cancelled == []


async def test_a_409_on_complete_is_dropped_without_retrying(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_tool_task("refund", {"amount": 5})
    fake.stale_result_tokens.add(token)
    worker = make_worker(fake, box.agent)
    async with running(worker):
        await fake.wait_for(lambda: fake.completes[token], "the result")
        await fake.wait_for(lambda: worker.running == 0, "the task ended")
    assert fake.complete_tries[token] == 1 and fake.fails[token] == []
    assert worker.completed == 0


async def test_a_result_the_server_refuses_is_reported_as_a_permanent_failure(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_tool_task("refund", {"amount": 5})
    fake.refused_result_tokens.add(token)
    async with running(make_worker(fake, box.agent)):
        await fake.wait_for(lambda: fake.fails[token], "the failure report")
    assert fake.complete_tries[token] == 1
    assert fake.fails[token] == [
        {
            "worker_id": "w-test",
            "error": "the server refused the result: result.status must be ok, error, question or task",
            "retryable": False,
        }
    ]


# ---------------------------------------------------------------- stop


async def test_stop_lets_a_running_task_finish_within_the_drain_timeout(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_tool_task("wait_gate", {"name": "finishing"})
    worker = make_worker(fake, box.agent)
    runner = asyncio.create_task(worker.run())
    await fake.wait_for(lambda: box.started == ["finishing"], "the tool running")
    stopping = asyncio.create_task(worker.stop(drain_timeout_s=5.0))
    for _ in range(20):
        await asyncio.sleep(0)  # let stop() cancel the poll and begin draining
    assert not stopping.done() and worker.running == 1
    box.gates["finishing"].set()
    await asyncio.wait_for(stopping, 5)
    await asyncio.wait_for(runner, 5)
    assert fake.completes[token] == [{"status": "ok", "output": "finishing"}]
    assert box.cancelled == [] and worker.completed == 1


async def test_stop_cancels_a_task_that_outlives_the_drain_timeout(fake: FakeServer) -> None:
    box = Toolbox()
    token = fake.add_tool_task("wait_gate", {"name": "stuck"})
    worker = make_worker(fake, box.agent)
    runner = asyncio.create_task(worker.run())
    await fake.wait_for(lambda: box.started == ["stuck"], "the tool running")
    started = time.monotonic()
    await asyncio.wait_for(worker.stop(drain_timeout_s=0.2), 5)
    assert 0.2 <= time.monotonic() - started < 2.0
    await asyncio.wait_for(runner, 5)
    assert box.cancelled == ["stuck"] and worker.running == 0
    assert fake.completes[token] == [] and fake.fails[token] == []  # the server fails it by heartbeat loss
