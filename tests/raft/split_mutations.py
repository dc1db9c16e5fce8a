"""Mutations of the node loop's early sends (`dex_ha.raft.node.split_early_messages`):
each lets a message out before what it vouches for is durable. The simulation (which
calls the node's split) and the split's unit tests must both catch each of them."""

from __future__ import annotations

import pytest

from dex_ha.raft import node as raft_node
from dex_ha.raft.types import HardState, MessageType, Ready


def break_early_append_acks(mp: pytest.MonkeyPatch) -> None:
    """A follower's append acks leave before its fsync: a commit may rest on one copy."""
    mp.setattr(raft_node, "_EARLY_FROM_FOLLOWER", (MessageType.HEARTBEAT_RESP, MessageType.APP_RESP))


def break_early_refusal_check(mp: pytest.MonkeyPatch) -> None:
    """The early-send check compares term and vote only, not the vote-refusal window: a
    heartbeat ack may leave before the window it promises is on disk."""
    mp.setattr(raft_node, "_promises", lambda hs: (hs.term, hs.vote, 0))


def break_follower_hard_state_check(mp: pytest.MonkeyPatch) -> None:
    """Followers send their heartbeat acks early even when the Ready changes the hard
    state (a new term, a new window). (A Ready with heartbeat acks is a follower's.)"""
    original = raft_node._may_send_early

    def may_send_early(rd: Ready, durable: HardState) -> bool:
        if any(m.type == MessageType.HEARTBEAT_RESP for m in rd.messages):
            return rd.snapshot is None
        return original(rd, durable)

    mp.setattr(raft_node, "_may_send_early", may_send_early)
