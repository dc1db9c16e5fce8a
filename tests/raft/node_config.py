"""The NodeConfig of the in-process Raft node tests: relaxed durability, each node's data
under one root, and elections ten times faster than the product's default, so that a
leader is elected (and lost) within a test's deadlines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dex_ha.raft.node import Address, Member, NodeConfig

FAST_TIMING: dict[str, Any] = {
    "election_timeout_min_ms": 300,
    "election_timeout_max_ms": 600,
    "heartbeat_interval_ms": 50,
    "lease_drift_margin_ms": 30,
}


def node_config(
    nid: str,
    root: Path,
    members: dict[str, Member],
    *,
    raft_listen: Address | None,
    secret: bytes,
    **settings: Any,
) -> NodeConfig:
    """`nid`'s config, its data in `root / nid`; `settings` are further NodeConfig fields
    (they may override the timing)."""
    return NodeConfig(
        id=nid,
        data_dir=root / nid,
        raft_listen=raft_listen,
        members=members,
        durability="relaxed",
        secret=secret,
        **{**FAST_TIMING, **settings},
    )
