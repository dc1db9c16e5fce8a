"""OpenAIModel: a Worker model on the official `openai` SDK (pip install -e '.[openai]').

    from dex_ha.models.openai import OpenAIModel

    agent = Agent("support", model=OpenAIModel("gpt-4.1", instructions="You help customers."))

It speaks either the Responses API (the default) or Chat Completions, streaming text to
the session's clients as it arrives. Every call sends the whole input: the session history
kept by dex-ha is the source of truth, so nothing is stored at OpenAI (`store=False` on the
Responses API) and no `previous_response_id` is used; a retried attempt sends the same input.

The SDK's own retries are off: a failed call fails the attempt, and the server decides
whether to run another (a model step has up to 3 attempts within 30 minutes). Answers that
another attempt would get again (400, 401, 403, 404, 422) raise NonRetryableError, so the
turn fails at once with OpenAI's message.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

try:
    import openai
    from openai import AsyncOpenAI
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "dex_ha.models.openai needs the openai package: pip install -e '.[openai]' in the dex-ha clone"
    ) from exc

from dex_ha.worker.context import NonRetryableError
from dex_ha.worker.model import DeltaSink, HistoryItem, ModelRequest, ModelResponse, ToolCall

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

log = logging.getLogger("dex_ha.models.openai")

APIS = ("responses", "chat")
NOTE_ROLES = ("developer", "system", "user")
# HTTP statuses that another attempt with the same input would get again.
NON_RETRYABLE_STATUSES = frozenset({400, 401, 403, 404, 422})
# Request parameters OpenAIModel sets itself; `request_options` may not override them.
RESERVED_OPTIONS = frozenset(
    {
        "model",
        "input",
        "messages",
        "instructions",
        "tools",
        "stream",
        "stream_options",
        "store",
        "timeout",
        "max_output_tokens",
        "max_completion_tokens",
    }
)
# A tool without an input schema takes no arguments.
EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
MISSING_RESULT = "No result is recorded for this call."
DEFAULT_SUMMARY_INSTRUCTIONS = (
    "You compress a conversation between a user and an AI assistant that uses tools, so that the "
    "assistant can go on without the full text. Write a concise summary that keeps every fact, "
    "decision, commitment, open question and tool result that may matter later, including ids, "
    "names, numbers and which tool calls already ran (they must not be repeated). Answer with the "
    "summary only."
)


class OpenAIStreamError(Exception):
    """The stream reported a failure (an `error` event, a failed response) or ended before
    the response was complete. Retryable: another attempt may well succeed."""


class OpenAIModel:
    """A model for `dex_ha.worker.Agent` on OpenAI's API (see the module doc).

    `model`: the model name ("gpt-4.1", ...). `api`: "responses" (default) or "chat".
    `instructions`: the system prompt. `client`: an AsyncOpenAI to use (its retries are
    turned off); otherwise one is made from `api_key` / `base_url`, or the environment
    variables OPENAI_API_KEY / OPENAI_BASE_URL. `max_output_tokens`: a cap on each answer.
    `timeout_s`: the request timeout (with streaming, also the longest silence between two
    events). `summary_instructions`: the prompt of the compaction call. `note_role`: the
    role of the session's notes and summary in the input ("developer"; "system" or "user"
    for OpenAI-compatible servers without a developer role). `request_options`: further
    parameters of every request, by the SDK's names (temperature, reasoning, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        api: str = "responses",
        instructions: str | None = None,
        client: AsyncOpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_output_tokens: int | None = None,
        timeout_s: float | None = None,
        summary_instructions: str | None = None,
        note_role: str = "developer",
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}; got {api!r}")
        _check_optional_str(instructions, "instructions")
        _check_optional_str(summary_instructions, "summary_instructions")
        if note_role not in NOTE_ROLES:
            raise ValueError(f"note_role must be one of {', '.join(NOTE_ROLES)}; got {note_role!r}")
        if max_output_tokens is not None and (
            not isinstance(max_output_tokens, int) or isinstance(max_output_tokens, bool) or max_output_tokens < 1
        ):
            raise ValueError(f"max_output_tokens must be a positive integer or None, got {max_output_tokens!r}")
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0
        ):
            raise ValueError(f"timeout_s must be a positive number or None, got {timeout_s!r}")
        self.model = model
        self.api = api
        self.instructions = instructions
        self.summary_instructions = summary_instructions or DEFAULT_SUMMARY_INSTRUCTIONS
        self.note_role = note_role
        self.max_output_tokens = max_output_tokens
        self.timeout_s = timeout_s
        self._client = _client_without_retries(client, api_key, base_url)
        self._owns_client = client is None
        self.request_options = _check_request_options(request_options, self._create_function())
        warm_up_parsers(api)

    # ------------------------------------------------------------ the model protocol

    async def respond(self, request: ModelRequest, stream: DeltaSink) -> ModelResponse:
        """One model call: the history, summary and tools in, streamed text out as it
        arrives, the whole answer (text, tool calls, usage) returned."""
        entries = model_order(request.history)
        try:
            if self.api == "responses":
                return await self._stream_response(entries, request, stream)
            return await self._stream_chat(entries, request, stream)
        except openai.APIStatusError as exc:
            raise _mapped_error(exc) from exc

    async def summarize(self, history: list[HistoryItem], summary: str | None) -> str:
        """A summary of `history` (and of the earlier `summary` it continues), for compaction."""
        text = transcript(history, summary)
        try:
            if self.api == "responses":
                # Typed by hand: with the options passed as **kwargs, the SDK's overloads
                # (streamed or not) cannot pick one.
                response: Response = await self._client.responses.create(
                    **self._common_options(),
                    instructions=self.summary_instructions,
                    input=[{"role": "user", "content": text}],
                    store=False,
                )
                return response.output_text
            completion: ChatCompletion = await self._client.chat.completions.create(
                **self._common_options(),
                messages=[{"role": "system", "content": self.summary_instructions}, {"role": "user", "content": text}],
            )
            return (completion.choices[0].message.content or "") if completion.choices else ""
        except openai.APIStatusError as exc:
            raise _mapped_error(exc) from exc

    async def aclose(self) -> None:
        """Close the HTTP client this model made (a client passed in is the caller's)."""
        if self._owns_client:
            await self._client.close()

    # ------------------------------------------------------------ the Responses API

    async def _stream_response(
        self, entries: list[dict[str, Any]], request: ModelRequest, stream: DeltaSink
    ) -> ModelResponse:
        options: dict[str, Any] = {
            "input": responses_input(entries, request.summary, self.note_role),
            "store": False,
            "stream": True,
        }
        if self.instructions:
            options["instructions"] = self.instructions
        if request.tools:
            options["tools"] = responses_tools(request.tools)
        async with await self._client.responses.create(**self._common_options(), **options) as events:
            return from_response(await read_response_stream(events, stream))

    # ------------------------------------------------------------ Chat Completions

    async def _stream_chat(
        self, entries: list[dict[str, Any]], request: ModelRequest, stream: DeltaSink
    ) -> ModelResponse:
        options: dict[str, Any] = {
            "messages": chat_messages(entries, request.summary, self.instructions, self.note_role),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            options["tools"] = chat_tools(request.tools)
        answer = ChatAnswer()
        async with await self._client.chat.completions.create(**self._common_options(), **options) as chunks:
            async for chunk in chunks:
                text = answer.add(chunk)
                if text:
                    stream.send_text(text)
        return answer.response()

    # ------------------------------------------------------------ helpers

    def _common_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"model": self.model, **self.request_options}
        if self.max_output_tokens is not None:
            key = "max_output_tokens" if self.api == "responses" else "max_completion_tokens"
            options[key] = self.max_output_tokens
        if self.timeout_s is not None:
            options["timeout"] = self.timeout_s
        return options

    def _create_function(self) -> Any:
        return self._client.responses.create if self.api == "responses" else self._client.chat.completions.create

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, api={self.api!r})"


# ---------------------------------------------------------------- history → model order


def model_order(history: list[HistoryItem]) -> list[dict[str, Any]]:
    """The history as the model must see it: every assistant message directly followed by
    the results of its calls, in the order of the calls.

    Model APIs refuse an input in which anything stands between a tool call and its
    result, or a call without a result, or a result without its call. So each assistant
    entry carries its calls with their results (a call with none gets MISSING_RESULT); a
    note or message that came between them comes after; a result whose call is not in the
    history becomes a note. Entries: {"type": "user"|"note", "text"} and
    {"type": "assistant", "content", "calls": [{"id", "name", "arguments", "output"}]}.
    """
    results = {
        item.get("call_id"): item for item in history if isinstance(item, dict) and item.get("type") == "tool_result"
    }
    answered: set[str] = set()
    entries: list[dict[str, Any]] = []
    for item in history:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "user":
            entries.append({"type": "user", "text": _text(item.get("text"))})
        elif kind == "assistant":
            calls = []
            for call in item.get("tool_calls") or []:
                result = results.get(call.get("id"))
                if result is not None:
                    answered.add(call["id"])
                calls.append(
                    {
                        "id": call.get("id"),
                        "name": call.get("name"),
                        "arguments": call.get("arguments") or {},
                        "output": MISSING_RESULT if result is None else result_text(result),
                    }
                )
            entries.append({"type": "assistant", "content": _text(item.get("content")), "calls": calls})
        elif kind == "tool_result":
            if item.get("call_id") not in answered:
                entries.append(
                    {
                        "type": "note",
                        "text": f"The result of an earlier call of {item.get('name')} "
                        f"(call {item.get('call_id')}): {result_text(item)}",
                    }
                )
        elif kind == "note":
            entries.append({"type": "note", "text": _text(item.get("text"))})
        else:  # an item type this version does not know: show it rather than lose it
            entries.append({"type": "note", "text": json.dumps(item, ensure_ascii=False, default=str)})
    return entries


def result_text(result: HistoryItem) -> str:
    """What the model reads as a call's output: the tool's output (a string as is, anything
    else as JSON), or its status and error when it did not succeed."""
    if result.get("status") == "succeeded":
        output = result.get("output")
        return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
    return json.dumps({"status": result.get("status"), "error": result.get("error")}, ensure_ascii=False)


def transcript(history: list[HistoryItem], summary: str | None) -> str:
    """The history (and the summary before it) as plain text, for the summary call: as text
    the model cannot mistake it for a conversation to carry on, nor call its tools."""
    lines = [f"Summary of the conversation before this part:\n{summary}\n"] if summary else []
    for entry in model_order(history):
        if entry["type"] == "user":
            lines.append(f"User: {entry['text']}")
        elif entry["type"] == "note":
            lines.append(f"Note: {entry['text']}")
        else:
            if entry["content"]:
                lines.append(f"Assistant: {entry['content']}")
            for call in entry["calls"]:
                lines.append(
                    f"Assistant called {call['name']} (call {call['id']}) with "
                    f"{json.dumps(call['arguments'], ensure_ascii=False, default=str)}"
                )
                lines.append(f"Result of call {call['id']}: {call['output']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the Responses API


def responses_input(entries: list[dict[str, Any]], summary: str | None, note_role: str) -> list[dict[str, Any]]:
    """Input items of the Responses API: messages, and function_call / function_call_output
    pairs joined by call_id."""
    items: list[dict[str, Any]] = []
    if summary:
        items.append({"type": "message", "role": note_role, "content": _summary_text(summary)})
    for entry in entries:
        if entry["type"] == "user":
            items.append({"type": "message", "role": "user", "content": entry["text"]})
        elif entry["type"] == "note":
            items.append({"type": "message", "role": note_role, "content": entry["text"]})
        else:
            if entry["content"]:
                items.append({"type": "message", "role": "assistant", "content": entry["content"]})
            items += [
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                }
                for call in entry["calls"]
            ]
            items += [
                {"type": "function_call_output", "call_id": call["id"], "output": call["output"]}
                for call in entry["calls"]
            ]
    return items


def responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function tools of the Responses API. `strict` is off: a strict schema must list
    every property as required, which an agent's optional arguments are not."""
    return [
        {
            "type": "function",
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("input_schema") or EMPTY_OBJECT_SCHEMA,
            "strict": False,
        }
        for tool in tools
    ]


def from_response(response: Any) -> ModelResponse:
    """A ModelResponse from a Responses API `Response`: its text, its function calls
    (call_id is the id the history keeps), its usage."""
    texts, calls = [], []
    for item in response.output:
        if item.type == "message":
            texts += [
                part.text if part.type == "output_text" else part.refusal
                for part in item.content
                if part.type in ("output_text", "refusal")
            ]
        elif item.type == "function_call":
            calls.append(
                ToolCall(
                    item.call_id,
                    item.name,
                    parse_arguments(item.arguments, item.name, cut=response.status == "incomplete"),
                )
            )
    usage = response.usage
    return ModelResponse("".join(texts), calls, _usage(usage.input_tokens, usage.output_tokens) if usage else {})


# ---------------------------------------------------------------- Chat Completions


def chat_messages(
    entries: list[dict[str, Any]], summary: str | None, instructions: str | None, note_role: str
) -> list[dict[str, Any]]:
    """Chat messages: the instructions as the system message, then the conversation, each
    assistant message with tool_calls followed by one `tool` message per call."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    if summary:
        messages.append({"role": note_role, "content": _summary_text(summary)})
    for entry in entries:
        if entry["type"] == "user":
            messages.append({"role": "user", "content": entry["text"]})
        elif entry["type"] == "note":
            messages.append({"role": note_role, "content": entry["text"]})
        elif entry["calls"] or entry["content"]:
            message: dict[str, Any] = {"role": "assistant", "content": entry["content"] or None}
            if entry["calls"]:
                message["tool_calls"] = [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                        },
                    }
                    for call in entry["calls"]
                ]
            messages.append(message)
            messages += [
                {"role": "tool", "tool_call_id": call["id"], "content": call["output"]} for call in entry["calls"]
            ]
    return messages


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description") or "",
                "parameters": tool.get("input_schema") or EMPTY_OBJECT_SCHEMA,
            },
        }
        for tool in tools
    ]


class ChatAnswer:
    """A streamed chat completion put together chunk by chunk: the content, each tool call
    (its id and name come first, its arguments in fragments), the finish reason, the usage."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}  # by the call's index in the message
        self.finish_reason: str | None = None
        self.usage: Any = None

    def add(self, chunk: Any) -> str:
        """Take one chunk in; returns its new text (to stream on)."""
        if chunk.usage is not None:
            self.usage = chunk.usage
        new_text = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # one answer is asked for (n=1); ignore any other
            delta = choice.delta
            new_text += (delta.content or "") + (delta.refusal or "")
            for fragment in delta.tool_calls or []:
                call = self.calls.setdefault(fragment.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = fragment.id or call["id"]
                if fragment.function is not None:
                    call["name"] += fragment.function.name or ""
                    call["arguments"] += fragment.function.arguments or ""
            self.finish_reason = choice.finish_reason or self.finish_reason
        self.text.append(new_text)
        return new_text

    def response(self) -> ModelResponse:
        if self.finish_reason is None:
            raise OpenAIStreamError("the stream ended before the completion was finished")
        cut = self.finish_reason == "length"
        calls = [
            ToolCall(call["id"] or None, call["name"], parse_arguments(call["arguments"], call["name"], cut=cut))
            for _, call in sorted(self.calls.items())
        ]
        usage = _usage(self.usage.prompt_tokens, self.usage.completion_tokens) if self.usage is not None else {}
        return ModelResponse("".join(self.text), calls, usage)


# ---------------------------------------------------------------- warming the SDK up

_SAMPLE_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}
_SAMPLE_RESPONSE = {
    "id": "resp_0",
    "object": "response",
    "created_at": 0,
    "status": "completed",
    "model": "",
    "usage": _SAMPLE_USAGE,
    "output": [
        {
            "id": "msg_0",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        },
        {"id": "fc_0", "type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
    ],
}
_SAMPLE_CALL = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_SAMPLE_CHAT_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def warm_up_parsers(api: str) -> None:
    """Build the SDK's parsers of the answers `api` gives, now.

    The SDK builds them (pydantic schemas of some hundred event and item types) the first
    time it parses an answer: seconds of CPU on a busy machine, in the middle of the first
    model call, during which the Worker's event loop sends no heartbeat for any task (a
    short heartbeat timeout then fails the attempt). At construction, before the Worker
    runs, the cost is paid once where it harms nothing. It uses an internal function of the
    SDK, so a failure only logs: the SDK then builds them on first use, as it would anyway.
    """
    try:
        from openai._models import construct_type

        if api == "responses":
            from openai.types.responses import Response, ResponseStreamEvent

            construct_type(type_=Response, value=_SAMPLE_RESPONSE)
            for event in (
                {
                    "type": "response.output_text.delta",
                    "delta": "",
                    "item_id": "msg_0",
                    "output_index": 0,
                    "content_index": 0,
                    "sequence_number": 0,
                    "logprobs": [],
                },
                {"type": "response.completed", "response": _SAMPLE_RESPONSE, "sequence_number": 1},
            ):
                construct_type(type_=ResponseStreamEvent, value=event)
        else:
            from openai.types.chat import ChatCompletion, ChatCompletionChunk

            construct_type(
                type_=ChatCompletionChunk,
                value={
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "",
                    "usage": _SAMPLE_CHAT_USAGE,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": None,
                            "delta": {"content": "", "tool_calls": [{"index": 0, **_SAMPLE_CALL}]},
                        }
                    ],
                },
            )
            construct_type(
                type_=ChatCompletion,
                value={
                    "id": "c",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "",
                    "usage": _SAMPLE_CHAT_USAGE,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "", "tool_calls": [_SAMPLE_CALL]},
                        }
                    ],
                },
            )
    except Exception as exc:  # an SDK version without that function: no harm, only no head start
        log.debug("could not build the openai SDK's parsers ahead of time: %s", exc)


# ---------------------------------------------------------------- shared helpers


async def read_response_stream(events: Any, stream: DeltaSink) -> Any:
    """The final Response of a streamed Responses API call (an async iterable of its
    events); its text deltas go to `stream` as they arrive. A failed or unfinished
    response raises OpenAIStreamError (retryable)."""
    final = None
    async for event in events:
        if event.type == "response.output_text.delta":
            stream.send_text(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
        elif event.type == "response.failed":
            error = event.response.error
            raise OpenAIStreamError(f"the response failed: {error.message if error else 'no reason given'}")
        elif event.type == "error":
            raise OpenAIStreamError(f"the stream reported an error ({event.code}): {event.message}")
    if final is None:
        raise OpenAIStreamError("the stream ended before the response was complete")
    return final


def parse_arguments(arguments: str, name: str, *, cut: bool = False) -> dict[str, Any]:
    """A call's arguments (JSON text) as a dict. Not a JSON object: the attempt fails, as
    retryable (a model may do better next time) unless the output was `cut` at the token
    limit, which the same request would hit again."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    if cut:
        raise NonRetryableError(
            f"the answer reached the output token limit in the middle of a call of {name!r}; raise max_output_tokens"
        )
    raise OpenAIStreamError(f"the model called {name!r} with arguments that are not a JSON object: {arguments[:200]!r}")


def _usage(input_tokens: int | None, output_tokens: int | None) -> dict[str, Any]:
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    if input_tokens is not None and output_tokens is not None:
        usage["total_tokens"] = input_tokens + output_tokens
    return usage


def _summary_text(summary: str) -> str:
    return f"Summary of the conversation before the messages below:\n{summary}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value, ensure_ascii=False)


def _mapped_error(exc: openai.APIStatusError) -> Exception:
    """An error answer of the API: NonRetryableError with OpenAI's message when another
    attempt would get the same answer; the SDK's own error (retryable) otherwise."""
    if exc.status_code not in NON_RETRYABLE_STATUSES:
        return exc
    body = exc.body if isinstance(exc.body, dict) else {}
    message = body.get("message") if isinstance(body.get("message"), str) else exc.message
    code = body.get("code") or body.get("type")
    return NonRetryableError(f"OpenAI API error {exc.status_code}{f' ({code})' if code else ''}: {message}")


def _client_without_retries(client: AsyncOpenAI | None, api_key: str | None, base_url: str | None) -> AsyncOpenAI:
    """The client with the SDK's retries off: the dex-ha server owns retries, and an SDK
    retrying inside one attempt would hide failures from it and stretch the attempt."""
    if client is not None:
        if not isinstance(client, AsyncOpenAI):
            raise TypeError(f"client must be an openai.AsyncOpenAI, got {type(client).__name__}")
        if api_key is not None or base_url is not None:
            raise ValueError("client: give either a client or api_key/base_url, not both")
        return client.with_options(max_retries=0)
    _check_optional_str(api_key, "api_key")
    _check_optional_str(base_url, "base_url")
    if not (api_key or os.environ.get("OPENAI_API_KEY")):
        raise ValueError("api_key: none given and OPENAI_API_KEY is not set")
    return AsyncOpenAI(
        api_key=api_key or os.environ["OPENAI_API_KEY"],
        base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
        max_retries=0,
    )


def _check_request_options(options: Mapping[str, Any] | None, create: Any) -> dict[str, Any]:
    """Extra request parameters, checked now against the SDK's own parameter names, so a
    typo fails at start and not at every model call."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"request_options must be a dict, got {type(options).__name__}")
    known = set(inspect.signature(create).parameters)
    for key in options:
        if key in RESERVED_OPTIONS:
            raise ValueError(f"request_options: {key!r} is set by OpenAIModel (use its own argument, if any)")
        if key not in known:
            raise ValueError(f"request_options: {key!r} is not a parameter of this API's create()")
    return dict(options)


def _check_optional_str(value: Any, argument: str) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{argument} must be a string or None, got {type(value).__name__}")
