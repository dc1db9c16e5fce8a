"""The machinery both fake model APIs share (see the package doc): lifecycle, recording,
the answer queue, and streaming server-sent events with a stall or an error part way."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

from aiohttp import web
from multidict import CIMultiDict

from harness.local_app import start_local_app

# Seconds the server waits for running handlers when it stops; stalled streams are released
# first, so this only bounds a handler of a subclass that never returns.
SHUTDOWN_TIMEOUT_S = 2.0
# Request bodies up to this size: agents send whole conversations.
MAX_BODY_BYTES = 64 * 1024 * 1024

AnswerT = TypeVar("AnswerT")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it; `headers` look names up in any case."""

    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]
    body: Any  # the parsed JSON, or the raw text when it is not JSON

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True


@dataclass(frozen=True)
class SseEvent:
    """One server-sent event: `event` is the `event:` line (none when None); `data` is JSON
    (or a str sent as is, such as `[DONE]`); `is_delta` counts it for a stall or an error."""

    event: str | None
    data: dict[str, Any] | str
    is_delta: bool = False

    def encode(self) -> bytes:
        payload = self.data if isinstance(self.data, str) else json.dumps(self.data)
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {payload}\n\n".encode()


@dataclass(frozen=True)
class StreamPlan:
    """How a stream goes wrong, if it does: after `stall_after` deltas it hangs (no more
    bytes, the connection open) until the fake stops, then the connection is cut; after
    `error_after` deltas it sends `error_event` and ends. `delta_delay_s` paces the events."""

    stall_after: int | None = None
    error_after: int | None = None
    error_event: SseEvent | None = None
    delta_delay_s: float = 0.0


class FakeModelServer(Generic[AnswerT]):
    """An aiohttp server on 127.0.0.1 (a free port) that records every request and answers
    from a queue of scripted answers, then from the face's own fallback. A face (subclass)
    adds its routes in `add_routes` and says what an unscripted request gets."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.stalls = 0  # streams that reached their stall point
        self.app = web.Application(client_max_size=MAX_BODY_BYTES)
        self.add_routes(self.app)
        self.port: int | None = None
        self._queue: deque[AnswerT] = deque()
        self._ids = itertools.count(1)
        self._stalled = asyncio.Event()  # set when a stream has reached its stall point
        self._release = asyncio.Event()  # set on stop: stalled streams end
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------ what a face provides

    def add_routes(self, app: web.Application) -> None:
        """The face's routes; a subclass of a face adds its own after calling super."""
        raise NotImplementedError

    def answer_types(self) -> tuple[type, ...]:
        """The types a scripted answer may have (checked when it is queued)."""
        raise NotImplementedError

    def unscripted(self, request: RecordedRequest) -> AnswerT | Awaitable[AnswerT] | None:
        """The answer when the queue is empty (the face's script), or None for none."""
        raise NotImplementedError

    def nothing_scripted(self, request: RecordedRequest) -> AnswerT:
        """The error answer of a request nothing was scripted for: a clear failure, no hang."""
        raise NotImplementedError

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> Self:
        self._runner, url = await start_local_app(self.app, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        self.port = int(url.rsplit(":", 1)[1])
        return self

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def origin(self) -> str:
        if self.port is None:
            raise RuntimeError("the fake is not started")
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------ scripting and records

    def queue(self, *answers: AnswerT) -> None:
        """Answer the next requests with these, in order (before the face's script)."""
        allowed = self.answer_types()
        for answer in answers:
            if not isinstance(answer, allowed):
                names = " or ".join(("an " if t.__name__[0] in "AEIOU" else "a ") + t.__name__ for t in allowed)
                raise TypeError(f"a scripted answer must be {names}, got {type(answer).__name__}")
        self._queue.extend(answers)

    def bodies(self, path: str | None = None) -> list[Any]:
        """The request bodies received so far (at `path` only, when given)."""
        return [r.body for r in self.requests if path is None or r.path == path]

    async def wait_stalled(self, deadline_s: float = 10.0) -> None:
        """Until a stream has reached its stall point (TimeoutError after the deadline)."""
        await asyncio.wait_for(self._stalled.wait(), deadline_s)

    async def record(self, request: web.Request) -> RecordedRequest:
        """Record `request` (its body parsed as JSON when it is JSON) and return the record."""
        raw = await request.text()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        recorded = RecordedRequest(
            request.method, request.path, dict(request.query), CIMultiDict(request.headers), body
        )
        self.requests.append(recorded)
        return recorded

    async def next_answer(self, request: RecordedRequest) -> AnswerT:
        if self._queue:
            return self._queue.popleft()
        answer = self.unscripted(request)
        if isinstance(answer, Awaitable):
            answer = await answer
        return self.nothing_scripted(request) if answer is None else answer

    def make_id(self, prefix: str) -> str:
        """A unique id such as `msg_fake000007`."""
        return f"{prefix}_fake{next(self._ids):06d}"

    # ------------------------------------------------------------ streaming

    async def stream(
        self, http_request: web.Request, events: Sequence[SseEvent], plan: StreamPlan, headers: dict[str, str]
    ) -> web.StreamResponse:
        """Send `events` as SSE, going wrong as `plan` says (see StreamPlan)."""
        response = web.StreamResponse(headers={"Cache-Control": "no-cache", **headers})
        await response.prepare(http_request)
        sent_deltas = 0
        try:
            for event in events:
                if event.is_delta and plan.error_after is not None and sent_deltas >= plan.error_after:
                    if plan.error_event is not None:
                        await response.write(plan.error_event.encode())
                    return response
                if event.is_delta and plan.stall_after is not None and sent_deltas >= plan.stall_after:
                    await self._stall(http_request)
                    return response
                await response.write(event.encode())
                sent_deltas += event.is_delta
                if plan.delta_delay_s:
                    await asyncio.sleep(plan.delta_delay_s)
            await response.write_eof()
        except ConnectionResetError:  # the client went away (a killed Worker, say)
            pass
        return response

    async def _stall(self, http_request: web.Request) -> None:
        self.stalls += 1
        self._stalled.set()
        await self._release.wait()
        # Cut the connection, as a server that dies mid-stream: the client sees a broken
        # stream, not one that ended.
        if http_request.transport is not None:
            http_request.transport.abort()


def halves(text: str) -> list[str]:
    """`text` in two pieces, as the APIs stream arguments in fragments (never an empty one),
    so that a client must join partial JSON."""
    middle = len(text) // 2
    return [piece for piece in (text[:middle], text[middle:]) if piece]


def words(text: str) -> list[str]:
    """`text` in word-sized pieces (each with its trailing space), as the APIs stream text."""
    return re.findall(r"\S+\s*|\s+", text)
