"""The model interface a Worker calls, and ScriptedModel, a deterministic model for tests
and demos.

A model provider implements two coroutines:

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse
    async def summarize(self, history: list[dict], summary: str | None) -> str

`respond` gets the model-visible history (after the session's summary), the summary and
the tool list; it may stream text through `stream.send_text(...)` while it works (the
Worker relays those deltas to the server with heartbeats). Raising an exception (a 429 from
the model API, say) fails the attempt as retryable; the server decides whether to retry.
Raising `NonRetryableError` (a 400 or 401 from the model API) fails it with no retry.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

HistoryItem = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a model response. `id` may be None in a script: ScriptedModel
    then makes a deterministic one."""

    id: str | None
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """The assistant message: text and zero or more tool calls, with token usage."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Any, where: str = "response") -> ModelResponse:
        """A ModelResponse from itself or from a dict `{"content", "tool_calls", "usage"?}`;
        TypeError naming the bad field otherwise."""
        if isinstance(value, ModelResponse):
            value = {"content": value.content, "tool_calls": value.tool_calls, "usage": value.usage}
        if not isinstance(value, dict):
            raise TypeError(f"{where} must be a ModelResponse or a dict, got {type(value).__name__}")
        unknown = sorted(set(value) - {"content", "tool_calls", "usage"})
        if unknown:
            raise TypeError(f"{where}: unknown field {unknown[0]!r}")
        content = value.get("content", "")
        if not isinstance(content, str):
            raise TypeError(f"{where}.content must be a string")
        calls = value.get("tool_calls") or []
        if not isinstance(calls, (list, tuple)):
            raise TypeError(f"{where}.tool_calls must be a list")
        usage = value.get("usage") or {}
        if not isinstance(usage, dict):
            raise TypeError(f"{where}.usage must be a dict")
        return cls(content, [_coerce_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)], usage)

    def with_call_ids(self, prefix: str) -> ModelResponse:
        """Calls without an id get `{prefix}_{index}`: the same script position gives the
        same ids on every attempt, so a re-run RunModel answers the same calls."""
        calls = [
            call if call.id else ToolCall(f"{prefix}_{i}", call.name, call.arguments)
            for i, call in enumerate(self.tool_calls)
        ]
        return ModelResponse(self.content, calls, self.usage)

    def as_result(self) -> dict[str, Any]:
        """The RunModel result body (without inline tool results)."""
        return {
            "content": self.content,
            "tool_calls": [c.as_json() for c in self.tool_calls],
            "usage": dict(self.usage),
        }


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What RunModel gives the model: the history after the summary, the summary, and
    the tools (the agent's, then the server's built-ins ask_user and sleep)."""

    history: list[HistoryItem]
    summary: str | None
    tools: list[dict[str, Any]]


@runtime_checkable
class DeltaSink(Protocol):
    """Where a model streams live output; the Worker sends it with the next heartbeat."""

    def send_text(self, text: str) -> None: ...

    def send(self, delta: dict[str, Any]) -> None: ...


@runtime_checkable
class Model(Protocol):
    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse: ...

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str: ...


class ScriptExhausted(RuntimeError):
    """A ScriptedModel was asked for more responses than its script holds."""


ScriptFunction = Callable[[ModelRequest], Any]  # -> ModelResponse | dict (or an awaitable of one)
Summarizer = Callable[[list[HistoryItem], str | None], Any]  # -> str (or an awaitable of one)

# The default summary records how many model responses it covers, so a session's script
# position survives compaction (the summarised assistant items leave the history).
_RESPONSES_IN_SUMMARY = re.compile(r"model responses so far: (\d+)\)")


class ScriptedModel:
    """A model that answers from a script.

    `responses` is either a list (ModelResponse or dict) used in order, each session at
    its own position, or a function `(ModelRequest) -> ModelResponse | dict`. The position
    is derived from the request, never kept in memory, so it survives a Worker restart and
    a repeated attempt gets the same answer: the number of assistant items in the history,
    plus those a default summary says it covers.
    """

    def __init__(
        self,
        responses: Sequence[ModelResponse | dict[str, Any]] | ScriptFunction,
        *,
        summarizer: Summarizer | None = None,
        delta_delay_s: float = 0.0,
    ) -> None:
        if callable(responses):
            self._script: ScriptFunction | None = responses
            self._responses: list[ModelResponse] = []
        elif isinstance(responses, (list, tuple)):
            self._script = None
            self._responses = [ModelResponse.coerce(r, f"responses[{i}]") for i, r in enumerate(responses)]
        else:
            raise TypeError("responses must be a list of responses or a function of the request")
        if summarizer is not None and not callable(summarizer):
            raise TypeError("summarizer must be a function (history, summary) -> str")
        if not isinstance(delta_delay_s, (int, float)) or delta_delay_s < 0:
            raise ValueError("delta_delay_s must be a non-negative number")
        self._summarizer = summarizer
        self._delta_delay_s = float(delta_delay_s)

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        position = responses_so_far(request.history, request.summary)
        response = (await self._scripted(request, position)).with_call_ids(f"c{position}")
        pieces = _word_pieces(response.content)
        for piece in pieces:
            stream.send_text(piece)
            # Yield (or pause) between pieces so the deltas really are live, not one burst.
            await asyncio.sleep(self._delta_delay_s)
        usage = response.usage or {"input_items": len(request.history), "output_words": len(pieces)}
        return ModelResponse(response.content, response.tool_calls, usage)

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        if self._summarizer is not None:
            text = self._summarizer(history, summary)
            text = await text if inspect.isawaitable(text) else text
            if not isinstance(text, str):
                raise TypeError(f"summarizer must return a string, got {type(text).__name__}")
            return text
        covered = responses_so_far(history, summary)
        return f"summary of {len(history)} items (model responses so far: {covered})"

    async def _scripted(self, request: ModelRequest, position: int) -> ModelResponse:
        if self._script is not None:
            value = self._script(request)
            value = await value if inspect.isawaitable(value) else value
            return ModelResponse.coerce(value, "the script function's response")
        if position >= len(self._responses):
            raise ScriptExhausted(
                f"ScriptedModel has {len(self._responses)} responses; the session asks for response #{position + 1}"
            )
        return self._responses[position]


def responses_so_far(history: list[HistoryItem], summary: str | None) -> int:
    """How many model responses a session has had: assistant items in `history` plus the
    count a default ScriptedModel summary records (0 for any other summary)."""
    in_summary = 0
    if summary:
        match = _RESPONSES_IN_SUMMARY.search(summary)
        in_summary = int(match.group(1)) if match else 0
    return in_summary + sum(1 for item in history if isinstance(item, dict) and item.get("type") == "assistant")


def _word_pieces(text: str) -> list[str]:
    """`text` cut into word-sized pieces that join back to it exactly."""
    return re.findall(r"\S+\s*|\s+", text)


def _coerce_call(value: Any, where: str) -> ToolCall:
    if isinstance(value, ToolCall):
        call = value
    elif isinstance(value, dict):
        unknown = sorted(set(value) - {"id", "name", "arguments"})
        if unknown:
            raise TypeError(f"{where}: unknown field {unknown[0]!r}")
        arguments = value.get("arguments")
        call = ToolCall(value.get("id"), value.get("name"), {} if arguments is None else arguments)  # type: ignore[arg-type]
    else:
        raise TypeError(f"{where} must be a ToolCall or a dict, got {type(value).__name__}")
    if call.id is not None and (not isinstance(call.id, str) or not call.id):
        raise TypeError(f"{where}.id must be a non-empty string or None")
    if not isinstance(call.name, str) or not call.name:
        raise TypeError(f"{where}.name must be a non-empty string")
    if not isinstance(call.arguments, dict):
        raise TypeError(f"{where}.arguments must be a dict")
    return call
