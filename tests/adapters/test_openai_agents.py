"""dex_ha.adapters.openai_agents without a server: the model call (history → the SDK's input
items, the SDK's answer → text and tool calls), the tool steps, effects, and what is refused.

The model is the SDK's own test double, `agents.testing.ScriptedModel`, a real
`agents.Model` that records each call and streams its answer as Responses events.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import openai
import pytest
from agents import (
    Agent as SDKAgent,
)
from agents import (
    AgentHooks,
    ComputerTool,
    InputGuardrail,
    LocalShellTool,
    RunContextWrapper,
    WebSearchTool,
    function_tool,
)
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from dex_ha.adapters.openai_agents import durable_agent, effect, tool_context
from dex_ha.worker import ModelRequest, NonRetryableError, ToolContext, ToolError
from tests.support.doubles import ASK_USER_BUILTIN, TextSink

BUILTINS = [ASK_USER_BUILTIN]


def ctx_for(call_id: str, attempt: int = 1) -> ToolContext:
    return ToolContext(
        session_id="s1",
        turn_id="t1",
        step_id=f"st-{call_id}",
        call_id=call_id,
        attempt=attempt,
        idempotency_key=f"s1:{call_id}",
        worker_id="w1",
    )


@function_tool
def lookup(wrapper: RunContextWrapper[dict], order: str) -> dict:
    """Find an order by its id."""
    return {"order": order, "customer": wrapper.context["customer"], "key": tool_context().idempotency_key}


@effect("idempotent_write")
@function_tool
async def put_note(text: str) -> str:
    """Add a note."""
    return f"noted: {text}"


@function_tool
def refund(order: str) -> str:
    """Refund an order."""
    return "refunded"


def make_agent(model: ScriptedModel, **options: Any) -> SDKAgent[dict]:
    options.setdefault("tools", [lookup, put_note, refund])
    return SDKAgent(
        name="support",
        model=model,
        instructions=lambda wrapper, agent: f"Help {wrapper.context['customer']}.",
        **options,
    )


async def test_a_model_call_gets_the_agents_instructions_tools_and_the_history() -> None:
    model = ScriptedModel(
        [
            ModelStep(
                output=[assistant_message("Checking "), function_call("lookup", {"order": "A17"}, call_id="call_2")]
            )
        ]
    )
    dex = durable_agent(
        make_agent(model, tools=[lookup, put_note, refund, WebSearchTool()]), context={"customer": "Ann"}
    )
    history: list[dict[str, Any]] = [
        {"type": "user", "text": "Where is A17?"},
        {
            "type": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "name": "put_note", "arguments": {"text": "asked"}}],
        },
        {"type": "note", "text": "An operator reconciled a call."},
        {"type": "tool_result", "call_id": "call_1", "name": "put_note", "status": "failed", "error": "x"},
    ]
    deltas = TextSink()
    assert dex.model is not None
    response = await dex.model.respond(ModelRequest(history, "Earlier: hello.", BUILTINS), deltas)

    assert response.content == "Checking " and deltas.texts == ["Checking "]
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [("call_2", "lookup", {"order": "A17"})]
    call = model.last_call
    assert call is not None and call.streamed and call.system_instructions == "Help Ann."
    assert [tool.name for tool in call.tools] == ["lookup", "put_note", "refund", "web_search", "ask_user"]
    # A call's result comes right after it, and the note after the pair.
    assert call.input == [
        {
            "type": "message",
            "role": "developer",
            "content": "Summary of the conversation before the messages below:\nEarlier: hello.",
        },
        {"type": "message", "role": "user", "content": "Where is A17?"},
        {"type": "function_call", "call_id": "call_1", "name": "put_note", "arguments": '{"text": "asked"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"status": "failed", "error": "x"}'},
        {"type": "message", "role": "developer", "content": "An operator reconciled a call."},
    ]


async def test_a_tool_step_runs_the_sdks_tool_with_the_context_and_the_key() -> None:
    dex = durable_agent(make_agent(ScriptedModel()), context={"customer": "Ann"})
    output = await dex.tools["lookup"].invoke(ctx_for("call_7"), {"order": "A17"})
    assert output == {"order": "A17", "customer": "Ann", "key": "s1:call_7"}
    assert await dex.tools["put_note"].invoke(ctx_for("call_8"), {"text": "hi"}) == "noted: hi"


def test_effects_come_from_the_decorator_the_mapping_and_the_default() -> None:
    dex = durable_agent(make_agent(ScriptedModel()), effects={"lookup": "read"})
    policies = {tool["name"]: (tool["effect"], tool["approval"]) for tool in dex.definition()["tools"]}
    assert policies == {"lookup": ("read", False), "put_note": ("idempotent_write", False), "refund": ("write", False)}
    schema = dex.tools["lookup"].input_schema
    assert (
        schema is not None
        and schema["properties"] == {"order": {"title": "Order", "type": "string"}}
        and schema["required"] == ["order"]
    )


def test_effect_above_the_sdks_decorator_and_needs_approval() -> None:
    @effect("read")
    @function_tool(needs_approval=True)
    def check(order: str) -> str:
        """Check."""
        return order

    dex = durable_agent(SDKAgent(name="a", tools=[check], model=ScriptedModel()))
    assert dex.definition()["tools"][0] | {} == {
        "name": "check",
        "effect": "read",
        "approval": True,
        "inline": False,
        "description": "Check.",
        "input_schema": check.params_json_schema,
    }


def test_bad_effect_declarations_are_refused_naming_the_tool() -> None:
    agent = make_agent(ScriptedModel())
    with pytest.raises(ValueError, match=r"'lookpu' is not a function tool of this agent"):
        durable_agent(agent, effects={"lookpu": "read"})
    with pytest.raises(ValueError, match=r"effects\['put_note'\]: 'write' contradicts @effect\('idempotent_write'\)"):
        durable_agent(agent, effects={"put_note": "write"})
    with pytest.raises(ValueError, match=r"effects\['refund'\]: the effect must be one of"):
        durable_agent(agent, effects={"refund": "once"})


def nothing(*_: Any, **__: Any) -> Any:
    return None


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"handoffs": [SDKAgent(name="billing")]}, "handoffs are not supported"),
        (
            {"input_guardrails": [InputGuardrail(guardrail_function=nothing)]},
            "input and output guardrails are not supported",
        ),
        ({"hooks": AgentHooks()}, "agent hooks are not called"),
        ({"tool_use_behavior": "stop_on_first_tool"}, "tool_use_behavior must be 'run_llm_again'"),
        (
            {"tools": [LocalShellTool(executor=nothing)]},
            "tool 'local_shell' \\(LocalShellTool\\) runs in the agent's process",
        ),
        ({"tools": [ComputerTool(computer=nothing)]}, "tool .* \\(ComputerTool\\) runs in the agent's process"),
    ],
)
def test_what_cannot_run_durably_is_refused_with_the_reason(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=f"agent 'support': {reason}"):
        durable_agent(SDKAgent(name="support", **options))


def test_tools_the_adapter_cannot_honour_are_refused_naming_the_tool() -> None:
    @function_tool(name_override="ask_user")
    def ask(question: str) -> str:
        return question

    async def maybe(*_: Any) -> bool:
        return True

    @function_tool(needs_approval=maybe)
    def sometimes(order: str) -> str:
        return order

    with pytest.raises(ValueError, match="tool 'ask_user': the name of a built-in tool of the dex-ha server"):
        durable_agent(SDKAgent(name="a", tools=[ask]))
    with pytest.raises(ValueError, match="tool 'sometimes': needs_approval must be True or False"):
        durable_agent(SDKAgent(name="a", tools=[sometimes]))
    with pytest.raises(TypeError, match="agent must be an agents.Agent"):
        durable_agent(object())  # type: ignore[arg-type]


async def test_a_tool_past_its_timeout_is_the_tools_error() -> None:
    @function_tool(timeout=0.05)
    async def slow(order: str) -> str:
        await asyncio.sleep(5)
        return order

    dex = durable_agent(SDKAgent(name="a", tools=[slow], model=ScriptedModel()))
    with pytest.raises(ToolError, match="tool 'slow' timed out after 0.05 s"):
        await dex.tools["slow"].invoke(ctx_for("c1"), {"order": "A17"})


@pytest.mark.parametrize("status, error_type", [(400, NonRetryableError), (429, openai.RateLimitError)])
async def test_an_api_error_is_retryable_unless_another_attempt_gets_it_again(status: int, error_type: type) -> None:
    response = httpx2.Response(status, request=httpx2.Request("POST", "http://127.0.0.1/v1/responses"))
    error = openai.OpenAI(api_key="x", max_retries=0)._make_status_error("the message", body=None, response=response)
    dex = durable_agent(make_agent(ScriptedModel([ModelStep.raise_error(error)])), context={"customer": "Ann"})
    assert dex.model is not None
    with pytest.raises(error_type, match="the message"):
        await dex.model.respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())


async def test_the_summary_is_asked_of_the_agents_model() -> None:
    model = ScriptedModel([[assistant_message("They said hi.")]])
    dex = durable_agent(make_agent(model), context={"customer": "Ann"})
    assert dex.model is not None
    summary = await dex.model.summarize([{"type": "user", "text": "hi"}], None)
    assert summary == "They said hi."
    assert model.last_call is not None
    assert model.last_call.tools == [] and "User: hi" in model.last_call.input[0]["content"]
