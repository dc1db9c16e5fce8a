"""The role a node reports (`/v1/cluster`, `/readyz`, `dex-ha status`): a leaf module, so
both the node and the HTTP app can name the roles without importing each other."""

from __future__ import annotations

from enum import StrEnum


class NodeRole(StrEnum):
    """What a node does for the cluster now.

    - `active`: the leader, its lease valid and its takeover done; it serves the API.
    - `draining`: the active node during a planned step down; it hands out no new work.
    - `candidate`: an election is running, or a leader whose takeover or lease is not there yet.
    - `standby`: a voting follower.
    - `learner`: a non-voting member catching up.
    """

    ACTIVE = "active"
    DRAINING = "draining"
    CANDIDATE = "candidate"
    STANDBY = "standby"
    LEARNER = "learner"
