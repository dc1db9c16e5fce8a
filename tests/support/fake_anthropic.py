"""A fake Anthropic Messages API for tests: an aiohttp app on 127.0.0.1 (a free port) that
speaks the real wire format, so the official `anthropic` SDK (or anything else that sets
ANTHROPIC_BASE_URL, such as the Claude Code CLI) talks to it as to the real API, offline.

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
1. the next item of the queue (`replies=` at construction, `fake.push(...)` later);
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

import asyncio
import inspect
import itertools
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# Seconds the server waits for running handlers when it stops; stalled streams are released
# first, so this only bounds a handler of a subclass that never returns.
SHUTDOWN_TIMEOUT_S = 2.0
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

    def response_headers(self, request_id: str) -> dict[str, str]:
        headers = {"request-id": request_id, **self.headers}
        if self.retry_after is not None:
            headers["retry-after"] = f"{self.retry_after:g}"
        return headers


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


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    body: Any  # the parsed JSON, or the raw text when it is not JSON

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


Item = Reply | ApiError
Responder = Callable[[dict[str, Any]], Item | Awaitable[Item]]


class FakeAnthropic:
    """The fake server (see the module doc). Use it as `async with`, or `start()`/`stop()`."""

    def __init__(
        self,
        replies: Iterable[Item] = (),
        *,
        responder: Responder | None = None,
        model: str | None = None,
        validate: bool = True,
    ) -> None:
        self.validate = validate  # answer 400 to messages the real API refuses (see request_problem)
        self.queue: deque[Item] = deque()
        self.push(*replies)
        self.responder = responder
        self.model = model  # the model name in answers; default: the one the request names
        self.requests: list[RecordedRequest] = []
        self.stalls = 0  # streams that reached their stall point
        self.app = web.Application()
        self.add_routes(self.app)
        self._ids = itertools.count(1)
        self._release = asyncio.Event()  # set on stop: stalled streams end
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """The routes; a subclass adds its own after calling this."""
        app.router.add_post("/v1/messages", self.handle_messages)
        app.router.add_post("/v1/messages/count_tokens", self.handle_count_tokens)

    async def start(self) -> FakeAnthropic:
        self._runner = web.AppRunner(self.app, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeAnthropic:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """What to give the SDK as base_url (or ANTHROPIC_BASE_URL); no /v1."""
        if self.port is None:
            raise RuntimeError("the fake is not started")
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------ scripting and records

    def push(self, *items: Item) -> None:
        """Queue answers for the next requests, in order."""
        for item in items:
            if not isinstance(item, (Reply, ApiError)):
                raise TypeError(f"a scripted answer must be a Reply or an ApiError, got {type(item).__name__}")
            self.queue.append(item)

    def bodies(self, path: str = "/v1/messages") -> list[Any]:
        """The bodies of the requests to `path`, in order."""
        return [r.body for r in self.requests if r.path == path]

    async def record(self, request: web.Request) -> RecordedRequest:
        raw = await request.text()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        recorded = RecordedRequest(
            request.method, request.path, dict(request.query), {k.lower(): v for k, v in request.headers.items()}, body
        )
        self.requests.append(recorded)
        return recorded

    async def next_item(self, body: dict[str, Any]) -> Item:
        if self.queue:
            return self.queue.popleft()
        if self.responder is not None:
            item = self.responder(body)
            return await item if inspect.isawaitable(item) else item
        return ApiError(500, "api_error", f"fake anthropic: no reply scripted for request #{len(self.requests)}")

    # ------------------------------------------------------------ handlers

    async def handle_messages(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.record(request)
        request_id = f"req_fake{next(self._ids)}"
        if not isinstance(recorded.body, dict):
            return self.error_response(
                ApiError(400, "invalid_request_error", "the body must be a JSON object"), request_id
            )
        problem = request_problem(recorded.body) if self.validate else None
        if problem is not None:  # what the real API refuses, before any scripted answer is used
            return self.error_response(ApiError(400, "invalid_request_error", problem), request_id)
        item = await self.next_item(recorded.body)
        if isinstance(item, ApiError):
            return self.error_response(item, request_id)
        message = self.message_json(item, recorded.body)
        if not recorded.stream:
            return web.json_response(message, headers={"request-id": request_id})
        return await self.stream_message(request, item, message, request_id)

    async def handle_count_tokens(self, request: web.Request) -> web.Response:
        recorded = await self.record(request)
        return web.json_response({"input_tokens": rough_tokens(recorded.body)})

    def error_response(self, error: ApiError, request_id: str) -> web.Response:
        return web.json_response(
            error.body(request_id), status=error.status, headers=error.response_headers(request_id)
        )

    def message_json(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        """The complete message, as a non-streamed answer gives it."""
        content = [self._with_id(block) for block in reply.content]
        has_tool_use = any(block["type"] == "tool_use" for block in content)
        usage = reply.usage or {"input_tokens": rough_tokens(body), "output_tokens": rough_tokens(content)}
        return {
            "id": f"msg_fake{next(self._ids)}",
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
            return {**block, "id": f"toolu_fake{next(self._ids)}"}
        return dict(block)

    async def stream_message(
        self, request: web.Request, reply: Reply, message: dict[str, Any], request_id: str
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "cache-control": "no-cache", "request-id": request_id}
        )
        await response.prepare(request)
        deltas_sent = 0
        for event, data in stream_events(message):
            if data["type"] == "content_block_delta":
                if reply.stall_after_deltas is not None and deltas_sent >= reply.stall_after_deltas:
                    self.stalls += 1
                    await self._release.wait()  # hang until the fake stops (or the client leaves)
                    return response
                if reply.error is not None and deltas_sent >= reply.error_after_deltas:
                    await send_event(
                        response,
                        "error",
                        {
                            "type": "error",
                            "error": {"type": reply.error.type, "message": reply.error.message},
                            "request_id": request_id,
                        },
                    )
                    return response
                deltas_sent += 1
            await send_event(response, event, data)
        await response.write_eof()
        return response


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


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events (name, data) of `message`, in the API's order."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": usage.get("input_tokens", 0), "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": _empty_block(block)},
            )
        )
        if index == 0:
            events.append(("ping", {"type": "ping"}))
        for delta in _block_deltas(block):
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _empty_block(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] == "tool_use":
        return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    return block  # other block types are sent whole, with no deltas


def _block_deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        return [{"type": "text_delta", "text": piece} for piece in re.findall(r"\S+\s*|\s+", block["text"])]
    if block["type"] == "tool_use":
        raw = json.dumps(block["input"])
        middle = len(raw) // 2  # two pieces, so a client must join partial JSON
        return [{"type": "input_json_delta", "partial_json": piece} for piece in (raw[:middle], raw[middle:]) if piece]
    return []


async def send_event(response: web.StreamResponse, event: str, data: dict[str, Any]) -> None:
    await response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())


def rough_tokens(value: Any) -> int:
    """About four characters a token: good enough for usage numbers in tests."""
    return max(1, len(json.dumps(value)) // 4)
