"""The OpenAI face of the fake model server, for tests of anything built on the `openai` SDK.

It speaks the real wire format of the two endpoints agents use, streamed (server-sent
events, the exact event sequence the SDK parses) and not:

    POST /v1/responses           the Responses API
    POST /v1/chat/completions    Chat Completions

Replies are scripted per request, from a queue or from a function of the request; every
request is recorded. Nothing reaches the internet.

    async with FakeOpenAI() as fake:
        fake.queue(Reply("Hello there"),                                   # text, streamed word by word
                   Reply(tool_calls=[Call("lookup", {"q": "A17"})]),       # a function call
                   Failure(429, "Rate limit reached", retry_after=1),      # an error answer
                   Reply("cut off here and", stall_after=2),               # 2 deltas, then silence
                   Reply("half an answer", error_after=1))                 # 1 delta, then a stream error
        fake.script = lambda request: Reply(f"you said {request.body['input'][-1]['content']}")
        client = AsyncOpenAI(api_key="test", base_url=fake.base_url, max_retries=0)
        ...
        fake.requests[0].body        # the JSON body the SDK sent
        await fake.wait_stalled()    # a stalled stream has sent its deltas and hangs now

Queued replies are used first, in order, whatever the endpoint; then `script` (a function
`(RecordedRequest) -> Reply | Failure`); with neither, the request gets a 400 whose message
says that nothing was scripted, so a test fails with a clear reason instead of a hang.

A `Reply` becomes whichever format the endpoint and `stream` flag of the request ask for:
the same script serves the Responses API and Chat Completions, streamed or not. A stalled
stream stays open until the Worker holding it dies (its socket closes) or the fake stops.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness.fake_models.server import FakeModelServer, RecordedRequest, SseEvent, StreamPlan, halves, words

__all__ = ["CHAT_PATH", "RESPONSES_PATH", "Call", "Failure", "FakeOpenAI", "RecordedRequest", "Reply"]

RESPONSES_PATH = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Call:
    """One function call of a scripted reply; `call_id` is made up when not given."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)  # a str is sent as is (bad JSON, say)
    call_id: str | None = None

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """A model answer: text (a str is streamed word by word, a list of str is the exact
    deltas), function calls, token usage (made up when not given).

    `stall_after=N` (streaming only): send the first N text deltas, then nothing more and
    keep the connection open, as a model API that hangs mid-stream.
    `error_after=N` (streaming only): send the first N text deltas, then the API's
    mid-stream error (`error_message`) and end the stream: an `error` event on the
    Responses API, a chunk `{"error": {...}}` on Chat Completions.
    `delta_delay_s`: pause between streamed events, so that deltas arrive one by one.
    `incomplete=True`: the output was cut at the token limit (the Responses API answers
    status "incomplete" with reason max_output_tokens; Chat, finish_reason "length").
    """

    text: str | list[str] = ""
    tool_calls: list[Call] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    stall_after: int | None = None
    error_after: int | None = None
    error_message: str = "The server had an error while processing your request."
    delta_delay_s: float = 0.0
    incomplete: bool = False

    def deltas(self) -> list[str]:
        return list(self.text) if isinstance(self.text, list) else words(self.text)

    def full_text(self) -> str:
        return "".join(self.deltas())


# Default error `type` and `code` of OpenAI's error JSON, by HTTP status.
_ERROR_KINDS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


@dataclass(frozen=True)
class Failure:
    """An error answer: `status` with OpenAI's error JSON
    `{"error": {"message", "type", "param", "code"}}`, and `Retry-After` when given."""

    status: int
    message: str
    type: str | None = None
    code: str | None = None
    param: str | None = None
    retry_after: float | None = None

    def body(self) -> dict[str, Any]:
        kind, code = _ERROR_KINDS.get(self.status, ("api_error", None))
        return {
            "error": {
                "message": self.message,
                "type": self.type or kind,
                "param": self.param,
                "code": self.code if self.code is not None else code,
            }
        }

    def response(self) -> web.Response:
        headers = {"Retry-After": f"{self.retry_after:g}"} if self.retry_after is not None else None
        return web.json_response(self.body(), status=self.status, headers=headers)


Answer = Reply | Failure
Script = Callable[[RecordedRequest], Answer]


class FakeOpenAI(FakeModelServer[Answer]):
    """The OpenAI face (see the module doc). `base_url` ends in /v1, as the SDK expects."""

    def __init__(self, script: Script | None = None) -> None:
        super().__init__()
        self.script = script

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(RESPONSES_PATH, self._handle)
        app.router.add_post(CHAT_PATH, self._handle)

    def answer_types(self) -> tuple[type, ...]:
        return (Reply, Failure)

    def unscripted(self, request: RecordedRequest) -> Answer | None:
        return None if self.script is None else self.script(request)

    def nothing_scripted(self, request: RecordedRequest) -> Answer:
        return Failure(
            400, f"the fake OpenAI server has no reply scripted for request #{len(self.requests)} ({request.path})"
        )

    # ------------------------------------------------------------ HTTP

    async def _handle(self, http_request: web.Request) -> web.StreamResponse:
        request = await self.record(http_request)
        body = request.body
        if not isinstance(body, dict):
            return Failure(400, "We could not parse the JSON body of your request.").response()
        answer = await self.next_answer(request)
        if isinstance(answer, Failure):
            return answer.response()
        responses_api = request.path == RESPONSES_PATH
        if not request.stream:
            document = (
                self._response_object(body, answer, "completed")
                if responses_api
                else self._chat_completion(body, answer)
            )
            return web.json_response(document)
        events = self._response_events(body, answer) if responses_api else self._chat_chunks(body, answer)
        error = Failure(500, answer.error_message, code="server_error").body()
        # The Responses API's `error` event has the fields of the error object, its own type.
        error_event = (
            SseEvent("error", {**error["error"], "type": "error", "sequence_number": len(events)})
            if responses_api
            else SseEvent(None, error)
        )
        plan = StreamPlan(answer.stall_after, answer.error_after, error_event, answer.delta_delay_s)
        return await self.stream(http_request, events, plan, {"Content-Type": "text/event-stream; charset=utf-8"})

    # ------------------------------------------------------------ the Responses API

    def _response_object(
        self, body: dict[str, Any], reply: Reply, status: str, output: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """A Response object; `output` defaults to the reply's whole output."""
        done = status != "in_progress"
        if done:
            status = "incomplete" if reply.incomplete else status
        return {
            "id": self.make_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if done and reply.incomplete else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model", ""),
            "output": self._output_items(reply) if output is None else output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True),
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": body.get("tools", []),
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": self._usage(body, reply, responses_api=True) if done else None,
            "user": None,
            "metadata": {},
        }

    def _output_items(self, reply: Reply) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if reply.full_text() or not reply.tool_calls:
            items.append(_message_item(self.make_id("msg"), reply.full_text(), "completed"))
        for call in reply.tool_calls:
            items.append(
                _function_call_item(
                    self.make_id("fc"), self._call_id(call), call.name, call.arguments_json(), "completed"
                )
            )
        return items

    def _response_events(self, body: dict[str, Any], reply: Reply) -> list[SseEvent]:
        """The event sequence of a streamed response: created, in_progress, each output
        item (added, its parts and deltas, done), completed."""
        final = self._response_object(body, reply, "completed")
        started = {**final, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        events: list[tuple[str, dict[str, Any], bool]] = [
            ("response.created", {"response": started}, False),
            ("response.in_progress", {"response": started}, False),
        ]
        for index, item in enumerate(final["output"]):
            if item["type"] == "message":
                events += _message_events(item, index, reply.deltas())
            else:
                events += _function_call_events(item, index)
        events.append(
            (
                "response.completed" if final["status"] == "completed" else "response.incomplete",
                {"response": final},
                False,
            )
        )
        return [
            SseEvent(name, {"type": name, "sequence_number": n, **data}, is_delta)
            for n, (name, data, is_delta) in enumerate(events)
        ]

    # ------------------------------------------------------------ Chat Completions

    def _chat_completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.full_text() or None, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self._call_id(c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json()},
                }
                for c in reply.tool_calls
            ]
        return {
            "id": self.make_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}],
            "usage": self._usage(body, reply, responses_api=False),
        }

    def _chat_chunks(self, body: dict[str, Any], reply: Reply) -> list[SseEvent]:
        """The chunks of a streamed chat completion: the role, content deltas, each tool
        call (id and name first, then its arguments), the finish reason, the usage chunk
        (when stream_options.include_usage), then `[DONE]`."""
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": self.make_id("chatcmpl"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "system_fingerprint": None,
        }
        if with_usage:
            base["usage"] = None

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> SseEvent:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return SseEvent(None, {**base, "choices": [choice]})

        chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
        chunks += [SseEvent(None, chunk({"content": piece}).data, True) for piece in reply.deltas()]
        for index, call in enumerate(reply.tool_calls):
            opening = {
                "index": index,
                "id": self._call_id(call),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            chunks.append(chunk({"tool_calls": [opening]}))
            chunks += [
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in halves(call.arguments_json())
            ]
        chunks.append(chunk({}, _finish_reason(reply)))
        if with_usage:
            chunks.append(
                SseEvent(None, {**base, "choices": [], "usage": self._usage(body, reply, responses_api=False)})
            )
        chunks.append(SseEvent(None, "[DONE]"))
        return chunks

    # ------------------------------------------------------------ helpers

    def _usage(self, body: dict[str, Any], reply: Reply, *, responses_api: bool) -> dict[str, Any]:
        # Made-up but plausible counts: about 4 bytes of request per token, a token per delta.
        input_tokens = reply.input_tokens if reply.input_tokens is not None else len(json.dumps(body)) // 4
        output_tokens = (
            reply.output_tokens if reply.output_tokens is not None else len(reply.deltas()) + 10 * len(reply.tool_calls)
        )
        if responses_api:
            return {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            }
        return {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }

    def _call_id(self, call: Call) -> str:
        return call.call_id or self.make_id("call")


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    done = status == "completed"
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _message_events(item: dict[str, Any], index: int, deltas: list[str]) -> list[tuple[str, dict[str, Any], bool]]:
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    text = item["content"][0]["text"]
    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return [
        (
            "response.output_item.added",
            {"output_index": index, "item": _message_item(item["id"], "", "in_progress")},
            False,
        ),
        ("response.content_part.added", {**where, "part": empty_part}, False),
        *[("response.output_text.delta", {**where, "delta": piece, "logprobs": []}, True) for piece in deltas],
        ("response.output_text.done", {**where, "text": text, "logprobs": []}, False),
        ("response.content_part.done", {**where, "part": item["content"][0]}, False),
        ("response.output_item.done", {"output_index": index, "item": item}, False),
    ]


def _function_call_events(item: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any], bool]]:
    where = {"item_id": item["id"], "output_index": index}
    opening = _function_call_item(item["id"], item["call_id"], item["name"], "", "in_progress")
    return [
        ("response.output_item.added", {"output_index": index, "item": opening}, False),
        *[
            ("response.function_call_arguments.delta", {**where, "delta": piece}, False)
            for piece in halves(item["arguments"])
        ],
        (
            "response.function_call_arguments.done",
            {**where, "name": item["name"], "arguments": item["arguments"]},
            False,
        ),
        ("response.output_item.done", {"output_index": index, "item": item}, False),
    ]


def _finish_reason(reply: Reply) -> str:
    if reply.incomplete:
        return "length"
    return "tool_calls" if reply.tool_calls else "stop"
