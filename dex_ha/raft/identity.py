"""Cluster and member identity: which cluster a data directory belongs to, and which
incarnation of a member it is (docs/architecture.md, "Cluster identity").

Every data directory holds ``identity.json``:

- ``incarnation``: random, made when the directory is first used. A node whose data
  directory was deleted comes back with a new one, so its peers can tell it from the same
  node with its data.
- ``cluster_id``: the cluster the data belongs to ("" until known). Peers with different
  ids refuse each other (handshake.py carries it; a snapshot carries it too).
- ``founders``: the incarnations of the voters that founded the cluster together, as this
  node saw them (None: it did not found it; it joined, was restored, or predates ids).

The rule that keeps a member that lost its data from voting (see `decide`): a voter whose
directory is fresh (no cluster id, no founders, an empty log) grants no vote and does not
campaign until it has heard from its peers. If a peer holds data, the cluster exists
and this member is not one of its founders: it lost its data (or is new), and must be
added by the replace procedure instead. If every configured voter answers fresh, they
found a new cluster together; its id is a hash of their incarnations, so every founder
computes the same id, and two new clusters get different ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IDENTITY_FILE = "identity.json"
ID_HEX_CHARS = 16
# A replicated entry that gives a cluster without an id (data directories from before ids)
# its id. 0xC1 is never the first byte of msgpack, which every engine command is.
CLUSTER_ID_ENTRY_PREFIX = b"\xc1dex-ha cluster id\x00"


class IdentityRefused(Exception):
    """This node must not run as configured (another cluster, or it lost its data); the
    message is one line saying why and what to do. The process exits non-zero."""


def new_id() -> str:
    return secrets.token_hex(ID_HEX_CHARS // 2)


def founders_cluster_id(founders: tuple[str, ...]) -> str:
    """The id of a cluster founded by these incarnations (the same on every founder)."""
    digest = hashlib.sha256(b"dex-ha cluster\0" + "\0".join(sorted(founders)).encode())
    return digest.hexdigest()[:ID_HEX_CHARS]


def derived_cluster_id(*parts: str) -> str:
    """An id that every node computes alike from the same parts (restore: the backup's
    checksum and the member list), and that differs when any part differs."""
    return hashlib.sha256("\0".join(("dex-ha restored cluster", *parts)).encode()).hexdigest()[:ID_HEX_CHARS]


@dataclass(frozen=True)
class Identity:
    """What this node says about itself in the handshake (see the module docstring)."""

    incarnation: str
    cluster_id: str = ""
    founders: tuple[str, ...] | None = None
    has_log: bool = False  # not stored: whether the Raft log holds anything (it is the log's)

    @property
    def fresh(self) -> bool:
        """Nothing here yet: no cluster, no founding, an empty log."""
        return not self.cluster_id and self.founders is None and not self.has_log

    def to_wire(self) -> list[Any]:
        return [self.incarnation, self.cluster_id, self.has_log, list(self.founders or []), self.founders is not None]

    @classmethod
    def from_wire(cls, raw: object) -> Identity:
        """ValueError when `raw` is not an identity (a bad or hostile peer)."""
        if not isinstance(raw, list) or len(raw) != 5:
            raise ValueError("identity has the wrong shape")
        incarnation, cluster_id, has_log, founders, founded = raw
        if not (isinstance(incarnation, str) and isinstance(cluster_id, str) and isinstance(founders, list)):
            raise ValueError("identity fields have the wrong types")
        if len(incarnation) > 64 or len(cluster_id) > 64 or len(founders) > 64:
            raise ValueError("identity fields too long")
        if not all(isinstance(f, str) and len(f) <= 64 for f in founders):
            raise ValueError("identity founders have the wrong types")
        return cls(incarnation, cluster_id, tuple(founders) if founded else None, bool(has_log))


@dataclass
class IdentityFile:
    """identity.json of one data directory."""

    path: Path
    incarnation: str
    cluster_id: str = ""
    founders: tuple[str, ...] | None = None

    @classmethod
    def load_or_create(cls, data_dir: Path, durable: bool = True) -> tuple[IdentityFile, bool]:
        """(the file, whether it was created now)."""
        path = data_dir / IDENTITY_FILE
        if path.exists():
            try:
                raw = json.loads(path.read_text())
                founders = raw.get("founders")
                incarnation, cluster_id = raw["incarnation"], raw.get("cluster_id", "")
                return cls(path, incarnation, cluster_id, None if founders is None else tuple(founders)), False
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise IdentityRefused(
                    f"{path} is damaged ({type(exc).__name__}: {exc}): this data directory cannot say which "
                    f"cluster it belongs to. Replace the node (docs/operations.md, 'Replacing a node')"
                ) from None
        created = cls(path, new_id())
        created.save(durable)
        return created, True

    def save(self, durable: bool = True) -> None:
        raw = {
            "incarnation": self.incarnation,
            "cluster_id": self.cluster_id,
            "founders": None if self.founders is None else list(self.founders),
        }
        write_file(self.path, (json.dumps(raw, indent=1) + "\n").encode(), durable)

    def identity(self, has_log: bool) -> Identity:
        return Identity(self.incarnation, self.cluster_id, self.founders, has_log)


def write_file(path: Path, data: bytes, durable: bool) -> None:
    """Whole or not at all: a temp file, fsynced (when durable), renamed, the dir fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- the fresh voter's decision


@dataclass(frozen=True)
class Wait:
    """Not enough known yet: keep not voting, keep listening."""

    waiting_for: tuple[str, ...] = ()


@dataclass(frozen=True)
class Found:
    """Every configured voter is fresh: found the cluster with them (or, `adopted`, a peer
    already did and names this incarnation among the founders)."""

    cluster_id: str
    founders: tuple[str, ...]
    adopted_from: str = ""


@dataclass(frozen=True)
class LostData:
    """A peer holds data and this incarnation did not found it: refuse to run as a voter."""

    peer: str
    peer_cluster_id: str


Decision = Wait | Found | LostData


@dataclass
class FreshVoter:
    """What a fresh voter knows of its configured peers (from their handshakes), and
    what it may do with it. Pure: no clock, no I/O."""

    node_id: str
    own: Identity
    voters: tuple[str, ...]  # the configured voters, this node included
    peers: dict[str, Identity] = field(default_factory=dict)

    def heard(self, peer: str, identity: Identity) -> Decision:
        if peer in self.voters:
            self.peers[peer] = identity
        return self.decide()

    def decide(self) -> Decision:
        for peer, theirs in sorted(self.peers.items()):
            if theirs.fresh:
                continue
            if theirs.founders is not None and self.own.incarnation in theirs.founders and theirs.cluster_id:
                return Found(theirs.cluster_id, theirs.founders, adopted_from=peer)
            return LostData(peer, theirs.cluster_id)
        missing = tuple(v for v in self.voters if v != self.node_id and v not in self.peers)
        if missing:
            return Wait(missing)
        founders = tuple(
            sorted([self.own.incarnation, *(self.peers[v].incarnation for v in self.voters if v != self.node_id)])
        )
        return Found(founders_cluster_id(founders), founders)


def lost_data_line(node_id: str, decision: LostData) -> str:
    """The one line a fresh voter exits with when its peers hold data."""
    cluster = f"cluster {decision.peer_cluster_id}" if decision.peer_cluster_id else "a cluster with data"
    return (
        f"node {node_id} has an empty data directory, but its peer {decision.peer} belongs to {cluster}: "
        f"this node lost its data (or is new) and must not vote. Replace it instead: run "
        f"`dex-ha members replace {node_id} --url <active node>` and follow the steps it prints "
        f"(the node then starts with --join)"
    )


def mismatch_line(node_id: str, own_cluster: str, peer: str, peer_cluster: str) -> str:
    return (
        f"node {node_id} (cluster {own_cluster}) refuses peer {peer} of cluster {peer_cluster}: they are "
        f"different clusters. Check the peers in the config of both nodes; a node restored from another "
        f"cluster's backup or given another cluster's data directory cannot join this one"
    )
