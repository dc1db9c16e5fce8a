"""Per-follower replication progress, as the leader sees it (the etcd-raft model).

A follower is in one of three states:

* PROBE: the leader does not know where the follower's log matches its own. It sends
  one AppendEntries at a time and waits for the answer (or a heartbeat response)
  before sending the next, backing `next` off on each rejection.
* REPLICATE: the logs match up to `match`. The leader streams entries optimistically
  (pipelining), moving `next` forward as soon as it sends, bounded by `Inflights`.
* SNAPSHOT: the follower needs entries the leader has compacted away. The leader sent
  a snapshot and sends nothing else until the follower acknowledges it or the node loop
  reports the transfer failed.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """The AppendEntries messages sent but not yet acknowledged (flow control).

    Each item is (index of the last entry in the message, bytes of entries). The window
    is full when either the message count or the byte count reaches its limit.
    """

    def __init__(self, max_msgs: int, max_bytes: int) -> None:
        self._max_msgs = max(1, max_msgs)
        self._max_bytes = max(1, max_bytes)
        self._items: deque[tuple[int, int]] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return len(self._items) >= self._max_msgs or self.bytes >= self._max_bytes

    def add(self, last_index: int, size: int) -> None:
        self._items.append((last_index, size))
        self.bytes += size

    def free_le(self, index: int) -> None:
        """Forget every message whose entries the follower acknowledged (<= index)."""
        while self._items and self._items[0][0] <= index:
            self.bytes -= self._items.popleft()[1]

    def free_first(self) -> None:
        """Make room for one message (used when a heartbeat shows the peer is alive)."""
        if self._items:
            self.bytes -= self._items.popleft()[1]

    def reset(self) -> None:
        self._items.clear()
        self.bytes = 0


@dataclass
class Progress:
    """What the leader knows about one peer's log and liveness."""

    next: int
    inflights: Inflights
    last_contact_ms: int
    match: int = 0
    state: ProgressState = ProgressState.PROBE
    # PROBE: an AppendEntries is outstanding; wait for its answer before the next one.
    probe_sent: bool = False
    # SNAPSHOT: the index of the snapshot we sent.
    pending_snapshot: int = 0
    # Send time (leader clock) of the latest heartbeat round this peer acknowledged in the
    # current term; None until it acknowledges one. Drives the lease.
    lease_ack_ms: int | None = field(default=None)
    # Whether the peer has sent this leader anything yet. last_contact_ms starts at the
    # leader's "now" (so check-quorum gives a new peer a full election timeout), which
    # must not be shown to people as a contact: status() says "never" until this is set.
    heard_from: bool = False
    # The index the peer last said it applied (Message.applied); None until it answers.
    applied: int | None = None
    # How often, in this leader's term, the peer's answer showed it lacked entries it had
    # acknowledged (a wiped data directory, a lost disk). `lost_acknowledged` is the match
    # index it had before its latest loss, kept until its match reaches it again; 0: none.
    lost_entries: int = 0
    lost_acknowledged: int = 0

    # -- state transitions -------------------------------------------------------------

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            # The snapshot (if it arrived) covers everything up to pending_snapshot.
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        self.next = self.match + 1
        self._reset(ProgressState.REPLICATE)

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.pending_snapshot = 0
        self.inflights.reset()

    # -- bookkeeping -------------------------------------------------------------------

    def is_paused(self) -> bool:
        """True when the leader must not send another AppendEntries now."""
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True  # SNAPSHOT: wait for the snapshot to land

    def sent_entries(self, last_index: int, size: int, count: int) -> None:
        """Record that an AppendEntries ending at `last_index` went out."""
        if self.state is ProgressState.REPLICATE:
            if count:
                self.next = last_index + 1
                self.inflights.add(last_index, size)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def maybe_update(self, index: int) -> bool:
        """The peer acknowledged its log matches ours up to `index`. False if stale."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
            if self.match >= self.lost_acknowledged:
                self.lost_acknowledged = 0  # it has all it had lost again
        self.next = max(self.next, index + 1)
        return updated

    def lost_entries_at(self, rejected: int) -> bool:
        """Whether a rejection of the AppendEntries whose previous index was `rejected`
        shows the peer lacks entries it acknowledged: it answers our current probe, which
        asks about an entry at or below `match`.

        A peer never drops entries it acknowledged to this leader (the leader's log only
        grows in its term, so nothing ever tells the peer to truncate them), unless its
        storage lost them. Only the answer to the current probe counts: a rejection in
        REPLICATE at or below `match` may be an old answer overtaken by a later ack."""
        return self.state is ProgressState.PROBE and 0 < rejected <= self.match and self.next - 1 == rejected

    def lose_entries(self, has: int, hint_next: int) -> None:
        """The peer lost acknowledged entries (see lost_entries_at): forget its match down to
        `has`, what its answer proves it still holds (0 when it proves nothing), and probe
        from `hint_next` (not below has + 1). Its old match must not count for commit any
        more; the commit index itself never moves back."""
        self.lost_entries += 1
        self.lost_acknowledged = max(self.lost_acknowledged, self.match)
        self.match = has
        self.next = max(has + 1, hint_next)
        self._reset(ProgressState.PROBE)

    def maybe_decr_to(self, rejected: int, hint_next: int) -> bool:
        """The peer rejected an AppendEntries whose previous index was `rejected`.

        `hint_next` is where the peer's answer says probing should continue. Returns
        False for a stale rejection (one that says nothing about the current state).
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # an answer to an old message; we already know better
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # not the answer to our current probe
        self.next = max(min(rejected, hint_next), self.match + 1)
        self.probe_sent = False
        return True
