"""Run a Pydantic AI agent durably on dex-ha (pip install -e '.[pydantic-ai]').

    from pydantic_ai import Agent
    from dex_ha.adapters.pydantic_ai import durable_agent, effect

    support = Agent("openai:gpt-4.1", instructions="You help customers.")

    @effect("read")
    @support.tool_plain
    def lookup_order(order_id: str) -> dict: ...

    agent = durable_agent(support, name="support", effects={"refund": "write"})
    await Worker(urls, agents=[agent]).run()

dex-ha runs the loop, one step at a time, with the agent's own machinery:

- A RunModel step runs the agent's graph (`Agent.iter`) on the session's history until the
  model has answered, and stops there: the agent resolves its instructions, system prompts,
  model, settings and tool definitions, and calls its model (streamed) as in any run. The
  tool calls of the answer are not run there.
- Each call of a function tool is its own tool step with the effect you declare (default
  "write": at most once). The step runs the agent's graph on that one call, so the agent
  validates the arguments and runs the tool as usual (a `ModelRetry` from the tool, or
  arguments that do not validate, reach the model as the tool's error).

Native tools (web search, code execution, ... in `builtin_tools`) run at the model provider
inside the model call: they repeat when the model step does (at least once). What the
adapter cannot run durably (MCP servers and other toolsets, structured output, output
validators) is refused when you call durable_agent, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

try:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import messages as pm
    from pydantic_ai.agent import CallToolsNode, ModelRequestNode
    from pydantic_ai.direct import model_request
    from pydantic_ai.exceptions import ModelHTTPError, UserError
    from pydantic_ai.models import Model as PydanticModel
    from pydantic_ai.tools import DeferredToolResults, ToolDefinition
    from pydantic_ai.tools import Tool as PydanticTool
    from pydantic_ai.toolsets import ExternalToolset, FunctionToolset
    from pydantic_graph import End
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "dex_ha.adapters.pydantic_ai needs pydantic-ai: pip install -e '.[pydantic-ai]' in the dex-ha clone"
    ) from exc

from dex_ha.adapters._common import (
    builtin_tools,
    check_tool_name,
    declared_effect,
    effect,
    json_output,
    resolve_effects,
    running_tool,
    tool_context,
)
from dex_ha.models.openai import DEFAULT_SUMMARY_INSTRUCTIONS, NON_RETRYABLE_STATUSES, model_order, transcript
from dex_ha.worker.agent import Agent
from dex_ha.worker.context import NonRetryableError, ToolContext, ToolError
from dex_ha.worker.model import DeltaSink, HistoryItem, ModelRequest, ModelResponse, ToolCall

__all__ = ["PydanticAIModel", "durable_agent", "effect", "history_messages", "tool_context"]

SUMMARY_PREFIX = "Summary of the conversation before the messages below:\n"


def durable_agent(
    agent: PydanticAgent[Any, Any],
    *,
    name: str | None = None,
    effects: Mapping[str, str] | None = None,
    deps: Any = None,
    model: PydanticModel | str | None = None,
    compaction: dict[str, int] | None = None,
    model_start_to_close_ms: int | None = None,
    description: str | None = None,
) -> Agent:
    """A dex_ha.worker.Agent that runs `agent` (a pydantic_ai.Agent) step by step.

    `name`: the dex-ha agent name (default: the agent's own name). `effects`: {tool name:
    "read" | "idempotent_write" | "write"}, with @effect on the tool function as the other
    way to declare one; undeclared tools are "write". `deps`: the dependencies the agent's
    tools, instructions and system prompts get (`RunContext.deps`). `model`: a model to use
    instead of the agent's own. `compaction`, `model_start_to_close_ms`, `description`: as
    for dex_ha.worker.Agent.
    """
    if not isinstance(agent, PydanticAgent):
        raise TypeError(f"agent must be a pydantic_ai.Agent, got {type(agent).__name__}")
    if model is not None and not isinstance(model, (PydanticModel, str)):
        raise TypeError(f"model must be a pydantic_ai Model or a model name, got {type(model).__name__}")
    agent_name = name if name is not None else agent.name
    if agent_name is None:
        raise ValueError("name: the agent has no name of its own; pass name=")
    tools = _function_tools(agent)
    resolved = resolve_effects({tool.name: declared_effect(tool, tool.function) for tool in tools}, effects)
    dex_agent = Agent(
        agent_name,
        model=PydanticAIModel(agent, deps=deps, model=model),
        compaction=compaction,
        model_start_to_close_ms=model_start_to_close_ms,
        description=description,
    )
    for tool in tools:
        definition = tool.tool_def
        dex_agent.tool(
            effect=resolved[tool.name],
            name=tool.name,
            description=definition.description or None,
            input_schema=definition.parameters_json_schema,
            approval=tool.requires_approval,
        )(_tool_step(agent, tool, deps, model))
    return dex_agent


class PydanticAIModel:
    """The dex-ha model of a pydantic_ai.Agent: one model request of the agent per RunModel step."""

    def __init__(
        self, agent: PydanticAgent[Any, Any], *, deps: Any = None, model: PydanticModel | str | None = None
    ) -> None:
        self.agent = agent
        self.deps = deps
        self.model = model

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        """Run the agent's graph on the history up to the model's answer (streamed), and
        return its text and tool calls; the calls become tool steps."""
        messages = [*await self._system_prompt(), *history_messages(request.history, request.summary)]
        server_tools = ExternalToolset([_definition(tool) for tool in builtin_tools(request.tools)])
        try:
            async with self.agent.iter(
                None, message_history=messages, deps=self.deps, model=self.model, toolsets=[server_tools]
            ) as run:
                node = run.next_node
                while not isinstance(node, CallToolsNode):
                    if isinstance(node, End):
                        raise RuntimeError("the agent's run ended without a model answer")
                    if isinstance(node, ModelRequestNode):
                        async with node.stream(run.ctx) as events:
                            await _stream_text(events, stream)
                    node = await run.next(node)
        except ModelHTTPError as exc:
            raise _mapped_error(exc) from exc
        return dex_response(node.model_response)

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        """A summary for compaction, by the agent's model, from the history as a transcript."""
        request = pm.ModelRequest(
            parts=[pm.UserPromptPart(transcript(history, summary))], instructions=DEFAULT_SUMMARY_INSTRUCTIONS
        )
        model = self.model or self.agent.model
        if model is None:  # the error agent.iter raises in respond() for the same mistake
            raise UserError("`model` must either be set on the agent or passed to durable_agent")
        try:
            response = await model_request(model, [request])
        except ModelHTTPError as exc:
            raise _mapped_error(exc) from exc
        return response.text or ""

    async def _system_prompt(self) -> list[pm.ModelMessage]:
        """The agent's system prompts (static and dynamic, with deps), as the first request.

        The agent adds them only to a conversation without history, and the session's
        history does not keep them; so they are taken from a run with no history, stopped
        before its model request is sent."""
        async with self.agent.iter(None, deps=self.deps, model=self.model) as run:
            node = run.next_node
            while not isinstance(node, (ModelRequestNode, End)):
                node = await run.next(node)
        if not isinstance(node, ModelRequestNode):
            return []
        parts = [part for part in node.request.parts if isinstance(part, pm.SystemPromptPart)]
        return [pm.ModelRequest(parts=parts)] if parts else []

    def __repr__(self) -> str:
        return f"PydanticAIModel({self.agent.name!r})"


# ---------------------------------------------------------------- history and answers


def history_messages(history: list[HistoryItem], summary: str | None) -> list[pm.ModelMessage]:
    """The session's history as Pydantic AI messages: each assistant message (text and tool
    calls) followed by one request holding the results of its calls; notes and the summary
    as system prompt parts."""
    messages: list[pm.ModelMessage] = []
    if summary:
        messages.append(pm.ModelRequest(parts=[pm.SystemPromptPart(SUMMARY_PREFIX + summary)]))
    for entry in model_order(history):
        if entry["type"] == "user":
            messages.append(pm.ModelRequest(parts=[pm.UserPromptPart(entry["text"])]))
        elif entry["type"] == "note":
            messages.append(pm.ModelRequest(parts=[pm.SystemPromptPart(entry["text"])]))
        else:
            parts: list[pm.ModelResponsePart] = [pm.TextPart(entry["content"])] if entry["content"] else []
            parts += [
                pm.ToolCallPart(call["name"], call["arguments"], tool_call_id=call["id"]) for call in entry["calls"]
            ]
            messages.append(pm.ModelResponse(parts=parts))
            if entry["calls"]:
                messages.append(
                    pm.ModelRequest(
                        parts=[
                            pm.ToolReturnPart(call["name"], call["output"], tool_call_id=call["id"])
                            for call in entry["calls"]
                        ]
                    )
                )
    return messages


def dex_response(response: pm.ModelResponse) -> ModelResponse:
    """The model's answer for dex-ha: its text parts joined, its tool calls with their ids.
    Thinking parts and native tool parts (run at the provider) are left out."""
    text = "".join(part.content for part in response.parts if isinstance(part, pm.TextPart))
    calls = [
        ToolCall(part.tool_call_id, part.tool_name, part.args_as_dict())
        for part in response.parts
        if isinstance(part, pm.ToolCallPart)
    ]
    usage = {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens}
    return ModelResponse(text, calls, usage)


async def _stream_text(events: Any, stream: DeltaSink) -> None:
    async for event in events:
        if isinstance(event, pm.PartStartEvent) and isinstance(event.part, pm.TextPart):
            stream.send_text(event.part.content)
        elif isinstance(event, pm.PartDeltaEvent) and isinstance(event.delta, pm.TextPartDelta):
            stream.send_text(event.delta.content_delta)


def _definition(tool: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition(
        name=tool["name"],
        description=tool.get("description"),
        parameters_json_schema=tool.get("input_schema") or {"type": "object", "properties": {}},
    )


def _mapped_error(exc: ModelHTTPError) -> Exception:
    """An API error another attempt would get again (400, 401, ...) fails the turn at once."""
    if exc.status_code in NON_RETRYABLE_STATUSES:
        return NonRetryableError(f"model API error {exc.status_code} ({exc.model_name}): {exc.body}")
    return exc


# ---------------------------------------------------------------- tool steps


def _tool_step(
    agent: PydanticAgent[Any, Any], tool: PydanticTool[Any], deps: Any, model: PydanticModel | str | None
) -> Any:
    """The function of the dex-ha tool step that runs one call of `tool`: the agent's graph
    on a history that ends with that call, stopped once the tool's result is in."""

    async def run(ctx: ToolContext, **arguments: Any) -> Any:
        call_id = ctx.call_id or ctx.step_id
        history = [pm.ModelResponse(parts=[pm.ToolCallPart(tool.name, arguments, tool_call_id=call_id)])]
        # The server asked for the approval already: this step runs only once it was given.
        approved = DeferredToolResults(approvals={call_id: True}) if tool.requires_approval else None
        with running_tool(ctx):
            async with agent.iter(
                None, message_history=history, deferred_tool_results=approved, deps=deps, model=model
            ) as graph:
                node = graph.next_node
                while not isinstance(node, (ModelRequestNode, End)):
                    node = await graph.next(node)
        if not isinstance(node, ModelRequestNode):
            raise RuntimeError(f"tool {tool.name!r}: the agent's run ended without the tool's result")
        return _tool_outcome(node.request, call_id, tool.name)

    run.__name__ = tool.name
    return run


def _tool_outcome(request: pm.ModelRequest, call_id: str, name: str) -> Any:
    """The tool's output from the request the agent built after running it. A failure the
    agent turned into a message for the model (the tool raised ModelRetry or an error the
    agent caught, or the arguments did not validate) is the tool's error."""
    for part in request.parts:
        if getattr(part, "tool_call_id", None) != call_id:
            continue
        if isinstance(part, pm.ToolReturnPart) and part.outcome == "success":
            return json_output(part.content)
        if isinstance(part, pm.ToolReturnPart) and part.outcome in pm.ERROR_OUTCOMES:
            raise ToolError(part.model_response_str(wrap_if_error=False))
        if isinstance(part, pm.RetryPromptPart):
            raise ToolError(part.model_response())
        raise RuntimeError(f"tool {name!r}: call {call_id!r} ended as {getattr(part, 'outcome', part)!r}")
    raise RuntimeError(f"tool {name!r}: the agent's run gave no result for call {call_id!r}")


def _function_tools(agent: PydanticAgent[Any, Any]) -> list[PydanticTool[Any]]:
    """The agent's function tools; ValueError naming what the adapter cannot run durably."""
    what = f"agent {agent.name!r}"
    if agent.output_type is not str:
        raise ValueError(
            f"{what}: output_type must be str (a dex-ha session answers in text), got {agent.output_type!r}"
        )
    # Output validators run after the model's final answer, a point the adapter never
    # lets the agent reach; refusing them is better than skipping them silently.
    if getattr(agent, "_output_validators", None):
        raise ValueError(f"{what}: output validators are not supported by the dex-ha adapter")
    function_toolset, *others = agent.toolsets
    for toolset in others:
        raise ValueError(
            f"{what}: toolset {toolset.label} is not supported by the dex-ha adapter (MCP "
            "servers and other toolsets are only known at run time); register the tools "
            "on the agent itself"
        )
    if not isinstance(function_toolset, FunctionToolset):
        raise ValueError(f"{what}: its tools are not a plain function toolset ({function_toolset.label})")
    tools = list(function_toolset.tools.values())
    for tool in tools:
        check_tool_name(tool.name)
    return tools
