"""The errors the Raft core raises to its local callers (proposals, conf changes, transfers).

They are separate from core.py because every layer above Raft (the node loop, the server,
the harness) catches them, and an importer that only needs to know what went wrong should
not have to import the consensus state machine to name it.
"""

from __future__ import annotations

__all__ = ["ConfChangeRefused", "EntryTooLarge", "NotLeader", "ProposalDropped"]


class NotLeader(Exception):
    """The request needs the leader; `leader_id` is the leader we know of ("" if none)."""

    def __init__(self, leader_id: str) -> None:
        super().__init__(f"not the leader (leader: {leader_id or 'unknown'})")
        self.leader_id = leader_id


class ProposalDropped(Exception):
    """The leader cannot take this proposal now (not leader yet in lease, transfer, being removed)."""


class EntryTooLarge(ValueError):
    """A proposal above `max_entry_bytes`. Nothing was appended; the same data will never
    fit (a server answers 413). The cap keeps every entry small enough to travel in one
    AppendEntries frame: a larger one would stall replication for good."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"entry of {size} bytes is above the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class ConfChangeRefused(ValueError):
    """The configuration change cannot be made now: another one is pending, or it does
    not fit the current configuration (adding a member twice, promoting a voter, removing
    the last voter, ...). Nothing was appended; unlike ProposalDropped, retrying the same
    change will not help until the configuration changes."""
