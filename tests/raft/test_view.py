"""RaftView: what the Raft thread publishes for the HTTP side, and its lease rule."""

from __future__ import annotations

from dataclasses import replace

from dex_ha.raft.clock import now_ms
from dex_ha.raft.status import RaftView
from dex_ha.raft.types import Role

LEADER = RaftView(term=3, role=Role.LEADER, leader_id="n1", lease_end_ms=1_000, commit=7, voter=True)


def test_a_lease_is_valid_until_its_end():
    assert LEADER.lease_valid(at_ms=999)
    assert not LEADER.lease_valid(at_ms=1_000)


def test_no_lease_without_an_end_or_off_the_leader():
    assert not replace(LEADER, lease_end_ms=None).lease_valid(at_ms=0)
    assert not replace(LEADER, role=Role.FOLLOWER).lease_valid(at_ms=0)


def test_the_sole_voters_lease_does_not_run_out_once_established():
    sole = replace(LEADER, sole_voter=True)
    assert sole.lease_valid(at_ms=10**12)
    # ...but it must have been established in this term first (own-term entry applied).
    assert not replace(sole, lease_end_ms=None).lease_valid(at_ms=0)
    assert not replace(sole, role=Role.FOLLOWER).lease_valid(at_ms=0)


def test_remaining_counts_down_on_the_lease_clock():
    view = replace(LEADER, lease_end_ms=now_ms() + 10_000)
    assert 9_000 < view.lease_remaining_ms() <= 10_000
    assert replace(LEADER, lease_end_ms=None).lease_remaining_ms() == 0
