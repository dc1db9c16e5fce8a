"""The rolling upgrade's gate (server/versions.py), without processes: which state machine
the cluster may move to, which commands the active node refuses meanwhile, and when the
upgrade proposes SetClusterVersion."""

from __future__ import annotations

import pytest

from dex_ha.engine import CreateSession, ReportResults, SetClusterVersion
from dex_ha.raft.types import NodeVersion
from dex_ha.server.errors import ApiError
from dex_ha.server.versions import ClusterVersionUpgrade, check_command, lowest_state_machine

NEW = NodeVersion("0.2.0", 2)


def test_the_lowest_state_machine_counts_a_peer_without_a_version_as_0_1_0_and_waits_for_the_silent() -> None:
    members = ["n1", "n2", "n3"]
    assert lowest_state_machine(members, {"n1": NEW, "n2": NEW, "n3": NEW}) == 2
    assert lowest_state_machine(members, {"n1": NEW, "n2": None, "n3": NEW}) == 1  # a 0.1.0 peer
    assert lowest_state_machine(members, {"n1": NEW, "n2": NEW}) is None  # n3 not heard from


def test_a_command_newer_than_the_cluster_is_refused_with_what_to_do() -> None:
    check_command(CreateSession(at=1, agent="a"), cluster_version=1)
    check_command(ReportResults(at=1, reports=[]), cluster_version=2)
    with pytest.raises(ApiError) as refused:
        check_command(ReportResults(at=1, reports=[]), cluster_version=1)
    assert refused.value.status == 503
    assert "ReportResults needs state machine v2 and the cluster runs v1" in str(refused.value)
    check_command(ReportResults(at=1, reports=[]), cluster_version=1, gate_off=True)
    check_command(SetClusterVersion(at=1, version=2), cluster_version=1)  # what moves the version


@pytest.mark.parametrize(
    "versions,cluster,proposed",
    [
        ({"n1": NEW, "n2": NEW, "n3": NEW}, 1, [2]),
        ({"n1": NEW, "n2": None, "n3": NEW}, 1, []),  # n2 runs 0.1.0
        ({"n1": NEW, "n3": NEW}, 1, []),  # n2 silent
        ({"n1": NEW, "n2": NEW, "n3": NEW}, 2, []),  # already there
    ],
)
async def test_the_upgrade_proposes_the_new_version_only_once_every_member_runs_it(versions, cluster, proposed) -> None:
    seen: list[int] = []

    async def state():
        return ["n1", "n2", "n3"], versions, cluster

    async def propose(cmd):
        seen.append(cmd.version)

    await ClusterVersionUpgrade("n1", state, propose).check_once()
    assert seen == proposed
