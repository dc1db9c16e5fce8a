"""Run an OpenAI Agents SDK agent durably on dex-ha (pip install -e '.[openai-agents]').

    from agents import Agent, function_tool
    from dex_ha.adapters.openai_agents import durable_agent, effect

    @effect("read")
    @function_tool
    def lookup_order(order_id: str) -> dict: ...

    support = Agent(name="support", instructions="You help customers.", tools=[lookup_order, refund])
    agent = durable_agent(support, effects={"refund": "write"})      # a dex_ha.worker.Agent
    await Worker(urls, agents=[agent]).run()

The agent keeps its instructions, model, model settings and function tools. dex-ha runs
the loop instead of `Runner`: each model call is a RunModel step (the agent's own `Model`
object called inside it, streamed), and each function tool call is its own tool step with
the effect you declare (default "write": at most once). Hosted tools (web search, file
search, code interpreter, image generation, hosted MCP) run at OpenAI inside the model
call, so they repeat when the model step does (at least once). What the adapter cannot run
durably (handoffs, local MCP servers, guardrails, local shell or computer tools) is refused
when you call durable_agent, with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, cast

try:
    import openai
    from agents import (
        Agent as SDKAgent,
    )
    from agents import (
        AgentOutputSchema,
        AgentOutputSchemaBase,
        CodeInterpreterTool,
        FileSearchTool,
        FunctionTool,
        HostedMCPTool,
        ImageGenerationTool,
        ItemHelpers,
        ModelProvider,
        ModelSettings,
        ModelTracing,
        OpenAIProvider,
        RunContextWrapper,
        TResponseInputItem,
        WebSearchTool,
    )
    from agents import Model as SDKModel
    from agents.tool_context import ToolContext as SDKToolContext
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "dex_ha.adapters.openai_agents needs the openai-agents package: pip install -e '.[openai-agents]' in the dex-ha clone"
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
from dex_ha.models.openai import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    NON_RETRYABLE_STATUSES,
    from_response,
    model_order,
    read_response_stream,
    responses_input,
    transcript,
)
from dex_ha.worker.agent import Agent
from dex_ha.worker.context import NonRetryableError, ToolContext, ToolError
from dex_ha.worker.model import DeltaSink, HistoryItem, ModelRequest, ModelResponse

__all__ = ["AgentsModel", "durable_agent", "effect", "tool_context"]

# Tools OpenAI runs on its side during the model call: passed to the model as they are,
# they repeat when the RunModel step runs again (at least once).
HOSTED_TOOLS = (FileSearchTool, WebSearchTool, CodeInterpreterTool, ImageGenerationTool, HostedMCPTool)
# The role of the session's notes and summary in the model input.
NOTE_ROLE = "developer"


def durable_agent(
    agent: SDKAgent[Any],
    *,
    name: str | None = None,
    effects: Mapping[str, str] | None = None,
    model_provider: ModelProvider | None = None,
    context: Any = None,
    compaction: dict[str, int] | None = None,
    model_start_to_close_ms: int | None = None,
    description: str | None = None,
) -> Agent:
    """A dex_ha.worker.Agent that runs `agent` (an agents.Agent) step by step.

    `name`: the dex-ha agent name (default: the agent's own name). `effects`: {tool name:
    "read" | "idempotent_write" | "write"}, with @effect on the tool as the other way to
    declare one; undeclared tools are "write". `model_provider`: resolves the agent's model
    when it is a name or None (default: OpenAIProvider on an AsyncOpenAI client with its
    retries off, made at the first model call from OPENAI_API_KEY / OPENAI_BASE_URL).
    `context`: the object tools and dynamic instructions see as `RunContextWrapper.context`.
    `compaction`, `model_start_to_close_ms`, `description`: as for dex_ha.worker.Agent.
    """
    if not isinstance(agent, SDKAgent):
        raise TypeError(f"agent must be an agents.Agent, got {type(agent).__name__}")
    if model_provider is not None and not isinstance(model_provider, ModelProvider):
        raise TypeError(f"model_provider must be an agents.ModelProvider, got {type(model_provider).__name__}")
    _refuse_what_cannot_run_durably(agent)
    function_tools = _function_tools(agent)
    resolved = resolve_effects({tool.name: declared_effect(tool, _wrapped(tool)) for tool in function_tools}, effects)
    dex_agent = Agent(
        name if name is not None else agent.name,
        model=AgentsModel(agent, model_provider=model_provider, context=context),
        compaction=compaction,
        model_start_to_close_ms=model_start_to_close_ms,
        description=description if description is not None else agent.handoff_description,
    )
    for tool in function_tools:
        dex_agent.tool(
            effect=resolved[tool.name],
            name=tool.name,
            description=tool.description or None,
            input_schema=tool.params_json_schema,
            approval=tool.needs_approval is True,
        )(_tool_step(tool, context))
    return dex_agent


class AgentsModel:
    """The dex-ha model of an agents.Agent: one model call of the agent per RunModel step."""

    def __init__(
        self, agent: SDKAgent[Any], *, model_provider: ModelProvider | None = None, context: Any = None
    ) -> None:
        self.agent = agent
        self.context = context
        self._provider = model_provider

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        """Resolve the agent's instructions, tools and prompt as `Runner` would, call its
        model with the session's history, stream the text, return text and tool calls."""
        run_context = RunContextWrapper(context=self.context)
        tools = [*await self.agent.get_all_tools(run_context), *_server_tools(request.tools)]
        output_type = self.agent.output_type
        output_schema = (
            None
            if output_type in (None, str)
            else output_type
            if isinstance(output_type, AgentOutputSchemaBase)
            else AgentOutputSchema(output_type)
        )
        events = self._model().stream_response(
            await self.agent.get_system_prompt(run_context),
            # responses_input builds the Responses API's input items as plain dicts; the SDK
            # types them as TypedDicts of that same shape.
            cast("list[TResponseInputItem]", responses_input(model_order(request.history), request.summary, NOTE_ROLE)),
            self.agent.model_settings,
            tools,
            output_schema,
            [],
            ModelTracing.DISABLED,
            previous_response_id=None,
            conversation_id=None,
            prompt=await self.agent.get_prompt(run_context),
        )
        try:
            return from_response(await read_response_stream(events, stream))
        except openai.APIStatusError as exc:
            raise _mapped_error(exc) from exc

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        """A summary for compaction, by the agent's model, from the history as a transcript."""
        try:
            response = await self._model().get_response(
                DEFAULT_SUMMARY_INSTRUCTIONS,
                [{"role": "user", "content": transcript(history, summary)}],
                ModelSettings(),
                [],
                None,
                [],
                ModelTracing.DISABLED,
                previous_response_id=None,
                conversation_id=None,
                prompt=None,
            )
        except openai.APIStatusError as exc:
            raise _mapped_error(exc) from exc
        return "".join(ItemHelpers.extract_last_text(item) or "" for item in response.output)

    def _model(self) -> SDKModel:
        if isinstance(self.agent.model, SDKModel):
            return self.agent.model
        if self._provider is None:
            # Made at the first call, so that building the agent needs no API key; its
            # retries are off because the server decides whether a model step runs again.
            self._provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(max_retries=0))
        return self._provider.get_model(self.agent.model)

    def __repr__(self) -> str:
        return f"AgentsModel({self.agent.name!r})"


# ---------------------------------------------------------------- the model call


def _server_tools(tools: list[dict[str, Any]]) -> list[FunctionTool]:
    """The server's built-in tools (ask_user, sleep) as function tools the model can call;
    the server runs them, never this process."""

    async def never(_ctx: Any, _arguments: str) -> str:
        raise RuntimeError("a built-in tool of the dex-ha server runs on the server")

    return [
        FunctionTool(
            name=tool["name"],
            description=tool.get("description") or "",
            params_json_schema=tool.get("input_schema") or {"type": "object", "properties": {}},
            on_invoke_tool=never,
            strict_json_schema=False,
        )
        for tool in builtin_tools(tools)
    ]


def _mapped_error(exc: openai.APIStatusError) -> Exception:
    """An API error another attempt would get again (400, 401, ...) fails the turn at once."""
    if exc.status_code in NON_RETRYABLE_STATUSES:
        return NonRetryableError(f"OpenAI API error {exc.status_code}: {exc.message}")
    return exc


# ---------------------------------------------------------------- tool steps


def _tool_step(tool: FunctionTool, context: Any) -> Any:
    """The function of the dex-ha tool step that runs `tool`: the SDK's own invoker, with
    the JSON arguments the model sent and a ToolContext for this call."""

    async def run(ctx: ToolContext, **arguments: Any) -> Any:
        arguments_json = json.dumps(arguments, ensure_ascii=False)
        sdk_ctx = SDKToolContext(
            context=context, tool_name=tool.name, tool_call_id=ctx.call_id or ctx.step_id, tool_arguments=arguments_json
        )
        with running_tool(ctx):
            try:
                async with asyncio.timeout(tool.timeout_seconds):
                    output = await tool.on_invoke_tool(sdk_ctx, arguments_json)
            except TimeoutError:
                if tool.timeout_behavior == "raise_exception":
                    raise
                raise ToolError(f"tool {tool.name!r} timed out after {tool.timeout_seconds} s") from None
        return json_output(output)

    run.__name__ = tool.name
    return run


def _function_tools(agent: SDKAgent[Any]) -> list[FunctionTool]:
    tools = [tool for tool in agent.tools if isinstance(tool, FunctionTool)]
    for tool in tools:
        check_tool_name(tool.name)
        if tool.tool_input_guardrails or tool.tool_output_guardrails:
            raise ValueError(
                f"tool {tool.name!r}: tool guardrails are not supported by the dex-ha adapter "
                "(check the input inside the tool instead)"
            )
        if callable(tool.needs_approval):
            raise ValueError(
                f"tool {tool.name!r}: needs_approval must be True or False here (a dex-ha tool "
                "either always waits for approval or never)"
            )
    return tools


def _wrapped(tool: FunctionTool) -> Any:
    """The function a @function_tool wraps (where @effect below the SDK's decorator is)."""
    try:
        return tool.__wrapped__
    except AttributeError:
        return None


def _refuse_what_cannot_run_durably(agent: SDKAgent[Any]) -> None:
    """ValueError naming what the adapter cannot run as durable steps, and why."""
    what = f"agent {agent.name!r}"
    if agent.handoffs:
        raise ValueError(
            f"{what}: handoffs are not supported by the dex-ha adapter (run each agent as its own "
            "dex-ha agent, or give it the other agent as a tool with agent.as_tool())"
        )
    if agent.mcp_servers:
        raise ValueError(
            f"{what}: local MCP servers are not supported by the dex-ha adapter (their tools are "
            "only known at run time; use HostedMCPTool or wrap the calls in function tools)"
        )
    if agent.input_guardrails or agent.output_guardrails:
        raise ValueError(f"{what}: input and output guardrails are not supported by the dex-ha adapter")
    if agent.hooks is not None:
        raise ValueError(f"{what}: agent hooks are not called by the dex-ha adapter; remove them")
    if agent.tool_use_behavior != "run_llm_again":
        raise ValueError(
            f"{what}: tool_use_behavior must be 'run_llm_again' (dex-ha always gives the tool "
            f"results back to the model), got {agent.tool_use_behavior!r}"
        )
    for tool in agent.tools:
        if isinstance(tool, HostedMCPTool) and tool.tool_config.get("require_approval", "always") != "never":
            raise ValueError(
                f"{what}: hosted MCP tool {tool.name!r} needs require_approval='never' (its "
                "approvals would happen inside the model call)"
            )
        if not isinstance(tool, (FunctionTool, *HOSTED_TOOLS)):
            raise ValueError(
                f"{what}: tool {getattr(tool, 'name', tool)!r} ({type(tool).__name__}) runs in the "
                "agent's process and is not supported by the dex-ha adapter; wrap it in a "
                "function tool to run it as a durable step"
            )
