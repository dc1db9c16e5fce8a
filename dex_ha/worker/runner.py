"""The Worker: registers its agents, long-polls the server for tasks, runs each task in
its own asyncio task with heartbeats, and delivers the result.

    worker = Worker("http://127.0.0.1:8801", agents=[agent])
    runner = asyncio.create_task(worker.run())
    ...
    await worker.stop()          # drain, then cancel what is left
    await runner

Every HTTP call goes through `dex_ha.client.Connection`, which retries transport errors
and 503s forever while following the active node, so a failover costs the Worker nothing
but a pause. Results are fenced by the server (step, attempt, term): a 409 means the
attempt is no longer current, and the Worker drops what it was doing for it.

`poll_concurrency` polls (default 2) are in flight at once, each asking for its share of
the free slots, so the server can hand out work to one while another's answer is on its
way; together they never ask for more than `max_concurrency - running`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from dex_ha.client.connection import Connection, DexError, DexUnavailable
from dex_ha.client.env import TOKEN_VAR, WORKER_TOKEN_VAR, namespace_from_env, token_from_env, urls_from_env
from dex_ha.failpoints import Failpoints
from dex_ha.worker.agent import Agent, Tool
from dex_ha.worker.channel import ChannelLink, ChannelRefused
from dex_ha.worker.context import (
    ArgumentsRefused,
    AttemptCancelled,
    NonRetryableError,
    Pending,
    QuestionAsked,
    TaskHandle,
    ToolContext,
    ToolError,
)
from dex_ha.worker.model import ModelRequest, ModelResponse
from dex_ha.worker_protocol import CANCEL_REQUESTED, Report, Task

log = logging.getLogger("dex_ha.worker")

# Task kinds (contract strings of the API).
RUN_MODEL = "RunModel"
CALL_TOOL = "CallTool"
CALL_SINGLE_ATTEMPT_TOOL = "CallSingleAttemptTool"
POLL_TOOL_TASK = "PollToolTask"
COMPACT_CONTEXT = "CompactContext"

# How a Worker reaches the server: the Worker channel, falling back to HTTP long polls when
# the server has none ("auto", the default); the channel only; HTTP only. DEX_HA_WORKER_TRANSPORT
# sets it for Workers that do not say.
AUTO, CHANNEL, HTTP = "auto", "channel", "http"
TRANSPORTS = (AUTO, CHANNEL, HTTP)
TRANSPORT_VAR = "DEX_HA_WORKER_TRANSPORT"
# How long stop() waits for the acks of the last reports on the channel.
ACK_WAIT_S = 5.0
# After a delta, wait this long before the heartbeat that carries it, so a burst of
# deltas travels in one request; well under the ~100 ms a live stream can afford.
DELTA_BATCH_S = 0.03
MAX_HEARTBEAT_INTERVAL_S = 5.0
MIN_HEARTBEAT_INTERVAL_S = 0.01
# How long stop() waits for cancelled tasks to unwind (a sync tool in a thread cannot be
# interrupted; its thread keeps running, but the Worker no longer waits for it).
CANCEL_GRACE_S = 1.0
# Pause after a poll the server refused (a 4xx other than auth), so the loop cannot spin.
POLL_ERROR_PAUSE_S = 1.0
# A long poll's request timeout is its wait plus this margin.
POLL_TIMEOUT_MARGIN_S = 10.0
# An empty poll answer that came back faster than this is followed by a pause of this
# length, so a server that does not hold polls (or poll_wait_ms=0) cannot make us spin.
EMPTY_POLL_PAUSE_S = 0.05

# Crash points of the Worker (armed with DEX_HA_FAILPOINTS, see dex_ha.failpoints): the
# moments of the crash matrix that only the Worker process itself knows.
WORKER_FAILPOINTS = (
    "worker.<Kind>.before-first-heartbeat",  # an attempt of that task kind runs; its first heartbeat is not sent
    "worker.PollToolTask.during-poll",  # the poll function returned; its answer is not delivered
    "worker.complete.after-send",  # the server accepted a result; the Worker has not gone on
    "worker.channel.before-results",  # on the channel: a frame of reports is ready; it is not sent
)


def first_heartbeat_failpoint(kind: str) -> str:
    return f"worker.{kind}.before-first-heartbeat"


# The one shape of a task (dex_ha.worker_protocol), under the name this SDK gave it first.
WorkerTask = Task


def _task_path(task: Task, action: str) -> str:
    return f"/v1/worker/tasks/{quote(task.task_token, safe='')}/{action}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a finished task delivers: `complete` with `result`, or `fail` with `error`."""

    result: Any = None
    error: str | None = None
    retryable: bool = True
    not_started: bool = False  # no tool or model function was called for this attempt

    @property
    def failed(self) -> bool:
        return self.error is not None


class Unrunnable(Exception):
    """The Worker cannot run this task at all (unknown agent, tool or kind; a tool that
    breaks the protocol): it fails with retryable=False, since another attempt on the
    same code would fail the same way."""


class NotStarted(Unrunnable):
    """Unrunnable, found before any tool or model function was called (unknown kind,
    agent or tool; arguments refused): the fail report says `not_started`, so the server
    may record the tool call as not run instead of outcome_unknown."""


class AttemptSink:
    """What a running attempt talks to: the `DeltaSink` a model streams into, the
    `ToolContext.heartbeat` a tool calls, and the server's word to stop (`_stop`). On HTTP
    the deltas travel in heartbeats (AttemptHeartbeats), on the channel in its frames
    (ChannelAttempt)."""

    def __init__(self, task: Task, failpoints: Failpoints | None) -> None:
        self._task = task
        self._failpoints = failpoints
        self._pending: list[dict[str, Any]] = []
        self.stopped = False  # the server said stop: deliver no result for this attempt
        self.cancelled_by_server = False  # stop because of a cancel (not a 409 / not current)
        self.stop_reason = ""
        self.on_stop: Callable[[], None] | None = None
        self.contexts: list[ToolContext] = []  # marked cancelled when the server says stop

    def send_text(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        if text:
            self.send({"text": text})

    def send(self, delta: dict[str, Any]) -> None:
        if not isinstance(delta, dict):
            raise TypeError(f"delta must be a dict, got {type(delta).__name__}")
        self._pending.append(delta)
        self._queued()

    def _queued(self) -> None:
        """A delta was queued: see that it travels soon."""

    async def beat_with_progress(self, progress: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _stop(self, reason: str, *, cancelled_by_server: bool) -> None:
        self.stopped, self.stop_reason = True, reason
        self.cancelled_by_server = cancelled_by_server
        for ctx in self.contexts:
            ctx.cancelled = True
        if self.on_stop is not None:
            self.on_stop()


class ChannelAttempt(AttemptSink):
    """An attempt of a Worker on the channel: no heartbeats (the open channel keeps it
    alive); its deltas go in the channel's next frame; a `cancel` frame stops it."""

    def __init__(self, task: Task, link: ChannelLink, failpoints: Failpoints | None) -> None:
        super().__init__(task, failpoints)
        self._link = link
        self._first = True  # nothing of this attempt was sent yet

    def _queued(self) -> None:
        self.first_message()
        deltas, self._pending = self._pending, []
        self._link.send_deltas(self._task.task_token, deltas)

    def first_message(self) -> None:
        """Before the first delta or progress of this attempt goes to the server, or one
        heartbeat interval into an attempt that sent nothing (see
        Worker._first_message_deadline): the moment of the failpoint that HTTP hits before
        the first heartbeat."""
        if self._first:
            self._first = False
            if self._failpoints is not None:
                self._failpoints.hit(first_heartbeat_failpoint(self._task.kind))

    async def beat_with_progress(self, progress: dict[str, Any]) -> bool:
        """`ToolContext.heartbeat`: progress travels as a delta `{"progress": {...}}`; with
        none, nothing is sent (the open channel keeps the attempt alive)."""
        self.first_message()
        if progress:
            self.send({"progress": progress})
        await asyncio.sleep(0)  # a cancel frame read meanwhile is seen by the caller
        return not self.stopped


class AttemptHeartbeats(AttemptSink):
    """The heartbeats of one running attempt on HTTP, and the live deltas they carry.

    A delta wakes the heartbeat loop, which sends it (with any others that arrived
    meanwhile) within DELTA_BATCH_S. When the server answers `{"cancel": true}` or 409 it
    calls `on_stop` once and sends no more.
    """

    def __init__(
        self,
        conn: Connection,
        task: Task,
        worker_id: str,
        interval_s: float,
        failpoints: Failpoints | None = None,
    ) -> None:
        super().__init__(task, failpoints)
        self._conn = conn
        self._first = True  # no heartbeat of this attempt was sent yet
        self._worker_id = worker_id  # the server answers 403 to any other Worker's heartbeat
        self._interval_s = interval_s
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one heartbeat at a time keeps the deltas in order

    def _queued(self) -> None:
        self._wake.set()

    async def beat(self) -> bool:
        """Send one heartbeat with the queued deltas; False once the attempt must stop."""
        async with self._lock:
            if self.stopped:
                return False
            if self._first and self._failpoints is not None:
                self._failpoints.hit(first_heartbeat_failpoint(self._task.kind))
            self._first = False
            deltas, self._pending = self._pending, []
            body: dict[str, Any] = {"worker_id": self._worker_id}
            if deltas:
                body["deltas"] = deltas
            try:
                answer = await self._conn.request(
                    "POST",
                    _task_path(self._task, "heartbeat"),
                    body,
                    timeout_s=max(1.0, self._task.heartbeat_timeout_ms / 1000),
                )
            except DexError as exc:
                if exc.status == 409:
                    self._stop("the attempt is no longer current (409)", cancelled_by_server=False)
                else:  # not fatal: the next heartbeat may get through
                    log.error("%s: heartbeat refused: %s", self._task, exc)
            else:
                if isinstance(answer, dict) and answer.get("cancel") is True:
                    self._stop("the server cancelled it", cancelled_by_server=True)
            return not self.stopped

    async def flush(self) -> bool:
        """Let a heartbeat in flight finish, then send the deltas still queued; False
        when the attempt must stop."""
        async with self._lock:
            pass
        if self._pending:
            return await self.beat()
        return not self.stopped

    async def run(self) -> None:
        """Heartbeat every interval, and soon after each delta, until stopped or cancelled."""
        while not self.stopped:
            try:
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            else:
                await asyncio.sleep(DELTA_BATCH_S)
            self._wake.clear()
            await self.beat()

    async def beat_with_progress(self, progress: dict[str, Any]) -> bool:
        """`ToolContext.heartbeat`: progress travels as a delta `{"progress": {...}}`.
        Queued without waking the loop: this heartbeat carries it now."""
        if progress:
            self._pending.append({"progress": progress})
        return await self.beat()


class Worker:
    """Runs the tasks of its agents: poll, run with heartbeats, deliver (see module doc).

    ``urls`` is one URL, a list, or a comma-separated string. Left out (None), they come
    from the environment that ``tokens.env`` of ``dex-ha cluster up`` sets: ``urls`` from
    ``DEX_HA_URLS`` (else http://127.0.0.1:8801, where ``dex-ha dev`` listens) and
    ``token`` from ``DEX_HA_WORKER_TOKEN``, else ``DEX_HA_TOKEN`` (else no token).

    ``namespace``: the namespace whose agents this Worker registers and serves; left out,
    ``DEX_HA_NAMESPACE``, else none is named and the server uses ``default`` (or the only
    namespace of a token limited to one).
    """

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        token: str | None = None,
        agents: Sequence[Agent] = (),
        worker_id: str | None = None,
        max_concurrency: int = 8,
        poll_wait_ms: int = 20_000,
        heartbeat_interval_s: float | None = None,
        drain_timeout_s: float = 30.0,
        poll_concurrency: int = 2,
        eager: bool = True,
        on_result: Callable[[WorkerTask, Outcome], None] | None = None,
        namespace: str | None = None,
        transport: str | None = None,
        **connection_kwargs: Any,
    ) -> None:
        self._agents = _check_agents(agents)
        if transport is None:
            transport = os.environ.get(TRANSPORT_VAR) or AUTO
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.transport = transport
        if worker_id is not None and (not isinstance(worker_id, str) or not worker_id):
            raise ValueError("worker_id must be a non-empty string or None")
        if not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive integer, got {max_concurrency!r}")
        if not isinstance(poll_wait_ms, int) or isinstance(poll_wait_ms, bool) or poll_wait_ms < 0:
            raise ValueError(f"poll_wait_ms must be a non-negative integer, got {poll_wait_ms!r}")
        if heartbeat_interval_s is not None and not heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s must be > 0 or None, got {heartbeat_interval_s!r}")
        if not drain_timeout_s >= 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {drain_timeout_s!r}")
        if not isinstance(poll_concurrency, int) or isinstance(poll_concurrency, bool) or poll_concurrency < 1:
            raise ValueError(f"poll_concurrency must be a positive integer, got {poll_concurrency!r}")
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.max_concurrency = max_concurrency
        self.poll_wait_ms = poll_wait_ms
        self.heartbeat_interval_s = heartbeat_interval_s
        self.drain_timeout_s = drain_timeout_s
        # Several polls in flight: while one answer travels back, the server can already
        # hand out the next steps to another poll (as Temporal's pollers do).
        self.poll_concurrency = min(poll_concurrency, max_concurrency)
        # Eager dispatch: a result also asks for the session's next step, which comes back
        # in the answer (committed with the result), saving a poll per step of a turn.
        self.eager = eager
        self.on_result = on_result  # called for each result (complete or fail) the server accepted
        if urls is None:
            urls = urls_from_env()
        if token is None:
            token = token_from_env(WORKER_TOKEN_VAR, TOKEN_VAR)
        if namespace is None:
            namespace = namespace_from_env()
        self._conn = Connection(urls, token, namespace=namespace, **connection_kwargs)
        self._failpoints = Failpoints()  # inert unless DEX_HA_FAILPOINTS arms them (crash tests)
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_or_stop = asyncio.Event()  # set when a task ends or stop() begins
        self._stop_requested = asyncio.Event()
        self._loop_exited = asyncio.Event()
        self._in_flight: set[asyncio.Task[Any]] = set()  # the registration or poll requests
        self._reserved = 0  # slots promised to polls in flight (max_tasks they asked for)
        self._polls_in_flight = 0
        self._started = False
        self.completed = 0  # tasks whose result (complete or fail) the server accepted
        self._link: ChannelLink | None = None  # the Worker channel, while the Worker uses it
        self._attempts: dict[str, ChannelAttempt] = {}  # running on the channel, by task token
        self._reported: dict[str, tuple[Task, Outcome]] = {}  # reports on the channel awaiting their ack

    @property
    def running(self) -> int:
        """Tasks running now (never more than max_concurrency)."""
        return len(self._tasks)

    @property
    def agents(self) -> dict[str, Agent]:
        return dict(self._agents)

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Register every agent, then poll and run tasks until `stop()`.

        Raises DexError when the server refuses the registration, or a poll for
        authentication (401/403): both are configuration errors that retrying cannot fix.
        """
        if self._started:
            raise RuntimeError("Worker.run() was already called; make a new Worker")
        self._started = True
        clean_exit = False
        try:
            if not self._stop_requested.is_set():
                await self._register_agents()
            if self.transport == HTTP or self._stop_requested.is_set() or not await self._run_on_channel():
                await self._poll_until_stopped()
            clean_exit = True
        finally:
            self._loop_exited.set()
            if not clean_exit:  # an error or an outside cancel: nobody will drain
                await self._cancel_running()
                await self._conn.close()

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        """Stop polling; let running tasks finish for up to the drain timeout; cancel the
        rest (the server fails their attempts when their heartbeats stop)."""
        timeout = self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self._stop_requested.set()
        self._slot_or_stop.set()
        for request in list(self._in_flight):
            request.cancel()
        link = self._link
        if link is not None:  # the channel stays open while the attempts finish and their reports go
            await self._drain(timeout)
            await link.settle(ACK_WAIT_S)
            await link.close()
        if self._started:
            await self._loop_exited.wait()  # tasks from a poll answered just now are started first
        await self._drain(timeout)
        await self._conn.close()

    async def _drain(self, timeout: float) -> None:
        if self._tasks:
            log.info(
                "worker %s stopping: draining %d running tasks (up to %.1f s)",
                self.worker_id,
                len(self._tasks),
                timeout,
            )
            await asyncio.wait(set(self._tasks), timeout=timeout)
        if self._tasks:
            log.warning(
                "worker %s: %d tasks still running after the drain timeout; cancelling them",
                self.worker_id,
                len(self._tasks),
            )
            await self._cancel_running()

    # ------------------------------------------------------------ the Worker channel

    async def _run_on_channel(self) -> bool:
        """Run on the Worker channel until stop(); False when the server has none (an
        older server) and `transport` is "auto": the Worker polls over HTTP instead."""
        link = self._link = ChannelLink(
            self._conn, self.worker_id, list(self._agents), self, failpoints=self._failpoints
        )
        try:
            await link.run(self._stop_requested)
        except ChannelRefused as refused:
            self._link = None
            if self.transport == CHANNEL:
                raise refused.error from None
            log.info("worker %s: the server has no Worker channel (%s); polling over HTTP", self.worker_id, refused)
            return False
        return True

    def free_slots(self) -> int:
        return 0 if self._stop_requested.is_set() else self.max_concurrency - self.running

    def on_tasks(self, tasks: list[Any]) -> None:
        for raw in tasks:
            self._start(raw)

    def on_cancel(self, task_token: str, reason: str) -> None:
        attempt = self._attempts.get(task_token)
        if attempt is None or attempt.stopped:
            return
        if reason == CANCEL_REQUESTED:
            attempt._stop("the server cancelled it", cancelled_by_server=True)
        else:
            attempt._stop("the attempt is no longer current", cancelled_by_server=False)

    def on_welcome(self, held: list[str]) -> None:
        """A channel opened: the attempts still running here that the node does not list as
        held are no longer this Worker's (a takeover failed them, or the channel stayed closed
        past its grace). Stop them and send nothing, as an HTTP Worker does on a 409."""
        for token, attempt in list(self._attempts.items()):
            if token not in held and not attempt.stopped:
                attempt._stop("the node no longer holds this attempt", cancelled_by_server=False)

    def on_ack(self, report: Report, ack: dict[str, Any]) -> None:
        task, outcome = self._reported.pop(report.task_token, (None, None))
        if task is None or outcome is None:
            return
        status = ack.get("status")
        if status == 200:
            if report.outcome == "complete":
                self._failpoints.hit("worker.complete.after-send")
            self._accepted(task, outcome)
        elif status == 409:
            log.info("%s: report not needed any more (409: %s)", task, ack.get("message"))
        elif report.outcome == "complete" and status in (400, 413):
            log.error("%s: the server refused the result (%s): %s", task, status, ack.get("message"))
            refused = Outcome(error=f"the server refused the result: {ack.get('message')}", retryable=False)
            self._report_on_channel(task, refused, credit=0)
        else:
            log.error(
                "%s: the server refused the report (%s %s): %s", task, status, ack.get("error"), ack.get("message")
            )

    def _accepted(self, task: Task, outcome: Outcome) -> None:
        self.completed += 1
        log.debug("%s: %s", task, "completed" if not outcome.failed else f"reported failed: {outcome.error}")
        if self.on_result is not None:
            self.on_result(task, outcome)

    def _report_on_channel(self, task: Task, outcome: Outcome, *, credit: int) -> None:
        assert self._link is not None
        self._reported[task.task_token] = (task, outcome)
        report = (
            Report(
                task.task_token,
                "fail",
                error=outcome.error or "",
                retryable=outcome.retryable,
                not_started=outcome.not_started,
            )
            if outcome.failed
            else Report(task.task_token, "complete", result=outcome.result)
        )
        self._link.report(report, credit=credit)

    async def _run_on_the_channel(self, task: Task, link: ChannelLink) -> None:
        """One attempt on the channel, in this one asyncio task: run it, then queue its
        report with the slot it frees (they travel in one frame, and the server spends that
        slot on the next step in the report's own entry)."""
        me = asyncio.current_task()
        assert me is not None
        attempt = self._attempts[task.task_token] = ChannelAttempt(task, link, self._failpoints)
        attempt.on_stop = lambda: _cancel_from_outside(me)
        slot_given = False
        first_message_due = self._first_message_deadline(task, attempt)
        try:
            try:
                outcome: Outcome | None = await self._execute(task, attempt)
            except asyncio.CancelledError:
                if not attempt.stopped:  # stop(): the Worker itself is going away
                    raise
                me.uncancel()
            if attempt.stopped:
                outcome = self._stopped_outcome(task, attempt)
            if outcome is not None:
                # No failpoint here: an HTTP Worker's report is no heartbeat either, so an
                # attempt that ends before its first heartbeat reports on both transports.
                self._tasks.discard(me)  # its slot is free now: the credit rides with the report
                slot_given = True
                self._report_on_channel(task, outcome, credit=0 if self._stop_requested.is_set() else 1)
        finally:
            if first_message_due is not None:
                first_message_due.cancel()
            self._attempts.pop(task.task_token, None)
            if not slot_given and not self._stop_requested.is_set():
                self._tasks.discard(me)
                link.add_credit(1)

    def _first_message_deadline(self, task: Task, attempt: ChannelAttempt) -> asyncio.TimerHandle | None:
        """With the first-heartbeat failpoint armed (crash tests only), reach it one heartbeat
        interval into an attempt that sent nothing yet: the moment an HTTP Worker's first
        heartbeat would leave, so a tool that hangs silently is killed mid-run on both
        transports. Unarmed, nothing is scheduled."""
        if self._failpoints is None or not self._failpoints.armed(first_heartbeat_failpoint(task.kind)):
            return None
        return asyncio.get_running_loop().call_later(self._interval_for(task), attempt.first_message)

    # ------------------------------------------------------------ registration and polling

    async def _register_agents(self) -> None:
        for agent in self._agents.values():
            path = f"/v1/agents/{quote(agent.name, safe='')}"
            await self._interruptible(self._conn.request("PUT", path, agent.definition()))
            if self._stop_requested.is_set():
                return
            log.info("worker %s registered agent %s (%d tools)", self.worker_id, agent.name, len(agent.tools))

    async def _poll_until_stopped(self) -> None:
        pollers = [asyncio.create_task(self._poller()) for _ in range(self.poll_concurrency)]
        try:
            await asyncio.gather(*pollers)
        finally:
            for poller in pollers:
                poller.cancel()
            await asyncio.gather(*pollers, return_exceptions=True)

    def _free_slots(self) -> int:
        return self.max_concurrency - self.running - self._reserved

    async def _poller(self) -> None:
        """One poll loop; each asks for its share of the slots no other poll has claimed,
        so running + promised tasks never exceed max_concurrency."""
        while not self._stop_requested.is_set():
            free = self._free_slots()
            if free <= 0:
                self._slot_or_stop.clear()
                if self._free_slots() <= 0 and not self._stop_requested.is_set():
                    await self._slot_or_stop.wait()
                continue
            idle_pollers = self.poll_concurrency - self._polls_in_flight  # this one included
            ask = -(-free // idle_pollers)  # ceil: a lone free slot is still asked for
            self._reserved += ask
            self._polls_in_flight += 1
            asked_at = time.monotonic()
            try:
                tasks = await self._poll(ask)
                for raw in tasks:
                    self._start(raw)
            finally:
                self._reserved -= ask
                self._polls_in_flight -= 1
                self._slot_or_stop.set()  # the slots this poll did not fill are free again
            if not tasks and time.monotonic() - asked_at < EMPTY_POLL_PAUSE_S:
                await self._pause(EMPTY_POLL_PAUSE_S)

    async def _poll(self, max_tasks: int) -> list[Any]:
        """One long poll for up to `max_tasks` tasks; [] when interrupted or refused."""
        body = {
            "worker_id": self.worker_id,
            "agents": list(self._agents),
            "max_tasks": max_tasks,
            "wait_ms": self.poll_wait_ms,
        }
        request = self._conn.request(
            "POST", "/v1/worker/poll", body, timeout_s=self.poll_wait_ms / 1000 + POLL_TIMEOUT_MARGIN_S
        )
        try:
            answer = await self._interruptible(request)
        except DexError as exc:
            if exc.status in (401, 403):
                raise
            log.error("worker %s: poll refused: %s", self.worker_id, exc)
            await self._pause(POLL_ERROR_PAUSE_S)
            return []
        tasks = answer.get("tasks") if isinstance(answer, dict) else None
        if not isinstance(tasks, list):
            return []  # interrupted by stop() (None), or an answer without a task list
        if len(tasks) > max_tasks:  # never run more than max_concurrency
            log.warning(
                "worker %s: asked for %d tasks, got %d; ignoring the extra ones (they time out)",
                self.worker_id,
                max_tasks,
                len(tasks),
            )
        return list(tasks[:max_tasks])

    async def _interruptible(self, request: Coroutine[Any, Any, Any]) -> Any:
        """Await `request` in a task that stop() can cancel; None when it did."""
        task = asyncio.ensure_future(request)
        self._in_flight.add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._in_flight.discard(task)
        return None if task.cancelled() else task.result()

    async def _pause(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._stop_requested.wait()
        except TimeoutError:
            pass

    def _start(self, raw: Any) -> None:
        try:
            task = Task.from_json(raw)
        except (TypeError, ValueError) as exc:  # without a usable token there is nobody to tell
            log.error("worker %s: ignoring a malformed task (%s): %r", self.worker_id, exc, raw)
            return
        work = self._run_task(task) if self._link is None else self._run_on_the_channel(task, self._link)
        runner = asyncio.create_task(work, name=f"dex-ha {task}")
        self._tasks.add(runner)
        runner.add_done_callback(self._task_ended)

    def _task_ended(self, runner: asyncio.Task[None]) -> None:
        self._tasks.discard(runner)
        self._slot_or_stop.set()

    async def _cancel_running(self) -> None:
        running = set(self._tasks)
        for runner in running:
            runner.cancel()
        if running:
            await asyncio.wait(running, timeout=CANCEL_GRACE_S)

    # ------------------------------------------------------------ one task

    async def _run_task(self, task: WorkerTask) -> None:
        log.debug("%s: start (session %s)", task, task.session_id)
        try:
            outcome = await self._work(task)
            if outcome is not None:
                await self._deliver(task, outcome)
        except asyncio.CancelledError:
            log.debug("%s: cancelled inside the Worker; no result sent", task)
            raise
        except Exception:  # a bug in the Worker itself: keep the other tasks running
            log.exception("%s: the Worker failed while running it", task)
        log.debug("%s: end", task)

    async def _work(self, task: WorkerTask) -> Outcome | None:
        """Run the task with heartbeats; None when the server said stop (deliver nothing)."""
        heartbeats = AttemptHeartbeats(self._conn, task, self.worker_id, self._interval_for(task), self._failpoints)
        work = asyncio.create_task(self._execute(task, heartbeats))
        heartbeats.on_stop = lambda: _cancel_from_outside(work)
        beating = asyncio.create_task(heartbeats.run())
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:  # stop(): the work must not outlive its runner
            work.cancel()
            beating.cancel()
            await asyncio.wait({beating, work}, timeout=CANCEL_GRACE_S)
            raise
        try:
            if heartbeats.stopped:
                return self._stopped_outcome(task, heartbeats)
            if work.cancelled():  # the tool itself raised CancelledError
                return Outcome(error="the task was cancelled inside the Worker", retryable=True)
            # The last deltas reach the server before the result, so a stream ends complete.
            if not await heartbeats.flush():
                return self._stopped_outcome(task, heartbeats)
            return work.result()
        finally:
            beating.cancel()

    @staticmethod
    def _stopped_outcome(task: WorkerTask, heartbeats: AttemptSink) -> Outcome | None:
        """The server said stop. After a cancel, report that the work stopped, so the
        attempt ends now instead of at its heartbeat timeout (and a graceful drain does not
        wait for it). After a 409 the attempt is someone else's business: send nothing."""
        log.info("%s: %s; dropping its result", task, heartbeats.stop_reason)
        if heartbeats.cancelled_by_server:
            return Outcome(error="cancelled: the Worker stopped the attempt at the server's request", retryable=False)
        return None

    def _interval_for(self, task: WorkerTask) -> float:
        if self.heartbeat_interval_s is not None:
            return self.heartbeat_interval_s
        return max(MIN_HEARTBEAT_INTERVAL_S, min(task.heartbeat_timeout_ms / 3000, MAX_HEARTBEAT_INTERVAL_S))

    async def _execute(self, task: WorkerTask, heartbeats: AttemptSink) -> Outcome:
        """Dispatch by kind; every exception becomes a `fail` outcome."""
        handlers: dict[str, Callable[[WorkerTask, Agent, AttemptSink], Awaitable[Any]]] = {
            RUN_MODEL: self._run_model,
            CALL_TOOL: self._call_tool,
            CALL_SINGLE_ATTEMPT_TOOL: self._call_tool,
            POLL_TOOL_TASK: self._poll_tool_task,
            COMPACT_CONTEXT: self._compact_context,
        }
        try:
            handler = handlers.get(task.kind)
            if handler is None:
                raise NotStarted(f"this Worker does not know the task kind {task.kind!r}")
            result = await handler(task, self._agent_for(task), heartbeats)
            _check_json(result)
            return Outcome(result=result)
        except Unrunnable as exc:
            log.error("%s: cannot run it: %s", task, exc)
            return Outcome(error=str(exc), retryable=False, not_started=isinstance(exc, NotStarted))
        except AttemptCancelled:
            return Outcome(error="cancelled by the server", retryable=True)  # dropped: heartbeats.stopped
        except NonRetryableError as exc:
            log.error("%s: failed, not to be retried: %s", task, exc)
            return Outcome(error=f"{type(exc).__name__}: {exc}", retryable=False)
        except Exception as exc:
            log.exception("%s: raised %s: %s", task, type(exc).__name__, exc)
            return Outcome(error=f"{type(exc).__name__}: {exc}", retryable=True)

    def _agent_for(self, task: WorkerTask) -> Agent:
        name = task.agent
        if name is None and len(self._agents) == 1:
            name = next(iter(self._agents))
        agent = self._agents.get(name) if name is not None else None
        if agent is None:
            raise NotStarted(f"this Worker has no agent {name!r}")
        return agent

    def _context(
        self, task: WorkerTask, heartbeats: AttemptSink, *, call_id: str | None, idempotency_key: str | None
    ) -> ToolContext:
        ctx = ToolContext(
            session_id=task.session_id,
            turn_id=task.turn_id,
            step_id=task.step_id,
            call_id=call_id,
            attempt=task.attempt,
            idempotency_key=idempotency_key,
            worker_id=self.worker_id,
            answer=task.input.get("answer"),
            has_answer="answer" in task.input,
            send_heartbeat=heartbeats.beat_with_progress,
        )
        heartbeats.contexts.append(ctx)
        return ctx

    # ------------------------------------------------------------ task kinds

    async def _run_model(self, task: WorkerTask, agent: Agent, heartbeats: AttemptSink) -> dict[str, Any]:
        if agent.model is None:
            raise NotStarted(f"agent {agent.name!r} has no model")
        request = ModelRequest(
            history=list(task.input.get("history") or []),
            summary=task.input.get("summary"),
            tools=list(task.input.get("tools") or []),
        )
        response = ModelResponse.coerce(await agent.model.respond(request, heartbeats), "the model's response")
        calls = []
        for i, call in enumerate(response.tool_calls):
            if not call.id:
                raise ValueError(f"the model's tool_calls[{i}] has no id")
            entry = call.as_json()
            tool = agent.tools.get(call.name)
            if tool is not None and tool.inline:
                entry["result"] = await self._run_inline(task, heartbeats, tool, call.id, call.arguments)
            calls.append(entry)
        return {"content": response.content, "tool_calls": calls, "usage": dict(response.usage)}

    async def _run_inline(
        self, task: WorkerTask, heartbeats: AttemptSink, tool: Tool, call_id: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """An inline tool runs inside the model call; its result rides in the RunModel
        result. An exception (not ToolError) fails the whole RunModel attempt, which
        then runs again with its inline tools (at-least-once)."""
        ctx = self._context(task, heartbeats, call_id=call_id, idempotency_key=f"{task.session_id}:{call_id}")
        try:
            value = await tool.invoke(ctx, arguments)
        except ToolError as exc:
            return {"status": "error", "error": exc.message}
        except QuestionAsked:
            return {"status": "error", "error": f"inline tool {tool.name!r} cannot ask the user a question"}
        if isinstance(value, (TaskHandle, Pending)):
            return {"status": "error", "error": f"inline tool {tool.name!r} cannot be long-running"}
        return {"status": "ok", "output": value}

    async def _call_tool(self, task: WorkerTask, agent: Agent, heartbeats: AttemptSink) -> dict[str, Any]:
        tool = _tool_for(agent, task)
        ctx = self._context(task, heartbeats, call_id=task.input.get("call_id"), idempotency_key=task.idempotency_key)
        try:
            value = await tool.invoke(ctx, task.input.get("arguments") or {})
        except ArgumentsRefused as exc:  # before the function was called: it did not run
            raise NotStarted(exc.message) from None
        except ToolError as exc:
            return {"status": "error", "error": exc.message}
        except QuestionAsked as asked:
            return {"status": "question", "question": asked.question}
        if isinstance(value, TaskHandle):
            if tool.poll_fn is None:
                raise Unrunnable(f"tool {tool.name!r} returned a task handle but has no poll function")
            return {"status": "task", "handle": value.handle, "poll_after_ms": value.poll_after_ms}
        if isinstance(value, Pending):
            raise Unrunnable(f"tool {tool.name!r} returned ctx.pending(); only its poll function may")
        return {"status": "ok", "output": value}

    async def _poll_tool_task(self, task: WorkerTask, agent: Agent, heartbeats: AttemptSink) -> dict[str, Any]:
        tool = _tool_for(agent, task)
        if tool.poll_fn is None:
            raise NotStarted(f"tool {tool.name!r} has no poll function")
        ctx = self._context(task, heartbeats, call_id=task.input.get("call_id"), idempotency_key=task.idempotency_key)
        try:
            value = await tool.invoke_poll(ctx, task.input.get("handle"))
        except ToolError as exc:
            return {"status": "error", "error": exc.message}
        except QuestionAsked:
            raise Unrunnable(f"the poll function of tool {tool.name!r} cannot ask the user") from None
        self._failpoints.hit("worker.PollToolTask.during-poll")
        if isinstance(value, Pending):
            # The server rejects a null poll_after_ms: leave the key out to keep the old interval.
            return (
                {"status": "pending"}
                if value.poll_after_ms is None
                else {"status": "pending", "poll_after_ms": value.poll_after_ms}
            )
        if isinstance(value, TaskHandle):
            raise Unrunnable(f"the poll function of tool {tool.name!r} returned a new task handle")
        return {"status": "ok", "output": value}

    async def _compact_context(self, task: WorkerTask, agent: Agent, heartbeats: AttemptSink) -> dict[str, Any]:
        if agent.model is None:
            raise NotStarted(f"agent {agent.name!r} has no model")
        summary = await agent.model.summarize(list(task.input.get("history") or []), task.input.get("summary"))
        if not isinstance(summary, str):
            raise TypeError(f"the model's summarize() returned {type(summary).__name__}, not a string")
        return {"summary": summary}

    # ------------------------------------------------------------ delivery

    async def _deliver(self, task: WorkerTask, outcome: Outcome) -> None:
        """complete or fail, retried by the Connection until 200 or 409."""
        if outcome.failed:
            await self._send_fail(task, outcome.error or "", outcome.retryable, outcome.not_started)
            return
        body: dict[str, Any] = {"worker_id": self.worker_id, "result": outcome.result}
        if self.eager and not self._stop_requested.is_set():
            body["next_tasks"] = 1  # the slot this task frees
        try:
            answer = await self._conn.request("POST", _task_path(task, "complete"), body)
        except DexError as exc:
            if exc.status == 409:
                log.info("%s: result not needed any more (409: %s)", task, exc.message)
            elif isinstance(exc, DexUnavailable):
                log.error("%s: could not deliver the result: %s", task, exc.message)
            else:
                log.error("%s: the server refused the result (%d %s): %s", task, exc.status, exc.code, exc.message)
                await self._send_fail(task, f"the server refused the result: {exc.message}", retryable=False)
            return
        self._failpoints.hit("worker.complete.after-send")
        self.completed += 1
        log.debug("%s: completed", task)
        if self.on_result is not None:
            self.on_result(task, outcome)
        eager_tasks = answer.get("tasks") if isinstance(answer, dict) else None
        if eager_tasks:
            # This runner ends now: its slot goes to the task handed out with the result.
            self._tasks.discard(asyncio.current_task())
            for raw in eager_tasks[:1]:
                self._start(raw)

    async def _send_fail(self, task: WorkerTask, error: str, retryable: bool, not_started: bool = False) -> None:
        body: dict[str, Any] = {"worker_id": self.worker_id, "error": error, "retryable": retryable}
        if not_started:
            body["not_started"] = True
        try:
            await self._conn.request("POST", _task_path(task, "fail"), body)
        except DexError as exc:
            if exc.status == 409:
                log.info("%s: failure not needed any more (409: %s)", task, exc.message)
            else:
                log.error(
                    "%s: the server refused the failure report (%d %s): %s", task, exc.status, exc.code, exc.message
                )
            return
        self.completed += 1
        log.debug("%s: reported failed (retryable=%s): %s", task, retryable, error)
        if self.on_result is not None:
            self.on_result(task, Outcome(error=error, retryable=retryable, not_started=not_started))


# ---------------------------------------------------------------- helpers


def _check_agents(agents: Any) -> dict[str, Agent]:
    if isinstance(agents, Agent) or not isinstance(agents, Sequence) or not agents:
        raise ValueError("agents must be a non-empty list of Agent objects")
    by_name: dict[str, Agent] = {}
    for i, agent in enumerate(agents):
        if not isinstance(agent, Agent):
            raise TypeError(f"agents[{i}] must be an Agent, got {type(agent).__name__}")
        if agent.name in by_name:
            raise ValueError(f"agents: two agents are named {agent.name!r}")
        by_name[agent.name] = agent
    return by_name


def _tool_for(agent: Agent, task: WorkerTask) -> Tool:
    name = task.input.get("name")
    tool = agent.tools.get(name) if isinstance(name, str) else None
    if tool is None:
        raise NotStarted(f"agent {agent.name!r} has no tool {name!r}")
    return tool


def _check_json(result: Any) -> None:
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise Unrunnable(f"the result is not JSON: {exc}") from None


def _cancel_from_outside(work: asyncio.Task[Any]) -> None:
    """Cancel `work` unless the stop was noticed inside it (ctx.heartbeat): then the tool
    gets AttemptCancelled instead and may clean up without a CancelledError mid-way."""
    if asyncio.current_task() is not work:
        work.cancel()
