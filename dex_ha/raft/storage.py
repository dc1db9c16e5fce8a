"""Durable Raft log and hard state: a write-ahead log in segment files (after etcd's WAL).

Layout of the data directory::

    LOCK                                    flock'ed while a RaftStorage has it open
    0000000000000000-0000000000000001.wal   segment <seq>-<start index>, both hex
    0000000000000001-00000000000f4241.wal   ...

A segment is a sequence of records ``[u32 length][u32 crc32][payload]`` (little-endian;
zlib's CRC-32 of the payload, started from a value derived from the segment's seq and the
record's byte offset so a record is only valid where it was written: see _crc_seed).
The payload is one kind byte followed by a msgpack body:

    ENTRY       an Entry. Writing index i truncates everything >= i first, so a
                conflicting suffix is overwritten without a separate marker.
    HARD_STATE  the latest HardState wins.
    SNAPSHOT    [SnapshotMeta, keep_suffix]: entries <= meta.index are dropped; entries
                after it are kept only if keep_suffix (decided when it was written, so a
                replay never has to guess).

Every segment starts with a header: the current HARD_STATE and (if any) SNAPSHOT. That
makes each segment self-contained for everything but entries, so whole segments below
the snapshot can be deleted. A segment's name carries ``start`` = last index + 1 when it
was created: every entry still live that is older than the segment has index < start,
so once ``start - 1 <= snapshot index`` all earlier segments are garbage.

Crash safety:
  * one ``os.write`` and (strict) one ``fdatasync`` per ``save`` — the group commit;
    entries are written before the hard state, so a torn write never leaves a commit
    index pointing past the log;
  * new segments are written as ``*.tmp``, fsynced, renamed, then the directory fsynced;
  * on open, a torn tail (the last record of the last segment cut short or failing its
    CRC with no valid record after it) is truncated with a warning;
  * so is a zero-filled tail: after a crash, pages of the last segment that were never
    written back read as zeroes, and pages after them may hold a later (unsynced) write.
    In the last segment, an all-zero record header, or a damaged record with a zeroed
    512-byte sector in it, ends the log there (etcd's WAL decoder does the same: a zero
    length is the end of the file, and isTornEntry). Nothing after it was synced: an
    fsync writes every earlier page first. (Damage that zeroes synced data in the last
    segment would go unnoticed, as in etcd; the warning says how much was dropped.);
  * a write that finds the disk full (ENOSPC) is cut back to where it started and raises
    DiskFullError; the log stays usable and the same write succeeds once there is space
    (a failed fsync stays fatal: see _fsync);
  * any other damage raises LogCorruptionError naming the file, the byte offset and the
    entry index, so the node stops instead of silently losing acknowledged data.

Failpoints for crash tests: ``DEX_HA_FAILPOINTS="storage.save.after-write@3,..."`` makes
the process ``os._exit(FAILPOINT_EXIT_CODE)`` at the 3rd time it passes that point
(``@N`` optional, default 1). Unset, they cost one dict lookup. Names: see FAILPOINTS.

Not thread-safe: one caller at a time (the node loop).
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import re
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from dex_ha.diskspace import DiskFullError, is_disk_full
from dex_ha.failpoints import FAILPOINT_ENV, FAILPOINT_EXIT_CODE, Failpoints  # noqa: F401  (re-exported)

from .types import (
    Entry,
    HardState,
    SnapshotMeta,
    encode_entry,
    encode_hard_state,
    entry_from_wire,
    hard_state_from_wire,
    snapshot_meta_from_wire,
    snapshot_meta_to_wire,
)

log = logging.getLogger(__name__)

DURABILITY_MODES = ("strict", "relaxed")
DEFAULT_SEGMENT_BYTES = 64 << 20
MAX_RECORD_BYTES = 1 << 30  # a length above this is damage, not data

KIND_ENTRY = 1
KIND_HARD_STATE = 2
KIND_SNAPSHOT = 3
_KINDS = frozenset((KIND_ENTRY, KIND_HARD_STATE, KIND_SNAPSHOT))
_KIND_BYTE_RE = re.compile(b"[\x01-\x03]")

_HEADER = struct.Struct("<II")  # length, crc32 of the payload
_ZERO_HEADER = bytes(_HEADER.size)
SECTOR_BYTES = 512  # etcd's minSectorSize: the smallest unit a disk writes whole
_SEED = struct.Struct("<QQ")  # segment seq, byte offset: see _crc_seed
_SEGMENT_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")

FAILPOINTS = (
    "storage.save.after-write",  # records written, not yet fsynced
    "storage.save.after-fsync",  # durable, save() not yet returned
    "storage.rotate.after-tmp",  # new segment written as *.tmp, not yet renamed
    "storage.rotate.after-rename",  # new segment in place, old one still the open one
    "storage.snapshot.after-write",  # snapshot record written, not yet fsynced
    "storage.compact.mid-delete",  # after deleting the first of several segments
    "storage.fsync",  # an fsync of the log is about to run (armed with ":eio": it fails)
)


class LogCorruptionError(Exception):
    """The log is damaged somewhere other than its tail: the node must not start."""


@dataclass(slots=True)
class _Segment:
    seq: int
    start: int  # last index + 1 when the segment was created
    path: Path


def _segment_name(seq: int, start: int) -> str:
    return f"{seq:016x}-{start:016x}.wal"


def _crc_seed(seq: int, offset: int) -> int:
    """CRC start value binding a record to its place (segment, byte offset).

    A record's bytes copied elsewhere -- e.g. inside an entry's data -- do not verify
    there, so the scan for "valid data after a damaged record" cannot be fooled by them.
    """
    return zlib.crc32(_SEED.pack(seq, offset))


def _add_record(buf: bytearray, seq: int, base: int, kind: int, body: bytes) -> None:
    """Append one record to `buf`, which will be written at byte `base` of segment `seq`."""
    kind_byte = bytes((kind,))
    crc = zlib.crc32(body, zlib.crc32(kind_byte, _crc_seed(seq, base + len(buf))))
    buf += _HEADER.pack(len(body) + 1, crc)
    buf += kind_byte
    buf += body


def fsync_dir(path: Path) -> None:
    """A file's creation, rename or removal is durable once the directory holding it is synced."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# fdatasync also flushes the file size, which is all an append changes; not on macOS.
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


class _Terms:
    """Index -> term of the live log, kept as runs because terms change rarely.

    The storage does not keep entries in memory (the core does); it needs terms only to
    decide whether a snapshot's suffix survives, and indexes to validate appends.
    """

    def __init__(self, first: int, base_term: int) -> None:
        self.first = first  # index of the first live entry (snapshot index + 1)
        self.last = first - 1
        self.base_term = base_term  # term of entry first - 1 (the snapshot's)
        self._starts: list[int] = []
        self._terms: list[int] = []

    def term(self, index: int) -> int | None:
        if index == self.first - 1:
            return self.base_term
        if not self.first <= index <= self.last:
            return None
        return self._terms[bisect.bisect_right(self._starts, index) - 1]

    def append(self, entries: list[Entry]) -> None:
        """Entries are contiguous and entries[0].index is in [first, last + 1]."""
        self.truncate_from(entries[0].index)
        for e in entries:
            if not self._terms or self._terms[-1] != e.term:
                self._starts.append(e.index)
                self._terms.append(e.term)
        self.last = entries[-1].index

    def truncate_from(self, index: int) -> None:
        while self._starts and self._starts[-1] >= index:
            self._starts.pop()
            self._terms.pop()
        self.last = min(self.last, index - 1)

    def drop_through(self, index: int, term: int) -> None:
        """Forget entries <= index; `term` is the term of entry `index`."""
        k = bisect.bisect_right(self._starts, index)  # runs starting at or before index
        next_run_starts_later = k == len(self._starts) or self._starts[k] > index + 1
        if k > 0 and index < self.last and next_run_starts_later:
            self._starts[k - 1] = index + 1  # the run holding index + 1 now starts there
            k -= 1
        del self._starts[:k]
        del self._terms[:k]
        self.first, self.base_term = index + 1, term
        self.last = max(self.last, index)


class _Replay:
    """Rebuilds the state from records; the single source of truth for their meaning.

    Entries are held as a list starting at `offset`. Segments deleted by compaction
    leave holes before the snapshot index: an entry that does not extend the list
    (index beyond last + 1, or before offset) restarts it. `finish` checks the result
    covers everything after the snapshot, so a hole there is reported, not hidden.
    """

    def __init__(self) -> None:
        self.hard_state = HardState()
        self.snapshot: SnapshotMeta | None = None
        self.entries: list[Entry] = []
        self.offset = 1

    def apply(self, kind: int, body: Any) -> None:
        if kind == KIND_ENTRY:
            self._entry(entry_from_wire(body))
        elif kind == KIND_HARD_STATE:
            self.hard_state = hard_state_from_wire(body)
        else:
            meta_wire, keep_suffix = body
            self._snapshot(snapshot_meta_from_wire(meta_wire), bool(keep_suffix))

    def _entry(self, e: Entry) -> None:
        last = self.offset + len(self.entries) - 1
        if self.offset <= e.index <= last + 1:
            del self.entries[e.index - self.offset :]
        else:
            self.entries, self.offset = [], e.index
        self.entries.append(e)

    def _snapshot(self, meta: SnapshotMeta, keep_suffix: bool) -> None:
        self.snapshot = meta
        if keep_suffix and self.offset <= meta.index + 1:
            del self.entries[: meta.index + 1 - self.offset]
            self.offset = meta.index + 1
        elif not keep_suffix:
            self.entries, self.offset = [], meta.index + 1

    def finish(self, where: str) -> None:
        first = self.snapshot.index + 1 if self.snapshot else 1
        if self.entries and self.offset > first:
            raise LogCorruptionError(
                f"{where}: entries {first}..{self.offset - 1} are missing "
                f"(a segment file was lost?); the log resumes at index {self.offset}"
            )
        if not self.entries:
            self.offset = first


def _find_valid_record(buf: bytes, seq: int, start: int) -> int | None:
    """Offset of the first well-formed record at or after `start`, if any.

    Used only on the error path to tell a torn tail (nothing valid follows) from damage
    inside the log (valid data follows). Any byte may start a record because a damaged
    length field leaves boundaries unknown; candidates are the positions whose kind byte
    is plausible, found by a regex scan (C speed) rather than a Python loop per byte.
    """
    end = len(buf) - _HEADER.size
    view = memoryview(buf)
    for m in _KIND_BYTE_RE.finditer(buf, start + _HEADER.size):
        p = m.start() - _HEADER.size
        length, crc = _HEADER.unpack_from(buf, p)
        if 1 <= length <= end - p and zlib.crc32(view[p + 8 : p + 8 + length], _crc_seed(seq, p)) == crc:
            return p
    return None


def _zero_filled_at(buf: bytes, off: int) -> bool:
    """Does the damaged record at `off` look like never-written (zeroed) space?

    Yes when its header is all zeroes, or when a sector that starts inside the record
    (after its first byte) is all zeroes up to the sector's end or the file's end: the
    write got that far and no further. A length that cannot be right limits the record
    to its header.
    """
    if buf[off : off + _HEADER.size] == _ZERO_HEADER:
        return True
    length = _HEADER.unpack_from(buf, off)[0] if len(buf) - off >= _HEADER.size else 0
    end = off + _HEADER.size + (length if 1 <= length <= MAX_RECORD_BYTES else 0)
    end = min(end, len(buf))
    sector = (off // SECTOR_BYTES + 1) * SECTOR_BYTES  # the first boundary after off
    while sector < end:
        chunk = buf[sector : sector + SECTOR_BYTES]
        if chunk.count(0) == len(chunk):
            return True
        sector += SECTOR_BYTES
    return False


@dataclass(slots=True)
class _ScanResult:
    good_bytes: int  # length of the valid prefix
    records: int
    bad: str | None  # why reading stopped early, None if the file ended cleanly


def _scan_segment(buf: bytes, seq: int, on_record: Callable[[int, Any], None]) -> _ScanResult:
    """Feed every valid record to on_record; stop at the first bad one."""
    view = memoryview(buf)
    off, n, size = 0, 0, len(buf)
    unpack = msgpack.unpackb
    while off < size:
        if size - off < _HEADER.size:
            return _ScanResult(off, n, "record header cut short")
        length, crc = _HEADER.unpack_from(buf, off)
        if not 1 <= length <= MAX_RECORD_BYTES:
            return _ScanResult(off, n, f"invalid record length {length}")
        if off + _HEADER.size + length > size:
            return _ScanResult(off, n, "record cut short")
        payload = view[off + _HEADER.size : off + _HEADER.size + length]
        if zlib.crc32(payload, _crc_seed(seq, off)) != crc:
            return _ScanResult(off, n, "checksum mismatch")
        kind = payload[0]
        if kind not in _KINDS:
            return _ScanResult(off, n, f"unknown record kind {kind}")
        try:
            on_record(kind, unpack(payload[1:], raw=False))
        except LogCorruptionError:
            raise
        except Exception as exc:  # the CRC matched, so this is a bug or a collision
            return _ScanResult(off, n, f"undecodable record ({exc})")
        off += _HEADER.size + length
        n += 1
    return _ScanResult(off, n, None)


class RaftStorage:
    """The durable Raft log and hard state of one node. Open with RaftStorage.open()."""

    def __init__(
        self, dir: Path, durability: str, segment_bytes: int, on_fsync: Callable[[float], None] | None
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        self.dir = dir
        self.durability = durability
        self.fsync_count = 0
        self._strict = durability == "strict"
        self._segment_bytes = segment_bytes
        self._on_fsync = on_fsync
        self._failpoints = Failpoints()
        self._hard_state = HardState()
        self._snapshot: SnapshotMeta | None = None
        self._terms = _Terms(1, 0)
        self._segments: list[_Segment] = []
        self._fd = -1
        self._lock_fd = -1
        self._seg_size = 0
        self._dirty = False  # written since the last fsync of the open segment
        self._failed: BaseException | None = None
        self._initial: tuple[HardState, SnapshotMeta | None, list[Entry]] | None = None

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        dir: str | Path,
        durability: str = "strict",
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        on_fsync: Callable[[float], None] | None = None,
    ) -> RaftStorage:
        """Open (or create) the log in `dir`, replaying it and repairing a torn tail.

        Raises LogCorruptionError if the log is damaged anywhere but its tail.
        """
        self = cls(Path(dir), durability, segment_bytes, on_fsync)
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True)
            if self._strict:  # the new directory's own entry must survive a crash too
                fsync_dir(self.dir.parent)
        self._lock()
        try:
            self._load()
        except BaseException:
            self.close()
            raise
        return self

    def _lock(self) -> None:
        self._lock_fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise RuntimeError(f"raft log {self.dir} is already open in another process or object") from exc

    def close(self) -> None:
        """Flush (strict) and release the directory. Idempotent."""
        if self._fd >= 0:
            try:
                if self._dirty and self._strict and self._failed is None:
                    self._fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> RaftStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load(self) -> None:
        for tmp in self.dir.glob("*.wal.tmp"):  # a rotation that did not finish
            tmp.unlink()
        self._segments = self._list_segments()
        if not self._segments:
            self._create_segment(seq=0, start=1)
            self._initial = (HardState(), None, [])
            return
        replay = self._replay(repair=True)
        self._adopt(replay)
        self._initial = (replay.hard_state, replay.snapshot, replay.entries)
        last = self._segments[-1]
        self._fd = os.open(last.path, os.O_WRONLY | os.O_APPEND)
        self._seg_size = os.fstat(self._fd).st_size

    def _list_segments(self) -> list[_Segment]:
        segs = []
        for p in self.dir.iterdir():
            m = _SEGMENT_RE.match(p.name)
            if m:
                segs.append(_Segment(int(m.group(1), 16), int(m.group(2), 16), p))
        segs.sort(key=lambda s: s.seq)
        for a, b in zip(segs, segs[1:]):
            if b.seq != a.seq + 1:
                raise LogCorruptionError(
                    f"{self.dir}: segment {a.seq + 1:016x} is missing (have {a.path.name} then {b.path.name})"
                )
        return segs

    def _adopt(self, replay: _Replay) -> None:
        """Set the in-memory index/term bookkeeping from a finished replay."""
        self._hard_state = replay.hard_state
        self._snapshot = replay.snapshot
        snap = replay.snapshot
        self._terms = _Terms(snap.index + 1, snap.term) if snap else _Terms(1, 0)
        if replay.entries:
            self._terms.append(replay.entries)

    # ------------------------------------------------------------------ replay

    def _replay(self, repair: bool) -> _Replay:
        replay = _Replay()
        for i, seg in enumerate(list(self._segments)):
            buf = seg.path.read_bytes()
            is_last = i == len(self._segments) - 1
            result = _scan_segment(buf, seg.seq, replay.apply)
            if result.bad is None:
                self._check_header(seg, result, buf)
                continue
            where = self._describe(seg, result, replay)
            if not is_last:
                raise LogCorruptionError(f"{where}; a segment before the last one was fully synced")
            zeroed = _zero_filled_at(buf, result.good_bytes)
            if not zeroed and _find_valid_record(buf, seg.seq, result.good_bytes + 1) is not None:
                raise LogCorruptionError(f"{where}; valid records follow, so this is not a torn write")
            if not repair:
                raise LogCorruptionError(f"{where} (torn tail not repaired)")
            if zeroed:
                where += self._describe_zeroed_tail(buf, seg, result)
            self._truncate_torn_tail(seg, result, where)
            if result.records == 0 and self._drop_empty_last_segment(seg):
                continue
            self._check_header(seg, result, buf)
        replay.finish(str(self.dir))
        return replay

    @staticmethod
    def _describe(seg: _Segment, result: _ScanResult, replay: _Replay) -> str:
        last = replay.offset + len(replay.entries) - 1
        return (
            f"{seg.path}: {result.bad} at byte offset {result.good_bytes} "
            f"(record {result.records}; the last good entry is index {last}, "
            f"so the damage is at entry index {last + 1} or the hard state after it)"
        )

    @staticmethod
    def _describe_zeroed_tail(buf: bytes, seg: _Segment, result: _ScanResult) -> str:
        """What truncating a zero-filled tail drops: it is never synced data, but say it."""
        later = 0
        p = _find_valid_record(buf, seg.seq, result.good_bytes + 1)
        while p is not None:
            later += 1
            p = _find_valid_record(buf, seg.seq, p + _HEADER.size + _HEADER.unpack_from(buf, p)[0])
        return (
            f"; zero-filled from there (space never written back before a crash): the log "
            f"ends there, dropping {len(buf) - result.good_bytes} bytes holding {later} "
            f"well-formed record(s) of later, unsynced writes"
        )

    def _check_header(self, seg: _Segment, result: _ScanResult, buf: bytes) -> None:
        if result.records == 0 or buf[8] != KIND_HARD_STATE:
            raise LogCorruptionError(f"{seg.path}: segment does not start with its hard-state header")

    def _truncate_torn_tail(self, seg: _Segment, result: _ScanResult, where: str) -> None:
        log.warning("raft log: torn tail truncated (an interrupted write): %s", where)
        os.truncate(seg.path, result.good_bytes)
        if self._strict:
            fd = os.open(seg.path, os.O_WRONLY)
            try:
                self._fsync(fd)
            finally:
                os.close(fd)

    def _drop_empty_last_segment(self, seg: _Segment) -> bool:
        """A last segment with no valid record holds nothing: delete it if others remain."""
        if len(self._segments) == 1:
            return False
        seg.path.unlink()
        self._segments.pop()
        if self._strict:
            self._fsync_dir()
        return True

    # ------------------------------------------------------------------ reads

    def initial_state(self) -> tuple[HardState, SnapshotMeta | None, list[Entry]]:
        """Hard state, latest snapshot meta, and the entries after it, in order."""
        self._check_usable()
        if self._initial is not None:
            state, self._initial = self._initial, None  # hand the big list over once
            return state
        replay = self._replay(repair=False)
        return replay.hard_state, replay.snapshot, replay.entries

    def first_index(self) -> int:
        return self._terms.first

    def last_index(self) -> int:
        return self._terms.last

    def term(self, index: int) -> int | None:
        """Term of entry `index` (or of the snapshot at first_index - 1); None if unknown."""
        return self._terms.term(index)

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    @property
    def snapshot(self) -> SnapshotMeta | None:
        return self._snapshot

    # ------------------------------------------------------------------ writes

    def save(self, hard_state: HardState | None, entries: list[Entry], sync: bool = True) -> None:
        """Append entries (overwriting a conflicting suffix) and record the hard state.

        One write and, when strict and `sync`, one fsync for the whole call: durable on
        return. Entries must be contiguous and start within [first_index, last_index + 1].
        """
        self.append(hard_state, entries)
        if sync:
            self.sync()

    def append(self, hard_state: HardState | None, entries: list[Entry]) -> None:
        """The write half of `save`: in the file, not yet durable until `sync()`. The node
        loop runs `sync()` in a thread so the event loop goes on while the disk works."""
        self._check_usable()
        if not entries and hard_state is None:
            return
        if entries:
            self._check_append(entries)
        if self._seg_size >= self._segment_bytes:
            self._rotate()
        buf = bytearray()
        seq, base = self._segments[-1].seq, self._seg_size
        for e in entries:  # entries before the hard state: see the module docstring
            _add_record(buf, seq, base, KIND_ENTRY, encode_entry(e))  # bytes shared with the sends
        if hard_state is not None:
            _add_record(buf, seq, base, KIND_HARD_STATE, encode_hard_state(hard_state))
        self._write(buf)
        self._failpoints.hit("storage.save.after-write")
        if entries:
            self._terms.append(entries)
        if hard_state is not None:
            self._hard_state = hard_state

    @property
    def syncs(self) -> bool:
        """True when `sync()` really fsyncs (strict durability)."""
        return self._strict

    def sync(self) -> None:
        """Make everything appended so far durable (strict); nothing in relaxed mode."""
        if self._strict:
            self._fsync(self._fd)
            self._failpoints.hit("storage.save.after-fsync")

    def _check_append(self, entries: list[Entry]) -> None:
        first = entries[0].index
        if not self._terms.first <= first <= self._terms.last + 1:
            raise ValueError(f"cannot append at index {first}: the log holds {self._terms.first}..{self._terms.last}")
        for a, b in zip(entries, entries[1:]):
            if b.index != a.index + 1:
                raise ValueError(f"entries are not contiguous: {a.index} then {b.index}")

    def save_snapshot(self, meta: SnapshotMeta) -> None:
        """Durably record a snapshot; entries <= meta.index are dropped.

        Entries after it are kept only if the log holds meta.index with meta.term (the
        log matching property says they then agree with the snapshot); otherwise the
        whole log is dropped and the core appends afterwards. Does not delete files:
        call compact() for that.
        """
        self._check_usable()
        cur = self._snapshot
        if cur is not None and meta.index < cur.index:
            raise ValueError(f"snapshot at {meta.index} is older than the saved one at {cur.index}")
        if cur is not None and (meta.index, meta.term) == (cur.index, cur.term):
            return
        keep_suffix = self._terms.term(meta.index) == meta.term
        buf = bytearray()
        self._add_snapshot_record(buf, self._segments[-1].seq, self._seg_size, meta, keep_suffix)
        self._write(buf)
        self._failpoints.hit("storage.snapshot.after-write")
        if self._strict:
            self._fsync(self._fd)
        self._snapshot = meta
        if keep_suffix:
            self._terms.drop_through(meta.index, meta.term)
        else:
            self._terms = _Terms(meta.index + 1, meta.term)

    @staticmethod
    def _add_snapshot_record(buf: bytearray, seq: int, base: int, meta: SnapshotMeta, keep_suffix: bool) -> None:
        body = msgpack.packb([snapshot_meta_to_wire(meta), keep_suffix], use_bin_type=True)
        _add_record(buf, seq, base, KIND_SNAPSHOT, body)

    def compact(self, index: int) -> None:
        """Delete the segment files that hold nothing after `index`.

        Entries <= the snapshot index are already gone logically (save_snapshot), so
        `index` may not exceed it: beyond it we would lose the term that log matching
        needs. Whole files only; the newest segment is never deleted.
        """
        self._check_usable()
        snap_index = self._snapshot.index if self._snapshot else 0
        if index > snap_index:
            raise ValueError(f"cannot compact to {index}: beyond the snapshot index {snap_index}")
        # The newest segment whose entries all come after `index` keeps everything still
        # needed; the segments before it can go, oldest first (a crash leaves a suffix).
        keep = max((k for k, s in enumerate(self._segments) if s.start <= index + 1), default=0)
        if keep == 0:
            return
        doomed, self._segments = self._segments[:keep], self._segments[keep:]
        for n, seg in enumerate(doomed):
            seg.path.unlink()
            if n == 0 and len(doomed) > 1:
                self._failpoints.hit("storage.compact.mid-delete")
        if self._strict:
            self._fsync_dir()
        log.info("raft log: compacted %d segment(s) up to index %d", len(doomed), index)

    # ------------------------------------------------------------------ segments

    def _rotate(self) -> None:
        """Close the full segment and start the next one, header first."""
        if self._dirty and self._strict:
            self._fsync(self._fd)  # a later fsync of the new file would not cover it
        old_fd = self._fd
        last = self._segments[-1]
        self._create_segment(seq=last.seq + 1, start=self._terms.last + 1)
        os.close(old_fd)

    def _create_segment(self, seq: int, start: int) -> None:
        """Write a segment holding only the header, atomically, and make it the open one."""
        path = self.dir / _segment_name(seq, start)
        tmp = path.with_name(path.name + ".tmp")
        buf = bytearray()
        _add_record(buf, seq, 0, KIND_HARD_STATE, encode_hard_state(self._hard_state))
        if self._snapshot is not None:
            self._add_snapshot_record(buf, seq, 0, self._snapshot, keep_suffix=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            try:
                _write_all(fd, buf)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                tmp.unlink(missing_ok=True)  # nothing refers to it yet: the old segment stays open
                raise DiskFullError(self.dir, exc) from exc
            if self._strict:
                self._fsync(fd)
            self._failpoints.hit("storage.rotate.after-tmp")
            os.rename(tmp, path)
            if self._strict:
                self._fsync_dir()
            self._failpoints.hit("storage.rotate.after-rename")
        except BaseException:
            os.close(fd)
            raise
        self._segments.append(_Segment(seq, start, path))
        self._fd, self._seg_size, self._dirty = fd, len(buf), False

    # ------------------------------------------------------------------ low level

    def _write(self, buf: bytearray) -> None:
        try:
            _write_all(self._fd, buf)
        except BaseException as exc:
            if is_disk_full(exc) and self._cut_back_partial_write():
                raise DiskFullError(self.dir, exc) from exc
            self._failed = exc  # the file may hold a partial record: stop using it
            raise
        self._seg_size += len(buf)
        self._dirty = True

    def _cut_back_partial_write(self) -> bool:
        """After a write that ran out of space: drop whatever part of it reached the file,
        so the segment ends at its last whole record again. (Shrinking a file needs no
        space.) False if even that failed: then the log must not be used any more."""
        try:
            os.ftruncate(self._fd, self._seg_size)
        except OSError:
            log.exception("raft log: cannot cut a partial write back in %s", self._segments[-1].path)
            return False
        return True

    def _fsync(self, fd: int) -> None:
        t0 = time.perf_counter()
        try:
            self._failpoints.hit("storage.fsync")  # ":eio" arms a failed fsync
            _datasync(fd)
        except BaseException as exc:
            # After a failed fsync the kernel may have dropped the dirty pages; retrying
            # would report success for lost data. The node must stop.
            self._failed = exc
            raise
        self.fsync_count += 1
        if fd == self._fd:
            self._dirty = False
        if self._on_fsync is not None:
            self._on_fsync(time.perf_counter() - t0)

    def _fsync_dir(self) -> None:
        t0 = time.perf_counter()
        fsync_dir(self.dir)
        self.fsync_count += 1
        if self._on_fsync is not None:
            self._on_fsync(time.perf_counter() - t0)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise RuntimeError(f"raft log {self.dir} failed earlier and cannot be used") from self._failed
        if self._lock_fd < 0:
            raise RuntimeError(f"raft log {self.dir} is closed")


def _write_all(fd: int, buf: bytes | bytearray) -> None:
    view = memoryview(buf)
    while view:
        n = os.write(fd, view)
        view = view[n:]
