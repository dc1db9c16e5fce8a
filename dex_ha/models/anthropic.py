"""AnthropicModel: a Worker model on Anthropic's Messages API, through the official
`anthropic` SDK (pip install -e '.[anthropic]').

    from dex_ha.models.anthropic import AnthropicModel

    agent = Agent("support", model=AnthropicModel("claude-sonnet-4-5", system="You help customers.",
                                                  max_tokens=2048))

`respond` turns the session's history, its summary and the tool list into one streamed
Messages request, relays text deltas as they arrive, and turns the message back into text,
tool calls and usage. `summarize` asks the same model for a summary (context compaction).

The SDK's own retries are off: the server decides retries (a model step gets up to 3
attempts within 30 minutes). A 429, 529, 5xx, timeout or connection error propagates as the
SDK's exception, so the attempt fails as retryable; 400, 401, 403, 404 and 413 raise
NonRetryableError with Anthropic's message, so the turn fails at once with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "AnthropicModel needs the anthropic package: pip install -e '.[anthropic]' in the dex-ha clone"
    ) from exc

from dex_ha.worker.context import NonRetryableError
from dex_ha.worker.model import DeltaSink, HistoryItem, ModelRequest, ModelResponse, ToolCall

DEFAULT_MAX_TOKENS = 4096
# Seconds the SDK waits for the API (for a stream: between two chunks; the API sends pings).
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SUMMARY_INSTRUCTIONS = (
    "You compact the history of a conversation between a user and an AI assistant that uses tools. "
    "Write a summary that lets the assistant go on without the original messages: the user's goals and "
    "requests, the decisions made, what each tool call did and its result (say which writes ran and which "
    "failed or have an unknown outcome), open questions, and anything the assistant promised. "
    "Answer with the summary only."
)
# Statuses where another attempt fails the same way: the turn fails at once.
NON_RETRYABLE_STATUSES = frozenset({400, 401, 403, 404, 413})
# The same, for an `error` event inside a stream (its HTTP status is 200).
NON_RETRYABLE_ERROR_TYPES = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "request_too_large"}
)
SUMMARY_HEADING = "Summary of the conversation so far:"
NOTE_PREFIX = "[note from the system] "
NO_RESULT = "no result was recorded for this tool call"
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")

Message = dict[str, Any]  # one Messages API message: {"role", "content": [blocks]}


class AnthropicModel:
    """A Worker model on the Anthropic Messages API (see the module doc).

    `model` is the model name; `system` the system prompt; `max_tokens` the most tokens of a
    response. Pass `client` (an `anthropic.AsyncAnthropic`), or `api_key` and `base_url`
    (default: the ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL environment variables). `timeout`
    (seconds, default 300) bounds each wait for the API.
    `summary_instructions` and `summary_max_tokens` shape the summary call.
    """

    def __init__(
        self,
        model: str,
        *,
        system: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        client: anthropic.AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        summary_instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
        summary_max_tokens: int | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string (the Anthropic model name)")
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a string or None, got {type(system).__name__}")
        _check_positive_int(max_tokens, "max_tokens")
        if summary_max_tokens is not None:
            _check_positive_int(summary_max_tokens, "summary_max_tokens")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if not isinstance(summary_instructions, str) or not summary_instructions.strip():
            raise ValueError("summary_instructions must be a non-empty string")
        self.model = model
        self.system = system
        self.max_tokens = max_tokens
        self.summary_instructions = summary_instructions
        self.summary_max_tokens = summary_max_tokens or max_tokens
        self.client = _make_client(client, api_key, base_url, timeout)

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        try:
            params: dict[str, Any] = {
                "messages": to_messages(request.history, request.summary),
                "max_tokens": self.max_tokens,
            }
            if request.tools:
                params["tools"] = to_tools(request.tools)
        except ValueError as exc:  # the same input would fail the same way on every attempt
            raise NonRetryableError(str(exc)) from exc
        if self.system:
            params["system"] = self.system
        return from_message(await self._stream(params, stream))

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        """One model call over a transcript of `history` (and the earlier summary). A
        transcript, not the messages themselves: the API refuses tool_use blocks in a
        request without the tool definitions, and compaction does not get those."""
        params = {
            "system": self.summary_instructions,
            "max_tokens": self.summary_max_tokens,
            "messages": [{"role": "user", "content": [_text(transcript(history, summary))]}],
        }
        response = from_message(await self._stream(params, None))
        if not response.content.strip():
            raise RuntimeError("the model returned an empty summary")
        return response.content

    async def _stream(self, params: dict[str, Any], sink: DeltaSink | None) -> Any:
        """One streamed Messages call; text deltas go to `sink` as they arrive. Returns the
        SDK's final Message. Streamed even without a sink: the SDK refuses long
        non-streamed calls, and a summary may be long."""
        try:
            async with self.client.messages.stream(model=self.model, **params) as events:
                async for event in events:
                    if sink is not None and event.type == "content_block_delta" and event.delta.type == "text_delta":
                        sink.send_text(event.delta.text)
                return await events.get_final_message()
        except anthropic.APIStatusError as exc:
            if not is_retryable(exc):
                raise NonRetryableError(describe_error(exc)) from exc
            raise

    def __repr__(self) -> str:
        return f"AnthropicModel({self.model!r}, max_tokens={self.max_tokens})"


def _make_client(
    client: Any, api_key: str | None, base_url: str | None, timeout: float | None
) -> anthropic.AsyncAnthropic:
    """The SDK client, with its own retries off (the server owns retries)."""
    if client is not None:
        if not isinstance(client, anthropic.AsyncAnthropic):
            raise TypeError(f"client must be an anthropic.AsyncAnthropic, got {type(client).__name__}")
        if api_key is not None or base_url is not None:
            raise ValueError("client: pass either client or api_key/base_url, not both")
        options: dict[str, Any] = {"max_retries": 0}
        if timeout is not None:
            options["timeout"] = timeout
        return client.with_options(**options)
    if api_key is None and not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        raise ValueError("api_key: pass api_key=, set ANTHROPIC_API_KEY, or pass a configured client=")
    return anthropic.AsyncAnthropic(
        api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout if timeout is not None else DEFAULT_TIMEOUT_S
    )


# ---------------------------------------------------------------- errors


def is_retryable(exc: anthropic.APIStatusError) -> bool:
    """False when another attempt would get the same answer (a bad request, bad
    credentials, no such model, too large). An `error` event inside a stream comes with
    status 200, so it is judged by its error type."""
    if exc.status_code in NON_RETRYABLE_STATUSES:
        return False
    if exc.status_code < 400:
        return _error_type(exc) not in NON_RETRYABLE_ERROR_TYPES
    return True


def describe_error(exc: anthropic.APIStatusError) -> str:
    """`anthropic 400 invalid_request_error: <Anthropic's message> (request req_...)`."""
    message = _error_field(exc, "message") or str(exc)
    kind = _error_type(exc)
    request_id = getattr(exc, "request_id", None)
    return (
        f"anthropic {exc.status_code}{' ' + kind if kind else ''}: {message}"
        f"{f' (request {request_id})' if request_id else ''}"
    )


def _error_type(exc: anthropic.APIStatusError) -> str | None:
    return _error_field(exc, "type")


def _error_field(exc: anthropic.APIStatusError, name: str) -> str | None:
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    value = error.get(name) if isinstance(error, dict) else None
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------- request mapping


def to_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic tool definitions: name, description, input_schema (an object schema). The
    policy fields of dex-ha (effect, approval, ...) stay out."""
    result = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ValueError(f"request.tools[{i}] must be a dict with a name")
        entry: dict[str, Any] = {"name": tool["name"], "input_schema": tool.get("input_schema") or EMPTY_SCHEMA}
        if tool.get("description"):
            entry["description"] = tool["description"]
        result.append(entry)
    return result


def to_messages(history: Sequence[HistoryItem], summary: str | None) -> list[Message]:
    """The Messages API `messages` for a session's history (after its summary).

    The API wants roles that alternate, user first, and every assistant message with
    tool_use blocks followed by one user message that starts with a tool_result for each
    of them. So: the results of a response are placed right after it (in the order of its
    calls, a made-up error result for a call that has none); a result whose call is not in
    the history (summarised away) becomes plain text; the summary, notes and user messages
    are user-side text; consecutive messages of one role are merged.
    """
    results = {item.get("call_id"): item for item in history if _is(item, "tool_result")}
    placed: set[str] = set()
    messages: list[Message] = []
    if summary:
        _append(messages, "user", [_text(f"{SUMMARY_HEADING}\n{summary}")])
    for index, item in enumerate(history):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "user":
            _append(messages, "user", _texts(_string(item.get("text"))))
        elif kind == "note":
            _append(messages, "user", _texts(NOTE_PREFIX + _string(item.get("text"))))
        elif kind == "assistant":
            blocks, ids = _assistant_blocks(item, index)
            _append(messages, "assistant", blocks)
            if ids:  # the results come next, whatever stands between them in the history
                _append(messages, "user", [_result_block(call_id, results.get(call_id)) for call_id in ids])
                placed.update(ids)
        elif kind == "tool_result":
            if item.get("call_id") not in placed:
                _append(messages, "user", [_text(_orphan_result_text(item))])
        else:
            raise ValueError(f"request.history[{index}] has an unknown type {kind!r}")
    if not messages:
        raise ValueError("request: the history and the summary are both empty; there is nothing to answer")
    if messages[0]["role"] != "user":  # the summary was empty and the history starts mid-way
        messages.insert(0, {"role": "user", "content": [_text("(earlier messages are not shown)")]})
    return messages


def _append(messages: list[Message], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add blocks as a message of `role`, merged into the last message if it has that role.
    A merge never puts text before a tool_result: results open the user message that
    follows their assistant message, and anything merged comes after them."""
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def _assistant_blocks(item: HistoryItem, index: int) -> tuple[list[dict[str, Any]], list[str]]:
    blocks = _texts(_string(item.get("content")))
    ids: list[str] = []
    for j, call in enumerate(item.get("tool_calls") or []):
        if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not isinstance(call.get("name"), str):
            raise ValueError(f"request.history[{index}].tool_calls[{j}] needs a string id and name")
        arguments = call.get("arguments")
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["name"],
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
        ids.append(call["id"])
    return blocks, ids


def _result_block(call_id: str, item: HistoryItem | None) -> dict[str, Any]:
    if item is None:
        return {"type": "tool_result", "tool_use_id": call_id, "content": NO_RESULT, "is_error": True}
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": _result_text(item)}
    if item.get("status") != "succeeded":
        block["is_error"] = True
    return block


def _result_text(item: HistoryItem) -> str:
    """A succeeded call's output (a string as is, anything else as JSON); otherwise the
    status and the error, so the model tells `failed` from `outcome_unknown`."""
    if item.get("status") == "succeeded":
        output = item.get("output")
        return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return f"{item.get('status')}: {item.get('error')}"


def _orphan_result_text(item: HistoryItem) -> str:
    return f"[result of an earlier call of tool {item.get('name')!r}] {_result_text(item)}"


def _is(item: Any, kind: str) -> bool:
    return isinstance(item, dict) and item.get("type") == kind


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else json.dumps(value, ensure_ascii=False))


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def _texts(value: str) -> list[dict[str, Any]]:
    """A text block, or none for blank text (the API refuses empty text blocks)."""
    return [_text(value)] if value.strip() else []


def transcript(history: Sequence[HistoryItem], summary: str | None) -> str:
    """The history as plain text, for the summary call."""
    lines = [f"{SUMMARY_HEADING}\n{summary}\n"] if summary else []
    for item in history:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "user":
            lines.append(f"User: {_string(item.get('text'))}")
        elif kind == "note":
            lines.append(f"Note: {_string(item.get('text'))}")
        elif kind == "assistant":
            if _string(item.get("content")).strip():
                lines.append(f"Assistant: {_string(item.get('content'))}")
            for call in item.get("tool_calls") or []:
                lines.append(
                    f"Assistant called tool {call.get('name')} (call {call.get('id')}) with "
                    f"{json.dumps(call.get('arguments'), ensure_ascii=False)}"
                )
        elif kind == "tool_result":
            lines.append(f"Result of call {item.get('call_id')} ({item.get('name')}): {_result_text(item)}")
    lines.append("\nWrite the summary of the conversation above.")
    return "\n".join(lines)


# ---------------------------------------------------------------- response mapping


def from_message(message: Any) -> ModelResponse:
    """Text (the text blocks joined), tool calls (tool_use id, name, input) and usage of an
    SDK Message. Other block types (thinking, server tools) are not part of the result."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(ToolCall(block.id, block.name, dict(block.input or {})))
    usage = {key: getattr(message.usage, key, None) for key in USAGE_KEYS}
    return ModelResponse("".join(texts), calls, {k: v for k, v in usage.items() if isinstance(v, int)})


def _check_positive_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
