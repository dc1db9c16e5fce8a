"""Raft transport, snapshots: a SNAP message cut into CHUNK frames and put back together.

A SNAP message is sent as CHUNK frames of ``snapshot_chunk_bytes``; the first chunk
carries the message without its data as ``header``. The receiver reassembles in memory
(bounded by ``max_snapshot_bytes``, 4 GiB) and delivers the whole Message once. Between
two chunks the sender writes the other queued messages, so heartbeats keep flowing
during a long transfer: a SNAP is the one message that later messages may overtake.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgpack

from .types import Message, encode_message
from .wire import KIND_CHUNK, ProtocolError, pack_frame


class OutgoingSnapshot:
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
        body = msgpack.packb([self.offset, self.total, done, header, self._view[self.offset : end]], use_bin_type=True)
        self.offset, self.finished = end, done
        return pack_frame(KIND_CHUNK, body, self._tag_bytes)


@dataclass
class Chunk:
    """One CHUNK frame's body, checked for shape."""

    offset: int
    total: int
    done: bool
    header: bytes | None  # the SNAP message without its data: only in the first chunk
    data: bytes


def parse_chunk(body: memoryview) -> Chunk:
    try:
        fields = msgpack.unpackb(body, raw=False)
        offset, total, done, header, data = fields
    except Exception as exc:
        raise ProtocolError(f"undecodable snapshot chunk: {exc}") from exc
    if not (
        isinstance(offset, int)
        and isinstance(total, int)
        and 0 <= offset <= total
        and isinstance(data, bytes)
        and (header is None or isinstance(header, bytes))
    ):
        raise ProtocolError("malformed snapshot chunk")
    return Chunk(offset, total, bool(done), header, data)


@dataclass
class Reassembly:
    """A snapshot being received on one connection."""

    header: Message
    total: int
    data: bytearray

    def add(self, chunk: Chunk) -> Message | None:
        """Append the next chunk; the whole SNAP message once the last one arrived."""
        if chunk.offset != len(self.data) or chunk.total != self.total:
            raise ProtocolError(f"snapshot chunk at offset {chunk.offset} does not continue the transfer")
        if len(self.data) + len(chunk.data) > self.total:
            raise ProtocolError("snapshot chunks exceed the announced total")
        self.data += chunk.data
        if not chunk.done:
            return None
        if len(self.data) != self.total:
            raise ProtocolError(f"snapshot ended after {len(self.data)} of {self.total} bytes")
        self.header.data = bytes(self.data)
        return self.header
