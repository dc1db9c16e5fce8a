"""RaftStorage: durability, overwrite, compaction, torn tails, corruption, crash safety."""

from __future__ import annotations

import logging
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from dex_ha.failpoints import FAILPOINT_ENV, FAILPOINT_EXIT_CODE
from dex_ha.raft import storage as storage_mod
from dex_ha.raft.storage import LogCorruptionError, RaftStorage
from dex_ha.raft.types import ConfState, Entry, HardState, SnapshotMeta
from tests.raft.storage_workload import Compact, Model, Save, Snapshot, explain_crash_state, generate, run_op

REPO = Path(__file__).resolve().parents[2]
CONF = ConfState(voters=("n1", "n2", "n3"))


def ents(term: int, start: int, n: int, size: int = 256) -> list[Entry]:
    return [Entry(term, i, data=f"t{term}i{i}".encode().ljust(size, b"-")) for i in range(start, start + n)]


def segments(dir: Path) -> list[Path]:
    return sorted(dir.glob("*.wal"))


def records(path: Path) -> list[tuple[int, int]]:
    """(offset, total length) of each record in a well-formed segment file."""
    buf, out, off = path.read_bytes(), [], 0
    while off < len(buf):
        (length,) = struct.unpack_from("<I", buf, off)
        out.append((off, 8 + length))
        off += 8 + length
    return out


def reopen(dir: Path, **kw) -> tuple[RaftStorage, tuple]:
    """Open (the caller closes) and read the initial state."""
    st = RaftStorage.open(dir, durability=kw.pop("durability", "relaxed"), **kw)
    return st, st.initial_state()


def load(dir: Path, **kw) -> tuple:
    """The initial state a restart would see."""
    with RaftStorage.open(dir, durability=kw.pop("durability", "relaxed"), **kw) as st:
        return st.initial_state()


# ---------------------------------------------------------------------------- basics


def test_round_trip_across_reopen(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path)
    assert st.initial_state() == (HardState(), None, [])
    st.save(HardState(1, "n1", 0), ents(1, 1, 10))
    st.save(HardState(2, "n2", 5), ents(2, 11, 5))
    st.save_snapshot(SnapshotMeta(4, 1, CONF))
    st.save(HardState(2, "n2", 12), [])
    st.close()

    st, (hs, snap, log) = reopen(tmp_path)
    assert hs == HardState(2, "n2", 12)
    assert snap == SnapshotMeta(4, 1, CONF)
    assert log == ents(1, 5, 6) + ents(2, 11, 5)
    assert (st.first_index(), st.last_index()) == (5, 15)
    assert (st.term(4), st.term(5), st.term(11)) == (1, 1, 2)
    st.close()


def test_vote_refusal_window_survives_reopen_and_old_hard_states_read(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed")
    st.save(HardState(3, "n2", 0, vote_refusal_ms=1500), ents(3, 1, 2))
    seq, base = st._segments[-1].seq, st._seg_size
    # A hard state as written before vote_refusal_ms existed: [term, vote, commit].
    buf = bytearray()
    storage_mod._add_record(buf, seq, base, storage_mod.KIND_HARD_STATE, msgpack.packb([4, "n1", 2]))
    storage_mod._write_all(st._fd, buf)
    st.close()
    hs, _, log = load(tmp_path)
    assert hs == HardState(4, "n1", 2, vote_refusal_ms=0) and len(log) == 2
    with RaftStorage.open(tmp_path, durability="relaxed") as st:
        st.save(HardState(4, "n1", 2, vote_refusal_ms=700), [])
    assert load(tmp_path)[0] == HardState(4, "n1", 2, 700)


def test_overwrite_of_a_conflicting_suffix(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed")
    st.save(HardState(1, "n1", 3), ents(1, 1, 10))
    st.save(HardState(2, "n2", 3), ents(2, 6, 2))  # a new leader replaces 6..10
    assert st.last_index() == 7 and st.term(6) == 2 and st.term(5) == 1
    st.close()
    _, _, log = load(tmp_path)
    assert log == ents(1, 1, 5) + ents(2, 6, 2)


def test_overwrite_reaching_into_an_earlier_segment(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed", segment_bytes=2048)
    for i in range(1, 41, 4):
        st.save(HardState(1, "n1", 0), ents(1, i, 4))
    assert len(segments(tmp_path)) > 3
    st.save(HardState(3, "n3", 0), ents(3, 5, 3))
    st.close()
    _, _, log = load(tmp_path)
    assert log == ents(1, 1, 4) + ents(3, 5, 3)
    assert st.last_index() == 7


def test_appends_must_be_contiguous_and_after_the_snapshot(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed")
    st.save(None, ents(1, 1, 5))
    with pytest.raises(ValueError, match="index 8"):
        st.save(None, ents(1, 8, 1))
    with pytest.raises(ValueError, match="contiguous"):
        st.save(None, [Entry(1, 6), Entry(1, 8)])
    st.save_snapshot(SnapshotMeta(3, 1, CONF))
    with pytest.raises(ValueError, match="index 3"):
        st.save(None, ents(2, 3, 1))
    with pytest.raises(ValueError, match="beyond the snapshot"):
        st.compact(4)
    with pytest.raises(ValueError, match="older"):
        st.save_snapshot(SnapshotMeta(2, 1, CONF))


def test_durability_value_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        RaftStorage.open(tmp_path, durability="sometimes")


def test_a_directory_is_opened_once(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed")
    with pytest.raises(RuntimeError, match="already open"):
        RaftStorage.open(tmp_path, durability="relaxed")
    st.close()
    RaftStorage.open(tmp_path, durability="relaxed").close()


def test_snapshot_keeps_a_matching_suffix_and_drops_a_conflicting_log(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed")
    st.save(None, ents(1, 1, 10))
    st.save_snapshot(SnapshotMeta(6, 1, CONF))  # we hold 6 with term 1: 7..10 agree
    assert (st.first_index(), st.last_index()) == (7, 10)
    st.save_snapshot(SnapshotMeta(8, 5, CONF))  # a leader's snapshot contradicting our log
    assert (st.first_index(), st.last_index()) == (9, 8)
    st.save(None, ents(5, 9, 2))
    st.close()
    _, snap, log = load(tmp_path)
    assert snap == SnapshotMeta(8, 5, CONF) and log == ents(5, 9, 2)


# ---------------------------------------------------------------------------- fsync accounting


def test_strict_is_one_fsync_per_save_and_relaxed_none(tmp_path: Path) -> None:
    seen: list[float] = []
    st = RaftStorage.open(tmp_path / "s", durability="strict", on_fsync=seen.append)
    base = st.fsync_count
    st.save(HardState(1, "n1", 0), ents(1, 1, 100))
    assert st.fsync_count == base + 1
    st.save(HardState(1, "n1", 0), ents(1, 101, 1), sync=False)
    assert st.fsync_count == base + 1
    assert len(seen) == st.fsync_count and all(s >= 0 for s in seen)
    st.close()  # flushes the unsynced save
    assert st.fsync_count == base + 2

    rl = RaftStorage.open(
        tmp_path / "r", durability="relaxed", segment_bytes=4096, on_fsync=lambda s: pytest.fail("relaxed mode fsynced")
    )
    for i in range(1, 200, 10):
        rl.save(HardState(1, "n1", i), ents(1, i, 10))
    rl.save_snapshot(SnapshotMeta(150, 1, CONF))
    rl.compact(150)
    rl.close()
    assert rl.fsync_count == 0


# ---------------------------------------------------------------------------- compaction


def test_compaction_drops_segments_and_survives_reopen(tmp_path: Path) -> None:
    st = RaftStorage.open(tmp_path, durability="relaxed", segment_bytes=8192)
    for i in range(1, 1001, 10):
        st.save(HardState(1, "n1", i - 1), ents(1, i, 10))
    before = len(segments(tmp_path))
    assert before > 20
    st.save_snapshot(SnapshotMeta(900, 1, CONF))
    st.compact(900)
    starts = [int(p.stem.split("-")[1], 16) for p in segments(tmp_path)]
    # Kept: the newest segment begun at or before 901 (it may hold 901) and those after.
    assert starts[0] <= 901 and all(s > 901 for s in starts[1:]), starts
    assert len(starts) < before // 4
    st.save(HardState(1, "n1", 1000), ents(1, 1001, 5))
    st.close()
    hs, snap, log = load(tmp_path)
    assert hs.commit == 1000 and snap.index == 900
    assert log == ents(1, 901, 105)


def test_hard_state_and_snapshot_survive_compaction_of_the_segment_that_recorded_them(tmp_path: Path) -> None:
    """Every segment starts with the current hard state and snapshot for this reason."""
    st = RaftStorage.open(tmp_path, durability="relaxed", segment_bytes=1024)
    st.save(HardState(4, "n3", 10), ents(1, 1, 10))  # fills segment 0
    st.save_snapshot(SnapshotMeta(20, 3, CONF))  # beyond our log: it is all dropped
    for i in range(21, 61, 4):  # no hard state in these saves; segments rotate
        st.save(None, ents(3, i, 4, size=100))
    st.compact(20)
    names = [p.name for p in segments(tmp_path)]
    assert all(int(n.split("-")[1][:16], 16) >= 21 for n in names), names
    st.close()
    hs, snap, log = load(tmp_path)
    assert hs == HardState(4, "n3", 10) and snap == SnapshotMeta(20, 3, CONF)
    assert [e.index for e in log] == list(range(21, 61))


@pytest.mark.parametrize("seed", range(12))
def test_random_workload_matches_model_across_reopens(tmp_path: Path, seed: int) -> None:
    """Appends, overwrites, snapshots and compaction with small segments, reopened often."""
    ops = generate(seed, 250)
    rng = random.Random(seed)
    model = Model()
    st = RaftStorage.open(tmp_path, durability="relaxed", segment_bytes=16384)
    for op in ops:
        run_op(st, op)
        model.apply(op)
        assert (st.first_index(), st.last_index()) == (model.first(), model.last())
        probe = rng.randint(model.first() - 1, model.last() + 1)
        assert st.term(probe) == model.term(probe), probe
        if rng.random() < 0.1:
            st.close()
            st = RaftStorage.open(tmp_path, durability="relaxed", segment_bytes=16384)
            assert st.initial_state() == model.state()
    assert any(isinstance(op, Compact) for op in ops) and any(isinstance(op, Snapshot) for op in ops)
    st.close()
    st, state = reopen(tmp_path, segment_bytes=16384)
    assert state == model.state()
    assert st.initial_state() == model.state()  # a second call re-reads from disk
    st.close()


# ---------------------------------------------------------------------------- torn tails


def _log_with_last_record(dir: Path) -> tuple[tuple, int, int]:
    """A log whose last record is one entry; returns (state before it, its offset, its end)."""
    st = RaftStorage.open(dir, durability="relaxed")
    st.save(HardState(1, "n1", 0), ents(1, 1, 5))
    st.save(HardState(1, "n1", 3), ents(1, 6, 5))
    st.close()
    st, before = reopen(dir)
    st.save(None, ents(1, 11, 1, size=300))
    st.close()
    (seg,) = segments(dir)
    off, length = records(seg)[-1]
    return before, off, off + length


def test_torn_tail_is_truncated_at_every_cut_point(tmp_path: Path, caplog) -> None:
    src = tmp_path / "src"
    before, start, end = _log_with_last_record(src)
    assert end - start > 300
    for cut in range(start, end):
        dst = tmp_path / f"cut{cut}"
        shutil.copytree(src, dst)
        (seg,) = segments(dst)
        os.truncate(seg, cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dex_ha.raft.storage"):
            st, state = reopen(dst)
        assert state == before, cut
        assert seg.stat().st_size == start  # the partial record is gone from disk
        assert cut == start or "torn tail" in caplog.text
        st.save(None, ents(2, 11, 1))  # and the log takes appends again
        st.close()
        _, _, log = load(dst)
        assert log == before[2] + ents(2, 11, 1)
        shutil.rmtree(dst)


def test_torn_multi_record_save_leaves_an_entry_prefix_and_the_old_hard_state(tmp_path: Path) -> None:
    """Entries are written before the hard state, so a commit index never outruns the log."""
    src = tmp_path / "src"
    st = RaftStorage.open(src, durability="relaxed")
    first = Save(HardState(1, "n1", 0), tuple(ents(1, 1, 5)))
    torn = Save(HardState(2, "n2", 9), tuple(ents(2, 4, 6, size=40)))
    run_op(st, first)
    (seg,) = segments(src)
    start = seg.stat().st_size
    run_op(st, torn)
    st.close()
    end = seg.stat().st_size
    for cut in range(start, end):
        dst = tmp_path / f"cut{cut}"
        shutil.copytree(src, dst)
        os.truncate(segments(dst)[0], cut)
        with RaftStorage.open(dst, durability="relaxed") as st:
            state = st.initial_state()
        assert explain_crash_state([first, torn], 1, state) is None, cut
        hs, _, log = state
        assert hs.commit <= log[-1].index
        shutil.rmtree(dst)


def test_checksum_mismatch_in_the_last_record_is_a_torn_tail(tmp_path: Path, caplog) -> None:
    before, start, end = _log_with_last_record(tmp_path)
    (seg,) = segments(tmp_path)
    _flip(seg, end - 7)
    with caplog.at_level(logging.WARNING, logger="dex_ha.raft.storage"):
        state = load(tmp_path)
    assert state == before
    assert "checksum mismatch" in caplog.text and str(seg) in caplog.text


def test_a_record_copied_into_entry_data_does_not_make_a_torn_tail_look_corrupt(tmp_path: Path) -> None:
    """Records are bound to their offset: bytes of a valid record inside an entry's data
    are not taken for "valid data after the damage" when the entry is torn."""
    st = RaftStorage.open(tmp_path, durability="relaxed")
    st.save(HardState(1, "n1", 0), ents(1, 1, 3))
    st.close()
    (seg,) = segments(tmp_path)
    off, length = records(seg)[-2]
    a_record = seg.read_bytes()[off : off + length]
    st, before = reopen(tmp_path)
    st.save(None, [Entry(1, 4, data=b"x" * 7 + a_record + b"y" * 200)])
    st.close()
    os.truncate(seg, seg.stat().st_size - 50)
    state = load(tmp_path)
    assert state == before


# ---------------------------------------------------------------------------- zero-filled tails
#
# After a crash, pages of the last segment that were never written back read as zeroes,
# and later pages may hold a later, unsynced write: zeroes followed by well-formed
# records. The log ends at the zeroes (etcd's WAL does the same).


def _log_with_unsynced_tail(dir: Path) -> tuple[tuple, int, list[tuple[int, int]]]:
    """A synced prefix, then 12 single-entry saves; returns (state of the prefix, its
    end offset, (offset, length) of each later record)."""
    st = RaftStorage.open(dir, durability="relaxed")
    st.save(HardState(1, "n1", 0), ents(1, 1, 5))
    st.close()
    st, before = reopen(dir)
    (seg,) = segments(dir)
    start = seg.stat().st_size
    for i in range(6, 18):
        st.save(None, ents(1, i, 1, size=300))
    st.close()
    return before, start, [r for r in records(seg) if r[0] >= start]


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    buf = bytearray(path.read_bytes())
    buf[offset : offset + len(data)] = data
    path.write_bytes(bytes(buf))


@pytest.mark.parametrize("after_zeroes", ["later_records", "record_fragment", "garbage"])
def test_zeroes_at_a_record_boundary_end_the_log(tmp_path: Path, caplog, after_zeroes: str) -> None:
    before, start, later = _log_with_unsynced_tail(tmp_path)
    (seg,) = segments(tmp_path)
    zero_to = later[4][0]  # the first four unsynced records are zeroes
    if after_zeroes == "record_fragment":
        zero_to += 100  # the zeroes end inside a record; whole records follow it
    _overwrite(seg, start, bytes(zero_to - start))
    if after_zeroes == "garbage":
        _overwrite(seg, zero_to, random.Random(1).randbytes(seg.stat().st_size - zero_to))
    with caplog.at_level(logging.WARNING, logger="dex_ha.raft.storage"):
        st, state = reopen(tmp_path)
    assert state == before
    assert seg.stat().st_size == start  # truncated at the zeroes
    assert "zero-filled" in caplog.text and str(seg) in caplog.text
    st.save(None, ents(2, 6, 1))  # the log takes appends again, and keeps them
    st.close()
    assert load(tmp_path)[2] == before[2] + ents(2, 6, 1)


def test_zeroes_from_a_sector_inside_a_record_end_the_log_before_it(tmp_path: Path) -> None:
    """The write of a record got as far as a sector boundary: the rest is zeroes, and
    a later page of the same unsynced write did reach the disk."""
    before, start, later = _log_with_unsynced_tail(tmp_path)
    (seg,) = segments(tmp_path)
    k, (off, length) = next(
        (k, r) for k, r in enumerate(later[1:], 1) if r[0] // 512 != (r[0] + r[1] - 1) // 512
    )  # spans a boundary
    boundary = (off // 512 + 1) * 512
    zero_to = later[k + 2][0] + 50  # into a later record; well-formed records follow
    _overwrite(seg, boundary, bytes(zero_to - boundary))
    st, state = reopen(tmp_path)
    assert state[2] == before[2] + ents(1, 6, k, size=300)  # up to the torn record
    assert seg.stat().st_size == off
    st.close()


def test_a_checksum_mismatch_before_zeroes_is_still_corruption(tmp_path: Path) -> None:
    before, start, later = _log_with_unsynced_tail(tmp_path)
    (seg,) = segments(tmp_path)
    _flip(seg, later[1][0] + 40)  # real damage in a record ...
    _overwrite(seg, later[6][0], bytes(later[8][0] - later[6][0]))  # ... valid records, zeroes
    size = seg.stat().st_size
    with pytest.raises(LogCorruptionError, match="checksum mismatch.*valid records follow"):
        RaftStorage.open(tmp_path, durability="relaxed")
    assert seg.stat().st_size == size


def test_zeroes_in_a_segment_before_the_last_are_corruption(tmp_path: Path) -> None:
    _three_saves(tmp_path, segment_bytes=2048)
    segs = segments(tmp_path)
    assert len(segs) >= 2
    off, length = records(segs[0])[-1]
    _overwrite(segs[0], off, bytes(length))
    with pytest.raises(LogCorruptionError, match=str(segs[0])):
        RaftStorage.open(tmp_path, durability="relaxed")


# ---------------------------------------------------------------------------- corruption


def _flip(path: Path, offset: int) -> None:
    buf = bytearray(path.read_bytes())
    buf[offset] ^= 0x40
    path.write_bytes(bytes(buf))


def _entry_record(seg: Path, index: int) -> tuple[int, int]:
    """Offset and length of the record holding entry `index` (found by its payload text)."""
    buf = seg.read_bytes()
    for off, length in records(seg):
        if f"t1i{index}-".encode() in buf[off : off + length]:
            return off, length
    raise AssertionError(f"entry {index} not found")


def _three_saves(dir: Path, segment_bytes: int = 64 << 20) -> None:
    st = RaftStorage.open(dir, durability="relaxed", segment_bytes=segment_bytes)
    for i in range(1, 31, 10):
        st.save(HardState(1, "n1", i), ents(1, i, 10))
    st.close()


@pytest.mark.parametrize("where", ["payload", "crc", "length"])
def test_damage_inside_the_log_stops_with_file_and_index(tmp_path: Path, where: str) -> None:
    _three_saves(tmp_path)
    (seg,) = segments(tmp_path)
    off, length = _entry_record(seg, 15)
    _flip(seg, {"payload": off + length // 2, "crc": off + 5, "length": off + 1}[where])
    size = seg.stat().st_size
    with pytest.raises(LogCorruptionError) as err:
        RaftStorage.open(tmp_path, durability="relaxed")
    msg = str(err.value)
    assert str(seg) in msg and "entry index 15" in msg and f"byte offset {off}" in msg
    assert seg.stat().st_size == size  # nothing was "repaired" away
    RaftStorage.open(tmp_path / "other", durability="relaxed").close()  # the lock was released
    with pytest.raises(LogCorruptionError):
        RaftStorage.open(tmp_path, durability="relaxed")


def test_damage_at_the_end_of_a_non_last_segment_is_corruption(tmp_path: Path) -> None:
    _three_saves(tmp_path, segment_bytes=2048)
    segs = segments(tmp_path)
    assert len(segs) >= 2
    _flip(segs[0], segs[0].stat().st_size - 3)
    with pytest.raises(LogCorruptionError, match=str(segs[0])):
        RaftStorage.open(tmp_path, durability="relaxed")


def test_a_lost_first_segment_is_corruption(tmp_path: Path) -> None:
    """Without a snapshot covering them, entries of a deleted first segment are missing."""
    _three_saves(tmp_path, segment_bytes=2048)
    segs = segments(tmp_path)
    segs[0].unlink()
    with pytest.raises(LogCorruptionError, match="missing"):
        RaftStorage.open(tmp_path, durability="relaxed")


def test_a_missing_segment_is_corruption(tmp_path: Path) -> None:
    _three_saves(tmp_path, segment_bytes=2048)
    segs = segments(tmp_path)
    assert len(segs) >= 3
    segs[1].unlink()
    with pytest.raises(LogCorruptionError, match="missing"):
        RaftStorage.open(tmp_path, durability="relaxed")


# ---------------------------------------------------------------------------- crashes


@pytest.mark.parametrize("seed", range(10))
def test_power_loss_keeps_every_synced_save(tmp_path: Path, monkeypatch, seed: int) -> None:
    """Simulate losing everything not fsynced: each file is cut back to its size at its
    last fsync. Saves with sync=False become durable through the next synced save, even
    when a segment rotation happened in between."""
    from dex_ha.raft import storage as storage_mod

    synced: dict[int, int] = {}  # inode -> size at the last fsync
    real_sync = storage_mod._datasync

    def tracking_sync(fd: int) -> None:
        real_sync(fd)
        st_ = os.fstat(fd)
        synced[st_.st_ino] = st_.st_size

    monkeypatch.setattr(storage_mod, "_datasync", tracking_sync)
    ops = generate(seed, 200)
    rng = random.Random(seed)
    after_compaction = [i + 1 for i, op in enumerate(ops) if isinstance(op, Compact)]
    crash_at = rng.choice(after_compaction) if seed % 2 else rng.randint(1, len(ops))
    st = RaftStorage.open(tmp_path, durability="strict", segment_bytes=8192)
    acked = 0
    for i, op in enumerate(ops[:crash_at]):
        if isinstance(op, Save) and rng.random() < 0.4:
            st.save(op.hard_state, list(op.entries), sync=False)  # not acknowledged
        else:
            run_op(st, op)
            acked = i + 1
    for seg in segments(tmp_path):  # the power goes out; the lock dies with the process
        os.truncate(seg, synced.get(seg.stat().st_ino, 0))
    os.close(st._fd)
    os.close(st._lock_fd)
    monkeypatch.undo()
    state = load(tmp_path, segment_bytes=8192)
    assert explain_crash_state(ops, acked, state) is None, explain_crash_state(ops, acked, state)


class _Child:
    """The crash child process, with deadline-bounded line reads of its stdout."""

    def __init__(self, dir: Path, seed: int, n_ops: int, segment_bytes: int, failpoints: str = "") -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        env.pop(FAILPOINT_ENV, None)
        if failpoints:
            env[FAILPOINT_ENV] = failpoints
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.raft.storage_crash_child",
                str(dir),
                str(seed),
                str(n_ops),
                str(segment_bytes),
            ],
            stdout=subprocess.PIPE,
            cwd=REPO,
            env=env,
        )
        assert self.proc.stdout is not None  # stdout=PIPE
        self._stdout = self.proc.stdout
        self._poll = select.poll()
        self._poll.register(self._stdout.fileno(), select.POLLIN)
        self._buf = b""
        self.acked = 0  # number of operations acknowledged

    def read_line(self, deadline: float) -> str | None:
        """The next line, or None at end of output."""
        fd = self._stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "crash child too slow"
            if not self._poll.poll(remaining * 1000):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        text = line.decode()
        if text.startswith("ack "):
            self.acked = int(text.split()[1]) + 1
        return text

    def wait(self, timeout: float = 60) -> int:
        self._stdout.close()
        return self.proc.wait(timeout)


def _check_recovery(dir: Path, ops: list, acked: int, segment_bytes: int) -> None:
    st = RaftStorage.open(dir, durability="strict", segment_bytes=segment_bytes)
    state = st.initial_state()
    assert explain_crash_state(ops, acked, state) is None, explain_crash_state(ops, acked, state)
    last = st.last_index()
    st.save(HardState(99, "n1", 0), [Entry(99, last + 1, data=b"after")])
    st.close()
    st = RaftStorage.open(dir, durability="strict", segment_bytes=segment_bytes)
    hs, _, log = st.initial_state()
    assert hs.term == 99 and log[-1] == Entry(99, last + 1, data=b"after")
    st.close()


CRASH_OPS, CRASH_SEGMENT = 200, 16384


@pytest.mark.parametrize("trial", range(8))
def test_sigkill_loses_nothing_acknowledged(tmp_path: Path, trial: int) -> None:
    seed = 1000 + trial
    ops = generate(seed, CRASH_OPS)
    kill_after = random.Random(seed).randint(0, CRASH_OPS - 1)
    child = _Child(tmp_path, seed, CRASH_OPS, CRASH_SEGMENT)
    deadline = time.monotonic() + 60
    while child.acked < kill_after:
        if child.read_line(deadline) in (None, "done"):
            break
    child.proc.send_signal(signal.SIGKILL)
    while child.read_line(deadline) not in (None, "done"):  # acks already in the pipe count too
        pass
    child.wait()
    _check_recovery(tmp_path, ops, child.acked, CRASH_SEGMENT)


FAILPOINT_CASES = [
    ("storage.save.after-write", 1),
    ("storage.save.after-write", 37),
    ("storage.save.after-write", 150),
    ("storage.save.after-fsync", 1),
    ("storage.save.after-fsync", 90),
    ("storage.rotate.after-tmp", 1),
    ("storage.rotate.after-tmp", 6),
    ("storage.rotate.after-rename", 1),
    ("storage.rotate.after-rename", 6),
    ("storage.snapshot.after-write", 1),
    ("storage.snapshot.after-write", 3),
    ("storage.compact.mid-delete", 1),
    ("storage.compact.mid-delete", 2),
]


@pytest.mark.parametrize("point,count", FAILPOINT_CASES, ids=[f"{p}@{n}" for p, n in FAILPOINT_CASES])
def test_crash_at_each_persist_point_loses_nothing_acknowledged(tmp_path: Path, point: str, count: int) -> None:
    seed = 7
    ops = generate(seed, CRASH_OPS)
    child = _Child(tmp_path, seed, CRASH_OPS, CRASH_SEGMENT, failpoints=f"{point}@{count}")
    deadline = time.monotonic() + 60
    while child.read_line(deadline) not in (None, "done"):
        pass
    assert child.wait() == FAILPOINT_EXIT_CODE, f"failpoint {point}@{count} was not reached"
    assert child.acked < CRASH_OPS
    _check_recovery(tmp_path, ops, child.acked, CRASH_SEGMENT)
