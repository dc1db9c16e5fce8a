"""What `/readyz` answers (server/readiness.py), byte for byte: the JSON of a ready and of a
not-ready node, and the role a node reports in each of its states."""

from __future__ import annotations

import json

import pytest

from dex_ha.raft.types import Role
from dex_ha.server.readiness import Readiness, liveness, node_role
from dex_ha.server.roles import NodeRole


def test_the_active_node_answers_200_ready() -> None:
    ready = Readiness("n1", NodeRole.ACTIVE, None)
    assert ready.ready and ready.http_status == 200
    assert json.dumps(ready.body()) == '{"status": "ready", "node_id": "n1", "role": "active"}'


def test_another_node_answers_503_with_its_role_and_the_leader_url() -> None:
    standby = Readiness("n2", NodeRole.STANDBY, "http://127.0.0.1:8801")
    assert not standby.ready and standby.http_status == 503
    assert json.dumps(standby.body()) == (
        '{"error": "not_ready", "message": "node n2 is standby, not the active node", '
        '"leader_url": "http://127.0.0.1:8801", "role": "standby"}'
    )


def test_livez_says_alive() -> None:
    assert liveness("n3") == {"status": "alive", "node_id": "n3"}


@pytest.mark.parametrize(
    ("ready", "draining", "raft_role", "voter", "expected"),
    [
        (True, False, Role.LEADER, True, NodeRole.ACTIVE),
        (False, True, Role.LEADER, True, NodeRole.DRAINING),
        (False, False, Role.LEADER, True, NodeRole.CANDIDATE),  # leader, takeover or lease not there yet
        (False, False, Role.CANDIDATE, True, NodeRole.CANDIDATE),
        (False, False, Role.PRE_CANDIDATE, True, NodeRole.CANDIDATE),
        (False, False, Role.FOLLOWER, True, NodeRole.STANDBY),
        (False, False, Role.FOLLOWER, False, NodeRole.LEARNER),
    ],
)
def test_the_role_a_node_reports(ready: bool, draining: bool, raft_role: Role, voter: bool, expected: NodeRole) -> None:
    assert node_role(ready=ready, draining=draining, raft_role=raft_role, voter=voter) is expected
