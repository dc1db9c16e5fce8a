"""Agent definitions (`PUT /v1/agents/{name}`, docs/api.md) and the tool policies in them.

A definition is validated and normalised (every optional field filled in) before it is
stored, so comparing two definitions is comparing two canonical JSON strings, and the
policy recorded on a tool call is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dex_ha.engine.kinds import MAX_DURATION_MS
from dex_ha.engine.results import Rejected

EFFECTS = ("read", "idempotent_write", "write")

# Built-in tools the model may call; they become wait steps, never Worker tasks.
ASK_USER = "ask_user"
SLEEP = "sleep"
BUILTIN_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": ASK_USER,
        "builtin": True,
        "description": "Ask the user a question and wait for the answer.",
        "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]},
    },
    {
        "name": SLEEP,
        "builtin": True,
        "description": "Wait for a number of milliseconds before going on.",
        "input_schema": {"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0}}, "required": ["ms"]},
    },
)
BUILTIN_NAMES = frozenset(t["name"] for t in BUILTIN_TOOLS)


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How the engine runs one tool; recorded on every call of it."""

    name: str
    effect: str
    approval: bool = False
    inline: bool = False
    start_to_close_ms: int | None = None
    max_attempts: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "effect": self.effect,
            "approval": self.approval,
            "inline": self.inline,
            "start_to_close_ms": self.start_to_close_ms,
            "max_attempts": self.max_attempts,
        }


# The policy recorded on built-in calls: they change nothing outside the session.
BUILTIN_POLICY = {name: ToolPolicy(name=name, effect="read") for name in BUILTIN_NAMES}


def normalize_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """The definition with defaults filled in; raises Rejected("invalid") naming the field."""
    allowed = {"tools", "compaction", "model", "description", "metadata"}
    _no_unknown_keys(definition, allowed, "definition")
    tools = definition.get("tools", [])
    if not isinstance(tools, list):
        raise Rejected("invalid", "definition.tools must be a list")
    normalized_tools = [_normalize_tool(t, f"definition.tools[{i}]") for i, t in enumerate(tools)]
    names = [t["name"] for t in normalized_tools]
    if len(set(names)) != len(names):
        raise Rejected("invalid", "definition.tools: tool names must be unique")
    compaction = _object(definition.get("compaction") or {}, "definition.compaction")
    _no_unknown_keys(compaction, {"max_items", "max_tokens"}, "definition.compaction")
    model = _object(definition.get("model") or {}, "definition.model")
    _no_unknown_keys(model, {"start_to_close_ms"}, "definition.model")
    return {
        "tools": normalized_tools,
        "compaction": {
            "max_items": _positive_int(compaction.get("max_items"), "definition.compaction.max_items"),
            "max_tokens": _positive_int(compaction.get("max_tokens"), "definition.compaction.max_tokens"),
        },
        "model": {
            "start_to_close_ms": _duration_ms(model.get("start_to_close_ms"), "definition.model.start_to_close_ms")
        },
        "description": definition.get("description"),
        "metadata": definition.get("metadata"),
    }


def _normalize_tool(tool: Any, where: str) -> dict[str, Any]:
    tool = _object(tool, where)
    _no_unknown_keys(
        tool,
        {"name", "description", "input_schema", "effect", "approval", "inline", "start_to_close_ms", "max_attempts"},
        where,
    )
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise Rejected("invalid", f"{where}.name must be a non-empty string")
    if name in BUILTIN_NAMES:
        raise Rejected("invalid", f"{where}.name: {name!r} is a built-in tool")
    effect = tool.get("effect")
    if effect not in EFFECTS:
        raise Rejected("invalid", f"{where}.effect must be one of {', '.join(EFFECTS)}")
    for flag in ("approval", "inline"):
        if not isinstance(tool.get(flag, False), bool):
            raise Rejected("invalid", f"{where}.{flag} must be a boolean")
    if tool.get("approval") and tool.get("inline"):
        raise Rejected("invalid", f"{where}: an inline tool cannot wait for approval")
    return {
        "name": name,
        "description": tool.get("description"),
        "input_schema": tool.get("input_schema"),
        "effect": effect,
        "approval": tool.get("approval", False),
        "inline": tool.get("inline", False),
        "start_to_close_ms": _duration_ms(tool.get("start_to_close_ms"), f"{where}.start_to_close_ms"),
        "max_attempts": _positive_int(tool.get("max_attempts"), f"{where}.max_attempts"),
    }


def tool_policy(definition: dict[str, Any] | None, name: str) -> ToolPolicy | None:
    """The policy of tool `name` in a normalised definition (None: not defined)."""
    if name in BUILTIN_POLICY:
        return BUILTIN_POLICY[name]
    for tool in (definition or {}).get("tools", []):
        if tool["name"] == name:
            return ToolPolicy(
                name=name,
                effect=tool["effect"],
                approval=tool["approval"],
                inline=tool["inline"],
                start_to_close_ms=tool["start_to_close_ms"],
                max_attempts=tool["max_attempts"],
            )
    return None


def policy_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """How the tool policies of normalised definition `new` differ from those of `old`
    (None: a new agent): one {"tool", "old", "new"} per tool whose policy changed, `old`
    or `new` None for a tool added or removed, in tool name order."""
    before = {t["name"]: _policy_fields(t) for t in (old or {}).get("tools", [])}
    after = {t["name"]: _policy_fields(t) for t in new.get("tools", [])}
    return [
        {"tool": name, "old": before.get(name), "new": after.get(name)}
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    ]


def lowered_approvals(changes: list[dict[str, Any]]) -> list[str]:
    """The tools that needed approval before `changes` (policy_changes) and no longer do,
    removed ones included: a removed tool added again later would otherwise come back
    without approval."""
    return [
        c["tool"]
        for c in changes
        if c["old"] is not None and c["old"]["approval"] and (c["new"] is None or not c["new"]["approval"])
    ]


def _policy_fields(tool: dict[str, Any]) -> dict[str, Any]:
    return {"effect": tool["effect"], "approval": tool["approval"], "inline": tool["inline"]}


def model_tools(definition: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The tool list a RunModel task carries: the agent's tools, then the built-ins."""
    return [*(definition or {}).get("tools", []), *BUILTIN_TOOLS]


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Rejected("invalid", f"{where} must be an object")
    return value


def _no_unknown_keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise Rejected("invalid", f"{where}: unknown field {unknown[0]!r}")


def _positive_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Rejected("invalid", f"{where} must be a positive integer")
    return value


def _duration_ms(value: Any, where: str) -> int | None:
    duration = _positive_int(value, where)
    if duration is not None and duration > MAX_DURATION_MS:
        raise Rejected("invalid", f"{where} must be at most {MAX_DURATION_MS} (ten years)")
    return duration
