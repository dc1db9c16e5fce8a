"""The Worker's end of the Worker channel (docs/worker-protocol.md): one WebSocket to the
active node, kept open across failovers, that batches what the Worker sends.

`ChannelLink` knows frames, not tasks: the Worker (runner.py) hands it reports, deltas and
credit, and gets tasks, acks and cancels back through a `ChannelPeer`. Reports stay in
`unacked` until their ack comes; after a reconnect they are sent again (a result that did
commit is answered 200 again, a failure 409: both settle it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import aiohttp

from dex_ha.client.connection import Connection, DexError
from dex_ha.failpoints import Failpoints
from dex_ha.worker_protocol import (
    ACKS,
    CANCEL,
    CHANNEL_PATH,
    CLOSE_NOT_ACTIVE,
    CREDIT,
    MAX_BATCH,
    RESULTS,
    TASKS,
    WELCOME,
    ProtocolError,
    Report,
    decode_frame,
    encode_frame,
)

log = logging.getLogger("dex_ha.worker.channel")

# After a delta, wait this long before the frame that carries it, so a burst of deltas
# travels in one frame; well under the ~100 ms a live stream can afford.
DELTA_BATCH_S = 0.03
# Ping the node this often; no pong within half of it: the connection is dead, reconnect.
PING_S = 5.0


class ChannelRefused(Exception):
    """The node has no channel for this Worker (an older server: 404; a proxy that drops the
    upgrade: 400). The Worker may fall back to HTTP; `error` is the node's answer."""

    def __init__(self, error: DexError) -> None:
        super().__init__(str(error))
        self.error = error


class ChannelPeer(Protocol):
    """What the link asks of the Worker."""

    def free_slots(self) -> int: ...
    def on_tasks(self, tasks: list[Any]) -> None: ...
    def on_ack(self, report: Report, ack: dict[str, Any]) -> None: ...
    def on_cancel(self, task_token: str, reason: str) -> None: ...
    def on_welcome(self, held: list[str]) -> None: ...


class ChannelLink:
    def __init__(
        self,
        conn: Connection,
        worker_id: str,
        agents: list[str],
        peer: ChannelPeer,
        encoding: str = "msgpack",
        failpoints: Failpoints | None = None,
    ) -> None:
        self._conn = conn
        self._failpoints = failpoints
        self._params = {"worker_id": worker_id, "agents": ",".join(agents), "encoding": encoding}
        self._encoding = encoding
        self._peer = peer
        self.worker_id = worker_id
        self._reports: list[Report] = []  # to send
        self.unacked: dict[str, Report] = {}  # sent, no ack yet (by task token)
        self._deltas: dict[str, list[dict[str, Any]]] = {}
        self._credit = 0
        self._tasks_seq = 0  # the last `tasks` frame received, acknowledged in the next frame
        self._ack_sent = 0
        self._wake = asyncio.Event()
        self._acked = asyncio.Event()  # set at each ack
        self._closing = False
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._opening: asyncio.Future[aiohttp.ClientWebSocketResponse] | None = None
        self.connected = asyncio.Event()
        self.sessions = 0  # channels opened so far (1 + reconnects)

    # ------------------------------------------------------------ what the Worker sends

    def report(self, report: Report, *, credit: int = 0) -> None:
        """Queue a report (and the slot it frees); it goes in the next frame."""
        self._reports.append(report)
        self._credit += credit
        self._wake.set()

    def add_credit(self, n: int) -> None:
        self._credit += n
        self._wake.set()

    def send_deltas(self, task_token: str, deltas: list[dict[str, Any]]) -> None:
        self._deltas.setdefault(task_token, []).extend(deltas)
        self._wake.set()

    async def settle(self, timeout_s: float) -> None:
        """Wait until every report was acknowledged, for up to `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.outstanding:
                    self._acked.clear()
                    await self._acked.wait()
        except TimeoutError:
            log.warning("worker %s: %d reports not acknowledged when it stopped", self.worker_id, self.outstanding)

    @property
    def outstanding(self) -> int:
        """Reports not acknowledged yet (queued or sent)."""
        return len(self._reports) + len(self.unacked)

    # ------------------------------------------------------------ lifetime

    async def run(self, stopping: asyncio.Event) -> None:
        """Open the channel and keep it open (reconnecting, following the active node) until
        close(). Raises ChannelRefused when the node has no channel for this Worker."""
        failures = 0
        while not self._closing:
            opening = self._opening = asyncio.ensure_future(
                self._conn.open_websocket(CHANNEL_PATH, self._params, heartbeat_s=PING_S)
            )
            try:
                ws = await opening
            except asyncio.CancelledError:
                if self._closing and opening.cancelled():  # close() while no node answered
                    return
                raise
            except DexError as exc:
                if exc.status in (400, 404):
                    raise ChannelRefused(exc) from None
                raise
            self.sessions += 1
            code = await self._session(ws, stopping)
            if self._closing:
                return
            if code == CLOSE_NOT_ACTIVE:
                log.info("worker %s: the node is no longer active; reconnecting to the active one", self.worker_id)
                failures = 0
            else:
                log.warning("worker %s: channel closed (code %s); reconnecting", self.worker_id, code)
                await self._conn.sleep_before_retry(failures)
                failures += 1

    async def close(self) -> None:
        """Close the channel for good (a stopped Worker)."""
        self._closing = True
        self._wake.set()
        if self._opening is not None:
            self._opening.cancel()
        if self._ws is not None:
            await self._ws.close()

    async def _session(self, ws: aiohttp.ClientWebSocketResponse, stopping: asyncio.Event) -> int | None:
        """One open channel: send what is queued, read what comes, until it closes."""
        self._ws = ws
        # The node's credit for this Worker starts at 0 with each channel; reports it may
        # not have seen go again.
        self._credit = 0 if stopping.is_set() else self._peer.free_slots()
        self._reports = [*self.unacked.values(), *self._reports]
        self.unacked.clear()
        writer = asyncio.create_task(self._write(ws))
        try:
            await self._read(ws)
        finally:
            self.connected.clear()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            self._ws = None
        return ws.close_code

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                break
            try:
                frame = decode_frame(msg.data, self._encoding)
                self._on_frame(frame)
            except (ProtocolError, KeyError, TypeError) as exc:
                log.error(
                    "worker %s: a frame from the node does not fit the protocol (%s); reconnecting", self.worker_id, exc
                )
                await ws.close()
                break

    def _on_frame(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == WELCOME:
            self._peer.on_welcome(list(frame.get("held") or []))
            self.connected.set()
            self._wake.set()
        elif kind == TASKS:
            self._tasks_seq = max(self._tasks_seq, frame["seq"])
            self._peer.on_tasks(frame["tasks"])
        elif kind == ACKS:
            for ack in frame["acks"]:
                self._on_ack(ack)
        elif kind == CANCEL:
            self._peer.on_cancel(frame["task_token"], frame["reason"])
        # Other types: from a newer node; ignored, as the protocol says.

    def _on_ack(self, ack: dict[str, Any]) -> None:
        self._acked.set()
        report = self.unacked.pop(ack["task_token"], None)
        if report is None:
            return  # an ack of a report sent again meanwhile: the first one settled it
        if ack["status"] == 503:  # not committed: send it again after a pause
            asyncio.get_running_loop().call_later(self._conn.retry_delay(1), self._resend, report)
            return
        self._peer.on_ack(report, ack)

    def _resend(self, report: Report) -> None:
        if not self._closing:
            self._reports.append(report)
            self._wake.set()

    async def _write(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        await self.connected.wait()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._reports or self._credit:
                await asyncio.sleep(0)  # what else finishes in this turn of the loop joins the frame
            elif self._deltas:
                await asyncio.sleep(DELTA_BATCH_S)
            frame = self._take_frame()
            if frame is None:
                continue
            if "results" in frame and self._failpoints is not None:
                self._failpoints.hit("worker.channel.before-results")
            data = encode_frame(frame, self._encoding)
            if isinstance(data, str):
                await ws.send_str(data)
            else:
                await ws.send_bytes(data)
            if self._reports or self._deltas:
                self._wake.set()

    def _take_frame(self) -> dict[str, Any] | None:
        reports, self._reports = self._reports[:MAX_BATCH], self._reports[MAX_BATCH:]
        tokens = list(self._deltas)[:MAX_BATCH]
        deltas = [{"task_token": t, "deltas": self._deltas.pop(t)} for t in tokens]
        credit, self._credit = self._credit, 0
        if not (reports or deltas or credit or self._tasks_seq > self._ack_sent):
            return None
        for report in reports:
            self.unacked[report.task_token] = report
        frame: dict[str, Any] = {"type": RESULTS if reports or deltas else CREDIT, "ack": self._tasks_seq}
        self._ack_sent = self._tasks_seq
        if reports:
            frame["results"] = [r.as_json() for r in reports]
        if deltas:
            frame["deltas"] = deltas
        if credit:
            frame["credit"] = credit
        return frame
