"""Raft transport: TCP connections carrying length-prefixed msgpack frames between nodes.

Each node dials every peer once and sends on that connection only; it receives on the
connections its peers dialed. So between two nodes there are two one-way streams, each
ordered, each with its own reconnect loop (the etcd "stream" model). A transport made
with ``listen=None`` opens no port: it can only dial, which is all a single voter (or
``dex-ha dev``) needs, since no one ever sends to it.

Wire format, in both directions::

    frame   = [u32 big-endian length][kind byte][body][tag]   length counts kind + body + tag
    MESSAGE   body = types.encode_message(msg)
    CHUNK     body = msgpack [offset, total, done, header, data]  (one piece of a SNAP)
    HELLO / AUTH / AUTH_OK   the handshake below (never a tag)

A frame longer than ``max_frame_bytes`` drops the connection as soon as its length is
read: it is never buffered. Before authentication the limit is 4 KiB.

Handshake (dialer D, acceptor A), under a deadline (``handshake_timeout``, 5 s)::

    A -> D  HELLO    ["dex-ha-raft", 2, challenge_A]          32 random bytes
    D -> A  AUTH     [id_D, challenge_D, mac("dialer", challenge_A, id_D)]
    A -> D  AUTH_OK  [id_A, mac("acceptor", challenge_D, id_A)]

    mac(role, challenge, id) = HMAC-SHA256(secret, "dex-ha-raft " + role + NUL + challenge + id)

Each side proves it holds the secret by answering a fresh challenge of the other, so
neither talks to an impostor, and a recorded answer cannot be replayed. The role label
keeps an answer given as dialer from being reflected as an acceptor's answer. A only
answers after checking D, so it cannot be used as an oracle. Comparisons are
constant-time; a missing, short or wrong MAC is refused. Without a secret the MACs are
empty and unchecked (insecure mode; the node loop logs it). With TLS contexts the
connection is mutual TLS first (the acceptor requires a client certificate), then the
same handshake inside it. After the handshake every message's ``frm`` must equal the
authenticated id, or the connection is dropped.

Frames after the handshake (secret mode without TLS). The handshake alone would let a
relay that forwarded it inject, replay or reorder frames afterwards, so every frame
carries a tag, as in the TLS 1.2 record MAC (RFC 5246 §6.2.3.1)::

    tag = HMAC-SHA256(K, seq || frame without its tag)[:16]    seq: u64 big-endian
    K   = HKDF-SHA256(ikm=secret, salt=challenge_D || challenge_A,
                      info="dex-ha peer v1" || u16 len || id_D || u16 len || id_A || direction)

``seq`` counts the frames of the connection from 0 and is never sent: both ends count,
so a frame that is injected, dropped, replayed or reordered fails, and so does the first
frame after it. K is fresh per connection (both challenges are) and per direction
(``direction`` is "dialer->acceptor"; the acceptor sends nothing after AUTH_OK, the
other label is reserved for it), so a frame recorded on one connection fails on any
other. A frame whose tag fails drops the connection (the dialer redials). 16 bytes (128
bits, half of SHA-256's output, the least RFC 2104 §5 advises) leave a forger one chance
in 2^128 per try, and each try costs it the connection. With mutual TLS the record layer
already protects every frame, and without a secret there is no key: no tag in either
case.

Snapshots: a SNAP message is sent as CHUNK frames of ``snapshot_chunk_bytes``; the first
chunk carries the message without its data as ``header``. The receiver reassembles in
memory (bounded by ``max_snapshot_bytes``, 4 GiB) and calls on_message once with the
whole Message. Between two chunks the sender writes the other queued messages, so
heartbeats keep flowing during a long transfer: a SNAP is the one message that later
messages may overtake. ``on_snapshot_sent(peer, ok)`` reports that the last chunk was
handed to the kernel (ok) or that the transfer failed (the core then retries).

Loss: Raft tolerates lost messages, so the transport drops instead of blocking: when a
peer's queue is full, while its connection is backing off after a failure, and whatever
was queued when a connection fails. Each drop calls ``on_unreachable(peer)``.
Callbacks triggered by send() run soon after it (loop.call_soon), never inside it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import os
import random
import socket
import ssl
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from .types import MalformedMessage, Message, MessageType, decode_message, encode_message

Address = tuple[str, int]

PROTOCOL = "dex-ha-raft"
PROTOCOL_VERSION = 2  # 2: frames after the handshake carry a tag (secret mode)
CHALLENGE_BYTES = 32
HANDSHAKE_MAC_BYTES = 32  # a whole HMAC-SHA256
TAG_BYTES = 16  # a frame's tag: see the module docstring for why 16 are enough
LINK_KEY_LABEL = b"dex-ha peer v1"
DIALER_TO_ACCEPTOR = b"dialer->acceptor"
ACCEPTOR_TO_DIALER = b"acceptor->dialer"  # reserved: the acceptor sends no frame after AUTH_OK
HANDSHAKE_MAX_FRAME = 4096
DEFAULT_MAX_FRAME_BYTES = 16 << 20  # node.py keeps max_entry_bytes below it
MAX_NODE_ID_CHARS = 255

KIND_MESSAGE = 1
KIND_CHUNK = 2
KIND_HELLO = 16
KIND_AUTH = 17
KIND_AUTH_OK = 18

_LENGTH = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_SEQ_AND_LENGTH = struct.Struct(">QI")
_ID_LENGTH = struct.Struct(">H")
READ_BYTES = 256 << 10  # one read() from a socket
BATCH_BYTES = 1 << 20  # one write() to a socket: as many queued frames as fit
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
STABLE_CONNECTION_S = 1.0  # a connection that lived this long resets the backoff


class FrameTooLarge(Exception):
    """A length prefix above the limit: the peer is broken or hostile."""


class ProtocolError(Exception):
    """A frame that is well-formed but not allowed here (wrong kind, order, sender)."""


class FrameAuthError(ProtocolError):
    """A frame whose tag does not verify: injected, replayed, reordered or corrupted."""


class HandshakeError(Exception):
    """The peer failed to authenticate (or we failed to authenticate it)."""


@dataclass
class TransportStats:
    frames_sent: int = 0
    bytes_sent: int = 0
    writes: int = 0  # socket writes: frames_sent / writes is the batching factor
    frames_received: int = 0
    bytes_received: int = 0
    messages_dropped: int = 0  # not sent: queue full, peer unreachable, unknown peer, too large
    connections_rejected: int = 0  # inbound connections that failed TLS or the handshake
    connections_dropped: int = 0  # authenticated connections closed for a protocol error
    frames_unauthenticated: int = 0  # frames whose tag failed (each also drops its connection)
    connect_failures: int = 0  # outbound dials (incl. handshake) that failed
    snapshots_sent: int = 0
    snapshots_received: int = 0
    snapshots_failed: int = 0


# ---------------------------------------------------------------------------------- frames


def pack_frame(kind: int, body: bytes, tag_bytes: int = 0) -> bytes:
    """A frame whose length also counts the tag that FrameMac.seal() appends to it."""
    return _LENGTH.pack(len(body) + 1 + tag_bytes) + bytes((kind,)) + body


class FrameDecoder:
    """Splits a byte stream into frames (kind byte + body).

    Raises FrameTooLarge as soon as a length prefix above the limit arrives, so an
    oversized frame is never buffered; the buffer holds at most one frame plus one read.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        off, size = 0, len(buf)
        with memoryview(buf) as view:
            while size - off >= 4:
                (n,) = _LENGTH.unpack_from(buf, off)
                if n > self.max_frame_bytes:
                    raise FrameTooLarge(f"frame length {n} (limit {self.max_frame_bytes})")
                if n == 0:
                    raise ProtocolError("empty frame")
                if size - off - 4 < n:
                    break
                frames.append(bytes(view[off + 4 : off + 4 + n]))
                off += 4 + n
        del buf[:off]
        return frames


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[int, bytes]:
    """One frame during the handshake, before the bulk reader takes over."""
    (n,) = _LENGTH.unpack(await reader.readexactly(4))
    if not 1 <= n <= limit:
        raise FrameTooLarge(f"handshake frame length {n} (limit {limit})")
    frame = await reader.readexactly(n)
    return frame[0], frame[1:]


def _unpack_fields(kind: int, body: bytes, expected_kind: int, n: int) -> list[object]:
    if kind != expected_kind:
        raise HandshakeError(f"expected handshake frame {expected_kind}, got {kind}")
    try:
        fields = msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise HandshakeError(f"undecodable handshake frame: {exc}") from exc
    if not isinstance(fields, list) or len(fields) != n:
        raise HandshakeError("handshake frame has the wrong shape")
    return fields


def _check_node_id(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NODE_ID_CHARS:
        raise HandshakeError("invalid node id in handshake")
    return value


def _mac(secret: bytes | None, role: str, challenge: bytes, node_id: str) -> bytes:
    if secret is None:
        return b""
    msg = f"{PROTOCOL} {role}\0".encode() + challenge + node_id.encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _verify_mac(secret: bytes | None, role: str, challenge: bytes, node_id: str, mac: object) -> None:
    if secret is None:
        return  # insecure mode: nothing to check
    # The length first, said out loud: an empty or truncated answer must never pass as
    # a prefix of the right one (compare_digest also refuses it, in constant time).
    if (not isinstance(mac, bytes) or len(mac) != HANDSHAKE_MAC_BYTES
            or not hmac.compare_digest(mac, _mac(secret, role, challenge, node_id))):
        raise HandshakeError(f"bad or missing authentication from a peer claiming to be {node_id!r}")


# ---------------------------------------------------------------------------------- frame tags


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF (RFC 5869) with SHA-256: extract a key from `ikm` with `salt`, then expand it
    to `length` bytes bound to `info`."""
    prk = hmac.digest(salt, ikm, "sha256")
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes((counter,)), "sha256")
        okm += block
    return okm[:length]


def link_key(secret: bytes, dialer_challenge: bytes, acceptor_challenge: bytes,
             dialer_id: str, acceptor_id: str, direction: bytes) -> bytes:
    """The key of one direction of one connection (see the module docstring). The ids are
    length-prefixed, so ("ab", "c") and ("a", "bc") give different keys."""
    info = LINK_KEY_LABEL
    for node_id in (dialer_id, acceptor_id):
        raw = node_id.encode()
        info += _ID_LENGTH.pack(len(raw)) + raw
    return hkdf_sha256(secret, dialer_challenge + acceptor_challenge, info + direction)


class FrameMac:
    """Tags the frames of one direction of one connection: the sender seals, the receiver
    opens, each counting the sequence number on its own."""

    def __init__(self, key: bytes) -> None:
        # Keyed once; each tag starts from a copy (this saves rehashing the padded key).
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)
        self._seq = 0

    def _tag(self, head: bytes, rest: bytes | memoryview) -> bytes:
        h = self._keyed.copy()
        h.update(head)
        h.update(rest)
        return h.digest()[:TAG_BYTES]

    def seal(self, frame: bytes) -> bytes:
        """The tag to send right after `frame` (made by pack_frame with TAG_BYTES)."""
        tag = self._tag(_SEQ.pack(self._seq), frame)
        self._seq += 1
        return tag

    def open(self, frame: bytes) -> memoryview:
        """`frame` as FrameDecoder returns it (kind, body, tag): its kind and body, or
        FrameAuthError."""
        tag_at = len(frame) - TAG_BYTES
        if tag_at < 1:
            raise FrameAuthError(f"frame {self._seq} of this connection is too short to carry a tag")
        view = memoryview(frame)
        # What the sender tagged: the sequence number, then the frame from its length prefix.
        expected = self._tag(_SEQ_AND_LENGTH.pack(self._seq, len(frame)), view[:tag_at])
        if not hmac.compare_digest(expected, view[tag_at:]):
            raise FrameAuthError(f"frame {self._seq} of this connection fails its MAC: it was injected, "
                                 "replayed, reordered or corrupted on the way")
        self._seq += 1
        return view[:tag_at]


# ---------------------------------------------------------------------------------- snapshots


@dataclass
class _Reassembly:
    """A snapshot being received on one connection."""

    header: Message
    total: int
    data: bytearray


class _OutgoingSnapshot:
    """A SNAP message being sent chunk by chunk."""

    def __init__(self, msg: Message, chunk_bytes: int, tag_bytes: int) -> None:
        self.msg = msg
        self.total = len(msg.data)
        self.offset = 0
        self.finished = False  # the last chunk has been taken
        self._chunk_bytes = chunk_bytes
        self._tag_bytes = tag_bytes
        self._view = memoryview(msg.data)

    def next_frame(self) -> bytes:
        end = min(self.offset + self._chunk_bytes, self.total)
        header = encode_message(dataclasses.replace(self.msg, data=b"")) if self.offset == 0 else None
        done = end == self.total
        body = msgpack.packb([self.offset, self.total, done, header, self._view[self.offset:end]],
                             use_bin_type=True)
        self.offset, self.finished = end, done
        return pack_frame(KIND_CHUNK, body, self._tag_bytes)


# ---------------------------------------------------------------------------------- sending

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


class _PeerSender:
    """The outbound side for one peer: a bounded queue and a task that keeps one
    connection up (dial, authenticate, write batches; on failure drop and back off)."""

    def __init__(self, transport: RaftTransport, peer_id: str, addr: Address) -> None:
        self.t = transport
        self.peer_id = peer_id
        self.addr = addr
        self.queue: deque[bytes | Message] = deque()  # encoded frames; a SNAP stays a Message
        self.queued_bytes = 0
        self.unreachable = False  # the last dial failed and we are waiting to retry
        self.snapshot: _OutgoingSnapshot | None = None
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
                t.log.error("raft snapshot for %s is %d bytes, above max_snapshot_bytes %d: dropped",
                            self.peer_id, len(msg.data), t.max_snapshot_bytes)
                self._drop(msg, "too large")
                return
            self.queue.append(msg)
            self._wake.set()
        else:
            frame = pack_frame(KIND_MESSAGE, encode_message(msg), t.tag_bytes)
            if len(frame) - 4 > t.max_frame_bytes:
                t.log.error("raft message %s to %s is %d bytes, above max_frame_bytes %d: dropped",
                            msg.type.name, self.peer_id, len(frame) - 4, t.max_frame_bytes)
                self._drop(msg, "too large")
                return
            self.queue.append(frame)
            self.queued_bytes += len(frame)
            self._wake.set()

    def _drop(self, msg: Message, reason: str) -> None:
        self.t.stats.messages_dropped += 1
        self.t.log.debug("raft message %s to %s dropped: %s", msg.type.name, self.peer_id, reason)
        self.t._notify_later(self.t.on_unreachable, self.peer_id)
        if msg.type == MessageType.SNAP:
            self.t.stats.snapshots_failed += 1
            self.t._notify_later(self.t.on_snapshot_sent, self.peer_id, False)

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
            self.t._notify(self.t.on_snapshot_sent, self.peer_id, False)
        if had_frames:
            self.t._notify(self.t.on_unreachable, self.peer_id)

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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     mac: FrameMac | None) -> float:
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
            async with asyncio.timeout(delay * (0.5 + self.t._rng.random())):  # not wait_for (3.11 cancel race)
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
        self.t.log.log(level, "raft connection to %s at %s:%d failed: %s", self.peer_id, *self.addr,
                       str(exc) or type(exc).__name__)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameMac | None]:
        t = self.t
        host, port = self.addr
        async with asyncio.timeout(t.handshake_timeout):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=t.ssl_client, server_hostname=host if t.ssl_client else None)
            try:
                mac = await self._dialer_handshake(reader, writer)
            except BaseException:
                writer.close()
                raise
        if self._failures:
            t.log.info("raft connection to %s at %s:%d is back", self.peer_id, host, port)
        self._failures = 0
        return reader, writer, mac

    async def _dialer_handshake(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> FrameMac | None:
        """Authenticate both ways; returns what tags our frames on this connection."""
        t = self.t
        proto, version, challenge = _unpack_fields(*await _read_frame(reader, HANDSHAKE_MAX_FRAME), KIND_HELLO, 3)
        if proto != PROTOCOL or version != PROTOCOL_VERSION:
            raise HandshakeError(f"peer speaks {proto!r} version {version!r}")
        if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_BYTES:
            raise HandshakeError("bad challenge from peer")
        my_challenge = os.urandom(CHALLENGE_BYTES)
        auth = [t.node_id, my_challenge, _mac(t.secret, "dialer", challenge, t.node_id)]
        writer.write(pack_frame(KIND_AUTH, msgpack.packb(auth, use_bin_type=True)))
        await writer.drain()
        peer_id, mac = _unpack_fields(*await _read_frame(reader, HANDSHAKE_MAX_FRAME), KIND_AUTH_OK, 2)
        peer_id = _check_node_id(peer_id)
        _verify_mac(t.secret, "acceptor", my_challenge, peer_id, mac)
        if peer_id != self.peer_id:
            raise HandshakeError(f"{self.addr[0]}:{self.addr[1]} is node {peer_id!r}, not {self.peer_id!r}")
        return t._frame_mac(my_challenge, challenge, t.node_id, peer_id)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    mac: FrameMac | None) -> None:
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
                self.snapshot = _OutgoingSnapshot(item, self.t.snapshot_chunk_bytes, self.t.tag_bytes)
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
        self.t._notify(self.t.on_snapshot_sent, self.peer_id, True)


# ---------------------------------------------------------------------------------- transport


class RaftTransport:
    """Carries Raft messages between this node and its peers. See the module docstring."""

    def __init__(self, node_id: str, listen: Address | None, peers: dict[str, Address],
                 on_message: Callable[[Message], None], *, secret: bytes | None = None,
                 ssl_server: ssl.SSLContext | None = None, ssl_client: ssl.SSLContext | None = None,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, snapshot_chunk_bytes: int = 1 << 20,
                 max_snapshot_bytes: int = 4 << 30,
                 max_queue_messages: int = 4096, max_queue_bytes: int = 64 << 20,
                 handshake_timeout: float = 5.0,
                 on_unreachable: Callable[[str], None] | None = None,
                 on_snapshot_sent: Callable[[str, bool], None] | None = None,
                 logger: logging.Logger | None = None) -> None:
        """Beyond the obvious: `max_snapshot_bytes` bounds a reassembled snapshot (it is
        held in memory); `max_queue_messages` / `max_queue_bytes` bound each peer's send
        queue (beyond them send() drops); `handshake_timeout` bounds dialing, TLS and
        the handshake, in seconds. Peers equal to node_id are ignored. `listen` None: no
        listener (see the module docstring)."""
        if (ssl_server is None) != (ssl_client is None):
            raise ValueError("mutual TLS needs both ssl_server and ssl_client (or neither)")
        if snapshot_chunk_bytes + 64 * 1024 > max_frame_bytes:
            raise ValueError("snapshot_chunk_bytes must leave 64 KiB of max_frame_bytes for the chunk header")
        if secret is not None and len(secret) < 16:
            raise ValueError("the cluster secret must be at least 16 bytes")
        self.node_id = node_id
        self.listen = listen
        self.port: int | None = None
        self.on_message = on_message
        self.on_unreachable = on_unreachable
        self.on_snapshot_sent = on_snapshot_sent
        self.secret = secret
        self.ssl_server = ssl_server
        self.ssl_client = ssl_client
        # Frames carry a tag with a secret and without TLS (whose records are protected).
        self.tag_bytes = TAG_BYTES if secret is not None and ssl_server is None else 0
        self.max_frame_bytes = max_frame_bytes
        self.snapshot_chunk_bytes = snapshot_chunk_bytes
        self.max_snapshot_bytes = max_snapshot_bytes
        self.max_queue_messages = max_queue_messages
        self.max_queue_bytes = max_queue_bytes
        self.handshake_timeout = handshake_timeout
        self.log = logger or logging.getLogger(__name__)
        self.stats = TransportStats()
        self._rejection_log = LogBudget(burst=REJECTION_LOG_BURST, window_s=REJECTION_LOG_WINDOW_S)
        self._drop_log = LogBudget(burst=REJECTION_LOG_BURST, window_s=REJECTION_LOG_WINDOW_S)
        self._rng = random.Random()
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._senders: dict[str, _PeerSender] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # inbound handlers and retired senders
        self._inbound_writers: set[asyncio.StreamWriter] = set()
        self._started = False
        self._peers: dict[str, Address] = {}
        self.set_peers(peers)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen (port 0 picks a free port, stored in self.port), unless `listen` is
        None, and dial the peers."""
        if self.listen is not None:
            await self._start_listener(*self.listen)
        self._started = True
        for sender in self._senders.values():
            sender.start()

    async def _start_listener(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, *_, sockaddr = infos[0]
        self._listener = socket.create_server(sockaddr[:2], family=family, backlog=128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._accept_task = asyncio.create_task(self._accept_loop(self._listener),
                                                name=f"raft-accept-{self.node_id}")

    async def stop(self) -> None:
        """Close the listener and every connection; no task is left behind."""
        self._started = False
        tasks = set(self._tasks)
        if self._accept_task is not None:
            tasks.add(self._accept_task)
        for sender in self._senders.values():
            if sender.task is not None:
                tasks.add(sender.task)
        for writer in list(self._inbound_writers):
            writer.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener, self._accept_task = None, None
        self._senders = {pid: _PeerSender(self, pid, addr) for pid, addr in self._peers.items()}

    # ------------------------------------------------------------------ sending

    def send(self, msg: Message) -> None:
        """Queue msg for msg.to; never blocks. Lost messages are reported, not raised."""
        sender = self._senders.get(msg.to)
        if sender is None:
            self.stats.messages_dropped += 1
            self.log.debug("raft message %s to unknown peer %r dropped", msg.type.name, msg.to)
            return
        sender.enqueue(msg)

    def flush(self) -> None:
        """Write what is queued for every peer now (see _PeerSender.write_now)."""
        for sender in self._senders.values():
            sender.write_now()

    def snapshots_in_flight(self) -> dict[str, tuple[int, int]]:
        """(bytes written so far, total bytes) of each snapshot being sent, by peer (progress for people)."""
        return {peer_id: (sender.snapshot.offset, sender.snapshot.total)
                for peer_id, sender in self._senders.items() if sender.snapshot is not None}

    def set_peers(self, peers: dict[str, Address]) -> None:
        """Replace the peer set (membership change). Changed addresses reconnect."""
        self._peers = {pid: tuple(addr) for pid, addr in peers.items() if pid != self.node_id}
        if self._peers and self.listen is None:
            self.log.warning("raft transport of %s has no listener: peers %s cannot send to it",
                             self.node_id, ", ".join(sorted(self._peers)))
        for pid in list(self._senders):
            sender = self._senders[pid]
            if self._peers.get(pid) != sender.addr:
                self._retire(self._senders.pop(pid))
        for pid, addr in self._peers.items():
            if pid not in self._senders:
                sender = self._senders[pid] = _PeerSender(self, pid, addr)
                if self._started:
                    sender.start()

    def _retire(self, sender: _PeerSender) -> None:
        for _ in sender.abandon():
            self.stats.snapshots_failed += 1
            self._notify_later(self.on_snapshot_sent, sender.peer_id, False)
        if sender.task is not None:
            sender.task.cancel()
            self._track(sender.task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify(self, callback: Callable[..., None] | None, *args: object) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            self.log.exception("raft transport callback %r failed", callback)

    def _notify_later(self, callback: Callable[..., None] | None, *args: object) -> None:
        """From send(): the caller may be in the middle of handling a Ready."""
        if callback is None:
            return
        try:
            asyncio.get_running_loop().call_soon(self._notify, callback, *args)
        except RuntimeError:  # no loop yet (before start): nobody is in the middle of anything
            self._notify(callback, *args)

    # ------------------------------------------------------------------ receiving

    async def _accept_loop(self, listener: socket.socket) -> None:
        # Our own accept loop rather than asyncio.start_server: TLS must start before
        # any byte is read (start_tls on a stream races with the ClientHello), and a
        # failed TLS handshake must reach our log with the peer's address.
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # e.g. out of file descriptors: do not spin
                self.log.error("raft listener on port %s: accept failed: %s", self.port, exc)
                await asyncio.sleep(0.1)
                continue
            self._track(asyncio.create_task(self._serve_inbound(conn)))

    def _log_rejection(self, addr: str, reason: str) -> None:
        """A scanner or a misconfigured peer can open thousands of connections: log the
        first few of each window and then how many were not logged."""
        self._log_limited(self._rejection_log, "rejected connections",
                          "raft connection from %s rejected: %s", addr, reason)

    def _log_limited(self, budget: LogBudget, what: str, fmt: str, *args: object) -> None:
        allowed, unlogged = budget.take(asyncio.get_running_loop().time())
        if unlogged:
            self.log.warning("raft: %d more %s were not logged (see stats)", unlogged, what)
        if allowed:
            self.log.warning(fmt, *args)

    def _frame_mac(self, dialer_challenge: bytes, acceptor_challenge: bytes,
                   dialer_id: str, acceptor_id: str) -> FrameMac | None:
        """What tags the dialer's frames on a connection the handshake just authenticated
        (None: frames carry no tag here)."""
        if not self.tag_bytes:
            return None
        assert self.secret is not None
        return FrameMac(link_key(self.secret, dialer_challenge, acceptor_challenge,
                                 dialer_id, acceptor_id, DIALER_TO_ACCEPTOR))

    async def _serve_inbound(self, conn: socket.socket) -> None:
        addr = "%s:%d" % conn.getpeername()[:2]
        writer = None
        try:
            async with asyncio.timeout(self.handshake_timeout):
                reader, writer = await self._open_stream(conn)
                self._inbound_writers.add(writer)
                peer_id, mac = await self._acceptor_handshake(reader, writer)
            sender = self._senders.get(peer_id)
            if sender is not None:
                sender.peer_dialed_us()
        except (TimeoutError, HandshakeError, FrameTooLarge, asyncio.IncompleteReadError, OSError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
            self.stats.connections_rejected += 1
            self._log_rejection(addr, reason)
        except Exception:  # a bug on our side: refuse this connection, keep serving
            self.stats.connections_rejected += 1
            self.log.exception("raft connection from %s rejected after an unexpected error", addr)
        else:
            await self._receive(reader, peer_id, addr, mac)
        finally:
            if writer is not None:
                self._inbound_writers.discard(writer)
                writer.close()
            else:
                conn.close()

    async def _open_stream(self, conn: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Wrap an accepted socket in streams, completing mutual TLS first if configured."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_BYTES, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        # (The returned protocol is the TLS layer under uvloop, so keep our own.)
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, conn, ssl=self.ssl_server,
            ssl_handshake_timeout=self.handshake_timeout if self.ssl_server else None)
        # What asyncio.open_connection does for a dialed socket.
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _acceptor_handshake(self, reader: asyncio.StreamReader,
                                  writer: asyncio.StreamWriter) -> tuple[str, FrameMac | None]:
        """Authenticate both ways; returns the peer's id and what checks its frames."""
        challenge = os.urandom(CHALLENGE_BYTES)
        writer.write(pack_frame(KIND_HELLO, msgpack.packb([PROTOCOL, PROTOCOL_VERSION, challenge],
                                                          use_bin_type=True)))
        await writer.drain()
        peer_id, peer_challenge, mac = _unpack_fields(*await _read_frame(reader, HANDSHAKE_MAX_FRAME),
                                                      KIND_AUTH, 3)
        peer_id = _check_node_id(peer_id)
        _verify_mac(self.secret, "dialer", challenge, peer_id, mac)
        if peer_id == self.node_id:
            raise HandshakeError("peer claims our own node id")
        if not isinstance(peer_challenge, bytes) or len(peer_challenge) != CHALLENGE_BYTES:
            raise HandshakeError("bad challenge from peer")
        reply = [self.node_id, _mac(self.secret, "acceptor", peer_challenge, self.node_id)]
        writer.write(pack_frame(KIND_AUTH_OK, msgpack.packb(reply, use_bin_type=True)))
        await writer.drain()
        return peer_id, self._frame_mac(peer_challenge, challenge, peer_id, self.node_id)

    async def _receive(self, reader: asyncio.StreamReader, peer_id: str, addr: str,
                       mac: FrameMac | None) -> None:
        """Deliver frames until the peer closes or breaks the protocol (then drop it)."""
        decoder = FrameDecoder(self.max_frame_bytes)
        conn = _InboundConnection(self, peer_id, mac)
        try:
            while data := await reader.read(READ_BYTES):
                self.stats.bytes_received += len(data)
                for frame in decoder.feed(data):
                    self.stats.frames_received += 1
                    conn.handle_frame(frame)
        except (FrameTooLarge, ProtocolError, MalformedMessage) as exc:
            self.stats.connections_dropped += 1
            if isinstance(exc, FrameAuthError):
                self.stats.frames_unauthenticated += 1
            # Rate-limited: whoever can inject into the stream can make us drop (and the
            # peer redial) as often as it likes.
            self._log_limited(self._drop_log, "dropped connections",
                              "raft connection from %s (%s) dropped: %s: %s", peer_id, addr, type(exc).__name__, exc)
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.log.info("raft connection from %s (%s) lost: %s", peer_id, addr, exc)
        except Exception:  # a bug on our side: drop this connection, keep the node serving
            self.stats.connections_dropped += 1
            self.log.exception("raft connection from %s (%s) dropped after an unexpected error", peer_id, addr)
        if conn.reassembly is not None:
            self.stats.snapshots_failed += 1
            self.log.warning("raft snapshot from %s abandoned after %d of %d bytes", peer_id,
                             len(conn.reassembly.data), conn.reassembly.total)

    def _deliver(self, msg: Message) -> None:
        if msg.to != self.node_id:
            self.stats.messages_dropped += 1
            self.log.warning("raft message %s from %s is addressed to %r, not us (%r): dropped",
                             msg.type.name, msg.frm, msg.to, self.node_id)
            return
        self._notify(self.on_message, msg)


class _InboundConnection:
    """Per-connection receive state: the authenticated sender, what checks its frames' tags,
    and a snapshot in progress."""

    def __init__(self, transport: RaftTransport, peer_id: str, mac: FrameMac | None) -> None:
        self.t = transport
        self.peer_id = peer_id
        self.mac = mac
        self.reassembly: _Reassembly | None = None

    def handle_frame(self, frame: bytes) -> None:
        # The tag first: nothing of a frame is looked at before we know the peer sent it.
        view = memoryview(frame) if self.mac is None else self.mac.open(frame)
        kind, body = view[0], view[1:]
        if kind == KIND_MESSAGE:
            self.t._deliver(self._check_sender(decode_message(body)))
        elif kind == KIND_CHUNK:
            self._handle_chunk(body)
        else:
            raise ProtocolError(f"unexpected frame kind {kind}")

    def _check_sender(self, msg: Message) -> Message:
        if msg.frm != self.peer_id:
            raise ProtocolError(f"message claims to be from {msg.frm!r} on a connection "
                                f"authenticated as {self.peer_id!r}")
        return msg

    def _handle_chunk(self, body: memoryview) -> None:
        offset, total, done, header, data = self._parse_chunk(body)
        if offset == 0:
            self._begin_snapshot(total, header)
        r = self.reassembly
        if r is None or offset != len(r.data) or total != r.total:
            raise ProtocolError(f"snapshot chunk at offset {offset} does not continue the transfer")
        if len(r.data) + len(data) > total:
            raise ProtocolError("snapshot chunks exceed the announced total")
        r.data += data
        if done:
            if len(r.data) != total:
                raise ProtocolError(f"snapshot ended after {len(r.data)} of {total} bytes")
            self.reassembly = None
            r.header.data = bytes(r.data)
            self.t.stats.snapshots_received += 1
            self.t._deliver(r.header)

    @staticmethod
    def _parse_chunk(body: memoryview) -> tuple[int, int, bool, bytes | None, bytes]:
        try:
            fields = msgpack.unpackb(body, raw=False)
            offset, total, done, header, data = fields
        except Exception as exc:
            raise ProtocolError(f"undecodable snapshot chunk: {exc}") from exc
        if not (isinstance(offset, int) and isinstance(total, int) and 0 <= offset <= total
                and isinstance(data, bytes) and (header is None or isinstance(header, bytes))):
            raise ProtocolError("malformed snapshot chunk")
        return offset, total, bool(done), header, data

    def _begin_snapshot(self, total: int, header: bytes | None) -> None:
        if header is None:
            raise ProtocolError("first snapshot chunk without its message header")
        if total > self.t.max_snapshot_bytes:
            raise ProtocolError(f"snapshot of {total} bytes exceeds the limit {self.t.max_snapshot_bytes}")
        msg = self._check_sender(decode_message(header))
        if msg.type != MessageType.SNAP:
            raise ProtocolError(f"snapshot chunk header is a {msg.type.name} message")
        if self.reassembly is not None:
            self.t.stats.snapshots_failed += 1
            self.t.log.warning("raft snapshot from %s restarted before it completed", self.peer_id)
        self.reassembly = _Reassembly(msg, total, bytearray())
