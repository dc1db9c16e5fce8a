"""A deterministic storage workload and an in-memory model of what it should leave behind.

Shared by the storage tests and the crash child process (storage_crash_child.py): both
generate the same operations from a seed, so the test can tell which states a killed
child may legitimately have left on disk.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dex_ha.raft.storage import RaftStorage
from dex_ha.raft.types import ConfState, Entry, HardState, SnapshotMeta

CONF = ConfState(voters=("n1", "n2", "n3"))


@dataclass(frozen=True)
class Save:
    hard_state: HardState | None
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Snapshot:
    meta: SnapshotMeta


@dataclass(frozen=True)
class Compact:
    index: int


Op = Save | Snapshot | Compact


@dataclass
class Model:
    """The logical content of the log: what initial_state() must return."""

    hard_state: HardState = HardState()
    snapshot: SnapshotMeta | None = None
    entries: list[Entry] = field(default_factory=list)  # after the snapshot, in order

    def first(self) -> int:
        return self.snapshot.index + 1 if self.snapshot else 1

    def last(self) -> int:
        return self.entries[-1].index if self.entries else self.first() - 1

    def term(self, index: int) -> int | None:
        if index == self.first() - 1:
            return self.snapshot.term if self.snapshot else 0
        if self.first() <= index <= self.last():
            return self.entries[index - self.first()].term
        return None

    def copy(self) -> Model:
        return Model(self.hard_state, self.snapshot, list(self.entries))

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        if entries:
            del self.entries[entries[0].index - self.first() :]
            self.entries.extend(entries)

    def apply(self, op: Op) -> None:
        if isinstance(op, Save):
            self.append(op.entries)
            if op.hard_state is not None:
                self.hard_state = op.hard_state
        elif isinstance(op, Snapshot):
            meta = op.meta
            if self.term(meta.index) == meta.term:
                self.entries = [e for e in self.entries if e.index > meta.index]
            else:
                self.entries = []
            self.snapshot = meta

    def state(self) -> tuple[HardState, SnapshotMeta | None, list[Entry]]:
        return self.hard_state, self.snapshot, list(self.entries)


def entry_data(term: int, index: int, rng: random.Random) -> bytes:
    """Recognisable payload; sometimes large, to cross segment boundaries quickly."""
    size = rng.choice((16, 100, 256, 256, 2000))
    return f"t{term}i{index}:".encode().ljust(size, b".")


def generate(seed: int, n_ops: int) -> list[Op]:
    """Raft-like traffic: appends, overwrites of an uncommitted suffix, snapshots, compaction."""
    rng = random.Random(seed)
    model = Model()
    ops: list[Op] = []
    term, commit = 1, 0
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.07 and commit > model.first():
            meta = SnapshotMeta(commit, model.term(commit) or 0, CONF)
            op: Op = Snapshot(meta)
            model.apply(op)
            ops.append(op)
            op = Compact(rng.randint(max(0, commit - 50), commit))
        elif r < 0.17 and model.last() > commit:
            term += 1  # a new leader overwrites part of the uncommitted suffix
            start = rng.randint(commit + 1, model.last())
            ents = tuple(
                Entry(term, i, data=entry_data(term, i, rng)) for i in range(start, start + rng.randint(1, 30))
            )
            op = Save(HardState(term, "n2", commit), ents)
        else:
            start = model.last() + 1
            ents = tuple(
                Entry(term, i, data=entry_data(term, i, rng))
                for i in range(start, start + rng.choice((1, 1, 5, 20, 100)))
            )
            commit = max(commit, rng.randint(commit, start - 1)) if start > 1 else 0
            hs = HardState(term, "n1", commit) if rng.random() < 0.9 else None
            op = Save(hs, ents)
        model.apply(op)
        ops.append(op)
    return ops


def run_op(st: RaftStorage, op: Op) -> None:
    if isinstance(op, Save):
        st.save(op.hard_state, list(op.entries))
    elif isinstance(op, Snapshot):
        st.save_snapshot(op.meta)
    else:
        st.compact(op.index)


State = tuple[HardState, SnapshotMeta | None, list[Entry]]


def explain_crash_state(ops: list[Op], acked: int, recovered: State) -> str | None:
    """None if `recovered` is a state the log may hold after a crash, else why not.

    ops[:acked] were acknowledged, so they must all be there. Any later operation may
    have happened too, in order; the one in flight may be absent, complete, or -- for a
    save -- a prefix of its entries (the hard state is written after them, so it is the
    old one then).
    """
    model = Model()
    for op in ops[:acked]:
        model.apply(op)
    if recovered == model.state():
        return None
    rec_last = recovered[2][-1].index if recovered[2] else None
    for op in ops[acked:]:
        if isinstance(op, Save) and op.entries and rec_last is not None:
            m = rec_last - op.entries[0].index + 1
            if 1 <= m <= len(op.entries):
                partial = model.copy()
                partial.append(op.entries[:m])
                if recovered == partial.state():
                    return None
        model.apply(op)
        if recovered == model.state():
            return None
    hs, snap, ents = recovered
    return (
        f"recovered state (hard state {hs}, snapshot {snap}, "
        f"{len(ents)} entries, last {rec_last}) is no state reachable after op {acked}"
    )
