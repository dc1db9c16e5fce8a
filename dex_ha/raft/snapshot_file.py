"""Snapshot files carry a checksum: a trailer with fields, appended after the state.

A snapshot file is the state machine's copy (for the engine: one SQLite database) followed
by a trailer::

    <payload>                  the copy, exactly as the state machine wrote it
    {...}                      the trailer's fields, one JSON object (see SnapshotTrailer)
    [u32 trailer length][8 bytes "DEXSNAP\\n"]   little-endian; the magic ends the file

A trailer rather than a header: the state machine writes its copy into the file, and
the node appends the trailer once it hashed the copy, so the state is never copied a
second time to make room in front. The fields are JSON so that more can be added (a
reader ignores fields it does not know); `format` changes only for a layout change.

The trailer is written when the snapshot is made, and checked before a snapshot is
loaded at start, before it is sent to a follower and before a received one is installed.
The file travels whole (trailer included), so a follower checks what the leader made.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

MAGIC = b"DEXSNAP\n"
FORMAT_VERSION = 1
_TAIL = struct.Struct("<I8s")  # trailer length, magic
MAX_TRAILER_BYTES = 64 << 10  # the trailer is a hundred bytes; more is damage
_READ_BYTES = 1 << 20


class SnapshotCorruptionError(Exception):
    """A snapshot's bytes do not match its checksum (or it has no valid trailer)."""


@dataclass(frozen=True)
class SnapshotTrailer:
    format: int
    index: int  # the log index the state is at
    payload_bytes: int
    sha256: str  # of the payload, hex

    def encode(self) -> bytes:
        fields = json.dumps(asdict(self), separators=(",", ":")).encode()
        return fields + _TAIL.pack(len(fields), MAGIC)


def seal_file(path: Path, index: int) -> SnapshotTrailer:
    """Append the trailer to the state copy at `path` (which holds only the payload).
    Reads the file once to hash it, a piece at a time: run it off the event loop."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
    trailer = SnapshotTrailer(FORMAT_VERSION, index, size, digest.hexdigest())
    with open(path, "ab") as f:
        f.write(trailer.encode())
    return trailer


def seal_bytes(payload: bytes, index: int) -> bytes:
    """A whole snapshot file's bytes for `payload` (for copies made in memory)."""
    trailer = SnapshotTrailer(FORMAT_VERSION, index, len(payload), hashlib.sha256(payload).hexdigest())
    return payload + trailer.encode()


def verify(data: bytes, index: int, where: str, digest: bool = True) -> memoryview:
    """The payload of a whole snapshot file's bytes, checked against its trailer and
    against the `index` it should be at; SnapshotCorruptionError naming `where` otherwise.
    A view, not a copy: a snapshot may be large. `digest=False` skips the hash, for bytes
    already checked (it reads the whole payload, so it runs off the event loop)."""
    trailer, start = _read_trailer(data[-_TAIL.size :], lambda n: data[-_TAIL.size - n : -_TAIL.size], len(data))
    _check_index(trailer, index, where)
    payload = memoryview(data)[: trailer.payload_bytes]
    if start != trailer.payload_bytes:
        raise SnapshotCorruptionError(f"{where}: {_size_mismatch(trailer, start)}")
    if digest and (found := hashlib.sha256(payload).hexdigest()) != trailer.sha256:
        raise SnapshotCorruptionError(f"{where}: {_digest_mismatch(trailer, found)}")
    return payload


def verify_file(path: Path, index: int) -> SnapshotTrailer:
    """Check the snapshot file at `path` without holding it in memory (start-up, tests)."""
    size = os.stat(path).st_size
    with open(path, "rb") as f:

        def read_at(offset: int, n: int) -> bytes:
            f.seek(offset)
            return f.read(n)

        tail = read_at(max(0, size - _TAIL.size), _TAIL.size)
        trailer, start = _read_trailer(tail, lambda n: read_at(size - _TAIL.size - n, n), size)
        _check_index(trailer, index, str(path))
        if start != trailer.payload_bytes:
            raise SnapshotCorruptionError(f"{path}: {_size_mismatch(trailer, start)}")
        f.seek(0)
        digest, left = hashlib.sha256(), trailer.payload_bytes
        while left and (chunk := f.read(min(_READ_BYTES, left))):
            digest.update(chunk)
            left -= len(chunk)
    if digest.hexdigest() != trailer.sha256:
        raise SnapshotCorruptionError(f"{path}: {_digest_mismatch(trailer, digest.hexdigest())}")
    return trailer


def _read_trailer(tail: bytes, read_fields: Callable[[int], bytes], size: int) -> tuple[SnapshotTrailer, int]:
    """The trailer, and where it starts (= the payload's length if nothing was cut or added)."""
    if len(tail) < _TAIL.size:
        raise SnapshotCorruptionError(f"the file has {size} bytes: too short to be a snapshot")
    length, magic = _TAIL.unpack(tail)
    if magic != MAGIC or not 0 < length <= min(MAX_TRAILER_BYTES, size - _TAIL.size):
        raise SnapshotCorruptionError("no snapshot trailer at the end of the file (cut short, or not a snapshot)")
    try:
        raw = json.loads(read_fields(length))
        trailer = SnapshotTrailer(**{k: raw[k] for k in ("format", "index", "payload_bytes", "sha256")})
    except (ValueError, TypeError, KeyError) as exc:
        raise SnapshotCorruptionError(f"the snapshot trailer is damaged ({exc})") from None
    if trailer.format != FORMAT_VERSION:
        raise SnapshotCorruptionError(f"unknown snapshot format {trailer.format!r} (this node reads {FORMAT_VERSION})")
    return trailer, size - _TAIL.size - length


def _check_index(trailer: SnapshotTrailer, index: int, where: str) -> None:
    if trailer.index != index:
        raise SnapshotCorruptionError(f"{where}: the snapshot is at index {trailer.index}, not {index}")


def _size_mismatch(trailer: SnapshotTrailer, found: int) -> str:
    return f"the state has {found} bytes, its trailer says {trailer.payload_bytes} (index {trailer.index})"


def _digest_mismatch(trailer: SnapshotTrailer, digest: str) -> str:
    return (
        f"checksum mismatch at index {trailer.index}: the state's sha256 is {digest}, "
        f"its trailer says {trailer.sha256} (the snapshot is damaged)"
    )
