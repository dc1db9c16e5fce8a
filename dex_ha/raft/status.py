"""What a Raft node reports about itself: `RaftCore.status()` and `RaftNode.status()`, and
`RaftView`, the small view of the core the node loop publishes for the HTTP side.

Typed and frozen, like etcd's `Status{BasicStatus, Config, Progress}`: a reader gets
attributes a type checker knows instead of dict keys, and cannot change what the node
reported. `to_json()` gives the plain dict the node used to return, for logs and tools.
They are apart from the core and the node loop so that a reader (the server, the
simulator, tools) can name what a node reports without importing the machinery that
produces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .clock import now_ms
from .lease import lease_holds
from .types import NodeVersion, Role

if TYPE_CHECKING:  # the core builds its Status from this module: no import at run time
    from .core import RaftCore


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One member of the configuration as this node sees it.

    On the leader `match`, `next` and `state` are its replication progress (`state` is
    "probe", "replicate" or "snapshot"; "self" for the leader itself). `contacted` is
    False while the leader never heard from the member (then `last_contact_ms_ago` is
    None), True once it did. `applied` is the index the member last said it applied (None
    until it answers, 0 from a member of a release before this field). `lost_entries`
    counts the times in this leader's term that the member's answers showed it lacked
    entries it had acknowledged; `lost_acknowledged` is the match index it had before the
    latest such loss, until its match reaches it again (None otherwise). On any other node
    nothing of that is known: all None.
    """

    voter: bool
    match: int | None = None
    next: int | None = None
    state: str | None = None
    last_contact_ms_ago: int | None = None
    contacted: bool | None = None
    applied: int | None = None
    lost_entries: int | None = None
    lost_acknowledged: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "voter": self.voter,
            "match": self.match,
            "next": self.next,
            "state": self.state,
            "last_contact_ms_ago": self.last_contact_ms_ago,
            "contacted": self.contacted,
            "applied": self.applied,
            "lost_entries": self.lost_entries,
            "lost_acknowledged": self.lost_acknowledged,
        }


@dataclass(frozen=True, slots=True)
class LostEntries:
    """The leader of `term` saw `member` answer as if it lacked entries it had acknowledged
    up to `acknowledged` (its data directory was wiped or its disk lost writes): entries
    the cluster counted as stored on it are not. What its answer proves it still holds is
    `has` (0: nothing proven). The leader probes it again from there, so it catches up;
    the node loop logs this and counts it (`RaftCore.take_lost_entries`)."""

    member: str
    term: int
    acknowledged: int
    has: int


@dataclass(frozen=True, slots=True)
class Status:
    """A node's Raft state at one moment. `role` is the core's role in lower case
    ("follower", "pre_candidate", "candidate", "leader", "learner"); `leader` and `vote`
    are "" when there is none. The node loop adds what only it knows: the index of its
    latest snapshot and the snapshots it is sending (bytes sent, total bytes) by peer.
    The core hands `members` over read-only (a MappingProxyType)."""

    id: str
    role: str
    term: int
    vote: str
    leader: str
    commit: int
    applied: int
    first_index: int
    last_index: int
    lease_remaining_ms: int
    transferring_to: str
    members: Mapping[str, MemberStatus]
    snapshot_index: int | None = None
    snapshots_sending: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # What each node runs, by id, as its latest message said (this node's own included);
    # None: a node of a release before versions. A node not heard from is absent.
    versions: Mapping[str, NodeVersion | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The status as plain JSON-able values (the node-loop fields only when set)."""
        out: dict[str, Any] = {
            "id": self.id,
            "role": self.role,
            "term": self.term,
            "vote": self.vote,
            "leader": self.leader,
            "commit": self.commit,
            "applied": self.applied,
            "first_index": self.first_index,
            "last_index": self.last_index,
            "lease_remaining_ms": self.lease_remaining_ms,
            "transferring_to": self.transferring_to,
            "members": {member_id: m.to_json() for member_id, m in self.members.items()},
        }
        if self.snapshot_index is not None:
            out["snapshot_index"] = self.snapshot_index
            out["snapshots_sending"] = {peer: list(sent) for peer, sent in self.snapshots_sending.items()}
        return out


@dataclass(frozen=True)
class RaftView:
    """What the node's loop publishes of the core after every change that matters, so that
    code on another thread (the HTTP side) reads it without touching the core.

    Published before each Ready is handled (before any message of it leaves) and at the end
    of each turn: a lease given up for a transfer is gone from the view before TimeoutNow is
    sent, so the HTTP side never acts on a lease the core has already given away.
    """

    term: int
    role: Role
    leader_id: str
    lease_end_ms: int | None  # on the `now_ms()` clock; None: no valid lease
    commit: int
    voter: bool  # this node is a voting member
    # The only voter (`dex-ha dev`): no other node can be elected without a membership
    # change that this leader commits itself, so its lease, once established in its term,
    # does not run out with time. (A starved thread must not make a lone node inactive.)
    sole_voter: bool = False

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    def lease_valid(self, at_ms: int | None = None) -> bool:
        if not self.is_leader:
            return False
        return lease_holds(self.lease_end_ms, self.sole_voter, now_ms() if at_ms is None else at_ms)

    def lease_remaining_ms(self) -> int:
        return 0 if self.lease_end_ms is None else max(0, self.lease_end_ms - now_ms())


def view_of(core: RaftCore) -> RaftView:
    """The view the node loop publishes of `core` (the simulator publishes the same)."""
    voters = core.conf_state.voters
    return RaftView(
        term=core.term,
        role=core.role,
        leader_id=core.leader_id,
        lease_end_ms=core.lease_end_ms(),
        commit=core.commit_index,
        voter=core.id in voters,
        sole_voter=core.sole_voter(),
    )
