"""Agent, tool decorator and ToolContext: the definition a Worker registers, and the
errors a developer gets for a bad declaration. No server needed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dex_ha.engine.agents import normalize_definition
from dex_ha.worker import Agent, AttemptCancelled, Pending, TaskHandle, ToolContext, ToolError, infer_input_schema
from dex_ha.worker.context import QuestionAsked


def make_ctx(**overrides: Any) -> ToolContext:
    fields: dict[str, Any] = dict(
        session_id="s1", turn_id="t1", step_id="st1", call_id="c1", attempt=1, idempotency_key="s1:c1", worker_id="w1"
    )
    fields.update(overrides)
    return ToolContext(**fields)


def support_agent() -> Agent:
    agent = Agent("support", compaction={"max_items": 40}, model_start_to_close_ms=90_000)

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, order_id: str, verbose: bool = False) -> dict:
        """Find an order.

        Longer text that is not part of the description."""
        return {"order_id": order_id}

    @agent.tool(
        effect="write",
        approval=True,
        start_to_close_ms=60_000,
        max_attempts=1,
        description="Refund money",
        input_schema={"type": "object"},
    )
    def refund(ctx: ToolContext, amount: int) -> str:
        return "ok"

    @agent.tool(effect="idempotent_write", name="build_target")
    async def build(ctx: ToolContext, target: str, tags: list[str], options: dict | None = None) -> Any:
        return ctx.task_handle({"job": target})

    @agent.tool(effect="read", inline=True)
    async def search(ctx: ToolContext, query: str, limit: int | None = 10, **filters: Any) -> list:
        return []

    return agent


def test_definition_carries_each_policy_and_inferred_schemas() -> None:
    definition = support_agent().definition()
    assert definition["compaction"] == {"max_items": 40}
    assert definition["model"] == {"start_to_close_ms": 90_000}
    tools = {tool["name"]: tool for tool in definition["tools"]}
    assert list(tools) == ["lookup", "refund", "build_target", "search"]

    assert tools["lookup"] == {
        "name": "lookup",
        "effect": "read",
        "approval": False,
        "inline": False,
        "description": "Find an order.",
        "input_schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
        },
    }
    # Explicit values win over inference; timeouts and attempts are passed through.
    assert tools["refund"] == {
        "name": "refund",
        "effect": "write",
        "approval": True,
        "inline": False,
        "description": "Refund money",
        "input_schema": {"type": "object"},
        "start_to_close_ms": 60_000,
        "max_attempts": 1,
    }
    assert tools["build_target"]["effect"] == "idempotent_write"
    assert tools["build_target"]["input_schema"] == {
        "type": "object",
        "additionalProperties": False,
        "required": ["target", "tags"],
        "properties": {
            "target": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "options": {"type": "object"},
        },
    }
    assert "start_to_close_ms" not in tools["build_target"] and "description" not in tools["build_target"]
    search = tools["search"]
    assert search["inline"] is True and search["approval"] is False
    # **filters allows extra properties; Optional[int] becomes its base type.
    assert search["input_schema"] == {
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    }


def test_definition_is_accepted_unchanged_by_the_server_validator() -> None:
    definition = support_agent().definition()
    normalized = normalize_definition(definition)
    for sent, stored in zip(definition["tools"], normalized["tools"], strict=True):
        assert {k: stored[k] for k in sent} == sent
    assert normalized["compaction"]["max_items"] == 40
    assert normalized["model"]["start_to_close_ms"] == 90_000


def test_agent_without_options_sends_only_its_tools() -> None:
    agent = Agent("plain")
    assert agent.definition() == {"tools": []}


def test_schema_of_unannotated_and_untyped_parameters_accepts_anything() -> None:
    def tool(ctx, a, b=None, *rest):
        return None

    tool.__annotations__["b"] = "SomethingUnknown"  # a name that resolves nowhere, as a typo would

    assert infer_input_schema(tool) == {
        "type": "object",
        "additionalProperties": False,
        "required": ["a"],
        "properties": {"a": {}, "b": {}},
    }


@pytest.mark.parametrize(
    "kwargs, argument, error",
    [
        ({"effect": "delete"}, "effect", ValueError),
        ({"effect": None}, "effect", ValueError),
        ({"effect": "write", "approval": True, "inline": True}, "approval", ValueError),
        ({"effect": "read", "start_to_close_ms": 0}, "start_to_close_ms", ValueError),
        ({"effect": "read", "max_attempts": -1}, "max_attempts", ValueError),
        ({"effect": "read", "max_attempts": 1.5}, "max_attempts", ValueError),
        ({"effect": "read", "approval": "yes"}, "approval", TypeError),
        ({"effect": "read", "inline": 1}, "inline", TypeError),
        ({"effect": "read", "input_schema": "object"}, "input_schema", TypeError),
        ({"effect": "read", "name": "ask_user"}, "name", ValueError),
        ({"effect": "read", "name": "sleep"}, "name", ValueError),
        ({"effect": "read", "name": ""}, "name", ValueError),
    ],
)
def test_bad_tool_declarations_name_the_argument(kwargs: dict[str, Any], argument: str, error: type[Exception]) -> None:
    agent = Agent("a")

    async def tool(ctx: ToolContext) -> None:
        return None

    with pytest.raises(error, match=argument):
        agent.tool(**kwargs)(tool)
    assert agent.tools == {}


def test_effect_is_required() -> None:
    with pytest.raises(TypeError, match="effect"):
        Agent("a").tool()  # type: ignore[call-arg]


def test_duplicate_tool_names_are_refused() -> None:
    agent = Agent("a")

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext) -> None: ...

    with pytest.raises(ValueError, match="name: .*already has a tool named 'lookup'"):

        @agent.tool(effect="write", name="lookup")
        async def other(ctx: ToolContext) -> None: ...

    assert agent.tools["lookup"].effect == "read"


def test_a_tool_function_must_take_the_context() -> None:
    with pytest.raises(ValueError, match="fn: .*ToolContext"):

        @Agent("a").tool(effect="read")
        def no_params() -> None: ...


def test_poll_functions_attach_to_tools_only() -> None:
    agent = Agent("a")
    other = Agent("b")

    @agent.tool(effect="idempotent_write")
    async def build(ctx: ToolContext, target: str) -> Any: ...

    async def poll_build(ctx: ToolContext, handle: Any) -> Any: ...

    def not_a_tool(ctx: ToolContext) -> None: ...

    with pytest.raises(ValueError, match="tool: "):
        agent.poll(not_a_tool)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool: "):
        agent.poll("missing")
    with pytest.raises(ValueError, match="tool: "):
        other.poll(build)  # a tool of another agent
    with pytest.raises(ValueError, match="fn: .*\\(ctx, handle\\)"):
        build.poll(lambda ctx: None)

    assert agent.poll(build)(poll_build) is poll_build
    assert build.poll_fn is poll_build
    with pytest.raises(ValueError, match="fn: .*already has a poll function"):
        build.poll(poll_build)


def test_an_inline_tool_cannot_have_a_poll_function() -> None:
    agent = Agent("a")

    @agent.tool(effect="read", inline=True)
    async def search(ctx: ToolContext) -> Any: ...

    with pytest.raises(ValueError, match="fn: .*inline"):

        @search.poll
        async def poll_search(ctx: ToolContext, handle: Any) -> Any: ...


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"name": ""}, "name"),
        ({"name": "a/b"}, "name"),
        ({"name": "a", "compaction": {"max_lines": 3}}, "compaction"),
        ({"name": "a", "compaction": {"max_items": 0}}, "compaction"),
        ({"name": "a", "model_start_to_close_ms": -5}, "model_start_to_close_ms"),
    ],
)
def test_bad_agent_arguments(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        Agent(**kwargs)


async def test_sync_tools_run_in_a_thread_and_decorated_functions_stay_callable() -> None:
    agent = Agent("a")

    @agent.tool(effect="read")
    def where(ctx: ToolContext, x: int) -> dict:
        return {"thread": threading.get_ident(), "x": x}

    result = await where.invoke(make_ctx(), {"x": 3})
    assert result["x"] == 3 and result["thread"] != threading.get_ident()
    assert where(make_ctx(), x=4)["x"] == 4  # the Tool object calls the function itself


async def test_arguments_that_do_not_fit_the_signature_are_the_tools_error() -> None:
    agent = Agent("a")
    ran = []

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, order_id: str) -> None:
        ran.append(order_id)

    with pytest.raises(ToolError, match="bad arguments"):
        await lookup.invoke(make_ctx(), {"order": "1"})
    with pytest.raises(ToolError, match="arguments must be an object"):
        await lookup.invoke(make_ctx(), ["1"])  # type: ignore[arg-type]
    assert ran == []


async def test_ask_ends_the_run_with_the_question_until_there_is_an_answer() -> None:
    with pytest.raises(QuestionAsked) as asked:
        await make_ctx().ask({"text": "Ship it?"})
    assert asked.value.question == {"text": "Ship it?"}
    assert not isinstance(asked.value, Exception)  # a tool's `except Exception` cannot swallow it
    assert await make_ctx(answer="yes", has_answer=True).ask("Ship it?") == "yes"
    assert await make_ctx(answer=None, has_answer=True).ask("Ship it?") is None  # null is an answer


def test_task_handle_and_pending_values() -> None:
    ctx = make_ctx()
    assert ctx.task_handle({"job": 1}) == TaskHandle({"job": 1}, 1000)
    assert ctx.task_handle("h", poll_after_ms=0) == TaskHandle("h", 0)
    assert ctx.pending() == Pending(None)
    assert ctx.pending(250) == Pending(250)
    with pytest.raises(ValueError, match="handle"):
        ctx.task_handle(None)
    with pytest.raises(ValueError, match="poll_after_ms"):
        ctx.task_handle("h", poll_after_ms=-1)
    with pytest.raises(ValueError, match="poll_after_ms"):
        ctx.pending(1.5)  # type: ignore[arg-type]


async def test_heartbeat_reports_progress_and_raises_once_cancelled() -> None:
    sent: list[dict[str, Any]] = []
    answers = iter([True, False])

    async def send(progress: dict[str, Any]) -> bool:
        sent.append(progress)
        return next(answers)

    ctx = make_ctx(send_heartbeat=send)
    await ctx.heartbeat(done=1, total=3)
    assert not ctx.cancelled
    with pytest.raises(AttemptCancelled):
        await ctx.heartbeat(done=2, total=3)
    assert ctx.cancelled
    with pytest.raises(AttemptCancelled):  # no further heartbeat is sent once cancelled
        await ctx.heartbeat(done=3, total=3)
    assert sent == [{"done": 1, "total": 3}, {"done": 2, "total": 3}]
    await make_ctx().heartbeat(x=1)  # no Worker: nothing to send, nothing raised


def test_tool_error_message_must_be_text() -> None:
    assert ToolError("no such order").message == "no such order"
    with pytest.raises(TypeError, match="message"):
        ToolError(404)  # type: ignore[arg-type]
