"""The Raft log as the core holds it in memory: the entries after the latest snapshot,
their terms, and how far they are committed, handed out to be persisted, and persisted.

The durable log is storage.py's; this one is what the consensus core (core.py) reads and
writes between two Readies. It is separate from the core because it is plain bookkeeping
over a list of entries (term lookups, slicing within a byte budget, truncation on a
conflict, compaction to a snapshot) with no Raft roles or messages in it, like etcd's
log.go beside raft.go. No I/O, no clock.
"""

from __future__ import annotations

from .types import Entry

__all__ = ["RaftLog"]


class RaftLog:
    """Entries after a snapshot boundary, plus the commit / persistence bookkeeping.

    * `snap_index`/`snap_term`: the last entry covered by the snapshot (0/0 if none);
    * `persisted`: entries up to here are durable (caller advanced a Ready with them);
    * `handed`: entries up to here were given to the caller to persist;
    * `commit`: highest index known committed.
    """

    def __init__(self, snap_index: int, snap_term: int, entries: list[Entry]) -> None:
        for i, e in enumerate(entries):
            if e.index != snap_index + 1 + i:
                raise ValueError(f"entries must follow the snapshot contiguously (at {e.index})")
        self.snap_index = snap_index
        self.snap_term = snap_term
        self._ents: list[Entry] = list(entries)
        self.commit = snap_index
        self.persisted = self.last_index
        self.handed = self.last_index

    @property
    def first_index(self) -> int:
        return self.snap_index + 1

    @property
    def last_index(self) -> int:
        return self.snap_index + len(self._ents)

    @property
    def last_term(self) -> int:
        return self._ents[-1].term if self._ents else self.snap_term

    def term(self, index: int) -> int | None:
        """Term of the entry at `index`; None if compacted away or beyond the end."""
        if index == self.snap_index:
            return self.snap_term
        if self.snap_index < index <= self.last_index:
            return self._ents[index - self.snap_index - 1].term
        return None

    def entry(self, index: int) -> Entry | None:
        if self.snap_index < index <= self.last_index:
            return self._ents[index - self.snap_index - 1]
        return None

    def slice(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi) up to `max_bytes` (always at least one if any)."""
        lo = max(lo, self.first_index)
        hi = min(hi, self.last_index + 1)
        out: list[Entry] = []
        size = 0
        base = self.snap_index + 1
        for i in range(lo, hi):
            e = self._ents[i - base]
            size += e.size()
            if out and size > max_bytes:
                break
            out.append(e)
        return out

    def is_up_to_date(self, index: int, term: int) -> bool:
        """Is a log ending at (index, term) at least as up to date as ours (§5.4.1)?"""
        return term > self.last_term or (term == self.last_term and index >= self.last_index)

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest index <= `index` whose entry term is <= `term` (fast backtracking).

        Returns `index` unchanged when it is beyond our log, and the snapshot index when
        the search runs into the compacted prefix.
        """
        if index > self.last_index:
            return index
        i = index
        while i > self.snap_index:
            t = self.term(i)
            if t is not None and t <= term:
                return i
            i -= 1
        return min(index, self.snap_index)

    def append(self, entries: list[Entry]) -> None:
        """Write `entries` from entries[0].index on, dropping whatever was there."""
        first = entries[0].index
        del self._ents[first - self.snap_index - 1 :]
        self._ents.extend(entries)
        self.handed = min(self.handed, first - 1)
        self.persisted = min(self.persisted, first - 1)

    def unhanded(self) -> list[Entry]:
        return self._ents[self.handed - self.snap_index :]

    def commit_to(self, index: int) -> bool:
        if index > self.commit:
            self.commit = index
            return True
        return False

    def stable_to(self, index: int, term: int) -> None:
        """The caller persisted entries up to (index, term) unless the log moved on."""
        if self.term(index) == term and index > self.persisted:
            self.persisted = index

    def compact(self, index: int, term: int) -> None:
        del self._ents[: index - self.snap_index]
        self.snap_index, self.snap_term = index, term

    def restore(self, index: int, term: int) -> None:
        """Replace everything with a snapshot at (index, term)."""
        self._ents = []
        self.snap_index, self.snap_term = index, term
        self.commit = max(self.commit, index)
        self.persisted = self.handed = index
