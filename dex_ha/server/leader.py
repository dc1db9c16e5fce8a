"""Leader services: the work only the active node does, for one term.

A `LeaderTerm` lives from the moment this node becomes leader until it loses leadership
(or the process stops). It:

1. takes over: proposes `FailHeldAttempts(term)`. When that entry has applied, every entry
   of earlier terms has applied too (it comes after them in the log), and every attempt an
   earlier leader handed out has failed and followed its crash-matrix row;
2. then runs dispatch (Worker long polls), the heartbeat and start_to_close monitor, and
   the timers, until it is stopped.

Waits use `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11, wait_for can swallow
a cancellation that races with the awaited thing finishing, and a loop that missed its
cancellation would keep the term's services running after stop().

Time: command `at` values are wall-clock milliseconds (the engine compares them with the
due times and deadlines it stored), read from the node's `ActiveClock`: the wall clock read
once when this term takes over, advanced by the monotonic clock since. So a step of the wall
clock while this node is active moves no deadline, no retry window and no timer; heartbeat
silence is measured on the monotonic clock directly. Attempts of earlier terms are failed at
takeover, so no deadline is ever measured across two nodes' clocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dex_ha.engine import (
    DEFAULT_NAMESPACE,
    ApplyResult,
    AttemptTimedOut,
    FailHeldAttempts,
    FireTimer,
    HeartbeatLost,
    Propose,
    StartedAttempt,
    StartQueuedAttempts,
    Task,
    same_token_secret,
)
from dex_ha.raft.errors import NotLeader, ProposalDropped
from dex_ha.server.errors import NotServing
from dex_ha.server.metrics import ServerMetrics
from dex_ha.server.replica import Replica
from dex_ha.server.task_tokens import TaskToken, new_token_secret
from dex_ha.server.tracing import SpanSink, TurnTracer, attempt_log_fields, traceparent
from dex_ha.server.validation import InvalidRequest
from dex_ha.worker_protocol import CLOSE_NOT_ACTIVE

if TYPE_CHECKING:
    from dex_ha.server.channel import WorkerChannel

log = logging.getLogger("dex_ha.server.leader")

# Hand-outs per StartQueuedAttempts entry. A Raft node applies whole entries, so one entry of a
# thousand hand-outs (a pass of many waiting polls) would keep its loop from heartbeats for
# that long; entries of this size let it apply a few between two ticks (ApplyPace).
HANDOUTS_PER_PROPOSAL = 32
# A Worker's error in the log line of its failed attempt is cut to this many characters.
LOGGED_ERROR_CHARS = 300


class ActiveClock:
    """Wall-clock milliseconds that follow elapsed time, not steps of the wall clock.

    `anchor()` reads the wall clock; `now_ms()` is that reading plus the monotonic time
    since. A node anchors when it starts and when it takes over as leader, and stamps every
    command with `now_ms()`: a step of the wall clock (NTP, an operator) while it is active
    changes no outcome. It is followed at the next takeover.
    """

    def __init__(self) -> None:
        self._wall_ms = 0.0
        self._mono_s = 0.0
        self.anchor()

    def anchor(self) -> None:
        self._wall_ms, self._mono_s = time.time() * 1000, time.monotonic()

    def now_ms(self) -> int:
        return int(self._wall_ms + (time.monotonic() - self._mono_s) * 1000)


@dataclass
class HandedOutAttempt:
    """What the leader keeps in memory about an attempt it handed out."""

    step_id: str
    attempt: int
    session_id: str
    kind: str
    worker_id: str
    last_seen: float  # monotonic seconds of the hand-out or the latest heartbeat
    token_secret: str | None  # the secret of its task token, as committed (None before schema 2)
    turn_id: str = ""

    def log_fields(self) -> dict[str, Any]:
        """The `extra=` of a log line about this attempt (see tracing.LOG_FIELDS)."""
        return attempt_log_fields(self.session_id, self.turn_id, self.step_id, self.attempt)


@dataclass
class _WaitingPoll:
    worker_id: str
    agents: list[str]
    max_tasks: int
    future: asyncio.Future[list[dict[str, Any]]] = field(repr=False)
    namespace: str = DEFAULT_NAMESPACE  # the Worker's token's: it gets the steps of its agents only
    # True once the Worker hung up (aiohttp does not cancel the handler): such a poll must
    # not be handed steps, or they would wait for their heartbeat timeout.
    gone: Callable[[], bool] = field(repr=False, default=lambda: False)
    claimed: bool = False  # included in a hand-out proposal: its answer is on the way


class LeaderTerm:
    """The leader services of one term."""

    def __init__(
        self,
        term: int,
        replica: Replica,
        propose: Propose,
        metrics: ServerMetrics,
        *,
        clock: ActiveClock,
        heartbeat_timeout_ms: int,
        monitor_interval_s: float | None = None,
        channel_grace_ms: int = 1_000,
        span_sink: SpanSink | None = None,
    ) -> None:
        self.term = term
        self.replica = replica
        self.engine = replica.reads  # read-only: changes go through propose
        self._propose = propose
        self.metrics = metrics
        self.clock = clock
        clock.anchor()  # the wall clock is read here, once per term (see ActiveClock)
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.channel_grace_ms = channel_grace_ms
        self._channels: dict[str, WorkerChannel] = {}  # worker_id -> its open channel
        # worker_id -> (attempts its closed channel held, the timer that fails them)
        self._closed_channels: dict[str, tuple[dict[tuple[str, int], str], asyncio.TimerHandle]] = {}
        # Check often enough that a silent attempt fails within ~10% past its timeout.
        self._monitor_interval_s = monitor_interval_s or min(1.0, max(0.02, heartbeat_timeout_ms / 10_000))
        self.takeover_done = False
        self.draining = False
        self.running: dict[tuple[str, int], HandedOutAttempt] = {}
        # The hand-out metrics by step kind: labels() costs more than the count itself.
        self._handout_metrics: dict[str, tuple[Any, Any]] = {}
        self.workers_seen: dict[str, float] = {}
        self._waiting: deque[_WaitingPoll] = deque()
        self._wake_dispatch = asyncio.Event()
        self._wake_timers = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started_mono = time.monotonic()
        self._stopped = False
        self._span_sink = span_sink
        self.tracer: TurnTracer | None = None  # once the takeover applied, when traces are exported

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.replica.changed.add_listener(self._on_change)
        self._tasks.append(asyncio.create_task(self._run(), name=f"leader-term-{self.term}"))

    async def stop(self) -> None:
        self._stopped = True
        for _, timer in self._closed_channels.values():
            timer.cancel()  # the next active node's takeover fails those attempts
        # Open channels reconnect to the next active node (their attempts of this term fail
        # at its takeover, so their results are not wanted any more).
        await asyncio.gather(
            *(ch.close(CLOSE_NOT_ACTIVE, "this node is no longer the active node") for ch in self._channels.values()),
            return_exceptions=True,
        )
        self.replica.changed.remove_listener(self._on_change)
        if self.tracer is not None:
            self.replica.on_sessions_changed = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._answer_waiting_polls(NotServing("this node is no longer the active node"))

    def _on_change(self) -> None:
        self._wake_dispatch.set()
        self._wake_timers.set()

    async def _run(self) -> None:
        await self._take_over()
        for name, loop in (
            ("dispatch", self._dispatch_loop),
            ("monitor", self._monitor_loop),
            ("timers", self._timer_loop),
        ):
            self._tasks.append(asyncio.create_task(self._supervised(name, loop), name=f"{name}-{self.term}"))

    async def _supervised(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a service loop; a bug that raises is logged and the loop starts again, so one
        bad step cannot silently stop all dispatch or all timers of the term."""
        while True:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader service %r of term %d failed; restarting it", name, self.term)
                await asyncio.sleep(0.1)

    async def _take_over(self) -> None:
        started = time.monotonic()
        while True:
            try:
                result = await self._propose(FailHeldAttempts(at=self.clock.now_ms(), term=self.term))
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dropped proposal: this term may still be ours; retry
                log.warning("takeover of term %d: FailHeldAttempts not applied (%s); retrying", self.term, exc)
                await asyncio.sleep(0.05)
        # Refused (an engine bug, the same on every node): none failed, the term goes on.
        by_kind = result.value.by_kind if result.value is not None else {}
        for kind, n in by_kind.items():
            self.metrics.attempts_failed.labels(kind=kind, reason="takeover").inc(n)
        if self._span_sink is not None:
            self._start_tracing(self._span_sink, result)
        self.takeover_done = True
        log.info(
            "takeover of term %d done in %.0f ms: %d attempts of earlier terms failed",
            self.term,
            (time.monotonic() - started) * 1000,
            sum(by_kind.values()),
        )

    def _start_tracing(self, sink: SpanSink, takeover: ApplyResult[object]) -> None:
        """Build spans from the session events of this term's entries, from the takeover on
        (whose failed attempts show as takeover events)."""
        tracer = self.tracer = TurnTracer(sink, self.engine, self.term, takeover.index)
        self.replica.on_sessions_changed = lambda ids: tracer.sessions_changed(tracer.known() if ids is None else ids)
        tracer.sessions_changed(takeover.event_sessions)

    # ------------------------------------------------------------------ dispatch

    async def poll(
        self,
        worker_id: str,
        agents: list[str],
        max_tasks: int,
        wait_ms: int,
        gone: Callable[[], bool] = lambda: False,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> list[dict[str, Any]]:
        """A Worker long poll: the tasks handed to it (committed), or [] when wait_ms passed.
        `gone()` says whether the Worker hung up meanwhile; only steps of agents of
        `namespace` are handed to it."""
        self._check_dispatching()
        self.workers_seen[worker_id] = time.monotonic()
        future = asyncio.get_running_loop().create_future()
        poll = _WaitingPoll(worker_id, agents, max_tasks, future, namespace, gone)
        self._waiting.append(poll)
        self._wake_dispatch.set()
        try:
            async with asyncio.timeout(wait_ms / 1000):
                return await asyncio.shield(poll.future)
        except TimeoutError:
            if poll.claimed:  # its hand-out is being committed: the answer comes shortly
                return await poll.future
            self._waiting.remove(poll)
            return []
        finally:
            if poll in self._waiting:  # the Worker went away (request cancelled)
                self._waiting.remove(poll)
            if not poll.future.done():
                poll.future.cancel()

    def waiting_polls(self) -> int:
        """Long polls waiting for work now."""
        return len(self._waiting)

    def _check_dispatching(self) -> None:
        if self._stopped or not self.takeover_done:
            raise NotServing("this node is not the active node yet")
        if self.draining:
            raise NotServing("this node is draining: it hands out no new work")

    async def _dispatch_loop(self) -> None:
        while True:
            self._wake_dispatch.clear()
            if self._waiting and not self.draining:
                matched = self._match_polls()
                if matched:
                    await self._hand_out(matched)
                    continue
            await self._wake_dispatch.wait()

    def _match_polls(self) -> list[tuple[_WaitingPoll, int]]:
        """How many queued steps each waiting poll gets, first poll first. Each agent's
        queue is counted once per pass (up to what the polls want); which steps a poll gets
        is decided when its hand-out applies (StartQueuedAttempts).

        A poll whose own data makes the lookup fail (an agent name the store cannot take)
        is answered with that error alone: one Worker's bad poll must not stop the
        dispatch of everyone else's steps.
        """
        wanted: dict[str, int] = {}
        for poll in self._waiting:
            for agent in poll.agents:
                wanted[agent] = wanted.get(agent, 0) + poll.max_tasks
        queued: dict[str, int] = {}
        owners: dict[str, str | None] = {}  # agent -> its namespace, read once per pass
        matched = []
        for poll in list(self._waiting):
            if poll.future.done() or poll.gone():  # answered with an error already, or hung up
                self._waiting.remove(poll)
                if not poll.future.done():
                    poll.future.set_result([])
                continue
            try:
                count = self._claim_queued(poll, queued, wanted, owners)
            except Exception as exc:  # whatever it is, it comes from this poll alone
                log.warning("poll of worker %r refused: its agents cannot be looked up (%r)", poll.worker_id, exc)
                self._waiting.remove(poll)
                poll.future.set_exception(InvalidRequest("agents", f"cannot be looked up ({exc})"))
                continue
            if count:
                poll.claimed = True
                self._waiting.remove(poll)
                matched.append((poll, count))
        return matched

    def _claim_queued(
        self, poll: _WaitingPoll, queued: dict[str, int], wanted: dict[str, int], owners: dict[str, str | None]
    ) -> int:
        """Up to poll.max_tasks of the steps queued for the poll's agents, taken off the
        counts in `queued` (read once per pass per agent, for every poll that wants it)."""
        count = 0
        for agent in poll.agents:
            if agent not in owners:
                owners[agent] = self.engine.agent_namespace(agent)
            # An agent of another namespace (it may have become one since the poll came):
            # none of its steps would be handed to this Worker, so none count.
            if owners[agent] != poll.namespace:
                continue
            if agent not in queued:
                queued[agent] = self.engine.count_queued(agent, wanted[agent])
            take = min(queued[agent], poll.max_tasks - count)
            queued[agent] -= take
            count += take
        return count

    async def _hand_out(self, matched: list[tuple[_WaitingPoll, int]]) -> None:
        """Propose every hand-out of this pass, HANDOUTS_PER_PROPOSAL to an entry (all at
        once: they share a Raft turn and its fsync); answer the polls once they applied.

        A poll gets the steps at the heads of its agents' queues when its entries apply, so
        fewer than counted when results took some meanwhile (eager dispatch); one that got
        none waits on."""
        at = self.clock.now_ms()
        proposals = [  # (index of the poll in `matched`, its entry)
            (
                index,
                StartQueuedAttempts(
                    at=at,
                    worker_id=poll.worker_id,
                    term=self.term,
                    agents=poll.agents,
                    namespace=poll.namespace,
                    token_secrets=[new_token_secret() for _ in range(min(HANDOUTS_PER_PROPOSAL, count - first))],
                ),
            )
            for index, (poll, count) in enumerate(matched)
            for first in range(0, count, HANDOUTS_PER_PROPOSAL)
        ]
        try:
            outcomes = await asyncio.gather(*(self._propose(cmd) for _, cmd in proposals), return_exceptions=True)
            started: list[list[StartedAttempt]] = [[] for _ in matched]
            uncommitted: set[int] = set()
            for (index, cmd), outcome in zip(proposals, outcomes):
                if isinstance(outcome, (NotLeader, ProposalDropped)):  # that poll is answered 503 below
                    log.info("hand-out of up to %d steps not committed: %r", len(cmd.token_secrets), outcome)
                    uncommitted.add(index)
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome
                if outcome.value is not None:  # None: refused, nothing handed out
                    started[index] += outcome.value.started
            for index, (poll, _) in enumerate(matched):
                tasks = [self.task_for_handout(s, poll.worker_id) for s in started[index]]
                if tasks or self._stopped:
                    if not poll.future.done():
                        poll.future.set_result(tasks)
                elif index not in uncommitted:  # results took every step it was counted: wait on
                    poll.claimed = False
                    self._waiting.appendleft(poll)
        finally:
            # A claimed poll must never wait forever: whatever went wrong, answer it.
            for poll, _ in matched:
                if poll.claimed and not poll.future.done():
                    poll.future.set_exception(NotServing("the hand-out was not committed; poll again"))

    def task_for_handout(self, started: StartedAttempt, worker_id: str) -> dict[str, Any]:
        """The task a Worker gets for a committed hand-out (`started`, as the engine
        reports it: the apply built the task's input, so nothing is read here); from now on
        the attempt's heartbeats are watched."""
        step_id, attempt, kind = started.step_id, started.attempt, started.kind
        self.running[(step_id, attempt)] = HandedOutAttempt(
            step_id,
            attempt,
            started.session_id,
            kind,
            worker_id,
            time.monotonic(),
            started.token_secret,
            started.turn_id,
        )
        started_total, schedule_to_start = self._handout_metrics.get(kind) or self._labelled_handout_metrics(kind)
        started_total.inc()
        now_ms = self.clock.now_ms()
        schedule_to_start.observe(max(0.0, (now_ms - (started.queued_at or now_ms)) / 1000))
        body = Task.from_handout(started, self.heartbeat_timeout_ms).as_json()
        # This leader drew a secret for each of its hand-outs; only entries written before
        # schema 2 lack one, and their results went to a proposer long gone.
        assert started.token_secret is not None, f"hand-out of {step_id}/{attempt} without a token secret"
        body["task_token"] = str(TaskToken(step_id, attempt, started.term, started.token_secret))
        if self.tracer is not None:  # the Worker continues the attempt's span
            body["traceparent"] = traceparent(started)
        return body

    def _labelled_handout_metrics(self, kind: str) -> tuple[Any, Any]:
        labelled = self._handout_metrics[kind] = (
            self.metrics.attempts_started.labels(kind=kind),
            self.metrics.schedule_to_start.labels(kind=kind),
        )
        return labelled

    def _answer_waiting_polls(self, exc: Exception) -> None:
        while self._waiting:
            poll = self._waiting.popleft()
            if not poll.future.done():
                poll.future.set_exception(exc)

    def begin_drain(self) -> None:
        """Planned step down / SIGTERM: hand out nothing more; waiting polls go elsewhere."""
        self.draining = True
        self._answer_waiting_polls(NotServing("this node is draining: it hands out no new work"))

    def end_drain(self) -> None:
        self.draining = False
        self._wake_dispatch.set()

    def running_in_term(self) -> int:
        return len(self.engine.running_attempts(term=self.term))

    # ------------------------------------------------------------------ heartbeats

    def heartbeat(self, step_id: str, attempt: int) -> HandedOutAttempt | None:
        """Note that the attempt is alive; None when this term did not hand it out."""
        running = self.running.get((step_id, attempt))
        if running is not None:
            running.last_seen = time.monotonic()
            self.workers_seen[running.worker_id] = running.last_seen
        return running

    def issued(self, token: TaskToken) -> HandedOutAttempt | None:
        """The hand-out of this term that issued `token` (its secret compared in constant
        time), or None."""
        handed_out = self.running.get((token.step_id, token.attempt))
        if (
            handed_out is None
            or token.term != self.term
            or not same_token_secret(handed_out.token_secret, token.secret)
        ):
            return None
        return handed_out

    def forget(self, step_id: str, attempt: int) -> None:
        self.running.pop((step_id, attempt), None)

    def worker_failed(self, step_id: str, attempt: int, error: str) -> None:
        """A Worker's report that the attempt failed has committed (over HTTP or its
        channel): count it and log it; the step retries after a backoff if it may."""
        running = self.running.pop((step_id, attempt), None)
        kind = running.kind if running is not None else "unknown"
        self.metrics.attempts_failed.labels(kind=kind, reason="worker_error").inc()
        if running is not None:  # an attempt of an earlier term was failed at takeover: not news
            log.info(
                "attempt %d of step %s (%s) failed on worker %s: %s",
                attempt,
                step_id,
                kind,
                running.worker_id,
                error[:LOGGED_ERROR_CHARS],
                extra=running.log_fields(),
            )

    def workers_connected(self) -> int:
        window = max(self.heartbeat_timeout_ms / 1000, 30.0)
        now = time.monotonic()
        for worker_id, seen in list(self.workers_seen.items()):
            if now - seen > window:
                del self.workers_seen[worker_id]
        return len(self.workers_seen)

    # ------------------------------------------------------------------ Worker channels

    def channels_open(self) -> int:
        return len(self._channels)

    def channel_opened(self, channel: WorkerChannel) -> dict[tuple[str, int], str]:
        """A Worker opened a channel; the attempts its previous channel held, if that one
        closed less than the grace period ago (they are this one's now), else none. A second
        channel of the same Worker replaces the first, which is closed."""
        worker_id = channel.worker_id
        self.workers_seen[worker_id] = time.monotonic()
        previous = self._channels.get(worker_id)
        self._channels[worker_id] = channel
        if previous is not None:
            channel.adopt(previous.held)
            previous.held = {}
            self._spawn(previous.close(1000, "replaced by a newer channel of the same Worker"))
        held, timer = self._closed_channels.pop(worker_id, ({}, None))
        if timer is not None:
            timer.cancel()
        return held

    def channel_closed(self, channel: WorkerChannel) -> None:
        """A channel closed: a dead Worker, unless it opens a channel again within the grace
        period. Then every attempt of this term handed to it fails as a lost heartbeat does
        (HeartbeatLost: the crash-matrix row of each step applies), only sooner."""
        worker_id = channel.worker_id
        if self._channels.get(worker_id) is not channel or self._stopped:
            return  # replaced by a newer channel, which holds its attempts; or the term ended
        del self._channels[worker_id]
        closed_at = time.monotonic()
        timer = asyncio.get_running_loop().call_later(
            self.channel_grace_ms / 1000, lambda: self._spawn(self._fail_channel_attempts(worker_id, closed_at))
        )
        self._closed_channels[worker_id] = (channel.held, timer)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` as part of this term (stop() cancels it)."""
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(asyncio.create_task(work))

    async def _fail_channel_attempts(self, worker_id: str, closed_at: float) -> None:
        self._closed_channels.pop(worker_id, None)
        lost = [a for a in self.running.values() if a.worker_id == worker_id]
        if lost:
            log.info(
                "worker %s: its channel closed %d ms ago; failing its %d attempts",
                worker_id,
                self.channel_grace_ms,
                len(lost),
            )
        await asyncio.gather(
            *(
                self._fail_attempt(
                    HeartbeatLost(
                        at=self.clock.now_ms(),
                        step_id=a.step_id,
                        attempt=a.attempt,
                        term=self.term,
                        silent_ms=int((time.monotonic() - closed_at) * 1000),
                    ),
                    a.kind,
                    "channel_closed",
                )
                for a in lost
            )
        )

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(self._monitor_interval_s)
            await self._fail_silent_and_late_attempts()

    async def _fail_silent_and_late_attempts(self) -> None:
        now_mono, now_wall = time.monotonic(), self.clock.now_ms()
        timeout_s = self.heartbeat_timeout_ms / 1000
        commands: list[tuple[HeartbeatLost | AttemptTimedOut, str, str]] = []
        for a in self.engine.running_attempts(term=self.term):
            tracked = self.running.get((a.step_id, a.attempt))
            if tracked is not None:
                silent_s = now_mono - tracked.last_seen
            else:  # committed, but its poll answer is not built yet: silent since its hand-out
                silent_s = min(now_mono - self._started_mono, (now_wall - a.started_at) / 1000)
            if a.deadline_at is not None and now_wall > a.deadline_at:
                commands.append(
                    (
                        AttemptTimedOut(at=now_wall, step_id=a.step_id, attempt=a.attempt, term=a.term),
                        a.kind,
                        "start_to_close",
                    )
                )
            elif silent_s > timeout_s:
                commands.append(
                    (
                        HeartbeatLost(
                            at=now_wall,
                            step_id=a.step_id,
                            attempt=a.attempt,
                            term=a.term,
                            silent_ms=int(silent_s * 1000),
                        ),
                        a.kind,
                        "heartbeat_timeout",
                    )
                )
        if commands:
            await asyncio.gather(*(self._fail_attempt(*c) for c in commands))

    async def _fail_attempt(self, cmd: HeartbeatLost | AttemptTimedOut, kind: str, reason: str) -> None:
        running = self.running.get((cmd.step_id, cmd.attempt))
        fields = running.log_fields() if running is not None else None
        try:
            result = await self._propose(cmd)
        except Exception as exc:  # lost leadership: the next leader's takeover fails it instead
            log.info("could not fail attempt %s/%d (%s): %s", cmd.step_id, cmd.attempt, reason, exc, extra=fields)
            return
        self.forget(cmd.step_id, cmd.attempt)
        if result.ok:
            self.metrics.attempts_failed.labels(kind=kind, reason=reason).inc()
            log.info("attempt %s/%d (%s) failed: %s", cmd.step_id, cmd.attempt, kind, reason, extra=fields)

    # ------------------------------------------------------------------ timers

    async def _timer_loop(self) -> None:
        while True:
            self._wake_timers.clear()
            timer = self.engine.next_timer()
            now = self.clock.now_ms()
            if timer is not None and timer.due_at <= now:
                due = self.engine.due_timers(now, limit=256)
                await asyncio.gather(*(self._fire(t.timer_id) for t in due))
                continue
            wait_s = None if timer is None else (timer.due_at - now) / 1000
            try:
                async with asyncio.timeout(wait_s):
                    await self._wake_timers.wait()
            except TimeoutError:
                pass

    async def _fire(self, timer_id: str) -> None:
        try:
            await self._propose(FireTimer(at=self.clock.now_ms(), timer_id=timer_id))
        except Exception as exc:
            log.info("timer %s not fired (%s); the next active node fires it", timer_id, exc)
            await asyncio.sleep(0.05)
