"""A fake dex-ha node for Worker SDK tests: only the worker routes of the API.

It records what the Worker sends (registrations, polls, heartbeats, results), hands out
tasks the test queues, and misbehaves on request: answer a heartbeat with cancel or 409,
a result with 409 or 400, or any route with 503 for the next N requests. Like the real
server, it answers 403 to a heartbeat or result whose worker_id is not the one that took
the task.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness.local_app import start_local_app
from harness.waiting import eventually

ROUTES = ("register", "poll", "heartbeat", "complete", "fail")


@dataclass
class Counters:
    """How many hand-outs are running (handed out, no result accepted yet), and the most ever."""

    outstanding: set[str] = field(default_factory=set)
    max_outstanding: int = 0

    def start(self, token: str) -> None:
        self.outstanding.add(token)
        self.max_outstanding = max(self.max_outstanding, len(self.outstanding))

    def end(self, token: str) -> None:
        self.outstanding.discard(token)


class FakeServer:
    def __init__(self, *, heartbeat_timeout_ms: int = 30_000) -> None:
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.url = ""
        # What the Worker sent.
        self.registrations: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.polls: list[dict[str, Any]] = []  # each body, plus "outstanding" when it arrived
        self.heartbeats: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.complete_tries: dict[str, int] = defaultdict(int)  # complete requests, 503-answered ones too
        self.completes: dict[str, list[Any]] = defaultdict(list)  # results of the complete requests served
        self.next_tasks_asked: dict[str, Any] = {}  # the `next_tasks` of each complete request
        self.eager_after: dict[str, str] = {}  # token -> token of a queued task handed out with its complete
        self.fails: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.log: list[tuple[str, str]] = []  # (route, token) in arrival order
        # What the fake answers.
        self.cancel_tokens: set[str] = set()  # heartbeat → {"cancel": true}
        self.stale_heartbeat_tokens: set[str] = set()  # heartbeat → 409
        self.stale_result_tokens: set[str] = set()  # complete/fail → 409
        self.refused_result_tokens: set[str] = set()  # complete → 400 invalid
        self.unavailable: dict[str, int] = defaultdict(int)  # route → answer 503 to the next N requests
        self.refused: dict[str, int] = {}  # route → answer every request with this 4xx status
        self.counters = Counters()
        self.handed_out: dict[str, dict[str, Any]] = {}
        self.taken_by: dict[str, str] = {}  # token -> the worker_id of the poll (or complete) that took it
        self._queue: list[dict[str, Any]] = []
        self._queued = asyncio.Event()
        self._tokens = itertools.count(1)
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        app = web.Application()
        app.router.add_put("/v1/agents/{name}", self._register)
        app.router.add_post("/v1/worker/poll", self._poll)
        app.router.add_post("/v1/worker/tasks/{token}/heartbeat", self._heartbeat)
        app.router.add_post("/v1/worker/tasks/{token}/complete", self._complete)
        app.router.add_post("/v1/worker/tasks/{token}/fail", self._fail)
        self._runner, self.url = await start_local_app(app, shutdown_timeout=0.1)
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------ test controls

    def add_task(
        self,
        kind: str,
        input: dict[str, Any],
        *,
        agent: str = "support",
        session_id: str = "s1",
        attempt: int = 1,
        idempotency_key: str | None = None,
        heartbeat_timeout_ms: int | None = None,
        named_agent: str | None = None,
    ) -> str:
        """Queue a task for the next poll of `agent`; returns its task token. The task
        names `named_agent` when given (a server/Worker mismatch), else `agent`."""
        token = f"tok-{next(self._tokens)}"
        self._queue.append(
            {
                "queue": agent,
                "task_token": token,
                "session_id": session_id,
                "turn_id": "t1",
                "step_id": f"st-{token}",
                "kind": kind,
                "attempt": attempt,
                "idempotency_key": idempotency_key,
                "input": input,
                "heartbeat_timeout_ms": heartbeat_timeout_ms or self.heartbeat_timeout_ms,
                "deadline_ms": None,
                "agent": named_agent or agent,
            }
        )
        self._queued.set()
        return token

    def add_tool_task(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str = "c1",
        kind: str = "CallTool",
        session_id: str = "s1",
        **extra_input: Any,
    ) -> str:
        return self.add_task(
            kind,
            {"call_id": call_id, "name": name, "arguments": arguments, **extra_input},
            session_id=session_id,
            idempotency_key=f"{session_id}:{call_id}",
        )

    def results_of(self, token: str) -> list[Any]:
        return self.completes[token]

    def deltas_of(self, token: str) -> list[dict[str, Any]]:
        return [d for body in self.heartbeats[token] for d in body.get("deltas", [])]

    async def wait_for(self, condition: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
        """Poll `condition` until it holds (returns something truthy); fail the test after `timeout_s`."""
        await eventually(condition, what, deadline_s=timeout_s, interval_s=0.005)

    # ------------------------------------------------------------ routes

    def _unavailable(self, route: str) -> web.Response | None:
        if route in self.refused:
            return web.json_response(
                {"error": "refused", "message": f"{route} refused by the test"}, status=self.refused[route]
            )
        if self.unavailable[route] > 0:
            self.unavailable[route] -= 1
            return web.json_response(
                {"error": "not_active", "message": "no active node", "leader_url": None},
                status=503,
                headers={"Retry-After": "0"},
            )
        return None

    async def _register(self, request: web.Request) -> web.Response:
        if (busy := self._unavailable("register")) is not None:
            return busy
        name = request.match_info["name"]
        self.registrations[name].append(await request.json())
        return web.json_response({"name": name})

    async def _poll(self, request: web.Request) -> web.Response:
        if (busy := self._unavailable("poll")) is not None:
            return busy
        body = await request.json()
        self.polls.append({**body, "outstanding": len(self.counters.outstanding)})
        deadline = time.monotonic() + body["wait_ms"] / 1000
        while not self._matching(body["agents"]):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return web.json_response({"tasks": []})
            self._queued.clear()
            try:
                await asyncio.wait_for(self._queued.wait(), remaining)
            except TimeoutError:
                pass
        tasks = self._matching(body["agents"])[: body["max_tasks"]]
        for task in tasks:
            self._queue.remove(task)
            self.handed_out[task["task_token"]] = task
            self.taken_by[task["task_token"]] = body["worker_id"]
            self.counters.start(task["task_token"])
        return web.json_response({"tasks": [{k: v for k, v in t.items() if k != "queue"} for t in tasks]})

    def _not_owner(self, token: str, body: dict[str, Any]) -> web.Response | None:
        """403 unless the report carries the worker_id that took the task."""
        if body.get("worker_id") == self.taken_by.get(token):
            return None
        return web.json_response(
            {
                "error": "forbidden",
                "message": f"worker_id: task {token} was handed to "
                f"{self.taken_by.get(token)!r}, not {body.get('worker_id')!r}",
            },
            status=403,
        )

    def _matching(self, agents: list[str]) -> list[dict[str, Any]]:
        return [task for task in self._queue if task["queue"] in agents]

    async def _heartbeat(self, request: web.Request) -> web.Response:
        if (busy := self._unavailable("heartbeat")) is not None:
            return busy
        token = request.match_info["token"]
        body = await request.json()
        self.heartbeats[token].append(body)
        self.log.append(("heartbeat", token))
        if (not_owner := self._not_owner(token, body)) is not None:
            return not_owner
        if token in self.stale_heartbeat_tokens:
            return _stale()
        return web.json_response({"cancel": token in self.cancel_tokens})

    async def _complete(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        self.complete_tries[token] += 1
        if (busy := self._unavailable("complete")) is not None:
            return busy
        body = await request.json()
        self.completes[token].append(body["result"])
        self.log.append(("complete", token))
        if (not_owner := self._not_owner(token, body)) is not None:
            return not_owner
        if token in self.stale_result_tokens:
            return _stale()
        if token in self.refused_result_tokens:
            return web.json_response(
                {"error": "invalid", "message": "result.status must be ok, error, question or task"}, status=400
            )
        self.counters.end(token)
        self.next_tasks_asked[token] = body.get("next_tasks")
        eager = self.eager_after.get(token)
        if eager is not None and body.get("next_tasks"):
            task = next(t for t in self._queue if t["task_token"] == eager)
            self._queue.remove(task)
            self.handed_out[eager] = task
            self.taken_by[eager] = body["worker_id"]
            self.counters.start(eager)
            return web.json_response({"tasks": [{k: v for k, v in task.items() if k != "queue"}]})
        return web.json_response({})

    async def _fail(self, request: web.Request) -> web.Response:
        if (busy := self._unavailable("fail")) is not None:
            return busy
        token = request.match_info["token"]
        body = await request.json()
        self.fails[token].append(body)
        self.log.append(("fail", token))
        if (not_owner := self._not_owner(token, body)) is not None:
            return not_owner
        if token in self.stale_result_tokens:
            return _stale()
        self.counters.end(token)
        return web.json_response({})


def _stale() -> web.Response:
    return web.json_response({"error": "stale_attempt", "message": "the attempt is no longer current"}, status=409)
