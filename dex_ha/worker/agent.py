"""An Agent: a model, the tools it may call, and the policy of each tool.

    agent = Agent("support", model=ScriptedModel([...]), compaction={"max_items": 40})

    @agent.tool(effect="read")
    async def lookup(ctx: ToolContext, order_id: str) -> dict: ...

`agent.definition()` is the body of `PUT /v1/agents/{name}`; the Worker
registers it before it polls. The policy fields (effect, approval, inline, timeouts,
attempts) tell the server how to run each call; the Worker only runs the functions.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dex_ha.worker.context import ArgumentsRefused, ToolContext
from dex_ha.worker.model import Model

EFFECTS = ("read", "idempotent_write", "write")
# The server's own tools (ask_user → a question, sleep → a timer); never declared by an agent.
BUILTIN_TOOL_NAMES = frozenset({"ask_user", "sleep"})
COMPACTION_KEYS = ("max_items", "max_tokens")

# Python annotation → JSON-schema type, for the input_schema inferred from a signature.
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    set: "array",
    dict: "object",
}

ToolFunction = Callable[..., Any]


@dataclass
class Tool:
    """One tool of an agent: its function, its policy, and (long-running) its poll function.

    Calling the Tool object calls the function itself, so a decorated function can still
    be used (and unit-tested) directly.
    """

    name: str
    fn: ToolFunction
    effect: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    approval: bool = False
    inline: bool = False
    start_to_close_ms: int | None = None
    max_attempts: int | None = None
    poll_fn: ToolFunction | None = field(default=None, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def poll(self, fn: ToolFunction) -> ToolFunction:
        """Decorator: `fn(ctx, handle)` polls the task this tool started; it returns
        `ctx.pending(...)`, a value (done, ok) or raises ToolError (done, failed)."""
        if not callable(fn):
            raise ValueError(f"fn: the poll function of tool {self.name!r} must be callable")
        if self.inline:
            raise ValueError(f"fn: tool {self.name!r} is inline; an inline tool cannot be long-running")
        if self.poll_fn is not None:
            raise ValueError(f"fn: tool {self.name!r} already has a poll function")
        _require_positional_params(fn, 2, "fn", "a poll function takes (ctx, handle)", exactly=True)
        self.poll_fn = fn
        return fn

    def definition(self) -> dict[str, Any]:
        """This tool's entry in the agent definition (optional fields only when set)."""
        entry: dict[str, Any] = {
            "name": self.name,
            "effect": self.effect,
            "approval": self.approval,
            "inline": self.inline,
        }
        optional = {
            "description": self.description,
            "input_schema": self.input_schema,
            "start_to_close_ms": self.start_to_close_ms,
            "max_attempts": self.max_attempts,
        }
        entry.update({key: value for key, value in optional.items() if value is not None})
        return entry

    async def invoke(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        """Run the tool function with the call's arguments (a sync function in a thread).

        Arguments that do not fit the signature raise ArgumentsRefused (a ToolError) before
        the function is called: the model sent a bad call, and it should see why rather
        than have the call retried unchanged.
        """
        if not isinstance(arguments, dict):
            raise ArgumentsRefused(f"tool {self.name!r}: arguments must be an object, got {type(arguments).__name__}")
        try:
            inspect.signature(self.fn).bind(ctx, **arguments)
        except TypeError as exc:
            raise ArgumentsRefused(f"tool {self.name!r}: bad arguments: {exc}") from None
        return await _call(self.fn, ctx, **arguments)

    async def invoke_poll(self, ctx: ToolContext, handle: Any) -> Any:
        if self.poll_fn is None:
            raise LookupError(f"tool {self.name!r} has no poll function (decorate one with @{self.name}.poll)")
        return await _call(self.poll_fn, ctx, handle)


class Agent:
    """A named agent: its model, its tools and policies, and its compaction limit."""

    def __init__(
        self,
        name: str,
        model: Model | None = None,
        *,
        compaction: dict[str, int] | None = None,
        model_start_to_close_ms: int | None = None,
        description: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"name must be a non-empty string without '/', got {name!r}")
        self.name = name
        self.model = model
        self.compaction = _check_compaction(compaction)
        self.model_start_to_close_ms = _optional_positive_int(model_start_to_close_ms, "model_start_to_close_ms")
        if description is not None and not isinstance(description, str):
            raise TypeError("description must be a string")
        self.description = description
        self.tools: dict[str, Tool] = {}

    def tool(
        self,
        *,
        effect: str,
        approval: bool = False,
        inline: bool = False,
        start_to_close_ms: int | None = None,
        max_attempts: int | None = None,
        description: str | None = None,
        input_schema: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> Callable[[ToolFunction], Tool]:
        """Decorator that declares a tool of this agent; returns the Tool object.

        `effect` is required: "read" (safe to repeat), "idempotent_write" (repeated with the
        same `ctx.idempotency_key`) or "write" (at most one attempt). When `input_schema`
        is not given it is inferred from the function's keyword parameters.
        """
        _check_effect(effect)
        _check_bool(approval, "approval")
        _check_bool(inline, "inline")
        if approval and inline:
            raise ValueError("approval: an inline tool runs inside the model call and cannot wait for approval")
        start_to_close_ms = _optional_positive_int(start_to_close_ms, "start_to_close_ms")
        max_attempts = _optional_positive_int(max_attempts, "max_attempts")
        if description is not None and not isinstance(description, str):
            raise TypeError("description must be a string")
        if input_schema is not None and not isinstance(input_schema, dict):
            raise TypeError("input_schema must be a dict (a JSON schema)")

        def register(fn: ToolFunction) -> Tool:
            if not callable(fn):
                raise ValueError("fn: a tool must be a function")
            tool_name = self._check_new_tool_name(name if name is not None else fn.__name__)
            _require_positional_params(fn, 1, "fn", "a tool function takes the ToolContext first")
            tool = Tool(
                name=tool_name,
                fn=fn,
                effect=effect,
                description=description if description is not None else _first_paragraph(fn),
                input_schema=input_schema if input_schema is not None else infer_input_schema(fn),
                approval=approval,
                inline=inline,
                start_to_close_ms=start_to_close_ms,
                max_attempts=max_attempts,
            )
            self.tools[tool_name] = tool
            return tool

        return register

    def poll(self, tool: Tool | str) -> Callable[[ToolFunction], ToolFunction]:
        """Decorator, same as `@tool.poll`, naming the tool (object or name) of this agent."""
        name = tool.name if isinstance(tool, Tool) else tool
        found = self.tools.get(name) if isinstance(name, str) else None
        if found is None or (isinstance(tool, Tool) and found is not tool):
            raise ValueError(f"tool: {tool!r} is not a tool of agent {self.name!r}")
        return found.poll

    def definition(self) -> dict[str, Any]:
        """The body of `PUT /v1/agents/{name}`."""
        body: dict[str, Any] = {"tools": [tool.definition() for tool in self.tools.values()]}
        if self.compaction:
            body["compaction"] = dict(self.compaction)
        if self.model_start_to_close_ms is not None:
            body["model"] = {"start_to_close_ms": self.model_start_to_close_ms}
        if self.description is not None:
            body["description"] = self.description
        return body

    def _check_new_tool_name(self, name: Any) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: a tool name must be a non-empty string, got {name!r}")
        if name in BUILTIN_TOOL_NAMES:
            raise ValueError(f"name: {name!r} is a built-in tool of the server; choose another name")
        if name in self.tools:
            raise ValueError(f"name: agent {self.name!r} already has a tool named {name!r}")
        return name

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={list(self.tools)})"


# ---------------------------------------------------------------- input schema


def infer_input_schema(fn: ToolFunction) -> dict[str, Any]:
    """A JSON schema of the keyword parameters after `ctx`: types from the annotations
    (int, str, float, bool, list, dict and their generic forms; Optional[X] as X),
    required = the parameters without a default."""
    signature = inspect.signature(fn)
    hints = _type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    extra_allowed = False
    for param in list(signature.parameters.values())[1:]:  # the first one is ctx
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra_allowed = True
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue  # cannot be filled from named arguments
        properties[param.name] = schema_of_annotation(hints.get(param.name, param.annotation))
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if not extra_allowed:
        schema["additionalProperties"] = False
    return schema


def schema_of_annotation(annotation: Any) -> dict[str, Any]:
    """The JSON schema of one annotation; {} (any value) when it has no JSON equivalent."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        return schema_of_annotation(options[0]) if len(options) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    base = origin if origin is not None else annotation
    json_type = _JSON_TYPES.get(base)
    if json_type is None:
        return {}
    schema: dict[str, Any] = {"type": json_type}
    args = typing.get_args(annotation)
    if json_type == "array" and len(args) == 1:
        item = schema_of_annotation(args[0])
        if item:
            schema["items"] = item
    return schema


def _type_hints(fn: ToolFunction) -> dict[str, Any]:
    """Resolved annotations (handles `from __future__ import annotations`); {} if they
    cannot be resolved, in which case the raw annotations are used."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation naming something not importable here
        return {}


# ---------------------------------------------------------------- helpers


async def _call(fn: ToolFunction, *args: Any, **kwargs: Any) -> Any:
    """Await an async function; run a sync one in a thread so it cannot block the loop
    (and with it the heartbeats of every other task)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):  # a sync wrapper that returned a coroutine
        return await result
    return result


def _require_positional_params(fn: ToolFunction, count: int, argument: str, why: str, *, exactly: bool = False) -> None:
    """`fn` must accept `count` positional arguments (and need no others when `exactly`)."""
    try:
        signature = inspect.signature(fn)
        bind = signature.bind if exactly else signature.bind_partial
        bind(*([None] * count))
    except TypeError:
        raise ValueError(f"{argument}: {why}; {getattr(fn, '__name__', fn)!r} does not accept that") from None
    except ValueError:  # no signature (some builtins): trust the caller
        pass


def _first_paragraph(fn: ToolFunction) -> str | None:
    doc = inspect.getdoc(fn)
    if not doc:
        return None
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip() or None


def _check_effect(effect: Any) -> None:
    if effect not in EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(EFFECTS)}; got {effect!r}")


def _check_bool(value: Any, argument: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{argument} must be a bool, got {type(value).__name__}")


def _optional_positive_int(value: Any, argument: str) -> int | None:
    return None if value is None else _positive_int(value, argument)


def _positive_int(value: Any, argument: str) -> int:
    """`value` when it is an int of at least 1 (a bool is not); the error names `argument`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{argument} must be a positive integer or None, got {value!r}")
    return value


def _check_compaction(compaction: Any) -> dict[str, int]:
    if compaction is None:
        return {}
    if not isinstance(compaction, dict):
        raise TypeError("compaction must be a dict with max_items and/or max_tokens")
    unknown = sorted(set(compaction) - set(COMPACTION_KEYS))
    if unknown:
        raise ValueError(f"compaction: unknown key {unknown[0]!r} (allowed: {', '.join(COMPACTION_KEYS)})")
    return {key: _positive_int(value, f"compaction[{key!r}]") for key, value in compaction.items() if value is not None}
