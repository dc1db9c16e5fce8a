"""The Anthropic face of the fake model server: the Messages API, so the official
`anthropic` SDK (or anything else that sets ANTHROPIC_BASE_URL, such as the Claude Code CLI)
talks to it as to the real API, offline.

    async with FakeAnthropic([Reply.of("Hello!"), ApiError.rate_limited()]) as fake:
        client = AsyncAnthropic(api_key="test", base_url=fake.base_url, max_retries=0)
        ...
        fake.requests[0].body["messages"]      # what the client sent

Routes: `POST /v1/messages` (streamed when the body says `"stream": true`, as Server-Sent
Events in the order the API sends them: message_start, content_block_start, ping,
content_block_delta..., content_block_stop, message_delta, message_stop; otherwise one JSON
message) and `POST /v1/messages/count_tokens` (a rough count). A query string such as
`?beta=true` is ignored.

What each `/v1/messages` request gets, in this order:
1. the next item of the queue (`replies=` at construction, `fake.queue(...)` later);
2. otherwise `responder(body)`, a function of the request body (sync or async);
3. otherwise a 500 `api_error` saying that nothing was scripted.
Before that, with `validate=True` (the default), a body the real API would refuse for its
structure (`request_problem`: roles that do not alternate, a tool_use without its
tool_result in the next message, ...) gets the 400 `invalid_request_error` the API gives.
An item is a :class:`Reply` (a message, with optional stall or mid-stream error) or an
:class:`ApiError` (an HTTP error with Anthropic's error JSON).

Every request is recorded in `fake.requests` (method, path, headers, body), the failed ones
too. To extend it, subclass and override `add_routes` (call super), or call
`fake.app.router.add_*` before `start()`; `fake.record(request)` records a request of your own.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness.fake_models.server import FakeModelServer, RecordedRequest, SseEvent, StreamPlan, halves, words

__all__ = [
    "ERROR_STATUS",
    "ApiError",
    "FakeAnthropic",
    "RecordedRequest",
    "Reply",
    "request_problem",
    "rough_tokens",
    "stream_events",
    "text",
    "tool_use",
]

# The HTTP status of each Anthropic error type, for ApiError.of_type.
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def text(value: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": value}


def tool_use(name: str, input: dict[str, Any] | None = None, id: str | None = None) -> dict[str, Any]:
    """A tool_use content block; without `id` the fake makes a unique one when it answers."""
    block: dict[str, Any] = {"type": "tool_use", "name": name, "input": dict(input or {})}
    if id is not None:
        block["id"] = id
    return block


@dataclass
class ApiError:
    """An error answer: `status` with `{"type": "error", "error": {"type", "message"}}`.

    Used as a queue item it answers the whole request; as `Reply.error` it is sent as an
    SSE `error` event in the middle of a stream (the HTTP status is then 200, as the API does).
    """

    status: int
    type: str
    message: str
    retry_after: float | None = None  # sets the Retry-After header
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_type(cls, type: str, message: str | None = None, **kwargs: Any) -> ApiError:
        return cls(ERROR_STATUS[type], type, message or f"fake {type}", **kwargs)

    @classmethod
    def rate_limited(cls, retry_after: float = 1.0) -> ApiError:
        return cls(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
            retry_after=retry_after,
        )

    @classmethod
    def overloaded(cls) -> ApiError:
        return cls(529, "overloaded_error", "Overloaded")

    def body(self, request_id: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}, "request_id": request_id}

    def response(self, request_id: str) -> web.Response:
        headers = {"request-id": request_id, **self.headers}
        if self.retry_after is not None:
            headers["retry-after"] = f"{self.retry_after:g}"
        return web.json_response(self.body(request_id), status=self.status, headers=headers)


@dataclass
class Reply:
    """One assistant message. `content` holds Anthropic content blocks (see `text` and
    `tool_use`). Streamed, text goes out in word-sized text_delta pieces and each tool's
    input in a few input_json_delta pieces.

    `stall_after_deltas=n`: a stream sends n content deltas, then hangs (no more bytes, the
    connection open) until the client goes away or the fake stops. `error` with
    `error_after_deltas=n`: n deltas, then an SSE `error` event, then the stream ends.
    Both apply to streamed requests only.
    """

    content: list[dict[str, Any]]
    stop_reason: str | None = None  # default: tool_use when a tool_use block is there, else end_turn
    usage: dict[str, int] | None = None  # default: a rough count of the request and the reply
    stall_after_deltas: int | None = None
    error: ApiError | None = None
    error_after_deltas: int = 0

    @classmethod
    def of(cls, *blocks: str | dict[str, Any], **kwargs: Any) -> Reply:
        """`Reply.of("Let me look.", tool_use("lookup", {"id": 7}))`: strings become text blocks."""
        return cls([text(b) if isinstance(b, str) else b for b in blocks], **kwargs)


Item = Reply | ApiError
Responder = Callable[[dict[str, Any]], Item | Awaitable[Item]]


class FakeAnthropic(FakeModelServer[Item]):
    """The Anthropic face (see the module doc). Use it as `async with`, or `start()`/`stop()`."""

    def __init__(
        self,
        replies: Iterable[Item] = (),
        *,
        responder: Responder | None = None,
        model: str | None = None,
        validate: bool = True,
    ) -> None:
        super().__init__()
        self.validate = validate  # answer 400 to messages the real API refuses (see request_problem)
        self.queue(*replies)
        self.responder = responder
        self.model = model  # the model name in answers; default: the one the request names

    @property
    def base_url(self) -> str:
        """What to give the SDK as base_url (or ANTHROPIC_BASE_URL); no /v1."""
        return self.origin

    def add_routes(self, app: web.Application) -> None:
        """The routes; a subclass adds its own after calling this."""
        app.router.add_post("/v1/messages", self.handle_messages)
        app.router.add_post("/v1/messages/count_tokens", self.handle_count_tokens)

    def answer_types(self) -> tuple[type, ...]:
        return (Reply, ApiError)

    def unscripted(self, request: RecordedRequest) -> Item | Awaitable[Item] | None:
        return None if self.responder is None else self.responder(request.body)

    def nothing_scripted(self, request: RecordedRequest) -> Item:
        return ApiError(500, "api_error", f"fake anthropic: no reply scripted for request #{len(self.requests)}")

    # ------------------------------------------------------------ handlers

    async def handle_messages(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.record(request)
        request_id = self.make_id("req")
        if not isinstance(recorded.body, dict):
            return ApiError(400, "invalid_request_error", "the body must be a JSON object").response(request_id)
        problem = request_problem(recorded.body) if self.validate else None
        if problem is not None:  # what the real API refuses, before any scripted answer is used
            return ApiError(400, "invalid_request_error", problem).response(request_id)
        item = await self.next_answer(recorded)
        if isinstance(item, ApiError):
            return item.response(request_id)
        message = self.message_json(item, recorded.body)
        if not recorded.stream:
            return web.json_response(message, headers={"request-id": request_id})
        error_event = None
        if item.error is not None:
            error = {"type": "error", "error": {"type": item.error.type, "message": item.error.message}}
            error_event = SseEvent("error", {**error, "request_id": request_id})
        plan = StreamPlan(
            stall_after=item.stall_after_deltas,
            error_after=item.error_after_deltas if item.error is not None else None,
            error_event=error_event,
        )
        headers = {"Content-Type": "text/event-stream", "request-id": request_id}
        return await self.stream(request, stream_events(message), plan, headers)

    async def handle_count_tokens(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        return web.json_response({"input_tokens": rough_tokens(recorded.body)})

    def message_json(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        """The complete message, as a non-streamed answer gives it."""
        content = [self._with_id(block) for block in reply.content]
        has_tool_use = any(block["type"] == "tool_use" for block in content)
        usage = reply.usage or {"input_tokens": rough_tokens(body), "output_tokens": rough_tokens(content)}
        return {
            "id": self.make_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": self.model or body.get("model", "fake-model"),
            "content": content,
            "stop_reason": reply.stop_reason or ("tool_use" if has_tool_use else "end_turn"),
            "stop_sequence": None,
            "usage": usage,
        }

    def _with_id(self, block: dict[str, Any]) -> dict[str, Any]:
        if block.get("type") == "tool_use" and "id" not in block:
            return {**block, "id": self.make_id("toolu")}
        return dict(block)


def request_problem(body: dict[str, Any]) -> str | None:
    """What the real Messages API would refuse in this body's structure, or None: a missing
    model or max_tokens, no messages, roles that do not alternate (starting with user), an
    empty content, an empty text block, a tool_use not answered by a tool_result at the
    start of the next (user) message, a tool_result that answers no tool_use just before, or
    tool blocks in a request without tools.

    Stricter than the API in one way: the API merges consecutive messages of one role, this
    check refuses them (a model provider should not rely on the merge). A client that does,
    such as a CLI under test, can run the fake with `validate=False`."""
    if not isinstance(body.get("model"), str) or not isinstance(body.get("max_tokens"), int):
        return "model and max_tokens: Field required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    open_ids: list[str] = []  # the tool_use ids of the previous assistant message
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role != ("user" if i % 2 == 0 else "assistant"):
            return f"messages.{i}: roles must alternate between user and assistant, starting with user"
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}: all messages must have non-empty content"
        if any(b.get("type") == "text" and not str(b.get("text", "")).strip() for b in blocks):
            return f"messages.{i}: text content blocks must contain non-whitespace text"
        results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        leading = [b.get("tool_use_id") for b in blocks[: len(open_ids)] if b.get("type") == "tool_result"]
        if open_ids and sorted(leading) != sorted(open_ids):
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(sorted(set(open_ids) - set(leading)))}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        if results != leading or any(r not in open_ids for r in results):
            return (
                f"messages.{i}: unexpected `tool_use_id` found in `tool_result` blocks. Each `tool_result` "
                "block must have a corresponding `tool_use` block in the previous message."
            )
        open_ids = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
        if (open_ids or results) and not body.get("tools"):
            return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    return None


def stream_events(message: dict[str, Any]) -> list[SseEvent]:
    """The SSE events of `message`, in the API's order; the content deltas count as deltas."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 1},
    }
    events = [SseEvent("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        start_block = {"type": "content_block_start", "index": index, "content_block": _empty_block(block)}
        events.append(SseEvent("content_block_start", start_block))
        if index == 0:
            events.append(SseEvent("ping", {"type": "ping"}))
        for delta in _block_deltas(block):
            data = {"type": "content_block_delta", "index": index, "delta": delta}
            events.append(SseEvent("content_block_delta", data, is_delta=True))
        events.append(SseEvent("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    output = {"output_tokens": usage.get("output_tokens", 0)}
    events.append(SseEvent("message_delta", {"type": "message_delta", "delta": delta, "usage": output}))
    events.append(SseEvent("message_stop", {"type": "message_stop"}))
    return events


def _empty_block(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] == "tool_use":
        return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    return block  # other block types are sent whole, with no deltas


def _block_deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        return [{"type": "text_delta", "text": piece} for piece in words(block["text"])]
    if block["type"] == "tool_use":
        return [{"type": "input_json_delta", "partial_json": piece} for piece in halves(json.dumps(block["input"]))]
    return []


def rough_tokens(value: Any) -> int:
    """About four characters a token: good enough for usage numbers in tests."""
    return max(1, len(json.dumps(value)) // 4)
