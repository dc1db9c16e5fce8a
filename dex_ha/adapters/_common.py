"""What both framework adapters share: the effect each tool declares, the dex-ha context of
the tool step running now, and the conversion of a tool's output to JSON.

Nothing here imports a framework, so `import dex_ha.adapters` needs no extra.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from dex_ha.worker.agent import BUILTIN_TOOL_NAMES, EFFECTS
from dex_ha.worker.context import ToolContext

# A tool whose effect nobody declared runs at most once: if its Worker dies mid-run the
# call records outcome_unknown instead of running again. The one safe default.
DEFAULT_EFFECT = "write"
# The attribute @effect sets on a framework tool (or on its function).
EFFECT_ATTRIBUTE = "__dex_ha_effect__"

T = TypeVar("T")

# The dex-ha context of the tool step running in this task (None outside a tool step). A
# context variable, not a global: each asyncio task (and each thread a tool runs in, which
# gets a copy of the caller's context) sees its own step.
_running_tool: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar("dex_ha_running_tool", default=None)


def effect(kind: str) -> Any:
    """Decorator: declare the effect of a framework tool, next to its definition.

        @effect("read")
        @function_tool            # or @agent.tool_plain in Pydantic AI
        def lookup_order(order_id: str) -> dict: ...

    `kind` is "read" (safe to run again), "idempotent_write" (runs again with the same
    idempotency key, see `tool_context()`) or "write" (at most once). It works above or
    below the framework's own decorator.
    """
    if kind not in EFFECTS:
        raise ValueError(f"kind: the effect must be one of {', '.join(EFFECTS)}; got {kind!r}")

    def mark(tool: T) -> T:
        try:
            setattr(tool, EFFECT_ATTRIBUTE, kind)
        except (AttributeError, TypeError):
            raise TypeError(
                f"@effect({kind!r}) cannot mark {tool!r}; declare it in effects={{name: {kind!r}}}"
            ) from None
        return tool

    return mark


def declared_effect(*candidates: Any) -> str | None:
    """The effect @effect put on the first of `candidates` that has one (a framework tool
    object, then the function it wraps)."""
    for candidate in candidates:
        kind = getattr(candidate, EFFECT_ATTRIBUTE, None)
        if isinstance(kind, str):  # @effect sets it, to a kind it checked
            return kind
    return None


def resolve_effects(decorated: Mapping[str, str | None], effects: Mapping[str, str] | None) -> dict[str, str]:
    """The effect of every tool: from `effects` ({tool name: effect}), else from @effect,
    else DEFAULT_EFFECT. `decorated` maps each tool name to its @effect (or None).

    Refused with ValueError naming the tool: a name in `effects` that is not a tool of the
    agent, an unknown effect, and a tool whose two declarations disagree.
    """
    if effects is None:
        effects = {}
    if not isinstance(effects, Mapping):
        raise TypeError(f"effects must be a dict {{tool name: effect}}, got {type(effects).__name__}")
    for name, kind in effects.items():
        if name not in decorated:
            known = ", ".join(sorted(decorated)) or "none"
            raise ValueError(f"effects: {name!r} is not a function tool of this agent (its tools: {known})")
        if kind not in EFFECTS:
            raise ValueError(f"effects[{name!r}]: the effect must be one of {', '.join(EFFECTS)}; got {kind!r}")
    resolved = {}
    for name, marked in decorated.items():
        given = effects.get(name)
        if given is not None and marked is not None and given != marked:
            raise ValueError(f"effects[{name!r}]: {given!r} contradicts @effect({marked!r}) on the tool")
        resolved[name] = given or marked or DEFAULT_EFFECT
    return resolved


def check_tool_name(name: str) -> None:
    """A framework tool may not take the name of one of the server's built-in tools."""
    if name in BUILTIN_TOOL_NAMES:
        raise ValueError(f"tool {name!r}: the name of a built-in tool of the dex-ha server; rename the tool")


def builtin_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The server's own tools (ask_user, sleep) among a RunModel task's tools: the adapter
    offers them to the framework's model next to the agent's tools, and the server runs them."""
    return [tool for tool in tools if tool.get("builtin")]


def tool_context() -> ToolContext:
    """The dex-ha ToolContext of the tool step running now: call it inside a framework tool
    to read `idempotency_key`, `attempt`, `session_id`, or to `await heartbeat()`.

    RuntimeError outside a tool step (a model call, or the tool called directly)."""
    ctx = _running_tool.get()
    if ctx is None:
        raise RuntimeError("tool_context() is only available inside a tool that runs as a dex-ha tool step")
    return ctx


@contextlib.contextmanager
def running_tool(ctx: ToolContext) -> Iterator[None]:
    """Make `ctx` the answer of tool_context() for the body of the block."""
    token = _running_tool.set(ctx)
    try:
        yield
    finally:
        _running_tool.reset(token)


def json_output(value: Any) -> Any:
    """A tool's output as a JSON value for the tool step's result: JSON values as they are,
    pydantic models and dataclasses as their fields, anything else as its str()."""
    return json.loads(json.dumps(value, default=_jsonable, ensure_ascii=False))


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
