"""Raft transport: TCP connections carrying length-prefixed msgpack frames between nodes.

Each node dials every peer once and sends on that connection only; it receives on the
connections its peers dialed. So between two nodes there are two one-way streams, each
ordered, each with its own reconnect loop (the etcd "stream" model). A transport made
with ``listen=None`` opens no port: it can only dial, which is all a single voter (or
``dex-ha dev``) needs, since no one ever sends to it.

This module ties the pieces together: the listener, the inbound connections, and one
sender per peer. The pieces, each with the details in its own docstring:

- wire.py: the frame format, the frame decoder, and the tags that protect frames after
  the handshake (secret mode without TLS);
- handshake.py: how both ends prove they hold the cluster secret, and the per-connection
  key of the tags;
- snapshot_stream.py: a SNAP message sent as chunks and reassembled;
- peer.py: the sending side (queue, batching, reconnect with backoff, what is dropped
  and reported when) and the budget that rate-limits log lines.

With TLS contexts the connection is mutual TLS first (the acceptor requires a client
certificate), then the same handshake inside it. After the handshake every message's
``frm`` must equal the authenticated id, or the connection is dropped. The receiver
reassembles a snapshot in memory (bounded by ``max_snapshot_bytes``, 4 GiB) and calls
on_message once with the whole Message.

The names of those modules that callers use are importable from here as well.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
from collections.abc import Callable

from . import handshake
from .handshake import (
    ACCEPTOR_TO_DIALER,
    DIALER_TO_ACCEPTOR,
    HandshakeError,
    IdentityCheck,
    hkdf_sha256,
    link_key,
)
from .identity import Identity
from .peer import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    REJECTION_LOG_BURST,
    REJECTION_LOG_WINDOW_S,
    Address,
    LogBudget,
    PeerSender,
)
from .snapshot_stream import Reassembly, parse_chunk
from .types import MalformedMessage, Message, MessageType, NodeVersion, decode_message
from .wire import (
    DEFAULT_MAX_FRAME_BYTES,
    KIND_CHUNK,
    KIND_MESSAGE,
    TAG_BYTES,
    FrameAuthError,
    FrameDecoder,
    FrameMac,
    FrameTooLarge,
    ProtocolError,
    TransportStats,
    pack_frame,
)

__all__ = [
    "ACCEPTOR_TO_DIALER",
    "BACKOFF_MAX_S",
    "BACKOFF_MIN_S",
    "DEFAULT_MAX_FRAME_BYTES",
    "DIALER_TO_ACCEPTOR",
    "KIND_CHUNK",
    "KIND_MESSAGE",
    "REJECTION_LOG_BURST",
    "REJECTION_LOG_WINDOW_S",
    "TAG_BYTES",
    "Address",
    "FrameAuthError",
    "FrameDecoder",
    "FrameMac",
    "FrameTooLarge",
    "HandshakeError",
    "LogBudget",
    "ProtocolError",
    "RaftTransport",
    "TransportStats",
    "hkdf_sha256",
    "link_key",
    "pack_frame",
]

READ_BYTES = 256 << 10  # one read() from a socket


class RaftTransport:
    """Carries Raft messages between this node and its peers. See the module docstring."""

    def __init__(
        self,
        node_id: str,
        listen: Address | None,
        peers: dict[str, Address],
        on_message: Callable[[Message], None],
        *,
        secret: bytes | None = None,
        ssl_server: ssl.SSLContext | None = None,
        ssl_client: ssl.SSLContext | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        snapshot_chunk_bytes: int = 1 << 20,
        max_snapshot_bytes: int = 4 << 30,
        max_queue_messages: int = 4096,
        max_queue_bytes: int = 64 << 20,
        handshake_timeout: float = 5.0,
        on_unreachable: Callable[[str], None] | None = None,
        on_snapshot_sent: Callable[[str, bool], None] | None = None,
        logger: logging.Logger | None = None,
        identity: Callable[[], Identity] | None = None,
        check_identity: IdentityCheck | None = None,
        version: NodeVersion | None = None,
    ) -> None:
        """Beyond the obvious: `max_snapshot_bytes` bounds a reassembled snapshot (it is
        held in memory); `max_queue_messages` / `max_queue_bytes` bound each peer's send
        queue (beyond them send() drops); `handshake_timeout` bounds dialing, TLS and
        the handshake, in seconds. Peers equal to node_id are ignored. `listen` None: no
        listener (see the module docstring). `identity()` is what the handshake says of
        this node (identity.py); `check_identity(peer, theirs)` sees each peer's and may
        refuse it (HandshakeError). `version` goes on every message sent (Message.version)."""
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
        self.identity = identity or _no_identity
        self.check_identity = check_identity
        self.version = version
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
        self.rng = random.Random()  # jitters the senders' backoff
        self._listener: socket.socket | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._senders: dict[str, PeerSender] = {}
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
        self._accept_task = asyncio.create_task(self._accept_loop(self._listener), name=f"raft-accept-{self.node_id}")

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
        self._senders = {pid: PeerSender(self, pid, addr) for pid, addr in self._peers.items()}

    # ------------------------------------------------------------------ sending

    def send(self, msg: Message) -> None:
        """Queue msg for msg.to; never blocks. Lost messages are reported, not raised."""
        sender = self._senders.get(msg.to)
        if sender is None:
            self.stats.messages_dropped += 1
            self.log.debug("raft message %s to unknown peer %r dropped", msg.type.name, msg.to)
            return
        msg.version = self.version
        sender.enqueue(msg)

    def flush(self) -> None:
        """Write what is queued for every peer now (see PeerSender.write_now)."""
        for sender in self._senders.values():
            sender.write_now()

    def snapshots_in_flight(self) -> dict[str, tuple[int, int]]:
        """(bytes written so far, total bytes) of each snapshot being sent, by peer (progress for people)."""
        return {
            peer_id: (sender.snapshot.offset, sender.snapshot.total)
            for peer_id, sender in self._senders.items()
            if sender.snapshot is not None
        }

    def set_peers(self, peers: dict[str, Address]) -> None:
        """Replace the peer set (membership change). Changed addresses reconnect."""
        self._peers = {pid: (addr[0], addr[1]) for pid, addr in peers.items() if pid != self.node_id}
        if self._peers and self.listen is None:
            self.log.warning(
                "raft transport of %s has no listener: peers %s cannot send to it",
                self.node_id,
                ", ".join(sorted(self._peers)),
            )
        for pid in list(self._senders):
            sender = self._senders[pid]
            if self._peers.get(pid) != sender.addr:
                self._retire(self._senders.pop(pid))
        for pid, addr in self._peers.items():
            if pid not in self._senders:
                sender = self._senders[pid] = PeerSender(self, pid, addr)
                if self._started:
                    sender.start()

    def _retire(self, sender: PeerSender) -> None:
        for _ in sender.abandon():
            self.stats.snapshots_failed += 1
            self.notify_later(self.on_snapshot_sent, sender.peer_id, False)
        if sender.task is not None:
            sender.task.cancel()
            self._track(sender.task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def notify(self, callback: Callable[..., None] | None, *args: object) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            self.log.exception("raft transport callback %r failed", callback)

    def notify_later(self, callback: Callable[..., None] | None, *args: object) -> None:
        """From send(): the caller may be in the middle of handling a Ready."""
        if callback is None:
            return
        try:
            asyncio.get_running_loop().call_soon(self.notify, callback, *args)
        except RuntimeError:  # no loop yet (before start): nobody is in the middle of anything
            self.notify(callback, *args)

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
        self._log_limited(
            self._rejection_log, "rejected connections", "raft connection from %s rejected: %s", addr, reason
        )

    def _log_limited(self, budget: LogBudget, what: str, fmt: str, *args: object) -> None:
        allowed, unlogged = budget.take(asyncio.get_running_loop().time())
        if unlogged:
            self.log.warning("raft: %d more %s were not logged (see stats)", unlogged, what)
        if allowed:
            self.log.warning(fmt, *args)

    def frame_mac(self, done: handshake.Handshake) -> FrameMac | None:
        """What tags the dialer's frames on a connection the handshake just authenticated
        (None: frames carry no tag here)."""
        if not self.tag_bytes:
            return None
        assert self.secret is not None
        return done.dialer_frame_mac(self.secret)

    async def _serve_inbound(self, conn: socket.socket) -> None:
        host, port = conn.getpeername()[:2]
        addr = f"{host}:{port}"
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
            lambda: protocol,
            conn,
            ssl=self.ssl_server,
            ssl_handshake_timeout=self.handshake_timeout if self.ssl_server else None,
        )
        # What asyncio.open_connection does for a dialed socket.
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _acceptor_handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[str, FrameMac | None]:
        """Authenticate both ways; returns the peer's id and what checks its frames."""
        done = await handshake.accept(
            reader,
            writer,
            node_id=self.node_id,
            secret=self.secret,
            identity=self.identity(),
            check=self.check_identity,
        )
        return done.dialer_id, self.frame_mac(done)

    async def _receive(self, reader: asyncio.StreamReader, peer_id: str, addr: str, mac: FrameMac | None) -> None:
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
            self._log_limited(
                self._drop_log,
                "dropped connections",
                "raft connection from %s (%s) dropped: %s: %s",
                peer_id,
                addr,
                type(exc).__name__,
                exc,
            )
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.log.info("raft connection from %s (%s) lost: %s", peer_id, addr, exc)
        except Exception:  # a bug on our side: drop this connection, keep the node serving
            self.stats.connections_dropped += 1
            self.log.exception("raft connection from %s (%s) dropped after an unexpected error", peer_id, addr)
        if conn.reassembly is not None:
            self.stats.snapshots_failed += 1
            self.log.warning(
                "raft snapshot from %s abandoned after %d of %d bytes",
                peer_id,
                len(conn.reassembly.data),
                conn.reassembly.total,
            )

    def _deliver(self, msg: Message) -> None:
        if msg.to != self.node_id:
            self.stats.messages_dropped += 1
            self.log.warning(
                "raft message %s from %s is addressed to %r, not us (%r): dropped",
                msg.type.name,
                msg.frm,
                msg.to,
                self.node_id,
            )
            return
        self.notify(self.on_message, msg)


def _no_identity() -> Identity:
    """A transport without a node (tests): an incarnation of its own, nothing else."""
    return _ANONYMOUS


_ANONYMOUS = Identity(incarnation="anonymous", has_log=True)


class _InboundConnection:
    """Per-connection receive state: the authenticated sender, what checks its frames' tags,
    and a snapshot in progress."""

    def __init__(self, transport: RaftTransport, peer_id: str, mac: FrameMac | None) -> None:
        self.t = transport
        self.peer_id = peer_id
        self.mac = mac
        self.reassembly: Reassembly | None = None

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
            raise ProtocolError(
                f"message claims to be from {msg.frm!r} on a connection authenticated as {self.peer_id!r}"
            )
        return msg

    def _handle_chunk(self, body: memoryview) -> None:
        chunk = parse_chunk(body)
        if chunk.offset == 0:
            self._begin_snapshot(chunk.total, chunk.header)
        if self.reassembly is None:
            raise ProtocolError(f"snapshot chunk at offset {chunk.offset} does not continue the transfer")
        snapshot = self.reassembly.add(chunk)
        if snapshot is not None:
            self.reassembly = None
            self.t.stats.snapshots_received += 1
            self.t._deliver(snapshot)

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
        self.reassembly = Reassembly(msg, total, bytearray())
