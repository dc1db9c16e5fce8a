"""Raft transport, the handshake: how two nodes prove to each other that they hold the
cluster secret, and the per-connection key that tags the frames after it.

Handshake (dialer D, acceptor A), under a deadline the transport sets
(``handshake_timeout``, 5 s)::

    A -> D  HELLO    ["dex-ha-raft", 3, challenge_A]          32 random bytes
    D -> A  AUTH     [id_D, challenge_D, mac("dialer", challenge_A, id_D, who_D), who_D]
    A -> D  AUTH_OK  [id_A, mac("acceptor", challenge_D, id_A, who_A), who_A]

    mac(role, challenge, id, who) = HMAC-SHA256(secret, "dex-ha-raft " + role + NUL + challenge
                                                + id + msgpack(who))

`who` is the sender's identity (identity.py: its cluster id, incarnation, whether its log
holds anything, the founders it knows). Each side hands the other's to `check`, which
refuses (HandshakeError) a peer of another cluster; the acceptor answers with its own
identity first, so that the dialer learns why it is refused.

Each side proves it holds the secret by answering a fresh challenge of the other, so
neither talks to an impostor, and a recorded answer cannot be replayed. The role label
keeps an answer given as dialer from being reflected as an acceptor's answer. A only
answers after checking D, so it cannot be used as an oracle. Comparisons are
constant-time; a missing, short or wrong MAC is refused. Without a secret the MACs are
empty and unchecked (insecure mode; the node loop logs it). With TLS contexts the
connection is mutual TLS first, then the same handshake inside it.

The key that tags the dialer's frames afterwards (wire.FrameMac)::

    K = HKDF-SHA256(ikm=secret, salt=challenge_D || challenge_A,
                    info="dex-ha peer v1" || u16 len || id_D || u16 len || id_A || direction)

K is fresh per connection (both challenges are) and per direction (``direction`` is
"dialer->acceptor"; the acceptor sends nothing after AUTH_OK, the other label is
reserved for it), so a frame recorded on one connection fails on any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from .identity import Identity
from .wire import KIND_AUTH, KIND_AUTH_OK, KIND_HELLO, FrameMac, pack_frame, read_frame

PROTOCOL = "dex-ha-raft"
PROTOCOL_VERSION = 3  # 2: frames after the handshake carry a tag (secret mode); 3: identities
CHALLENGE_BYTES = 32
HANDSHAKE_MAC_BYTES = 32  # a whole HMAC-SHA256
LINK_KEY_LABEL = b"dex-ha peer v1"
DIALER_TO_ACCEPTOR = b"dialer->acceptor"
ACCEPTOR_TO_DIALER = b"acceptor->dialer"  # reserved: the acceptor sends no frame after AUTH_OK
HANDSHAKE_MAX_FRAME = 4096
MAX_NODE_ID_CHARS = 255

_ID_LENGTH = struct.Struct(">H")


class HandshakeError(Exception):
    """The peer failed to authenticate (or we failed to authenticate it)."""


# Called with the peer's id and identity once it is authenticated; raises HandshakeError
# to refuse it (a peer of another cluster).
IdentityCheck = Callable[[str, Identity], None]


@dataclass(frozen=True)
class Handshake:
    """What both ends of a connection agree on once the handshake has succeeded."""

    dialer_id: str
    acceptor_id: str
    dialer_challenge: bytes
    acceptor_challenge: bytes

    def dialer_frame_mac(self, secret: bytes) -> FrameMac:
        """What tags the dialer's frames on this connection (the only frames it carries)."""
        return FrameMac(
            link_key(
                secret,
                self.dialer_challenge,
                self.acceptor_challenge,
                self.dialer_id,
                self.acceptor_id,
                DIALER_TO_ACCEPTOR,
            )
        )


async def dial(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    node_id: str,
    secret: bytes | None,
    expected_peer_id: str,
    addr: tuple[str, int],
    identity: Identity,
    check: IdentityCheck | None = None,
) -> Handshake:
    """The dialer's side: authenticate both ways with the node we meant to reach at `addr`."""
    proto, version, challenge = _unpack_fields(*await read_frame(reader, HANDSHAKE_MAX_FRAME), KIND_HELLO, 3)
    if proto != PROTOCOL or version != PROTOCOL_VERSION:
        raise HandshakeError(f"peer speaks {proto!r} version {version!r}")
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_BYTES:
        raise HandshakeError("bad challenge from peer")
    my_challenge = os.urandom(CHALLENGE_BYTES)
    who = identity.to_wire()
    auth = [node_id, my_challenge, _mac(secret, "dialer", challenge, node_id, who), who]
    writer.write(pack_frame(KIND_AUTH, msgpack.packb(auth, use_bin_type=True)))
    await writer.drain()
    peer_id, mac, peer_who = _unpack_fields(*await read_frame(reader, HANDSHAKE_MAX_FRAME), KIND_AUTH_OK, 3)
    peer_id = _check_node_id(peer_id)
    _verify_mac(secret, "acceptor", my_challenge, peer_id, mac, peer_who)
    if peer_id != expected_peer_id:
        raise HandshakeError(f"{addr[0]}:{addr[1]} is node {peer_id!r}, not {expected_peer_id!r}")
    if check is not None:
        check(peer_id, _identity_of(peer_who))
    return Handshake(
        dialer_id=node_id, acceptor_id=peer_id, dialer_challenge=my_challenge, acceptor_challenge=challenge
    )


async def accept(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    node_id: str,
    secret: bytes | None,
    identity: Identity,
    check: IdentityCheck | None = None,
) -> Handshake:
    """The acceptor's side: authenticate both ways with whoever dialed us."""
    challenge = os.urandom(CHALLENGE_BYTES)
    writer.write(pack_frame(KIND_HELLO, msgpack.packb([PROTOCOL, PROTOCOL_VERSION, challenge], use_bin_type=True)))
    await writer.drain()
    fields = _unpack_fields(*await read_frame(reader, HANDSHAKE_MAX_FRAME), KIND_AUTH, 4)
    peer_id, peer_challenge, mac, peer_who = fields
    peer_id = _check_node_id(peer_id)
    _verify_mac(secret, "dialer", challenge, peer_id, mac, peer_who)
    if peer_id == node_id:
        raise HandshakeError("peer claims our own node id")
    if not isinstance(peer_challenge, bytes) or len(peer_challenge) != CHALLENGE_BYTES:
        raise HandshakeError("bad challenge from peer")
    peer_identity = _identity_of(peer_who)
    who = identity.to_wire()
    reply = [node_id, _mac(secret, "acceptor", peer_challenge, node_id, who), who]
    writer.write(pack_frame(KIND_AUTH_OK, msgpack.packb(reply, use_bin_type=True)))
    await writer.drain()
    if check is not None:  # after our answer: the dialer learns which cluster refuses it
        check(peer_id, peer_identity)
    return Handshake(
        dialer_id=peer_id, acceptor_id=node_id, dialer_challenge=peer_challenge, acceptor_challenge=challenge
    )


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


def _identity_of(who: object) -> Identity:
    try:
        return Identity.from_wire(who)
    except ValueError as exc:
        raise HandshakeError(f"bad identity from peer: {exc}") from None


def _mac(secret: bytes | None, role: str, challenge: bytes, node_id: str, who: object) -> bytes:
    if secret is None:
        return b""
    msg = f"{PROTOCOL} {role}\0".encode() + challenge + node_id.encode() + msgpack.packb(who, use_bin_type=True)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _verify_mac(secret: bytes | None, role: str, challenge: bytes, node_id: str, mac: object, who: object) -> None:
    if secret is None:
        return  # insecure mode: nothing to check
    # The length first, said out loud: an empty or truncated answer must never pass as
    # a prefix of the right one (compare_digest also refuses it, in constant time).
    if (
        not isinstance(mac, bytes)
        or len(mac) != HANDSHAKE_MAC_BYTES
        or not hmac.compare_digest(mac, _mac(secret, role, challenge, node_id, who))
    ):
        raise HandshakeError(f"bad or missing authentication from a peer claiming to be {node_id!r}")


# ---------------------------------------------------------------------------------- the link key


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF (RFC 5869) with SHA-256: extract a key from `ikm` with `salt`, then expand it
    to `length` bytes bound to `info`."""
    prk = hmac.digest(salt, ikm, "sha256")
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes((counter,)), "sha256")
        okm += block
    return okm[:length]


def link_key(
    secret: bytes,
    dialer_challenge: bytes,
    acceptor_challenge: bytes,
    dialer_id: str,
    acceptor_id: str,
    direction: bytes,
) -> bytes:
    """The key of one direction of one connection (see the module docstring). The ids are
    length-prefixed, so ("ab", "c") and ("a", "bc") give different keys."""
    info = LINK_KEY_LABEL
    for node_id in (dialer_id, acceptor_id):
        raw = node_id.encode()
        info += _ID_LENGTH.pack(len(raw)) + raw
    return hkdf_sha256(secret, dialer_challenge + acceptor_challenge, info + direction)
