"""What a node answers on `/readyz` and `/livez`, and the role it reports.

`Readiness` is read on the probe listener's own thread (probes.py) as well as on the API
port, so it is built from what other threads may read: the Raft view and plain attributes
(see `NodeServer.readiness`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dex_ha.raft.types import Role
from dex_ha.server.roles import NodeRole


@dataclass(frozen=True)
class Readiness:
    """One answer of `/readyz`: ready (200) on the active node only; elsewhere 503 with
    the node's role and where the active node is."""

    node_id: str
    role: NodeRole
    leader_url: str | None  # the active node's URL as this node knows it; None when unknown or ready

    @property
    def ready(self) -> bool:
        return self.role is NodeRole.ACTIVE

    @property
    def http_status(self) -> int:
        return 200 if self.ready else 503

    def body(self) -> dict[str, Any]:
        """The JSON of the answer: `{"status": "ready", …}`, or a `not_ready` error."""
        if self.ready:
            return {"status": "ready", "node_id": self.node_id, "role": self.role}
        return {
            "error": "not_ready",
            "message": f"node {self.node_id} is {self.role}, not the active node",
            "leader_url": self.leader_url,
            "role": self.role,
        }


def node_role(*, ready: bool, draining: bool, raft_role: Role, voter: bool) -> NodeRole:
    """The role a node reports (roles.py): active when ready, draining during a step down,
    candidate while an election runs or a new leader is not serving yet, else standby or learner."""
    if ready:
        return NodeRole.ACTIVE
    if draining:
        return NodeRole.DRAINING
    if raft_role in (Role.PRE_CANDIDATE, Role.CANDIDATE, Role.LEADER):
        return NodeRole.CANDIDATE
    return NodeRole.STANDBY if voter else NodeRole.LEARNER


def liveness(node_id: str) -> dict[str, Any]:
    """`/livez`: the process serves."""
    return {"status": "alive", "node_id": node_id}
