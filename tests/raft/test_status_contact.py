"""The leader's status says when it never heard from a member ("never" in `dex-ha members`),
instead of a last contact made up from the moment it started tracking the member."""

from __future__ import annotations

from tests.raft.test_core import ETMIN, Cluster


def test_a_member_that_never_answered_has_no_last_contact_until_it_does() -> None:
    c = Cluster(["n1", "n2", "n3"], learners=["n4"])
    c.crash("n4")  # added to the configuration, never started
    n1 = c.elect("n1")
    for _ in range(2):  # time passes: a made-up contact age would grow; "never" stays
        c.run(ETMIN)
        members = n1.status().members
        assert members["n4"].contacted is False and members["n4"].last_contact_ms_ago is None
        n2_contact = members["n2"].last_contact_ms_ago
        assert members["n2"].contacted is True and n2_contact is not None and 0 <= n2_contact < ETMIN
        assert members["n1"].contacted is True and members["n1"].last_contact_ms_ago == 0
    c.start("n4")  # it starts at last and answers the leader
    c.run(200)
    n4 = n1.status().members["n4"]
    assert n4.contacted is True and n4.last_contact_ms_ago is not None and 0 <= n4.last_contact_ms_ago < 200
    assert n4.match == n1.status().commit


def test_a_follower_does_not_claim_to_know_the_contacts() -> None:
    c = Cluster(["n1", "n2", "n3"])
    c.elect("n1")
    c.run(200)
    n3 = c.cores["n2"].status().members["n3"]
    assert n3.contacted is None and n3.last_contact_ms_ago is None  # unknown, not "never"
