"""Helpers for HTTP tests against a real NodeServer running in the test's event loop.

- `start_node` / `stop_node`: a node on free loopback ports, waited for with a deadline.
- `HttpApi`: raw HTTP calls (aiohttp, not the SDKs) with the token of a role, answers as
  `Reply`, and a record of which route of `api_spec.ROUTES` each request hit, so a test's
  `@covers(...)` claim can be checked.
- `SseStream`: reads Server-Sent Events with a deadline.
- Small builders for the documents the API takes (agent definitions, model results).

Everything here is per test: no module-level mutable state, so two nodes can run in one
process.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dex_ha.local_cluster import ClusterPlan, plan_cluster, write_cluster_files
from dex_ha.server.api_spec import ROUTES, RouteSpec
from dex_ha.server.config import ServerConfig, dev_config, load_config
from dex_ha.server.node import NodeServer
from harness import readiness
from harness.ports import free_ports

CLIENT_TOKEN = "client-token-routes-0123456789"
WORKER_TOKEN = "worker-token-routes-0123456789"
ADMIN_TOKEN = "admin-token-routes-0123456789"
TOKENS: dict[str, tuple[str, ...]] = {"client": (CLIENT_TOKEN,), "worker": (WORKER_TOKEN,), "admin": (ADMIN_TOKEN,)}
TOKEN_OF_ROLE = {"client": CLIENT_TOKEN, "worker": WORKER_TOKEN, "admin": ADMIN_TOKEN}
CLUSTER_SECRET = "cluster-secret-routes-0123456789"

READY_DEADLINE_S = 10.0
SSE_DEADLINE_S = 5.0


# ---------------------------------------------------------------- nodes


def base_url(node: NodeServer) -> str:
    assert node.http_port is not None, "the node is not started"
    return f"http://127.0.0.1:{node.http_port}"


async def start_node(config: ServerConfig, *, wait_ready: bool = True) -> NodeServer:
    """Start a node; with `wait_ready`, wait (deadline) until its /readyz answers 200."""
    node = NodeServer(config)
    await node.start()
    if wait_ready:
        await readiness.wait_ready([base_url(node)], READY_DEADLINE_S, request_timeout_s=2.0)
    return node


def single_node_config(data_dir: Path, *, auth: bool = True, **overrides: Any) -> ServerConfig:
    """`dex-ha dev` on a free port, relaxed durability; tokens of every role when `auth`."""
    config = dev_config(data_dir, port=0, tokens=TOKENS if auth else None, durability="relaxed")
    return replace(config, **overrides)


def cluster_plan(root: Path, nodes: int = 3) -> ClusterPlan:
    """The plan of a loopback cluster of `nodes` nodes (n1, n2, …) on free ports, with this
    module's secret and tokens, and its files written under `root`: the same plan and node
    files as `dex-ha cluster up`, for nodes run in the test's event loop (`node_config`)."""
    ports = free_ports(3 * nodes)
    plan = plan_cluster(root, ports[:nodes], ports[nodes : 2 * nodes], ports[2 * nodes :], durability="relaxed")
    plan = replace(plan, cluster_secret=CLUSTER_SECRET, tokens={role: tokens[0] for role, tokens in TOKENS.items()})
    write_cluster_files(plan)
    return plan


def node_config(plan: ClusterPlan, node_id: str, **overrides: Any) -> ServerConfig:
    """A node's config as `dex-ha node` reads it from its file (no environment overrides),
    with short election timeouts and no probe listener unless `overrides` say otherwise."""
    config = load_config(plan.node(node_id).config_path, env={})
    defaults: dict[str, Any] = {"probe_listen": None, "election_timeout_min_ms": 300, "election_timeout_max_ms": 600}
    return replace(config, **{**defaults, **overrides})


# ---------------------------------------------------------------- which route a request hits


def _path_regex(route: RouteSpec) -> re.Pattern[str]:
    pattern = re.sub(r"{[^}]+}", "[^/]+", route.path)
    return re.compile(f"^{pattern}$")


def route_of(method: str, path: str) -> str | None:
    """The name of the route in `api_spec.ROUTES` that `method path` hits (None: none)."""
    for route in ROUTES:
        if route.method == method.upper() and _path_regex(route).match(path):
            return route.name
    return None


def role_for(route: RouteSpec) -> str | None:
    """A role the route accepts (None: it needs no token), so a test is not stopped by 401/403."""
    return None if route.roles is None else min(route.roles)


def concrete_path(route: RouteSpec, **params: str) -> str:
    """The route's path with its parameters filled in (`x` for the ones not given)."""
    return re.sub(r"{([^}:]+)[^}]*}", lambda m: params.get(m.group(1), "x"), route.path)


# ---------------------------------------------------------------- raw HTTP


@dataclass
class Reply:
    status: int
    body: Any  # parsed JSON when the answer is JSON, else the text
    headers: dict[str, str]
    elapsed_s: float

    def error_code(self) -> str | None:
        return self.body.get("error") if isinstance(self.body, dict) else None

    def error_message(self) -> str:
        return self.body.get("message", "") if isinstance(self.body, dict) else ""


@dataclass
class HttpApi:
    """Raw HTTP calls to one node, remembering the route each one hit."""

    url: str
    session: aiohttp.ClientSession
    auth: bool = True
    hits: list[tuple[str, int]] = field(default_factory=list)  # (route name, status)

    def auth_header(self, role: str | None) -> dict[str, str]:
        if role is None or not self.auth:
            return {}
        return {"Authorization": f"Bearer {TOKEN_OF_ROLE[role]}"}

    async def call(
        self,
        method: str,
        path: str,
        *,
        role: str | None = None,
        json_body: Any = None,
        data: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> Reply:
        """One request; `json_body` is sent as JSON, `data` as given (bytes, generator).
        A POST or PUT says it sends JSON unless `headers` say otherwise, as the node requires."""
        all_headers = {**self.auth_header(role), **(headers or {})}
        if json_body is not None:
            data = json.dumps(json_body).encode()
        if json_body is not None or method in ("POST", "PUT"):
            all_headers.setdefault("Content-Type", "application/json")
        started = time.monotonic()
        async with self.session.request(
            method,
            self.url + path,
            data=data,
            params=params,
            headers=all_headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            text = await response.text()
            elapsed = time.monotonic() - started
            body: Any = text
            if response.content_type == "application/json":
                body = json.loads(text)
            reply = Reply(response.status, body, dict(response.headers), elapsed)
        name = route_of(method, path)
        if name is not None:
            self.hits.append((name, reply.status))
        return reply

    async def get_bytes(
        self, path: str, role: str | None, timeout_s: float = 30.0
    ) -> tuple[int, bytes, dict[str, str]]:
        """A GET whose answer is not text (a backup file): (status, body bytes, headers)."""
        async with self.session.get(
            self.url + path, headers=self.auth_header(role), timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            status, body, headers = response.status, await response.read(), dict(response.headers)
        name = route_of("GET", path)
        if name is not None:
            self.hits.append((name, status))
        return status, body, headers

    async def get(self, path: str, role: str | None = "client", **kwargs: Any) -> Reply:
        return await self.call("GET", path, role=role, **kwargs)

    async def post(self, path: str, body: Any = None, role: str | None = "client", **kwargs: Any) -> Reply:
        return await self.call("POST", path, role=role, json_body=body, **kwargs)

    async def put(self, path: str, body: Any = None, role: str | None = "worker", **kwargs: Any) -> Reply:
        return await self.call("PUT", path, role=role, json_body=body, **kwargs)

    async def delete(self, path: str, role: str | None = "admin", **kwargs: Any) -> Reply:
        return await self.call("DELETE", path, role=role, **kwargs)

    def routes_hit(self) -> set[str]:
        return {name for name, _ in self.hits}

    # ------------------------------------------------------------ the usual steps of a test

    async def register_agent(self, name: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
        return expect(await self.put(f"/v1/agents/{name}", {"tools": tools}), 200)

    async def create_session(self, agent: str, session_id: str) -> dict[str, Any]:
        return expect(await self.post("/v1/sessions", {"agent": agent, "session_id": session_id}), 201)

    async def send_message(self, session_id: str, text: str, message_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text}
        if message_id is not None:
            body["message_id"] = message_id
        return expect(await self.post(f"/v1/sessions/{session_id}/messages", body), 202)

    async def snapshot(self, session_id: str) -> dict[str, Any]:
        return expect(await self.get(f"/v1/sessions/{session_id}"), 200)

    async def open_channel(
        self, agents: str, worker_id: str = "worker-1", encoding: str = "msgpack"
    ) -> aiohttp.ClientWebSocketResponse:
        """Open the Worker channel (a WebSocket); the caller closes it."""
        params = {"worker_id": worker_id, "agents": agents, "encoding": encoding}
        ws = await self.session.ws_connect(
            self.url + "/v1/worker/channel", params=params, headers=self.auth_header("worker"), autoping=True
        )
        self.hits.append(("worker_channel", 101))
        return ws

    async def poll_one(self, agent: str, worker_id: str = "worker-1", wait_ms: int = 5_000) -> dict[str, Any]:
        """Poll until one task of `agent` is handed out (the node's wait_ms is the deadline)."""
        reply = expect(
            await self.post(
                "/v1/worker/poll",
                {"worker_id": worker_id, "agents": [agent], "max_tasks": 1, "wait_ms": wait_ms},
                role="worker",
            ),
            200,
        )
        tasks = reply["tasks"]
        assert len(tasks) == 1, f"expected one task of agent {agent!r} within {wait_ms} ms, got {tasks}"
        return tasks[0]

    async def complete(self, task: dict[str, Any], result: Any, worker_id: str = "worker-1") -> dict[str, Any]:
        """Complete `task` as the Worker that polled it (poll_one's default Worker unless told)."""
        return expect(
            await self.post(
                f"/v1/worker/tasks/{task['task_token']}/complete",
                {"worker_id": worker_id, "result": result},
                role="worker",
            ),
            200,
        )

    async def start_turn_with_tool_calls(
        self, agent: str, session_id: str, tools: list[dict[str, Any]], calls: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Register `agent`, create the session, send a message, and complete its RunModel
        step with `calls`; returns the session snapshot after that."""
        await self.register_agent(agent, tools)
        await self.create_session(agent, session_id)
        await self.send_message(session_id, "please use your tools")
        task = await self.poll_one(agent)
        assert task["kind"] == "RunModel", task
        await self.complete(task, model_result("using tools", calls))
        return await self.snapshot(session_id)


def expect(reply: Reply, status: int) -> Any:
    """The body of a reply that must have `status` (the assertion shows the whole reply)."""
    assert reply.status == status, f"expected {status}, got {reply.status}: {reply.body}"
    return reply.body


def assert_error(reply: Reply, status: int, code: str | None = None, names: str | None = None) -> None:
    """An error answer: `status`, JSON {"error", "message"}, the code, and the field it names."""
    assert reply.status == status, f"expected {status}, got {reply.status}: {reply.body}"
    assert isinstance(reply.body, dict), f"an error answer must be JSON, got {reply.body!r}"
    assert isinstance(reply.body.get("error"), str) and isinstance(reply.body.get("message"), str), reply.body
    if code is not None:
        assert reply.body["error"] == code, reply.body
    if names is not None:
        assert names in reply.body["message"], f"the message should name {names!r}: {reply.body}"


# ---------------------------------------------------------------- documents


def tool(name: str, effect: str = "read", **policy: Any) -> dict[str, Any]:
    return {"name": name, "effect": effect, **policy}


def tool_call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def model_result(content: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A RunModel result: the assistant message."""
    return {"content": content, "tool_calls": calls or [], "usage": {"input_tokens": 3, "output_tokens": 2}}


def call_view(snapshot: dict[str, Any], call_id: str) -> dict[str, Any]:
    for call in snapshot["tool_calls"]:
        if call["call_id"] == call_id:
            return call
    raise AssertionError(f"no tool call {call_id!r} in the snapshot: {snapshot['tool_calls']}")


# ---------------------------------------------------------------- SSE


@dataclass
class SseEvent:
    id: str | None
    event: str
    data: dict[str, Any]


@dataclass
class SseStream:
    """The events of an open `text/event-stream` response, read with deadlines."""

    response: aiohttp.ClientResponse
    seen: list[SseEvent] = field(default_factory=list)

    async def next_event(self, timeout_s: float = SSE_DEADLINE_S) -> SseEvent:
        """The next event (comments and keep-alives skipped); fails the test after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no SSE event within {timeout_s} s (seen so far: {[e.event for e in self.seen]})")
            try:
                raw = await asyncio.wait_for(self.response.content.readline(), left)
            except TimeoutError:
                continue  # the deadline check above fails the test
            if not raw:
                pytest.fail(f"the event stream ended (seen: {[e.event for e in self.seen]})")
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
                continue
            if fields:
                event = SseEvent(fields.get("id"), fields.get("event", "message"), json.loads(fields["data"]))
                self.seen.append(event)
                return event

    async def until(
        self,
        predicate: Callable[[SseEvent], bool],
        timeout_s: float = SSE_DEADLINE_S,
    ) -> list[SseEvent]:
        """Events read up to and including the first that matches `predicate`."""
        deadline = time.monotonic() + timeout_s
        read: list[SseEvent] = []
        while True:
            event = await self.next_event(max(0.01, deadline - time.monotonic()))
            read.append(event)
            if predicate(event):
                return read


async def open_sse(
    api: HttpApi, session_id: str, *, last_event_id: str | None = None, after: str | None = None
) -> tuple[aiohttp.ClientResponse, SseStream]:
    """Open the session's event stream; the caller closes the response."""
    headers = api.auth_header("client")
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    params = {"after": after} if after is not None else None
    path = f"/v1/sessions/{session_id}/events"
    response = await api.session.get(
        api.url + path, headers=headers, params=params, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)
    )
    api.hits.append(("session_events", response.status))
    return response, SseStream(response)


__all__ = [
    "ADMIN_TOKEN",
    "CLIENT_TOKEN",
    "HttpApi",
    "Reply",
    "SseEvent",
    "SseStream",
    "TOKENS",
    "WORKER_TOKEN",
    "assert_error",
    "base_url",
    "call_view",
    "cluster_plan",
    "concrete_path",
    "expect",
    "free_ports",
    "model_result",
    "node_config",
    "open_sse",
    "role_for",
    "route_of",
    "single_node_config",
    "start_node",
    "tool",
    "tool_call",
]
