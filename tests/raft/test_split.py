"""The node loop's rule for what may leave before a Ready is on disk
(`dex_ha.raft.node.split_early_messages`), and that these tests notice when it breaks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dex_ha.raft.node import split_early_messages
from dex_ha.raft.types import ConfState, HardState, Message, MessageType, Ready, Role, SnapshotMeta

from .split_mutations import break_early_append_acks, break_early_refusal_check, break_follower_hard_state_check

MT = MessageType
DURABLE = HardState(term=3, vote="n1", commit=10, vote_refusal_ms=1000)


def _ready(*kinds: MessageType, hard_state: HardState | None = None, snapshot: bool = False) -> Ready:
    rd = Ready()
    rd.messages = [Message(type=k, frm="n2", to="n1", term=3) for k in kinds]
    rd.hard_state = hard_state
    if snapshot:
        rd.snapshot = SnapshotMeta(9, 3, ConfState(("n1", "n2", "n3")))
    return rd


def _early_kinds(rd: Ready, role: Role) -> list[MessageType]:
    early, rest = split_early_messages(rd, role, DURABLE)
    assert sorted(early + rest, key=id) == sorted(rd.messages, key=id), "the split must keep every message once"
    return [m.type for m in early]


def split_rule_violations() -> list[str]:
    """Each rule of the split that does not hold, in words (empty: all hold)."""
    follower_msgs = (MT.HEARTBEAT_RESP, MT.APP_RESP, MT.VOTE_RESP, MT.PRE_VOTE_RESP)
    leader_msgs = (MT.APP, MT.HEARTBEAT, MT.TIMEOUT_NOW)
    commit_only = HardState(term=3, vote="n1", commit=12, vote_refusal_ms=1000)
    checks = {
        "a follower sends its heartbeat acks early, nothing else": (
            _early_kinds(_ready(*follower_msgs), Role.FOLLOWER) == [MT.HEARTBEAT_RESP]
        ),
        "a commit-only hard state change does not hold the acks back": (
            _early_kinds(_ready(*follower_msgs, hard_state=commit_only), Role.FOLLOWER) == [MT.HEARTBEAT_RESP]
        ),
        "a leader sends its appends and heartbeats early, nothing else": (
            _early_kinds(_ready(*leader_msgs), Role.LEADER) == [MT.APP, MT.HEARTBEAT]
        ),
        "a follower waits for a new term to be durable": not _early_kinds(
            _ready(MT.HEARTBEAT_RESP, hard_state=HardState(4, "", 10, 1000)), Role.FOLLOWER
        ),
        "a follower waits for a new vote-refusal window to be durable": not _early_kinds(
            _ready(MT.HEARTBEAT_RESP, hard_state=HardState(3, "n1", 10, 2000)), Role.FOLLOWER
        ),
        "a leader waits for a new term to be durable": not _early_kinds(
            _ready(MT.HEARTBEAT, hard_state=HardState(4, "n2", 10, 1000)), Role.LEADER
        ),
        "nothing goes early with a snapshot": not _early_kinds(
            _ready(MT.HEARTBEAT_RESP, MT.APP_RESP, snapshot=True), Role.FOLLOWER
        ),
    }
    return [rule for rule, holds in checks.items() if not holds]


def test_split_rules_hold() -> None:
    assert split_rule_violations() == []


@pytest.mark.parametrize(
    "mutation",
    [break_early_append_acks, break_early_refusal_check, break_follower_hard_state_check],
    ids=lambda f: f.__name__,
)
def test_split_tests_catch_mutation(mutation: Callable[[pytest.MonkeyPatch], None]) -> None:
    """Each broken rule makes test_split_rules_hold fail."""
    with pytest.MonkeyPatch.context() as mp:
        mutation(mp)
        assert split_rule_violations() != []
