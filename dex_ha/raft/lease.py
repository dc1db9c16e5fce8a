"""The one rule for whether a leader may act as the active node: the core's own check
(`RaftCore.lease_valid`) and the view the node publishes to the HTTP side (`RaftView`) both
ask it, so a lone node and a cluster are judged alike by everyone who asks.
"""

from __future__ import annotations


def lease_holds(lease_end_ms: int | None, sole_voter: bool, now_ms: int) -> bool:
    """A leader's lease holds at `now_ms` (its own clock).

    `lease_end_ms` is None until the lease is established in the leader's term (or after it
    was given up for a transfer): no lease. The only voter (`dex-ha dev`) cannot be deposed
    without a membership change it commits itself, so once established its lease does not
    run out with time: a thread starved for a while must not make a lone node inactive."""
    if lease_end_ms is None:
        return False
    return sole_voter or now_ms < lease_end_ms
