"""The members of the cluster as one node sees and changes them: `dex-ha members`
(add a learner, promote it, remove a member), the members of `/v1/cluster`, and which
voter a step down hands the leadership to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dex_ha.raft.node import Member, member_context
from dex_ha.raft.status import MemberStatus, Status
from dex_ha.raft.threaded import RaftThread
from dex_ha.raft.types import ConfChange, ConfChangeType, NodeVersion
from dex_ha.server.config import ServerConfig
from dex_ha.server.consistency import ConsistencyCheck
from dex_ha.server.errors import MemberNotCaughtUp
from dex_ha.server.versions import version_of

# How far behind the commit index a learner may be, in entries, to be promoted.
PROMOTE_MAX_LAG_ENTRIES = 1_000


class Membership:
    """Member changes go through Raft (a conf change each); the views read its status."""

    def __init__(self, raft: RaftThread[Any], config: ServerConfig, consistency: ConsistencyCheck) -> None:
        self.raft = raft
        self.config = config
        self.consistency = consistency  # a member under its alarm may not lead

    # ------------------------------------------------------------------ changes

    async def add_member(self, node_id: str, raft_addr: tuple[str, int], url: str) -> None:
        await self.raft.change_membership(
            ConfChange(ConfChangeType.ADD_LEARNER, node_id, member_context(raft_addr[0], raft_addr[1], url))
        )

    async def promote_member(self, node_id: str) -> None:
        status = await self.raft.status()
        info = status.members.get(node_id)
        if info is not None and not info.voter:  # promoting a voter is refused by the core (409) below
            match, contact = info.match, info.last_contact_ms_ago
            # Caught up means applied, not only stored (a learner of the release before
            # reports no applied index: its match index then).
            done = match if not match or info.applied is None else min(match, info.applied)
            if (
                not done
                or status.commit - done > PROMOTE_MAX_LAG_ENTRIES
                or contact is None
                or contact > self.config.election_timeout_max_ms
            ):
                raise MemberNotCaughtUp(
                    f"learner {node_id!r} is not caught up (match index {match}, applied index {info.applied}, "
                    f"commit index {status.commit}, last contact {contact} ms ago); promote it once it is"
                )
        await self.raft.change_membership(ConfChange(ConfChangeType.PROMOTE, node_id))

    async def remove_member(self, node_id: str) -> None:
        await self.raft.change_membership(ConfChange(ConfChangeType.REMOVE, node_id))

    # ------------------------------------------------------------------ reads

    async def is_member(self, node_id: str) -> bool:
        return node_id in (await self.raft.status()).members

    async def members(self) -> list[dict[str, Any]]:
        """The members, ordered by id, as /v1/cluster shows them (see _member_view)."""
        return self.views(await self.raft.status())

    async def most_caught_up_voter(self) -> str | None:
        """The other voter a step down hands the leadership to: the one with the highest
        match index, then the most recent contact; never one under the consistency alarm."""
        members = (await self.raft.status()).members
        others = [
            (info.match or 0, -(info.last_contact_ms_ago or 0), node_id)
            for node_id, info in members.items()
            if info.voter and node_id != self.config.node_id and node_id not in self.consistency.alarms
        ]
        return max(others)[2] if others else None

    def views(self, status: Status) -> list[dict[str, Any]]:
        """The members of `status`, ordered by id, as /v1/cluster shows them."""
        known = self.raft.members()
        return [
            {
                **_member_view(node_id, info, known.get(node_id), status.snapshots_sending.get(node_id)),
                **_member_version(status.versions, node_id),
                "consistency_alarm": node_id in self.consistency.alarms,
            }
            for node_id, info in sorted(status.members.items())
        ]


def _member_view(
    node_id: str, info: MemberStatus, member: Member | None, sending: tuple[int, int] | None
) -> dict[str, Any]:
    """One member as /v1/cluster shows it. `contacted` is False when this (leader) node never
    heard from it, None when unknown (not the leader); `replication` is the leader's
    progress state (probe, replicate, snapshot; self); `snapshot_bytes` is [sent, total]
    while a snapshot streams to it (a learner catching up). `applied_index` is what the
    member last said it applied; `lost_entries` counts the times in this leader's term
    its answers showed it lacked entries it had acknowledged, and
    `lost_acknowledged_index` is the match index it had before, until it has it again."""
    return {
        "id": node_id,
        "voter": info.voter,
        "url": member.url or None if member is not None else None,
        "raft_addr": "{}:{}".format(*member.raft_addr) if member is not None else None,
        "match_index": info.match,
        "applied_index": info.applied,
        "lost_entries": info.lost_entries,
        "lost_acknowledged_index": info.lost_acknowledged,
        "last_contact_ms_ago": info.last_contact_ms_ago,
        "contacted": info.contacted,
        "replication": info.state,
        "snapshot_bytes": list(sending) if sending is not None else None,
    }


def _member_version(versions: Mapping[str, NodeVersion | None], node_id: str) -> dict[str, Any]:
    """A member's release and state machine as its latest message said; None when this
    node has not heard from it."""
    if node_id not in versions:
        return {"version": None, "state_machine_version": None}
    version = version_of(versions[node_id])
    return {"version": version.package, "state_machine_version": version.state_machine}
