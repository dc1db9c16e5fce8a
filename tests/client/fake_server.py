"""A fake dex-ha cluster for the Client SDK tests: small aiohttp apps on 127.0.0.1, port 0.

A :class:`FakeCluster` holds the state every node shares (sessions, committed events),
so a failover keeps it, as the replicated log does. Each :class:`FakeNode` is one HTTP
server that plays ``active`` (serves the client routes) or ``standby`` (503
``not_active`` with ``leader_url`` and ``Retry-After``), records every request, and can
be told to misbehave for its next requests (:class:`Fault`: a status, a dropped
connection, a slow answer) or to drop an event stream after some events.

Only what the tests need of the API is modelled; it is not a server.

Also here: :class:`RefusedPort` (a port nothing listens on), :class:`FakeSleep` (records
backoff waits and drives a fake clock) and random.Random stand-ins whose ``uniform``
returns a bound, so a test can read the backoff cap.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness.local_app import start_local_app


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    raw_path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class Fault:
    """What a node does to one request instead of serving it.

    ``kind``: ``"status"`` answers ``status`` with ``body`` and ``headers``; ``"drop"``
    closes the connection without an answer; ``"delay"`` sleeps ``delay_s`` and then
    serves the request normally (for client timeouts).
    """

    kind: str
    status: int = 503
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class FakeEvent:
    id: int
    session_id: str
    type: str
    data: dict[str, Any]
    at: int


class FakeCluster:
    """State shared by the nodes: sessions, messages seen, committed events."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, Any]] = {}
        self.message_ids: dict[str, list[str]] = {}
        self.events: list[FakeEvent] = []
        self.deltas: dict[str, list[dict[str, Any]]] = {}
        self.changed = asyncio.Condition()
        self._next_event_id = 100

    async def commit_event(self, session_id: str, type_: str, data: dict[str, Any]) -> FakeEvent:
        """Append a committed event and wake the streams."""
        event = FakeEvent(self._next_event_id, session_id, type_, data, at=1_700_000_000_000 + self._next_event_id)
        self._next_event_id += 7  # ids grow but are not consecutive, like the real ones
        self.events.append(event)
        async with self.changed:
            self.changed.notify_all()
        return event

    async def push_delta(self, session_id: str, delta: dict[str, Any]) -> None:
        """Queue a live delta for the streams of a session (sent once, never replayed)."""
        self.deltas.setdefault(session_id, []).append(delta)
        async with self.changed:
            self.changed.notify_all()

    def events_after(self, session_id: str, after: int) -> list[FakeEvent]:
        return [e for e in self.events if e.session_id == session_id and e.id > after]


class FakeNode:
    """One fake node. Start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, cluster: FakeCluster, role: str = "active") -> None:
        self.cluster = cluster
        self.role = role
        self.leader_url: str | None = None
        self.retry_after: str = "1"
        self.requests: list[RecordedRequest] = []
        self.faults: deque[Fault] = deque()
        # After this many events the next event stream is cut (one-shot).
        self.drop_stream_after: int | None = None
        # A reconnecting stream resends this many events before Last-Event-ID (one-shot),
        # to prove the client drops what it already yielded.
        self.replay_overlap = 0
        # Answer stream requests with an empty 200 that ends at once (a misbehaving node).
        self.empty_streams = False
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    # ------------------------------------------------------------------ control

    async def start(self) -> FakeNode:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/v1/sessions", self._create_session)
        app.router.add_get("/v1/sessions", self._list_sessions)
        app.router.add_get("/v1/sessions/{sid}", self._get_session)
        app.router.add_post("/v1/sessions/{sid}/messages", self._send_message)
        app.router.add_post("/v1/sessions/{sid}/approvals/{call_id}", self._echo)
        app.router.add_post("/v1/sessions/{sid}/questions/{qid}/answer", self._echo)
        app.router.add_post("/v1/sessions/{sid}/cancel", self._echo)
        app.router.add_post("/v1/sessions/{sid}/tool-calls/{call_id}/reconcile", self._echo)
        app.router.add_get("/v1/sessions/{sid}/events", self._events)
        app.router.add_get("/v1/cluster", self._cluster)
        app.router.add_route("*", "/v1/echo", self._echo)
        self._runner, self.url = await start_local_app(app, shutdown_timeout=0.5)
        return self

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def become_standby(self, leader_url: str | None) -> None:
        self.role = "standby"
        self.leader_url = leader_url

    def become_active(self) -> None:
        self.role = "active"
        self.leader_url = None

    def add_faults(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    # ------------------------------------------------------------------ plumbing

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.requests.append(
            RecordedRequest(
                request.method, request.path, request.raw_path, dict(request.query), dict(request.headers), body
            )
        )
        if self.faults:
            fault = self.faults.popleft()
            if fault.kind == "drop":
                assert request.transport is not None
                request.transport.abort()  # the client sees a reset, no answer
                return web.Response(status=500)
            if fault.kind == "status":
                return web.json_response(fault.body, status=fault.status, headers=fault.headers)
            if fault.kind == "delay":
                await asyncio.sleep(fault.delay_s)
        if self.role != "active" and request.path != "/v1/cluster":
            return web.json_response(
                {"error": "not_active", "message": "this node is a standby", "leader_url": self.leader_url},
                status=503,
                headers={"Retry-After": self.retry_after},
            )
        return await handler(request)

    async def _echo(self, request: web.Request) -> web.Response:
        recorded = self.requests[-1]
        return web.json_response({"ok": True, "path": recorded.path, "body": recorded.body})

    async def _cluster(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "node_id": f"fake-{self.url.rsplit(':', 1)[-1]}",
                "role": self.role,
                "leader_url": self.leader_url,
                "url": self.url,
            }
        )

    # ------------------------------------------------------------------ sessions

    async def _create_session(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = self.requests[-1].body or {}
        # The Client always sends a session id (it makes one up when the caller gives none).
        sid: str = body["session_id"]
        agent = body.get("agent")
        existing = self.cluster.sessions.get(sid)
        if existing is not None:
            if existing["agent"] != agent:
                return web.json_response({"error": "conflict", "message": "another agent"}, status=409)
            return web.json_response(existing, status=200)
        session: dict[str, Any] = {
            "session_id": sid,
            "agent": agent,
            "status": "idle",
            "metadata": body.get("metadata"),
            "waiting_messages": [],
        }
        self.cluster.sessions[sid] = session
        return web.json_response(session, status=201)

    async def _get_session(self, request: web.Request) -> web.Response:
        session = self.cluster.sessions.get(request.match_info["sid"])
        if session is None:
            return web.json_response({"error": "not_found", "message": "no such session"}, status=404)
        return web.json_response(session)

    async def _list_sessions(self, request: web.Request) -> web.Response:
        query = request.query
        limit = int(query.get("limit", "100"))
        matching = sorted(
            (
                s
                for s in self.cluster.sessions.values()
                if s["agent"] == query.get("agent", s["agent"]) and s["status"] == query.get("status", s["status"])
            ),
            key=lambda s: s["session_id"],
        )
        if "after" in query:
            matching = [s for s in matching if s["session_id"] > query["after"]]
        page = matching[:limit]
        next_after = page[-1]["session_id"] if len(matching) > limit else None
        return web.json_response({"sessions": page, "next_after": next_after})

    async def _send_message(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        if sid not in self.cluster.sessions:
            return web.json_response({"error": "not_found", "message": "no such session"}, status=404)
        body = self.requests[-1].body
        seen = self.cluster.message_ids.setdefault(sid, [])
        if body["message_id"] not in seen:
            seen.append(body["message_id"])
        return web.json_response({"session_id": sid, "message_id": body["message_id"]}, status=202)

    # ------------------------------------------------------------------ events (SSE)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["sid"]
        last = request.headers.get("Last-Event-ID")
        after = int(last) if last else 0
        if last and self.replay_overlap:
            earlier = [e.id for e in self.cluster.events if e.session_id == sid and e.id <= after]
            after = earlier[-1 - self.replay_overlap] if len(earlier) > self.replay_overlap else 0
            self.replay_overlap = 0
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if self.empty_streams:
            await resp.write_eof()
            return resp
        await resp.write(b": keep-alive\n\n")
        sent_deltas = len(self.cluster.deltas.get(sid, []))  # deltas are live: only new ones
        sent = 0
        while not self._stopping.is_set():
            for event in self.cluster.events_after(sid, after):
                payload = {"id": str(event.id), "type": event.type, "at": event.at, "data": event.data}
                await resp.write(f"id: {event.id}\nevent: {event.type}\ndata: {json.dumps(payload)}\n\n".encode())
                after = event.id
                sent += 1
                if self.drop_stream_after is not None and sent >= self.drop_stream_after:
                    self.drop_stream_after = None
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
            deltas = self.cluster.deltas.get(sid, [])
            for delta in deltas[sent_deltas:]:
                await resp.write(f"event: delta\ndata: {json.dumps(delta)}\n\n".encode())
            sent_deltas = len(deltas)
            async with self.cluster.changed:
                try:
                    await asyncio.wait_for(self.cluster.changed.wait(), 0.2)
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")  # also notices a client that left
        return resp


async def start_nodes(cluster: FakeCluster, *roles: str) -> list[FakeNode]:
    return [await FakeNode(cluster, role).start() for role in roles]


class RefusedPort:
    """A loopback port that refuses connections: bound but never listening, held until closed."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._sock.close()


class FakeSleep:
    """Records the waits instead of sleeping, and advances a fake clock by them."""

    def __init__(self, advance_by: float | None = None) -> None:
        self.sleeps: list[float] = []
        self.now = 1000.0
        self._advance_by = advance_by  # None: advance by the delay asked for

    async def __call__(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay if self._advance_by is None else self._advance_by
        await asyncio.sleep(0)

    def clock(self) -> float:
        return self.now


class UpperBoundRng(random.Random):
    """uniform(a, b) returns b: makes the backoff cap visible."""

    def uniform(self, a: float, b: float) -> float:
        return b


class LowerBoundRng(random.Random):
    """uniform(a, b) returns a: jitter drew zero."""

    def uniform(self, a: float, b: float) -> float:
        return a
