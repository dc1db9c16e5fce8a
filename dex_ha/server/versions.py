"""Versions: what each node runs, and the cluster's state-machine version (the rolling
upgrade's gate, after etcd's cluster version).

A node runs a release (the package version) and a state machine (engine
STATE_MACHINE_VERSION: which commands it can apply). Every Raft message carries both
(raft.types.NodeVersion), so each node knows what its peers run; a peer of 0.1.0 sends
none and counts as 0.1.0 with state machine 1.

The cluster's state-machine version is in the replicated state (SetClusterVersion). The
active node proposes no command newer than it (`check_command`), so a member that is not
upgraded yet never meets one. Once every member of the configuration, voters and
learners, has said it runs a newer state machine, the active node commits
SetClusterVersion to the lowest of them (`ClusterVersionUpgrade`): from then on the newer
commands are allowed. The version never goes down: a node of an older state machine that
meets the entry, or a snapshot after it, stops (engine NeedsUpgrade, exit 70).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

import dex_ha
from dex_ha.background import ActiveNodeTimer
from dex_ha.engine import (
    FIRST_STATE_MACHINE_VERSION,
    STATE_MACHINE_VERSION,
    Command,
    Propose,
    SetClusterVersion,
    command_since,
)
from dex_ha.raft.errors import NotLeader, ProposalDropped
from dex_ha.raft.types import NodeVersion
from dex_ha.server.errors import ApiError

log = logging.getLogger("dex_ha.server.versions")

# For tests only: run this node as if its code had this older state machine (as a node of
# an older release would), e.g. to see it stop on a newer entry. Never set it in production.
TEST_STATE_MACHINE_VERSION_ENV = "DEX_HA_TEST_STATE_MACHINE_VERSION"
# A failpoint used as a switch (armed, never hit): the active node ignores the gate, proposes
# newer commands anyway and moves the cluster to its own state machine without waiting for
# the members, so that a test can feed a node an entry it must stop on.
GATE_OFF_FAILPOINT = "server.version-gate.off"
# What a peer that sends no version runs: 0.1.0, the release before versions travelled.
UNVERSIONED_PEER = NodeVersion("0.1.0", FIRST_STATE_MACHINE_VERSION)
# How often the active node looks whether every member runs a newer state machine.
UPGRADE_CHECK_INTERVAL_S = 1.0


def own_version() -> NodeVersion:
    """What this node runs (its state machine lowered by TEST_STATE_MACHINE_VERSION_ENV)."""
    raw = os.environ.get(TEST_STATE_MACHINE_VERSION_ENV, "")
    state_machine = int(raw) if raw else STATE_MACHINE_VERSION
    if not FIRST_STATE_MACHINE_VERSION <= state_machine <= STATE_MACHINE_VERSION:
        raise ValueError(f"{TEST_STATE_MACHINE_VERSION_ENV} must be 1..{STATE_MACHINE_VERSION}, not {raw}")
    return NodeVersion(dex_ha.__version__, state_machine)


def version_of(reported: NodeVersion | None) -> NodeVersion:
    """A peer's version as its messages said (None: it sends none, so it runs 0.1.0)."""
    return UNVERSIONED_PEER if reported is None else reported


def lowest_state_machine(members: Iterable[str], versions: Mapping[str, NodeVersion | None]) -> int | None:
    """The lowest state machine among `members`; None while one of them has not been
    heard from (it might run anything)."""
    lowest = None
    for member in members:
        if member not in versions:
            return None
        runs = version_of(versions[member]).state_machine
        lowest = runs if lowest is None else min(lowest, runs)
    return lowest


def check_command(cmd: Command, cluster_version: int, gate_off: bool = False) -> None:
    """Refuse (503) a command newer than the cluster's state-machine version: a member
    that is not upgraded yet could not apply it. SetClusterVersion is the exception: it is
    what moves the version, proposed only once every member runs the new one."""
    needs = command_since(type(cmd))
    if needs > cluster_version and not gate_off and not isinstance(cmd, SetClusterVersion):
        raise ApiError(
            503,
            "unavailable",
            f"{type(cmd).__name__} needs state machine v{needs} and the cluster runs v{cluster_version}: "
            "a member is not upgraded yet (finish the rolling upgrade; `dex-ha status` shows each node's version)",
        )


class ClusterVersionUpgrade:
    """On the active node: commit SetClusterVersion once every member runs a newer state
    machine than the cluster's (see the module docstring). A timer, not a wait."""

    def __init__(
        self,
        node_id: str,
        state: Callable[[], Awaitable[tuple[list[str], Mapping[str, NodeVersion | None], int]]],
        propose: Propose,
        gate_off: bool = False,
    ) -> None:
        """`state()` gives (the members, what each runs, the cluster's version);
        `gate_off` (tests only, GATE_OFF_FAILPOINT): this node's own version is the target."""
        self.node_id = node_id
        self._state = state
        self._propose = propose
        self._gate_off = gate_off
        self._checking = asyncio.Lock()  # one check at a time: never two SetClusterVersion in flight
        self._timer = ActiveNodeTimer("cluster-version", UPGRADE_CHECK_INTERVAL_S, self._check_round)
        self._waiting_on: tuple[str, ...] = ()  # the members last logged as holding the version back

    def start(self, is_serving: Callable[[], bool]) -> None:
        self._timer.start(is_serving)

    async def stop(self) -> None:
        await self._timer.stop()

    async def _check_round(self) -> None:
        try:
            await self.check_once()
        except Exception:  # a bug: say it, and look again at the next interval
            log.exception("checking whether the cluster can move to a newer state machine failed")

    async def check_once(self) -> None:
        """Move the cluster now if every member runs a newer state machine (the loop calls
        it every interval; a route that needs the newer version calls it at once, so that
        a cluster whose members all run this release never makes a client wait for it)."""
        async with self._checking:
            await self._check()

    async def _check(self) -> None:
        members, versions, cluster = await self._state()
        target = lowest_state_machine([self.node_id] if self._gate_off else members, versions)
        if target is None or target <= cluster:
            self._note_waiting(members, versions, cluster)
            return
        log.info(
            "every member runs state machine v%d or newer: the cluster moves from v%d to v%d", target, cluster, target
        )
        try:
            await self._propose(SetClusterVersion(at=int(time.time() * 1000), version=target))
        except (NotLeader, ProposalDropped) as exc:
            log.info("the cluster version was not recorded (%s); the next active node does it", exc)

    def _note_waiting(self, members: list[str], versions: Mapping[str, NodeVersion | None], cluster: int) -> None:
        """Say once which members hold the cluster at its version while others run newer."""
        if not any(version_of(versions.get(m)).state_machine > cluster for m in members if m in versions):
            return
        behind = tuple(m for m in members if m not in versions or version_of(versions[m]).state_machine <= cluster)
        if behind != self._waiting_on:
            self._waiting_on = behind
            log.info(
                "the cluster stays at state machine v%d until these members run a newer one: %s (rolling upgrade)",
                cluster,
                ", ".join(behind),
            )
