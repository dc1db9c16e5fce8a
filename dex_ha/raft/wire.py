"""Raft transport, the wire: how bytes become frames, and how a frame's tag is checked.

Wire format, in both directions::

    frame   = [u32 big-endian length][kind byte][body][tag]   length counts kind + body + tag
    MESSAGE   body = types.encode_message(msg)
    CHUNK     body = msgpack [offset, total, done, header, data]  (one piece of a SNAP,
                     see snapshot_stream.py)
    HELLO / AUTH / AUTH_OK   the handshake (see handshake.py; never a tag)

A frame longer than ``max_frame_bytes`` drops the connection as soon as its length is
read: it is never buffered. Before authentication the limit is 4 KiB.

Frames after the handshake (secret mode without TLS). The handshake alone would let a
relay that forwarded it inject, replay or reorder frames afterwards, so every frame
carries a tag, as in the TLS 1.2 record MAC (RFC 5246 §6.2.3.1)::

    tag = HMAC-SHA256(K, seq || frame without its tag)[:16]    seq: u64 big-endian

K is the key of one direction of one connection (handshake.link_key). ``seq`` counts
the frames of the connection from 0 and is never sent: both ends count, so a frame that
is injected, dropped, replayed or reordered fails, and so does the first frame after it.
A frame whose tag fails drops the connection (the dialer redials). 16 bytes (128 bits,
half of SHA-256's output, the least RFC 2104 §5 advises) leave a forger one chance in
2^128 per try, and each try costs it the connection. With mutual TLS the record layer
already protects every frame, and without a secret there is no key: no tag in either
case.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
from dataclasses import dataclass

TAG_BYTES = 16  # a frame's tag: see the module docstring for why 16 are enough
DEFAULT_MAX_FRAME_BYTES = 16 << 20  # node.py keeps max_entry_bytes below it

KIND_MESSAGE = 1
KIND_CHUNK = 2
KIND_HELLO = 16
KIND_AUTH = 17
KIND_AUTH_OK = 18

_LENGTH = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_SEQ_AND_LENGTH = struct.Struct(">QI")


class FrameTooLarge(Exception):
    """A length prefix above the limit: the peer is broken or hostile."""


class ProtocolError(Exception):
    """A frame that is well-formed but not allowed here (wrong kind, order, sender)."""


class FrameAuthError(ProtocolError):
    """A frame whose tag does not verify: injected, replayed, reordered or corrupted."""


@dataclass
class TransportStats:
    """What crossed (or failed to cross) the wire, counted since the transport was made."""

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


async def read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[int, bytes]:
    """One frame read on its own (kind, body): the handshake's, before the bulk reader
    (FrameDecoder) takes over."""
    (n,) = _LENGTH.unpack(await reader.readexactly(4))
    if not 1 <= n <= limit:
        raise FrameTooLarge(f"handshake frame length {n} (limit {limit})")
    frame = await reader.readexactly(n)
    return frame[0], frame[1:]


# ---------------------------------------------------------------------------------- frame tags


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
            raise FrameAuthError(
                f"frame {self._seq} of this connection fails its MAC: it was injected, "
                "replayed, reordered or corrupted on the way"
            )
        self._seq += 1
        return view[:tag_at]
