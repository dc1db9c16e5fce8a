"""Raft transport, the sending side: one PeerSender per peer, and the log budget.

Each node dials every peer once and sends on that connection only (the etcd "stream"
model): a PeerSender holds the peer's bounded queue and a task that keeps one
connection up (dial, authenticate, write batches; on failure drop and back off).

Loss: Raft tolerates lost messages, so the sender drops instead of blocking: when a
peer's queue is full, while its connection is backing off after a failure, and whatever
was queued when a connection fails. Each drop calls ``on_unreachable(peer)``.
Callbacks triggered by send() run soon after it (loop.call_soon), never inside it.
``on_snapshot_sent(peer, ok)`` reports that a snapshot's last chunk was handed to the
kernel (ok) or that the transfer failed (the core then retries).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections import deque
from collections.abc import Callable
from typing import Protocol

from . import handshake
from .handshake import HandshakeError, IdentityCheck
from .identity import Identity
from .snapshot_stream import OutgoingSnapshot
from .types import Message, MessageType, encode_message
from .wire import KIND_MESSAGE, FrameMac, FrameTooLarge, ProtocolError, TransportStats, pack_frame

Address = tuple[str, int]

BATCH_BYTES = 1 << 20  # one write() to a socket: as many queued frames as fit
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
STABLE_CONNECTION_S = 1.0  # a connection that lived this long resets the backoff


class SenderHost(Protocol):
    """What a PeerSender needs from the transport that owns it: its settings, its
    counters and log, and the callbacks to the node (RaftTransport is one)."""

    node_id: str
    secret: bytes | None
    ssl_client: ssl.SSLContext | None
    tag_bytes: int
    max_frame_bytes: int
    snapshot_chunk_bytes: int
    max_snapshot_bytes: int
    max_queue_messages: int
    max_queue_bytes: int
    handshake_timeout: float
    log: logging.Logger
    stats: TransportStats
    rng: random.Random
    on_unreachable: Callable[[str], None] | None
    on_snapshot_sent: Callable[[str, bool], None] | None
    identity: Callable[[], Identity]
    check_identity: IdentityCheck | None

    def notify(self, callback: Callable[..., None] | None, *args: object) -> None: ...

    def notify_later(self, callback: Callable[..., None] | None, *args: object) -> None: ...

    def frame_mac(self, done: handshake.Handshake) -> FrameMac | None: ...


# What a failed dial may raise: the network, TLS, a timeout, or a peer failing the handshake.
_CONNECT_ERRORS = (OSError, TimeoutError, HandshakeError, FrameTooLarge, asyncio.IncompleteReadError)


REJECTION_LOG_BURST = 10  # rejected-connection lines per window
REJECTION_LOG_WINDOW_S = 10.0


class LogBudget:
    """At most `burst` log lines per `window_s`; the rest are counted, and the count is
    handed back with the first allowed line of a later window."""

    def __init__(self, burst: int, window_s: float) -> None:
        self.burst, self.window_s = burst, window_s
        self._window_start = float("-inf")
        self._used = 0
        self._unlogged = 0

    def take(self, now: float) -> tuple[bool, int]:
        """(may this line be logged, how many lines went unlogged before it)."""
        if now - self._window_start >= self.window_s:
            self._window_start, self._used = now, 0
        if self._used >= self.burst:
            self._unlogged += 1
            return False, 0
        self._used += 1
        unlogged, self._unlogged = self._unlogged, 0
        return True, unlogged


class PeerSender:
    """The outbound side for one peer: a bounded queue and a task that keeps one
    connection up (dial, authenticate, write batches; on failure drop and back off)."""

    def __init__(self, transport: SenderHost, peer_id: str, addr: Address) -> None:
        self.t = transport
        self.peer_id = peer_id
        self.addr = addr
        self.queue: deque[bytes | Message] = deque()  # encoded frames; a SNAP stays a Message
        self.queued_bytes = 0
        self.unreachable = False  # the last dial failed and we are waiting to retry
        self.snapshot: OutgoingSnapshot | None = None
        self.task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._failures = 0  # consecutive failed connection attempts, for log levels
        self.writer: asyncio.StreamWriter | None = None  # set while a connection is up
        self.mac: FrameMac | None = None  # with the writer, in secret mode (no TLS)
        self._peer_is_back = asyncio.Event()

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._run(), name=f"raft-send-{self.t.node_id}-{self.peer_id}")

    # -- queueing (called from send(), must not block)

    def enqueue(self, msg: Message) -> None:
        t = self.t
        if self.unreachable:
            self._drop(msg, "peer unreachable")
        elif len(self.queue) >= t.max_queue_messages or self.queued_bytes >= t.max_queue_bytes:
            self._drop(msg, "send queue full")
        elif msg.type == MessageType.SNAP:
            if len(msg.data) > t.max_snapshot_bytes:
                t.log.error(
                    "raft snapshot for %s is %d bytes, above max_snapshot_bytes %d: dropped",
                    self.peer_id,
                    len(msg.data),
                    t.max_snapshot_bytes,
                )
                self._drop(msg, "too large")
                return
            self.queue.append(msg)
            self._wake.set()
        else:
            frame = pack_frame(KIND_MESSAGE, encode_message(msg), t.tag_bytes)
            if len(frame) - 4 > t.max_frame_bytes:
                t.log.error(
                    "raft message %s to %s is %d bytes, above max_frame_bytes %d: dropped",
                    msg.type.name,
                    self.peer_id,
                    len(frame) - 4,
                    t.max_frame_bytes,
                )
                self._drop(msg, "too large")
                return
            self.queue.append(frame)
            self.queued_bytes += len(frame)
            self._wake.set()

    def _drop(self, msg: Message, reason: str) -> None:
        self.t.stats.messages_dropped += 1
        self.t.log.debug("raft message %s to %s dropped: %s", msg.type.name, self.peer_id, reason)
        self.t.notify_later(self.t.on_unreachable, self.peer_id)
        if msg.type == MessageType.SNAP:
            self.t.stats.snapshots_failed += 1
            self.t.notify_later(self.t.on_snapshot_sent, self.peer_id, False)

    def abandon(self) -> list[Message]:
        """Forget everything queued; returns the SNAP messages that will not be sent."""
        lost = [m for m in self.queue if isinstance(m, Message)]
        if self.snapshot is not None:
            lost.append(self.snapshot.msg)
            self.snapshot = None
        self.queue.clear()
        self.queued_bytes = 0
        return lost

    def _fail_pending(self) -> None:
        """The connection failed: whatever was queued or half-sent is lost."""
        had_frames = bool(self.queue) or self.snapshot is not None
        self.t.stats.messages_dropped += len(self.queue)
        for _ in self.abandon():
            self.t.stats.snapshots_failed += 1
            self.t.notify(self.t.on_snapshot_sent, self.peer_id, False)
        if had_frames:
            self.t.notify(self.t.on_unreachable, self.peer_id)

    # -- the connection loop

    async def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while True:
            try:
                reader, writer, mac = await self._connect()
            except Exception as exc:
                self._log_connect_failure(exc)
                self._fail_pending()
                # Unreachable: send() drops at once while we wait, rather than queue
                # messages that would be stale by the time a connection exists.
                backoff = await self._back_off(backoff, unreachable=True)
                continue
            lived = await self._serve(reader, writer, mac)
            self._fail_pending()
            if lived < STABLE_CONNECTION_S:
                # A peer that accepts and then drops us must not make us spin; the peer
                # was reachable a moment ago, so keep queueing meanwhile.
                backoff = await self._back_off(backoff, unreachable=False)
            else:
                backoff = BACKOFF_MIN_S

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mac: FrameMac | None) -> float:
        """Run one connection until it fails; returns how long it lasted (seconds)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self._pump(reader, writer, mac)
        except (OSError, ProtocolError, asyncio.IncompleteReadError) as exc:
            self.t.log.info("raft connection to %s at %s:%d lost: %s", self.peer_id, *self.addr, exc)
        except Exception:
            self.t.log.exception("raft connection to %s: unexpected error", self.peer_id)
        finally:
            writer.close()  # also when cancelled by stop() or set_peers()
        return loop.time() - started

    async def _back_off(self, delay: float, unreachable: bool) -> float:
        """Sleep about `delay` (jittered so nodes do not retry in lockstep), or until the
        peer shows it is back by dialing us; returns the next delay."""
        self.unreachable = unreachable
        self._peer_is_back.clear()
        try:
            async with asyncio.timeout(delay * (0.5 + self.t.rng.random())):  # not wait_for (3.11 cancel race)
                await self._peer_is_back.wait()
            return BACKOFF_MIN_S
        except TimeoutError:
            return min(delay * 2, BACKOFF_MAX_S)
        finally:
            self.unreachable = False

    def peer_dialed_us(self) -> None:
        """The peer just authenticated an inbound connection: it is up again, so redial
        now rather than at the end of a backoff that may have grown to seconds (after a
        restart, that wait would swallow our vote requests and cost an election)."""
        self._peer_is_back.set()

    def _log_connect_failure(self, exc: Exception) -> None:
        self.t.stats.connect_failures += 1
        self._failures += 1
        if not isinstance(exc, _CONNECT_ERRORS):  # a bug, not the network: say so loudly
            self.t.log.error("raft connection to %s: unexpected error", self.peer_id, exc_info=exc)
            return
        # The first failure of a streak is news; the retries every few seconds are not.
        level = logging.WARNING if self._failures == 1 else logging.DEBUG
        self.t.log.log(
            level, "raft connection to %s at %s:%d failed: %s", self.peer_id, *self.addr, str(exc) or type(exc).__name__
        )

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameMac | None]:
        t = self.t
        host, port = self.addr
        async with asyncio.timeout(t.handshake_timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=t.ssl_client, server_hostname=host if t.ssl_client else None
            )
            try:
                mac = await self._dialer_handshake(reader, writer)
            except BaseException:
                writer.close()
                raise
        if self._failures:
            t.log.info("raft connection to %s at %s:%d is back", self.peer_id, host, port)
        self._failures = 0
        return reader, writer, mac

    async def _dialer_handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> FrameMac | None:
        """Authenticate both ways; returns what tags our frames on this connection."""
        t = self.t
        done = await handshake.dial(
            reader,
            writer,
            node_id=t.node_id,
            secret=t.secret,
            expected_peer_id=self.peer_id,
            addr=self.addr,
            identity=t.identity(),
            check=t.check_identity,
        )
        return t.frame_mac(done)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mac: FrameMac | None) -> None:
        """Write queued frames in batches until the connection fails."""
        # The acceptor never writes after the handshake: a read completes only when the
        # peer closes (or misbehaves), which tells us to reconnect without waiting for
        # the next write to fail.
        closed = asyncio.ensure_future(reader.read(1))
        self.writer, self.mac = writer, mac
        try:
            while True:
                if not self.queue and self.snapshot is None:
                    await self._wait_for_work(closed)
                    continue
                self._write_batch(writer)
                await writer.drain()
                if self.snapshot is not None and self.snapshot.finished:
                    self._snapshot_done()
                if closed.done():
                    raise ProtocolError("peer closed the connection")
        finally:
            self.writer, self.mac = None, None
            closed.cancel()
            if closed.done() and not closed.cancelled():
                closed.exception()  # retrieved, so asyncio does not log it as forgotten

    async def _wait_for_work(self, closed: asyncio.Future[bytes]) -> None:
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((woken, closed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        if closed.done():
            raise ProtocolError("peer closed the connection")

    def write_now(self) -> None:
        """Hand queued frames to the socket without waiting for the pump task.

        The pump only runs when the event loop gets control; a caller about to block
        the loop (the node loop's fsync) calls this first so the bytes are already on
        their way. Skipped while a snapshot streams or the socket buffer is backed up:
        the pump and its drain() keep flow control there.
        """
        w = self.writer
        if w is None or not self.queue or self.snapshot is not None or w.transport.is_closing():
            return
        if w.transport.get_write_buffer_size() > BATCH_BYTES:
            return
        self._write_batch(w)

    def _write_batch(self, writer: asyncio.StreamWriter) -> None:
        batch, frames = self._next_batch()
        writer.write(batch)
        self.t.stats.frames_sent += frames
        self.t.stats.writes += 1
        self.t.stats.bytes_sent += len(batch)

    def _next_batch(self) -> tuple[bytes, int]:
        """Many queued frames for one write, plus at most one snapshot chunk; tagged."""
        frames: list[bytes] = []
        size = 0
        chunk_taken = False
        while self.queue and size < BATCH_BYTES:
            item = self.queue[0]
            if isinstance(item, Message):  # a SNAP: starts in its place, one at a time
                if self.snapshot is not None:
                    break
                self.queue.popleft()
                self.snapshot = OutgoingSnapshot(item, self.t.snapshot_chunk_bytes, self.t.tag_bytes)
                item = self.snapshot.next_frame()
                chunk_taken = True
            else:
                self.queue.popleft()
                self.queued_bytes -= len(item)
            frames.append(item)
            size += len(item)
        if self.snapshot is not None and not chunk_taken and not self.snapshot.finished:
            frames.append(self.snapshot.next_frame())
        return self._seal(frames), len(frames)

    def _seal(self, frames: list[bytes]) -> bytes:
        """The frames as they go on the wire: each followed by its tag, in secret mode.
        Tags are made here, at write time, because the sequence number and the key
        belong to the connection, and a frame may be queued before that one exists."""
        mac = self.mac
        if mac is None:
            return b"".join(frames)
        parts: list[bytes] = []
        for frame in frames:
            parts += (frame, mac.seal(frame))
        return b"".join(parts)

    def _snapshot_done(self) -> None:
        assert self.snapshot is not None
        self.t.stats.snapshots_sent += 1
        self.t.log.info("raft snapshot (%d bytes) sent to %s", self.snapshot.total, self.peer_id)
        self.snapshot = None
        self.t.notify(self.t.on_snapshot_sent, self.peer_id, True)
