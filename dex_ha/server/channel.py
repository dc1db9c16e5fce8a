"""The Worker channel: one WebSocket per Worker (`GET /v1/worker/channel`), which carries
tasks to it and its reports back (the contract: docs/worker-protocol.md).

A channel lives on the active node for one term. It

- hands out tasks as the Worker's credit allows: a frame's reports and the hand-out of its
  credit commit in ONE entry (ReportResults), and credit left over waits in the same
  long-poll queue HTTP polls wait in (`LeaderTerm.poll`), so both kinds of Worker share
  the dispatch and the namespace rules;
- answers each report with an ack carrying the status its HTTP route would answer
  (200, 403, 404, 409; 503 when the entry did not commit: send it again);
- keeps the attempts it holds alive (no per-attempt heartbeats on a channel) and tells the
  Worker when one of them was cancelled or is no longer current;
- when it closes, hands its attempts to the leader, which fails them after the grace
  period unless the same Worker opens a channel again (`LeaderTerm.channel_closed`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from dex_ha.engine import ReportItem, ReportResults
from dex_ha.server.errors import ApiError, NotServing
from dex_ha.server.task_tokens import TaskToken, new_token_secret
from dex_ha.worker_protocol import (
    ACKS,
    CANCEL,
    CANCEL_REQUESTED,
    CLOSE_INVALID_FRAME,
    CLOSE_NOT_ACTIVE,
    MAX_BATCH,
    NOT_CURRENT,
    PROTOCOL_VERSION,
    TASKS,
    WELCOME,
    Deltas,
    ProtocolError,
    Report,
    decode_frame,
    encode_frame,
    parse_worker_frame,
)

if TYPE_CHECKING:
    from dex_ha.server.app import Api
    from dex_ha.server.leader import LeaderTerm

log = logging.getLogger("dex_ha.server.channel")

# A channel's credit waits this long in the poll queue before it queues again (a wait costs
# nothing; new credit goes to the hand-out of the next reports frame meanwhile).
POLL_WAIT_MS = 20_000
# How often a channel keeps its attempts alive and, when the state changed, looks for the
# ones that were cancelled or are no longer current.
WATCH_INTERVAL_S = 0.25
# While the node drains (a step down), the channel stays open for the results of the
# attempts it holds, and asks again this often whether it may hand out.
DRAIN_RECHECK_S = 0.2
# The most hand-outs in one ReportResults (the engine takes up to 256).
MAX_EAGER = 64

Key = tuple[str, int]  # (step_id, attempt)
CheckReport = Callable[[str], TaskToken]  # the token of a report, or ApiError (403/404)


class WorkerChannel:
    """One open channel (see the module doc)."""

    def __init__(
        self,
        api: Api,
        leader: LeaderTerm,
        ws: web.WebSocketResponse,
        *,
        worker_id: str,
        agents: list[str],
        namespace: str,
        encoding: str,
        check_report: CheckReport,
    ) -> None:
        self.api = api
        self.leader = leader
        self.ws = ws
        self.worker_id = worker_id
        self.agents = agents
        self.namespace = namespace
        self.encoding = encoding
        self._check_report = check_report
        self.held: dict[Key, str] = {}  # the attempts it was handed -> their task tokens
        self._reporting: set[Key] = set()  # reports of these are being committed
        self._cancel_told: set[Key] = set()
        self.credit = 0  # tasks the Worker will take and has not been sent
        self._reserved = 0  # of that credit, promised to a poll or a hand-out in flight
        self._credit_added = asyncio.Event()
        self._tasks_seq = 0
        self.acked_seq = 0  # the highest `tasks` seq the Worker said it received
        self._state_changed = True
        self._work: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        """Run until the channel closes; then its attempts go to the leader (grace)."""
        self.held.update(self.leader.channel_opened(self))
        changed = self.api.node.replica.changed
        changed.add_listener(self._on_state_change)
        services = [asyncio.create_task(self._poll_loop()), asyncio.create_task(self._watch_loop())]
        try:
            await self._send(
                {
                    "type": WELCOME,
                    "protocol": PROTOCOL_VERSION,
                    "worker_id": self.worker_id,
                    "node_id": self.api.node.config.node_id,
                    "term": self.leader.term,
                    "grace_ms": self.api.node.config.worker_channel_grace_ms,
                    "max_batch": MAX_BATCH,
                    "held": sorted(self.held.values()),
                }
            )
            await self._read_frames()
        finally:
            changed.remove_listener(self._on_state_change)
            for service in services:
                service.cancel()
            await asyncio.gather(*services, return_exceptions=True)
            if self._work:  # reports being committed: their outcome decides what is held
                await asyncio.wait(self._work)
            self.leader.channel_closed(self)
            log.info(
                "worker channel of %s closed (code %s); %d attempts held, %d tasks frames not acknowledged",
                self.worker_id,
                self.ws.close_code,
                len(self.held),
                self._tasks_seq - self.acked_seq,
            )

    async def close(self, code: int, message: str) -> None:
        await self.ws.close(code=code, message=message.encode()[:120])

    def adopt(self, held: dict[Key, str]) -> None:
        """Attempts a closed channel of the same Worker held: this channel holds them now."""
        self.held.update(held)

    async def _read_frames(self) -> None:
        async for msg in self.ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                break
            try:
                self._on_frame(decode_frame(msg.data, self.encoding))
            except ProtocolError as exc:
                log.warning("worker channel of %s: invalid frame, closing it: %s", self.worker_id, exc)
                await self.close(CLOSE_INVALID_FRAME, str(exc))
                break

    def _on_frame(self, raw: dict[str, Any]) -> None:
        frame = parse_worker_frame(raw)
        if frame.ack is not None:
            self.acked_seq = max(self.acked_seq, frame.ack)
        for deltas in frame.deltas:
            self._relay(deltas)
        self.credit += frame.credit
        if frame.reports:  # the credit goes to the reports' entry first; what is left, to a poll
            self._spawn(self._report(frame.reports))
        elif frame.credit:
            self._credit_added.set()

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _send(self, frame: dict[str, Any]) -> None:
        data = encode_frame(frame, self.encoding)
        if isinstance(data, str):
            await self.ws.send_str(data)
        else:
            await self.ws.send_bytes(data)

    # ------------------------------------------------------------ hand-outs

    def _available(self) -> int:
        return self.credit - self._reserved

    async def _poll_loop(self) -> None:
        """Credit that no reports frame spent waits in the leader's poll queue."""
        while True:
            if self._available() <= 0:
                self._credit_added.clear()
                await self._credit_added.wait()
                continue
            count = min(self._available(), MAX_BATCH)
            self._reserved += count
            try:
                tasks = await self.leader.poll(
                    self.worker_id,
                    self.agents,
                    count,
                    POLL_WAIT_MS,
                    gone=lambda: self.ws.closed,
                    namespace=self.namespace,
                )
            except NotServing:
                if self.leader.draining and not self.ws.closed:
                    await asyncio.sleep(DRAIN_RECHECK_S)  # open for results; no hand-outs now
                    continue
                await self.close(CLOSE_NOT_ACTIVE, "this node is no longer the active node")
                return
            finally:
                self._reserved -= count
            await self._hand_over(tasks)

    async def _hand_over(self, tasks: list[dict[str, Any]]) -> None:
        """Send committed hand-outs; from now on this channel holds them (even if the send
        fails: a closed channel's attempts fail after the grace period)."""
        if not tasks:
            return
        self.api.node.failpoints.hit("server.handout.after-commit")
        for task in tasks:
            self.held[(task["step_id"], task["attempt"])] = task["task_token"]
        self.credit -= len(tasks)
        self._tasks_seq += 1
        await self._send({"type": TASKS, "seq": self._tasks_seq, "tasks": tasks})

    # ------------------------------------------------------------ reports

    async def _report(self, reports: list[Report]) -> None:
        """Commit a frame's reports (and its credit's hand-out) in one entry; ack each."""
        acks: list[dict[str, Any] | None] = [None] * len(reports)
        items: list[tuple[int, Key, ReportItem]] = []
        for i, report in enumerate(reports):
            try:
                token = self._check_report(report.task_token)
            except ApiError as exc:
                acks[i] = _ack(report.task_token, exc.status, exc.code, str(exc))
                continue
            items.append((i, (token.step_id, token.attempt), _report_item(token, report)))
        try:
            if items:
                await self._commit(reports, items, acks)
        finally:
            self._credit_added.set()
        await self._send({"type": ACKS, "acks": acks})

    async def _commit(
        self, reports: list[Report], items: list[tuple[int, Key, ReportItem]], acks: list[dict[str, Any] | None]
    ) -> None:
        leader = self.leader
        eager = 0 if leader.draining else max(0, min(self._available(), MAX_EAGER))
        self._reserved += eager
        keys = {key for _, key, _ in items}
        self._reporting |= keys
        try:
            self.api.node.failpoints.hit("server.complete.before-propose")
            result = await self.api.propose(
                ReportResults(
                    at=self.api.node.clock.now_ms(),
                    reports=[item for _, _, item in items],
                    next_worker_id=self.worker_id if eager else None,
                    next_term=leader.term,
                    next_agents=self.agents if eager else [],
                    next_token_secrets=[new_token_secret() for _ in range(eager)],
                    namespace=self.namespace,
                )
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not committed (in time): the Worker sends them again
            log.info("worker channel of %s: %d reports not committed: %r", self.worker_id, len(items), exc)
            for i, _, _ in items:
                acks[i] = _ack(reports[i].task_token, 503, "unavailable", f"not committed ({exc}); send it again")
            return
        finally:
            self._reserved -= eager
            self._reporting -= keys
        self.api.node.failpoints.hit("server.complete.after-commit")
        reported = result.accepted_value()
        for (i, key, item), answer in zip(items, reported.reports):
            acks[i] = {"task_token": reports[i].task_token, **answer.as_json()}
            if answer.status in (200, 409):  # settled, or someone else's business now
                self._settled(key, item, ok=answer.status == 200)
        await self._hand_over([leader.task_for_handout(s, self.worker_id) for s in reported.started])

    def _settled(self, key: Key, item: ReportItem, *, ok: bool) -> None:
        if ok and item.outcome == "fail":
            self.leader.worker_failed(*key, item.error)
        self.leader.forget(*key)
        self.held.pop(key, None)
        self._cancel_told.discard(key)

    def _relay(self, deltas: Deltas) -> None:
        """Live deltas of an attempt this channel holds (others are dropped, as a heartbeat
        of a stale attempt would be refused)."""
        token = TaskToken.parse(deltas.task_token)
        if token is None or self.held.get((token.step_id, token.attempt)) != deltas.task_token:
            return
        running = self.leader.running.get((token.step_id, token.attempt))
        if running is not None and deltas.deltas:
            self.api.node.relay.publish(running.session_id, token.step_id, token.attempt, deltas.deltas)

    # ------------------------------------------------------------ the attempts it holds

    def _on_state_change(self) -> None:
        self._state_changed = True

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            for key in self.held:  # alive while the channel is: no heartbeat timeout for them
                self.leader.heartbeat(*key)
            if self._state_changed and self.held:
                self._state_changed = False
                await self._tell_stops()

    async def _tell_stops(self) -> None:
        """Cancel frames for held attempts that were cancelled (the Worker reports a failure)
        or are no longer current (the Worker sends nothing more for them)."""
        running = {(a.step_id, a.attempt): a for a in self.api.engine.running_attempts(term=self.leader.term)}
        for key, token in list(self.held.items()):
            if key in self._reporting or key in self._cancel_told:
                continue
            attempt = running.get(key)
            if attempt is None:
                self.held.pop(key, None)
                self.leader.forget(*key)
                await self._send({"type": CANCEL, "task_token": token, "reason": NOT_CURRENT})
            elif attempt.cancel_requested:
                self._cancel_told.add(key)
                await self._send({"type": CANCEL, "task_token": token, "reason": CANCEL_REQUESTED})


def _report_item(token: TaskToken, report: Report) -> ReportItem:
    return ReportItem(
        step_id=token.step_id,
        attempt=token.attempt,
        term=token.term,
        outcome="complete" if report.outcome == "complete" else "fail",
        result=report.result,
        error=report.error,
        retryable=report.retryable,
        not_started=report.not_started,
    )


def _ack(task_token: str, status: int, code: str, message: str) -> dict[str, Any]:
    return {"task_token": task_token, "status": status, "error": code, "message": message}
