"""dex_ha.adapters.pydantic_ai without a server: the model call (history → Pydantic AI
messages, the agent's answer → text and tool calls), the tool steps, effects, and what is
refused. The model is Pydantic AI's own FunctionModel, which records what the agent sent."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from dex_ha.adapters.pydantic_ai import durable_agent, effect, history_messages, tool_context
from dex_ha.worker import ModelRequest, NonRetryableError, ToolContext, ToolError
from tests.support.doubles import ASK_USER_BUILTIN, TextSink

BUILTINS = [ASK_USER_BUILTIN]


class Recorder:
    """A FunctionModel whose streamed answer is `answer`, recording each request."""

    def __init__(self, *answer: str | DeltaToolCall) -> None:
        self.answer = answer
        self.calls: list[tuple[list[pm.ModelMessage], AgentInfo]] = []
        self.model = FunctionModel(stream_function=self._stream, model_name="recorder")

    async def _stream(self, messages: list[pm.ModelMessage], info: AgentInfo) -> Any:
        self.calls.append((messages, info))
        for index, piece in enumerate(self.answer):
            yield piece if isinstance(piece, str) else {index: piece}


def ctx_for(call_id: str) -> ToolContext:
    return ToolContext(
        session_id="s1",
        turn_id="t1",
        step_id=f"st-{call_id}",
        call_id=call_id,
        attempt=1,
        idempotency_key=f"s1:{call_id}",
        worker_id="w1",
    )


def make_agent(recorder: Recorder) -> Agent[str, str]:
    agent = Agent(recorder.model, name="support", deps_type=str, instructions="Be brief.", system_prompt="You sell.")

    @agent.system_prompt
    def customer(ctx: RunContext[str]) -> str:
        return f"The customer is {ctx.deps}."

    @agent.tool
    def lookup(ctx: RunContext[str], order: str) -> dict[str, str | None]:
        """Find an order by its id."""
        return {"order": order, "customer": ctx.deps, "key": tool_context().idempotency_key}

    @effect("idempotent_write")
    @agent.tool_plain
    def put_note(text: str) -> str:
        """Add a note."""
        if not text:
            raise ModelRetry("the note is empty")
        return f"noted: {text}"

    @agent.tool_plain(requires_approval=True)
    async def refund(order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    return agent


async def test_a_model_call_runs_the_agent_up_to_its_answer() -> None:
    recorder = Recorder("Checking ", "now.", DeltaToolCall("lookup", '{"order": "A17"}', tool_call_id="call_2"))
    dex = durable_agent(make_agent(recorder), deps="Ann")
    history: list[dict[str, Any]] = [
        {"type": "user", "text": "Where is A17?"},
        {
            "type": "assistant",
            "content": "One moment.",
            "tool_calls": [{"id": "call_1", "name": "put_note", "arguments": {"text": "asked"}}],
        },
        {
            "type": "tool_result",
            "call_id": "call_1",
            "name": "put_note",
            "status": "succeeded",
            "output": "noted: asked",
        },
    ]
    deltas = TextSink()
    assert dex.model is not None
    response = await dex.model.respond(ModelRequest(history, "Earlier: hello.", BUILTINS), deltas)

    assert response.content == "Checking now." and "".join(deltas.texts) == "Checking now."
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [("call_2", "lookup", {"order": "A17"})]
    [(messages, info)] = recorder.calls  # one model request, and no tool ran
    assert [t.name for t in info.function_tools] == ["lookup", "put_note", "refund", "ask_user"]
    assert info.instructions == "Be brief."
    system = [p.content for p in messages[0].parts if isinstance(p, pm.SystemPromptPart)]
    assert system == [
        "You sell.",
        "The customer is Ann.",
        "Summary of the conversation before the messages below:\nEarlier: hello.",
    ]
    assert [type(m).__name__ for m in messages] == ["ModelRequest", "ModelResponse", "ModelRequest"]
    call = messages[1].parts[1]
    assert isinstance(call, pm.ToolCallPart)
    assert (call.tool_name, call.args, call.tool_call_id) == ("put_note", {"text": "asked"}, "call_1")
    [result] = messages[2].parts
    assert isinstance(result, pm.ToolReturnPart)
    assert (result.tool_name, result.content, result.tool_call_id) == ("put_note", "noted: asked", "call_1")


def test_the_history_maps_notes_and_failed_results() -> None:
    messages = history_messages(
        [
            {"type": "user", "text": "hi"},
            {"type": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "refund", "arguments": {}}]},
            {"type": "note", "text": "reconciled"},
            {"type": "tool_result", "call_id": "c1", "name": "refund", "status": "outcome_unknown", "error": "lost"},
        ],
        None,
    )
    assert [[type(p).__name__ for p in m.parts] for m in messages] == [
        ["UserPromptPart"],
        ["ToolCallPart"],
        ["ToolReturnPart"],
        ["SystemPromptPart"],
    ]
    failed = messages[2].parts[0]
    assert isinstance(failed, pm.ToolReturnPart)
    assert failed.content == '{"status": "outcome_unknown", "error": "lost"}'


async def test_a_tool_step_runs_the_agents_tool_with_its_deps_and_the_key() -> None:
    dex = durable_agent(make_agent(Recorder("unused")), deps="Ann")
    assert await dex.tools["lookup"].invoke(ctx_for("call_7"), {"order": "A17"}) == {
        "order": "A17",
        "customer": "Ann",
        "key": "s1:call_7",
    }
    # The server approved it before the step ran, so the agent runs it without asking.
    assert await dex.tools["refund"].invoke(ctx_for("call_8"), {"order": "A17"}) == "refunded A17"


async def test_a_retry_or_bad_arguments_reach_the_model_as_the_tools_error() -> None:
    dex = durable_agent(make_agent(Recorder("unused")), deps="Ann")
    with pytest.raises(ToolError, match="the note is empty"):
        await dex.tools["put_note"].invoke(ctx_for("c1"), {"text": ""})
    with pytest.raises(ToolError, match="Input should be a valid string"):
        await dex.tools["lookup"].invoke(ctx_for("c2"), {"order": 17})


def test_effects_come_from_the_decorator_the_mapping_and_the_default() -> None:
    dex = durable_agent(make_agent(Recorder()), effects={"lookup": "read"})
    policies = {tool["name"]: (tool["effect"], tool["approval"]) for tool in dex.definition()["tools"]}
    assert policies == {"lookup": ("read", False), "put_note": ("idempotent_write", False), "refund": ("write", True)}
    schema = dex.tools["lookup"].input_schema
    assert schema is not None and schema["required"] == ["order"]


def test_bad_declarations_are_refused_naming_the_tool() -> None:
    agent = make_agent(Recorder())
    with pytest.raises(ValueError, match=r"'lookpu' is not a function tool of this agent"):
        durable_agent(agent, effects={"lookpu": "read"})
    with pytest.raises(ValueError, match=r"effects\['put_note'\]: 'read' contradicts @effect\('idempotent_write'\)"):
        durable_agent(agent, effects={"put_note": "read"})

    sleepy = Agent(Recorder().model, name="a")

    @sleepy.tool_plain
    def sleep(ms: int) -> None: ...

    with pytest.raises(ValueError, match="tool 'sleep': the name of a built-in tool of the dex-ha server"):
        durable_agent(sleepy)


def test_what_cannot_run_durably_is_refused_with_the_reason() -> None:
    model = Recorder().model
    with pytest.raises(ValueError, match="agent 'a': output_type must be str"):
        durable_agent(Agent(model, name="a", output_type=int))
    validated = Agent(model, name="a")
    validated.output_validator(lambda text: text)
    with pytest.raises(ValueError, match="agent 'a': output validators are not supported"):
        durable_agent(validated)
    with pytest.raises(ValueError, match="agent 'a': toolset .* is not supported"):
        durable_agent(Agent(model, name="a", toolsets=[FunctionToolset()]))
    with pytest.raises(ValueError, match="name: the agent has no name"):
        durable_agent(Agent(model))


async def test_an_api_error_another_attempt_would_get_again_is_not_retried() -> None:
    from pydantic_ai.exceptions import ModelHTTPError

    async def refuse(messages: list[pm.ModelMessage], info: AgentInfo) -> Any:
        raise ModelHTTPError(401, "recorder", {"message": "bad key"})
        yield  # an async generator, as FunctionModel's stream_function must be

    dex = durable_agent(Agent(FunctionModel(stream_function=refuse), name="a"))
    assert dex.model is not None
    with pytest.raises(NonRetryableError, match="model API error 401 .*bad key"):
        await dex.model.respond(ModelRequest([{"type": "user", "text": "hi"}], None, []), TextSink())


async def test_the_summary_is_asked_of_the_agents_model() -> None:
    seen: list[list[pm.ModelMessage]] = []

    def summarise(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        seen.append(messages)
        return pm.ModelResponse(parts=[pm.TextPart("They said hi.")])

    dex = durable_agent(Agent(FunctionModel(summarise), name="a"))
    assert dex.model is not None
    assert await dex.model.summarize([{"type": "user", "text": "hi"}], None) == "They said hi."
    transcript = seen[0][0].parts[0]
    assert isinstance(transcript, pm.UserPromptPart) and "User: hi" in transcript.content


async def test_any_other_exception_of_a_tool_fails_its_step() -> None:
    agent = Agent(Recorder().model, name="a")

    @agent.tool_plain
    def boom(order: str) -> str:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):  # the Worker reports a retryable failure
        await durable_agent(agent).tools["boom"].invoke(ctx_for("c1"), {"order": "A17"})
