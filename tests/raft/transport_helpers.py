"""Helpers for the transport tests: a node wrapper, a hand-written raw peer, a relay in the
middle, test certificates.

The raw peer speaks the wire protocol by hand (it does not reuse the transport's code),
so the tests also check that the protocol is what the transport's docstring says.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import ipaddress
import os
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack

from dex_ha.raft.transport import RaftTransport
from dex_ha.raft.types import Message, MessageType, encode_message

DEADLINE = 10.0  # seconds: the longest any single wait in these tests may take
LOOPBACK = "127.0.0.1"
SECRET = b"0123456789abcdef-cluster-secret"

KIND_MESSAGE, KIND_CHUNK, KIND_HELLO, KIND_AUTH, KIND_AUTH_OK = 1, 2, 16, 17, 18
PROTOCOL_VERSION = 3
TAG_BYTES = 16


@dataclass
class Node:
    """A RaftTransport plus what its callbacks saw."""

    transport: RaftTransport
    inbox: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)
    unreachable: list[str] = field(default_factory=list)
    snapshots_sent: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.transport.node_id

    @property
    def port(self) -> int:
        """The port the transport listens on (it must have been started with a listener)."""
        assert self.transport.port is not None, f"{self.id} does not listen"
        return self.transport.port

    @property
    def addr(self) -> tuple[str, int]:
        return (LOOPBACK, self.port)

    async def recv(self, timeout: float = DEADLINE) -> Message:
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def recv_n(self, n: int, timeout: float = DEADLINE) -> list[Message]:
        async def take() -> list[Message]:
            return [await self.inbox.get() for _ in range(n)]

        return await asyncio.wait_for(take(), timeout)


def make_node(node_id: str, port: int | None = 0, **kw) -> Node:
    """port None: no listener."""
    holder: list[Node] = []
    transport = RaftTransport(
        node_id,
        None if port is None else (LOOPBACK, port),
        {},
        lambda m: holder[0].inbox.put_nowait(m),
        on_unreachable=lambda p: holder[0].unreachable.append(p),
        on_snapshot_sent=lambda p, ok: holder[0].snapshots_sent.append((p, ok)),
        **kw,
    )
    holder.append(Node(transport))
    return holder[0]


async def connect_all(*nodes: Node) -> None:
    for n in nodes:
        n.transport.set_peers({m.id: m.addr for m in nodes if m is not n})


def app(frm: str, to: str, i: int, size: int = 256) -> Message:
    from dex_ha.raft.types import Entry

    return Message(
        MessageType.APP,
        to=to,
        frm=frm,
        term=3,
        log_term=3,
        index=i,
        commit=i,
        entries=[Entry(3, i + 1, data=bytes([i % 256]) * size)],
    )


# ---------------------------------------------------------------------------- raw peer


def frame(kind: int, body: bytes) -> bytes:
    return struct.pack(">I", len(body) + 1) + bytes((kind,)) + body


# The identity a raw test peer gives in the handshake: an incarnation of its own, no
# cluster id (accepted by any node), a log.
RAW_WHO: list[object] = ["raw-peer", "", True, [], False]


def mac(secret: bytes, role: str, challenge: bytes, node_id: str, who: object = RAW_WHO) -> bytes:
    signed = f"dex-ha-raft {role}\0".encode() + challenge + node_id.encode() + msgpack.packb(who, use_bin_type=True)
    return hmac.new(secret, signed, hashlib.sha256).digest()


def dialer_frame_key(
    secret: bytes, dialer_challenge: bytes, acceptor_challenge: bytes, dialer_id: str, acceptor_id: str
) -> bytes:
    """HKDF-SHA256 (RFC 5869), one block: extract with the two challenges as salt, expand
    with the label, the length-prefixed ids and the direction."""
    prk = hmac.new(dialer_challenge + acceptor_challenge, secret, hashlib.sha256).digest()
    info = b"dex-ha peer v1"
    for node_id in (dialer_id, acceptor_id):
        info += struct.pack(">H", len(node_id.encode())) + node_id.encode()
    return hmac.new(prk, info + b"dialer->acceptor" + b"\x01", hashlib.sha256).digest()


class RawPeer:
    """A hand-driven connection to a transport, for playing a bad (or good) peer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        host, port = writer.get_extra_info("sockname")[:2]
        self.local_addr = f"{host}:{port}"
        self.my_challenge = b""
        self.frame_key: bytes | None = None  # after a handshake with the secret (no TLS)
        self.seq = 0

    @classmethod
    async def connect(cls, port: int, ssl_ctx: ssl.SSLContext | None = None) -> RawPeer:
        r, w = await asyncio.wait_for(
            asyncio.open_connection(LOOPBACK, port, ssl=ssl_ctx, server_hostname=LOOPBACK if ssl_ctx else None),
            DEADLINE,
        )
        return cls(r, w)

    async def read_frame(self) -> tuple[int, bytes]:
        async def read() -> tuple[int, bytes]:
            (n,) = struct.unpack(">I", await self.reader.readexactly(4))
            body = await self.reader.readexactly(n)
            return body[0], body[1:]

        return await asyncio.wait_for(read(), DEADLINE)

    async def handshake(
        self, node_id: str, secret: bytes | None, *, acceptor: str = "b", mac_override: bytes | None = None
    ) -> None:
        """Answer the HELLO of `acceptor` as dialer `node_id`. With a secret, send_frame()
        then tags frames as the transport expects (without TLS, which RawPeer does not use
        after a handshake)."""
        kind, body = await self.read_frame()
        assert kind == KIND_HELLO
        proto, version, challenge = msgpack.unpackb(body)
        assert (proto, version, len(challenge)) == ("dex-ha-raft", PROTOCOL_VERSION, 32)
        mine = self.my_challenge = os.urandom(32)
        answer = (
            mac_override if mac_override is not None else (mac(secret, "dialer", challenge, node_id) if secret else b"")
        )
        self.send_raw(frame(KIND_AUTH, msgpack.packb([node_id, mine, answer, RAW_WHO], use_bin_type=True)))
        if secret is not None:
            self.frame_key = dialer_frame_key(secret, mine, challenge, node_id, acceptor)

    async def expect_auth_ok(self, peer_id: str, secret: bytes) -> None:
        kind, body = await self.read_frame()
        assert kind == KIND_AUTH_OK
        node_id, answer, who = msgpack.unpackb(body)
        assert node_id == peer_id
        assert answer == mac(secret, "acceptor", self.my_challenge, peer_id, who)  # it proved itself too

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send_frame(self, kind: int, body: bytes) -> None:
        """A frame after the handshake, followed by its tag when the link has a key:
        HMAC-SHA256(key, u64 sequence number || the frame up to its tag)[:16]."""
        if self.frame_key is None:
            self.send_raw(frame(kind, body))
            return
        head = struct.pack(">IB", 1 + len(body) + TAG_BYTES, kind)
        tag = hmac.new(self.frame_key, struct.pack(">Q", self.seq) + head + body, hashlib.sha256).digest()
        self.seq += 1
        self.send_raw(head + body + tag[:TAG_BYTES])

    def send_message(self, msg: Message) -> None:
        self.send_frame(KIND_MESSAGE, encode_message(msg))

    async def closed_by_peer(self) -> bool:
        """True once the other side closed the connection (EOF or reset) within the deadline."""

        async def drain() -> None:
            while await self.reader.read(65536):
                pass

        try:
            await asyncio.wait_for(drain(), DEADLINE)
        except (ConnectionError, ssl.SSLError):
            pass
        return True

    def close(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------------------- certificates


@dataclass
class Certs:
    ca: Path
    node_cert: Path
    node_key: Path
    rogue_cert: Path  # signed by a different CA
    rogue_key: Path

    def server_ctx(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.node_cert, self.node_key)
        ctx.load_verify_locations(self.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: a client must show a certificate
        return ctx

    def client_ctx(self, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(self.ca)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
        return ctx


def make_certs(dir: Path) -> Certs:
    """A CA and a node certificate for 127.0.0.1, plus a certificate from another CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key, path: Path) -> Path:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return path

    def write_cert(cert, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def ca(cn: str):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return key, cert

    def leaf(ca_key, ca_cert, cn: str):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK))]), critical=False
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        return key, cert

    ca_key, ca_cert = ca("dex-ha test CA")
    node_key, node_cert = leaf(ca_key, ca_cert, "node")
    other_ca_key, other_ca_cert = ca("some other CA")
    rogue_key, rogue_cert = leaf(other_ca_key, other_ca_cert, "rogue")
    return Certs(
        ca=write_cert(ca_cert, dir / "ca.pem"),
        node_cert=write_cert(node_cert, dir / "node.pem"),
        node_key=write_key(node_key, dir / "node.key"),
        rogue_cert=write_cert(rogue_cert, dir / "rogue.pem"),
        rogue_key=write_key(rogue_key, dir / "rogue.key"),
    )


# ---------------------------------------------------------------------------- relay


async def read_whole_frame(reader: asyncio.StreamReader) -> bytes:
    """One frame as it travels: length prefix included."""
    prefix = await reader.readexactly(4)
    return prefix + await reader.readexactly(struct.unpack(">I", prefix)[0])


@dataclass
class RelayConnection:
    """One dialer's connection through the relay."""

    number: int  # 0 for the first connection the relay accepted
    to_acceptor: asyncio.StreamWriter
    to_dialer: asyncio.StreamWriter
    dialer_id: str = ""  # read from the AUTH frame
    from_dialer: list[bytes] = field(default_factory=list)  # every frame the dialer sent, untouched
    from_acceptor: bytearray = field(default_factory=bytearray)  # every byte the acceptor sent
    closed_by_acceptor: bool = False  # the acceptor hung up (not the relay, not the dialer)
    cut_by_relay: bool = False

    def cut(self) -> None:
        """Hang up on both sides, as a relay that restarts would."""
        self.cut_by_relay = True
        self.to_acceptor.close()
        self.to_dialer.close()


# tamper(connection, frame_number, frame) -> the frames to forward in its place.
Tamper = Callable[[RelayConnection, int, bytes], list[bytes]]


class Relay:
    """A man in the middle that does not know the cluster secret.

    It accepts dialers on its own port and forwards each connection to `target_port`.
    Bytes from the acceptor pass unchanged (and are recorded); bytes from the dialer are
    split into frames, and each frame goes through `tamper`, which returns what to
    forward instead: frame 0 of a connection is the AUTH, the data frames follow.
    """

    def __init__(self, target_port: int, tamper: Tamper | None = None) -> None:
        self.target_port = target_port
        self.tamper: Tamper = tamper or (lambda conn, n, f: [f])
        self.connections: list[RelayConnection] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, 0)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for conn in self.connections:
            conn.cut()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, dialer_r: asyncio.StreamReader, dialer_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        acceptor_r, acceptor_w = await asyncio.open_connection(LOOPBACK, self.target_port)
        conn = RelayConnection(len(self.connections), acceptor_w, dialer_w)
        self.connections.append(conn)
        back = asyncio.create_task(self._from_acceptor(conn, acceptor_r))
        self._tasks.add(back)
        try:
            n = 0
            while True:
                f = await read_whole_frame(dialer_r)
                conn.from_dialer.append(f)
                if n == 0:
                    conn.dialer_id = msgpack.unpackb(f[5:])[0]
                for out in self.tamper(conn, n, f):
                    acceptor_w.write(out)
                await acceptor_w.drain()
                n += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            conn.cut()
            self._tasks.discard(task)

    @staticmethod
    async def _from_acceptor(conn: RelayConnection, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(65536):
                conn.from_acceptor += data
                conn.to_dialer.write(data)
        except ConnectionError:
            pass
        conn.closed_by_acceptor = not conn.cut_by_relay
        conn.cut()
