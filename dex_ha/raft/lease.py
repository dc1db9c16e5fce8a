"""The leader lease: its heartbeat rounds, when it ends, and the one rule for whether it holds.

The core (core.py) decides whether it may hold a lease at all (leader of its term, own-term
entry applied, lease not given up for a transfer) and feeds the acknowledgements in; this
module turns them into the lease. It is separate so that the safety argument (the core's
docstring, "Safety: the leader lease") has its arithmetic in one small place, and so that
the rule `lease_holds` is the same for the core's own check (`RaftCore.lease_valid`) and the
view the node publishes to the HTTP side (`RaftView`): a lone node and a cluster are judged
alike by everyone who asks. Pure: time comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .progress import Progress

__all__ = ["HeartbeatRounds", "end_ms", "lease_holds", "start_ms", "supporters", "voter_acks"]


class HeartbeatRounds:
    """A leader's numbered heartbeat rounds and when each was sent (its clock, at the tick
    that started the round, which is no later than the real send). Followers echo the
    number in HEARTBEAT_RESP (`Message.context`); a voter's acknowledgement counts for the
    lease from the send time of the round it acknowledged."""

    def __init__(self) -> None:
        self.latest = 0  # 0: no round yet in this term
        self._sent_ms: dict[int, int] = {}

    def start(self, now_ms: int, keep_ms: int) -> int:
        """Number a new round sent at `now_ms`. Rounds sent more than `keep_ms` before are
        forgotten: acknowledgements of rounds older than an election timeout cannot
        extend the lease."""
        self.latest += 1
        self._sent_ms[self.latest] = now_ms
        horizon = now_ms - keep_ms
        for r in [r for r, t in self._sent_ms.items() if t < horizon]:
            del self._sent_ms[r]
        return self.latest

    def sent_ms(self, round_number: int) -> int | None:
        """When round `round_number` was sent; None if unknown or forgotten."""
        return self._sent_ms.get(round_number)

    @property
    def latest_sent_ms(self) -> int:
        """When the latest round was sent (there must be one)."""
        return self._sent_ms[self.latest]


def voter_acks(
    voters: Sequence[str], leader_id: str, latest_round_ms: int, progress: Mapping[str, Progress]
) -> dict[str, int]:
    """Voter -> send time of the newest heartbeat round it acknowledged (the leader itself:
    the latest round). Voters never heard from are left out."""
    acks: dict[str, int] = {}
    for v in voters:
        if v == leader_id:
            acks[v] = latest_round_ms
        else:
            pr = progress.get(v)
            if pr is not None and pr.lease_ack_ms is not None:
                acks[v] = pr.lease_ack_ms
    return acks


def start_ms(acks: Mapping[str, int], voters: Sequence[str]) -> int | None:
    """Send time of the newest round a quorum of `voters` acknowledged; None without a quorum."""
    quorum = len(voters) // 2 + 1
    if not voters or len(acks) < quorum:
        return None
    return sorted(acks.values(), reverse=True)[quorum - 1]


def end_ms(start_ms: int | None, window_ms: int, drift_margin_ms: int) -> int | None:
    """When a lease that started at `start_ms` ends. Every acknowledging voter promised to
    refuse votes for at least the window the heartbeats carry (the leader's
    election_timeout_min) after it received the round; the margin covers clock drift."""
    if start_ms is None:
        return None
    return start_ms + window_ms - drift_margin_ms


def supporters(acks: Mapping[str, int], start_ms: int | None) -> tuple[str, ...]:
    """The voters whose acknowledgements a lease that started at `start_ms` counts: each
    acknowledged a round sent no earlier. Empty without a lease."""
    if start_ms is None:
        return ()
    return tuple(v for v in sorted(acks) if acks[v] >= start_ms)


def lease_holds(lease_end_ms: int | None, sole_voter: bool, now_ms: int) -> bool:
    """A leader's lease holds at `now_ms` (its own clock).

    `lease_end_ms` is None until the lease is established in the leader's term (or after it
    was given up for a transfer): no lease. The only voter (`dex-ha dev`) cannot be deposed
    without a membership change it commits itself, so once established its lease does not
    run out with time: a thread starved for a while must not make a lone node inactive."""
    if lease_end_ms is None:
        return False
    return sole_voter or now_ms < lease_end_ms
