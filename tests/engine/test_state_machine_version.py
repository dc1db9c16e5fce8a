"""The state-machine version in the engine: an entry of a newer state machine stops the
engine (NeedsUpgrade) and changes nothing, instead of being applied as invalid (which
would part this node's state from its peers'); SetClusterVersion moves the cluster's
version up, never down; a state or snapshot of a newer cluster is refused."""

from __future__ import annotations

import msgpack
import pytest

from dex_ha.engine import (
    STATE_MACHINE_VERSION,
    CreateSession,
    Engine,
    NeedsUpgrade,
    ReportResults,
    SetClusterVersion,
    command_since,
    encode_command,
)
from dex_ha.engine.results import ClusterVersionSet

AT = 1_000


def create(n: int) -> bytes:
    return encode_command(CreateSession(at=AT, agent="a", session_id=f"s{n}"))


def test_an_unknown_command_stops_the_engine_and_changes_nothing(tmp_path):
    engine = Engine(str(tmp_path / "state.db"), durable=False)
    engine.apply(1, create(1))
    before = engine.logical_dump()
    future = msgpack.packb([1, "ForgetEverything", {"at": AT, "_sm": STATE_MACHINE_VERSION + 1}], use_bin_type=True)
    with pytest.raises(NeedsUpgrade) as stopped:
        engine.apply_batch([(2, create(2)), (3, future)])
    assert str(stopped.value) == (
        f"upgrade this node: entry 3 carries ForgetEverything of state machine v{STATE_MACHINE_VERSION + 1}; "
        f"this node runs v{STATE_MACHINE_VERSION}"
    )
    # The whole batch is rolled back: the entry before it applies again after a restart.
    assert engine.logical_dump() == before
    assert engine.applied_index() == 1


def test_an_unknown_command_that_names_no_version_says_so():
    engine = Engine(":memory:")
    with pytest.raises(NeedsUpgrade, match="entry 1 carries Later of a newer state machine; this node runs v"):
        engine.apply(1, msgpack.packb([1, "Later", {"at": AT}], use_bin_type=True))
    with pytest.raises(NeedsUpgrade, match="command format 2"):
        engine.apply(1, msgpack.packb([2, "CreateSession", {"at": AT}], use_bin_type=True))
    assert engine.applied_index() == 0


def test_a_node_of_an_older_state_machine_stops_on_a_newer_command(tmp_path):
    """A node of state machine 1 (0.1.0's) meets ReportResults, which its code decodes
    but which came with version 2: it stops, unapplied."""
    old = Engine(str(tmp_path / "old.db"), durable=False, state_machine_version=1)
    report = encode_command(ReportResults(at=AT, reports=[]))
    assert command_since(ReportResults) == 2
    with pytest.raises(NeedsUpgrade, match="entry 1 carries ReportResults of state machine v2; this node runs v1"):
        old.apply(1, report)
    assert old.applied_index() == 0
    old.close()
    # The same state, opened by the new code, applies it.
    new = Engine(str(tmp_path / "old.db"), durable=False)
    assert new.apply(1, report).code == "invalid"  # an empty report: refused as such, but applied
    assert new.applied_index() == 1


def test_set_cluster_version_goes_up_only():
    engine = Engine(":memory:")
    assert engine.cluster_version() == 1
    assert engine.apply(1, encode_command(SetClusterVersion(at=AT, version=2))).value == ClusterVersionSet(2)
    assert engine.cluster_version() == 2
    again = engine.apply(2, encode_command(SetClusterVersion(at=AT, version=1)))
    assert again.ok and again.noop and engine.cluster_version() == 2


def test_a_cluster_version_above_this_engine_stops_it(tmp_path):
    """SetClusterVersion to a version this node does not run, a state (at start) and a
    snapshot of such a cluster: each stops the engine before it changes anything."""
    path = str(tmp_path / "state.db")
    old = Engine(path, durable=False, state_machine_version=1)
    with pytest.raises(NeedsUpgrade, match="carries SetClusterVersion of state machine v2; this node runs v1"):
        old.apply(1, encode_command(SetClusterVersion(at=AT, version=2)))
    old.close()
    new = Engine(path, durable=False)
    new.apply(1, encode_command(SetClusterVersion(at=AT, version=2)))
    snapshot = new.snapshot()
    new.close()
    with pytest.raises(NeedsUpgrade, match="this node runs v1"):
        Engine(path, durable=False, state_machine_version=1)
    other = Engine(str(tmp_path / "other.db"), durable=False, state_machine_version=1)
    other.apply(1, create(1))
    before = other.logical_dump()
    with pytest.raises(NeedsUpgrade, match="carries a snapshot of state machine v2"):
        other.restore(snapshot, 1)
    assert other.logical_dump() == before
