"""RaftCore.status() and RaftNode.status() return frozen, typed values (dex_ha/raft/status.py);
`to_json()` gives the plain dict they used to return, key for key."""

from __future__ import annotations

import dataclasses

import pytest

from tests.raft.test_core import Cluster

STATUS_KEYS = {
    "id",
    "role",
    "term",
    "vote",
    "leader",
    "commit",
    "applied",
    "first_index",
    "last_index",
    "lease_remaining_ms",
    "transferring_to",
    "members",
}
MEMBER_KEYS = {
    "voter",
    "match",
    "next",
    "state",
    "last_contact_ms_ago",
    "contacted",
    "applied",
    "lost_entries",
    "lost_acknowledged",
}


def test_the_status_is_frozen() -> None:
    c = Cluster(["n1", "n2", "n3"])
    st = c.elect("n1").status()
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.term = 99  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.members["n2"].match = 0  # type: ignore[misc]
    with pytest.raises(TypeError):  # the member map is read-only too
        st.members["n9"] = st.members["n2"]  # type: ignore[index]


def test_to_json_has_the_keys_and_values_of_the_status() -> None:
    c = Cluster(["n1", "n2", "n3"], learners=["n4"])
    n1 = c.elect("n1")
    c.run(200)
    st = n1.status()
    plain = st.to_json()
    assert set(plain) == STATUS_KEYS  # the node loop's fields only when the node loop set them
    assert (plain["id"], plain["role"], plain["term"], plain["commit"]) == (st.id, "leader", st.term, st.commit)
    assert set(plain["members"]) == {"n1", "n2", "n3", "n4"}
    for member_id, member in plain["members"].items():
        assert set(member) == MEMBER_KEYS
        assert member == dataclasses.asdict(st.members[member_id])
    assert plain["members"]["n4"]["voter"] is False and plain["members"]["n1"]["state"] == "self"


def test_the_node_loop_fields_appear_in_the_plain_form_once_set() -> None:
    c = Cluster(["n1", "n2", "n3"])
    st = dataclasses.replace(c.elect("n1").status(), snapshot_index=7, snapshots_sending={"n2": (10, 40)})
    plain = st.to_json()
    assert plain["snapshot_index"] == 7 and plain["snapshots_sending"] == {"n2": [10, 40]}
